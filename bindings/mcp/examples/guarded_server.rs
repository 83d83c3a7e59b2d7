//! Guard an MCP server with Abhyasa (C-MCP-1).
//!
//! A small mail server has two tools: `read_email` needs the Anumati consent
//! scope `email.read`; `list_folders` needs nothing. Wrapped in
//! [`Guarded`], every `tools/call` first applies the custody envelope in its
//! `_meta` through a durable receiver (the default store in a temporary directory), so a
//! call whose own envelope revokes `email.read` is refused, after the
//! revocation is applied and acked.
//!
//! ```text
//! cargo run -p abhyasa-mcp --example guarded_server            # scripted client, prints the exchange
//! cargo run -p abhyasa-mcp --example guarded_server -- --stdio # serve on stdio for any MCP client
//! ```

use std::sync::{Arc, Mutex};

use abhyasa_core::polarity::{PolarityRegistry, ANUMATI_KIND};
use abhyasa_core::{AgentId, Obligation};
use abhyasa_mcp::guard::system_now;
use abhyasa_mcp::{Envelope, EnvelopeReply, GuardReceiver, Guarded, ToolPolicy};
use abhyasa_store::{StoreKind, StoreOptions};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, RequestMetaObject, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData as McpError, ServerHandler, ServiceExt};
use serde_json::{json, Map};

/// The application's own server: knows nothing about Abhyasa.
#[derive(Clone)]
struct MailServer;

impl ServerHandler for MailServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let empty = || match json!({"type": "object"}) {
            serde_json::Value::Object(m) => m,
            _ => Map::new(),
        };
        Ok(ListToolsResult::with_all_items(vec![
            Tool::new("read_email", "Read the inbox", empty()),
            Tool::new("list_folders", "List mail folders", empty()),
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let text = match &*request.name {
            "read_email" => "3 messages: 'Lunch?', 'Invoice', 'Welcome'",
            "list_folders" => "Inbox, Sent, Archive",
            other => {
                return Err(McpError::invalid_params(
                    format!("unknown tool {other}"),
                    None,
                ))
            }
        };
        Ok(CallToolResult::success(vec![ContentBlock::text(text)]).into())
    }
}

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The guarded server: the mail server, its policy, a durable receiver, and
/// the custodian this connection speaks for.
fn guarded(
    dir: &std::path::Path,
) -> Result<(Guarded<MailServer>, Arc<Mutex<GuardReceiver>>), Error> {
    let me = AgentId::new("mail-server")?;
    let policy = ToolPolicy::new(me.clone(), PolarityRegistry::standard()).require(
        "read_email",
        ANUMATI_KIND,
        json!({"scope": "email.read"}),
    )?;
    let store = StoreKind::default().open(dir.join("guard"), &StoreOptions::default())?;
    let receiver = GuardReceiver::open(me, PolarityRegistry::standard(), store, system_now())?;
    // Over stdio the client is the process that launched us; its agent id
    // comes from configuration (here: fixed).
    let receiver = Arc::new(Mutex::new(receiver));
    let server = Guarded::new(
        MailServer,
        policy,
        receiver.clone(),
        AgentId::new("assistant")?,
    );
    Ok((server, receiver))
}

fn revoke_email_read() -> Result<Obligation, Error> {
    Ok(Obligation::builder()
        .id("consent-42")
        .kind(ANUMATI_KIND)
        .target("mail-server")
        .payload(json!({"decision": "revoke", "scope": "email.read"}))
        .deadline_seconds(3600)
        .max_retries(100)
        .sequence(1)
        .created_at(system_now())
        .build()?)
}

fn show(label: &str, r: &CallToolResult) {
    let text: Vec<String> = r
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.replace('\n', " ")))
        .collect();
    println!("{label}");
    println!("  isError: {}", r.is_error.unwrap_or(false));
    println!("  text:    {}", text.join(" "));
    let reply = r
        .meta
        .as_ref()
        .map(|m| EnvelopeReply::from_meta(m))
        .transpose();
    match reply {
        Ok(Some(Some(EnvelopeReply::Ack(a)))) => println!(
            "  ack:     {} {} by {} at {}",
            a.obligation_id,
            a.status.as_str(),
            a.target,
            a.acked_at.to_rfc3339()
        ),
        Ok(Some(Some(EnvelopeReply::Error { code, message }))) => {
            println!("  envelope error: {code}: {message}")
        }
        Ok(_) => println!("  ack:     (none)"),
        Err(e) => println!("  ack:     unreadable: {e}"),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let dir = tempfile::tempdir()?;
    let (server, receiver) = guarded(dir.path())?;
    if std::env::args().any(|a| a == "--stdio") {
        server
            .serve(rmcp::transport::io::stdio())
            .await?
            .waiting()
            .await?;
        return Ok(());
    }

    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    let running = server.serve(server_io);
    let client = ();
    let (running, client) = tokio::join!(running, client.serve(client_io));
    let (_running, client) = (running?, client?);

    let call = |name: &'static str, envelope: Option<&Envelope>| {
        let mut p = CallToolRequestParams::new(name);
        if let Some(e) = envelope {
            let mut meta = Map::new();
            e.insert_into(&mut meta);
            p.meta = Some(RequestMetaObject::from(meta));
        }
        p
    };

    let r = client.call_tool(call("read_email", None)).await?;
    show("1. read_email, consent in force:", &r);

    let env = Envelope {
        obligation: revoke_email_read()?,
    };
    let r = client.call_tool(call("read_email", Some(&env))).await?;
    show(
        "2. read_email carrying the revocation of email.read in _meta:",
        &r,
    );

    let r = client.call_tool(call("read_email", None)).await?;
    show("3. read_email again, no envelope:", &r);

    let r = client.call_tool(call("read_email", Some(&env))).await?;
    show(
        "4. the custodian redelivers the same envelope (re-acked, not re-applied):",
        &r,
    );
    let applications = receiver.lock().map(|g| g.applications()).unwrap_or(0);
    println!("  applications of consent-42 by the receiver: {applications}");

    let r = client.call_tool(call("list_folders", None)).await?;
    show("5. list_folders (needs no consent):", &r);

    client.cancel().await?;
    Ok(())
}
