//! `abhyasa mcp`: a stdio MCP server with the v1 reference server's tools
//! (a drop-in superset: same names, argument keys and result text) plus
//! tools that drive a running node over its control socket.
//!
//! It answers both lifecycles rmcp 3.11 serves: the `initialize` handshake
//! (2024-11-05 … 2025-11-25) and 2026-07-28's `server/discover` with
//! per-request metadata.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use abhyasa_core::custody::{AuthorityPolicy, PeerPolicy};
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::AgentId;
use abhyasa_store::{StoreKind, StoreOptions};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData as McpError, ServerHandler, ServiceExt};
use serde_json::{json, Map, Value};

use crate::control::{self, SocketResolver};
use crate::envelope::json_type;
use crate::guard::{system_now, GuardReceiver, Guarded, ToolPolicy};
use crate::tools::{self, ToolError, ToolReply};

/// How long a node tool waits for the node (a `send_obligation` with
/// `wait` may wait for custody to end; past this it says so).
pub const NODE_TIMEOUT: Duration = Duration::from_secs(30);

/// Options of `abhyasa mcp`.
#[derive(Debug, Clone, clap::Args)]
pub struct McpArgs {
    /// The node directory whose control socket the node tools talk to (its
    /// config.toml names the socket).
    #[arg(long, default_value = ".", conflicts_with = "socket")]
    pub dir: PathBuf,
    /// The control socket, instead of --dir.
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Guard this server's own tools (C-MCP-1): this server's agent id, the
    /// `target` of the obligations that arrive in `_meta`. Without it the
    /// server ignores `_meta` and never acks.
    #[arg(long, requires_all = ["custodian", "guard_store"])]
    pub agent: Option<String>,
    /// With --agent: the agent id of the client on stdio (the custodian the
    /// receiver's ledger is keyed on; stdio has no other identity).
    #[arg(long, requires = "agent")]
    pub custodian: Option<String>,
    /// With --agent: the store of the receiver's ledger (a directory for
    /// the default log store, a file for redb).
    #[arg(long, requires = "agent")]
    pub guard_store: Option<PathBuf>,
    /// With --agent: the kind of --guard-store: log (default), fjall, redb
    /// or sled.
    #[arg(long, requires = "guard_store", default_value_t = StoreKind::default(), value_parser = parse_store_kind)]
    pub guard_store_kind: StoreKind,
    /// With --agent: TOOL=KIND:SELECTOR, the governed key a tool needs,
    /// e.g. 'send_obligation=anumati.consent:{"scope":"abhyasa.send"}'.
    #[arg(long, requires = "agent")]
    pub require: Vec<String>,
    /// With --agent: what the custodian may govern at the guard (C-AZ-1):
    /// the kinds and governed-key prefixes it may issue. `None`: every
    /// kind and key, held under the custodian's identity. Set by the
    /// embedding command (`abhyasa mcp` reads it from the node
    /// directory's `[mcp]` section), not a flag.
    #[arg(skip)]
    pub authority: Option<PeerPolicy>,
}

fn parse_store_kind(s: &str) -> Result<StoreKind, String> {
    s.parse().map_err(|e| format!("{e}"))
}

/// Adds one `--require TOOL=KIND:SELECTOR` to `policy` (the tool must be
/// one of [`TOOL_NAMES`]; the selector a JSON payload naming the key).
pub fn parse_require(policy: ToolPolicy, spec: &str) -> Result<ToolPolicy, String> {
    let usage =
        || format!("--require {spec:?}: expected TOOL=KIND:SELECTOR (SELECTOR a JSON object)");
    let (tool, rest) = spec.split_once('=').ok_or_else(usage)?;
    let (kind, selector) = rest.split_once(':').ok_or_else(usage)?;
    let selector: Value = serde_json::from_str(selector)
        .map_err(|e| format!("--require {spec:?}: selector is not JSON: {e}"))?;
    if !TOOL_NAMES.contains(&tool) {
        return Err(format!(
            "--require {spec:?}: no tool {tool:?} (one of {})",
            TOOL_NAMES.join(", ")
        ));
    }
    policy
        .require(tool, kind, selector)
        .map_err(|e| format!("--require {spec:?}: {e}"))
}

impl McpArgs {
    /// Serves MCP on stdin/stdout until the client closes it.
    /// `socket_of_dir` reads a node directory's control socket path from
    /// its config (the node's own config loader).
    pub fn run(
        self,
        socket_of_dir: impl Fn(&Path) -> Result<PathBuf, String> + Send + Sync + 'static,
    ) -> Result<(), String> {
        let resolver: SocketResolver = match self.socket {
            Some(s) => Arc::new(move || Ok(s.clone())),
            None => {
                let dir = self.dir;
                Arc::new(move || socket_of_dir(&dir))
            }
        };
        let server = ReferenceServer::new(resolver);
        let guarded = match (&self.agent, &self.custodian, &self.guard_store) {
            (Some(agent), Some(custodian), Some(store)) => {
                let agent = AgentId::new(agent).map_err(|e| format!("--agent: {e}"))?;
                let custodian = AgentId::new(custodian).map_err(|e| format!("--custodian: {e}"))?;
                let mut policy = ToolPolicy::new(agent.clone(), PolarityRegistry::standard());
                for spec in &self.require {
                    policy = parse_require(policy, spec)?;
                }
                let store = self
                    .guard_store_kind
                    .open(store, &StoreOptions::default())
                    .map_err(|e| format!("--guard-store {}: {e}", store.display()))?;
                let receiver =
                    GuardReceiver::open(agent, PolarityRegistry::standard(), store, system_now())
                        .map_err(|e| format!("guard: {e}"))?;
                let receiver = match &self.authority {
                    Some(p) => {
                        let mut authority = AuthorityPolicy::default();
                        authority.set_peer(custodian.clone(), p.clone());
                        receiver.with_authority(authority)
                    }
                    None => receiver,
                };
                Some(Guarded::new(
                    server.clone(),
                    policy,
                    Arc::new(Mutex::new(receiver)),
                    custodian,
                ))
            }
            _ => None,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the runtime: {e}"))?;
        rt.block_on(async move {
            match guarded {
                Some(g) => serve_stdio(g).await,
                None => serve_stdio(server).await,
            }
        })
    }
}

async fn serve_stdio<S: rmcp::Service<RoleServer>>(service: S) -> Result<(), String> {
    let running = service
        .serve(rmcp::transport::io::stdio())
        .await
        .map_err(|e| format!("MCP session failed to start: {e}"))?;
    running
        .waiting()
        .await
        .map_err(|e| format!("MCP session ended with an error: {e}"))?;
    Ok(())
}

/// The `abhyasa mcp` server.
#[derive(Clone)]
pub struct ReferenceServer {
    socket: SocketResolver,
    timeout: Duration,
}

impl std::fmt::Debug for ReferenceServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReferenceServer")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// The tool names, in `tools/list` order.
pub const TOOL_NAMES: [&str; 11] = [
    "validate_obligation",
    "validate_custody_ack",
    "validate_abhyasa_service_ref",
    "check_admissibility",
    "compute_safe_action",
    "run_custody_transfer",
    "send_obligation",
    "obligation_status",
    "inbox",
    "escalations",
    "decide",
];

fn schema(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

fn one_object(key: &str) -> Map<String, Value> {
    schema(json!({
        "type": "object",
        "properties": {key: {"type": "object"}},
        "required": [key],
    }))
}

/// The tool list.
pub fn tool_list() -> Vec<Tool> {
    let t =
        |name: &'static str, desc: &'static str, s: Map<String, Value>| Tool::new(name, desc, s);
    vec![
        t(
            "validate_obligation",
            "Validate an Obligation in v1 JSON (strict field types, positive deadline, \
             non-negative max_retries, valid ids, digest if present).",
            one_object("obligation"),
        ),
        t(
            "validate_custody_ack",
            "Validate a CustodyAck in v1 JSON (status applied|declined|deferred).",
            one_object("ack"),
        ),
        t(
            "validate_abhyasa_service_ref",
            "Validate an AbhyasaServiceRef (the params of the AgentCard extension entry): \
             version, custody_ack_endpoint, and supported_kinds with the AB-2 sizing rule.",
            one_object("ref"),
        ),
        t(
            "check_admissibility",
            "AC-1: whether an Obligation is admissible under the standard registry \
             (Anumati, Phala, OAuth): carried under custody, or best-effort.",
            one_object("obligation"),
        ),
        t(
            "compute_safe_action",
            "safe(O) for an admissible Obligation: the principal-side fail-safe AB-4 applies.",
            one_object("obligation"),
        ),
        t(
            "run_custody_transfer",
            "Run a custody transfer on the real custodian and receiver over a seeded lossy \
             channel in virtual time, and report the terminal state (applied | declined | \
             escalated | best_effort). Optional 'channel' (drop_prob, duplicate_prob, \
             ack_drop_prob in [0,1], seed) and 'receiver_decision' (applied|declined|deferred).",
            schema(json!({
                "type": "object",
                "properties": {
                    "obligation": {"type": "object"},
                    "channel": {
                        "type": "object",
                        "properties": {
                            "drop_prob": {"type": "number", "minimum": 0, "maximum": 1},
                            "duplicate_prob": {"type": "number", "minimum": 0, "maximum": 1},
                            "ack_drop_prob": {"type": "number", "minimum": 0, "maximum": 1},
                            "seed": {"type": "integer", "minimum": 0},
                        },
                    },
                    "receiver_decision": {
                        "type": "string",
                        "enum": ["applied", "declined", "deferred"],
                    },
                },
                "required": ["obligation"],
            })),
        ),
        t(
            "send_obligation",
            "Offer an Obligation to the running node (custody opens durably before the \
             answer). 'wait': true waits for the outcome.",
            schema(json!({
                "type": "object",
                "properties": {
                    "obligation": {"type": "object"},
                    "wait": {"type": "boolean"},
                },
                "required": ["obligation"],
            })),
        ),
        t(
            "obligation_status",
            "Where an obligation stands on the running node (custodian and receiver side).",
            schema(json!({
                "type": "object",
                "properties": {"obligation_id": {"type": "string"}},
                "required": ["obligation_id"],
            })),
        ),
        t(
            "inbox",
            "The running node's inbox counters.",
            schema(json!({"type": "object", "properties": {}})),
        ),
        t(
            "escalations",
            "Escalations and surfaced declines awaiting a principal decision on the running node.",
            schema(json!({"type": "object", "properties": {}})),
        ),
        t(
            "decide",
            "Record a principal decision on the running node: either {key, decision: \
             granted|withheld, sequence?} on a governed key, or {obligation_id, resolution: \
             apply_safe|dismiss} for a surfaced decline.",
            schema(json!({
                "type": "object",
                "properties": {
                    "key": {"type": "string"},
                    "decision": {"type": "string", "enum": ["granted", "withheld"]},
                    "sequence": {"type": "integer", "minimum": 0},
                    "obligation_id": {"type": "string"},
                    "resolution": {"type": "string", "enum": ["apply_safe", "dismiss"]},
                },
            })),
        ),
    ]
}

/// A reply as an MCP tool result: the text is the reference's JSON, the
/// structured content the same object.
pub fn to_result(reply: ToolReply) -> CallToolResult {
    let text = serde_json::to_string_pretty(&reply.body).unwrap_or_else(|_| reply.body.to_string());
    let mut r = if reply.is_error {
        CallToolResult::structured_error(reply.body)
    } else {
        CallToolResult::structured(reply.body)
    };
    r.content = vec![ContentBlock::text(text)];
    r
}

fn str_arg<'a>(args: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, ToolError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s)),
        Some(Value::String(_)) => Err(ToolError(format!("argument {key:?} must not be empty"))),
        Some(other) => Err(ToolError(format!(
            "argument {key:?} must be a string, found {}",
            json_type(other)
        ))),
    }
}

fn no_args(args: &Map<String, Value>) -> Result<(), ToolError> {
    match args.keys().next() {
        None => Ok(()),
        Some(k) => Err(ToolError(format!(
            "unexpected argument {k:?} (this tool takes none)"
        ))),
    }
}

impl ReferenceServer {
    /// A server whose node tools reach the node through `socket`.
    pub fn new(socket: SocketResolver) -> Self {
        Self {
            socket,
            timeout: NODE_TIMEOUT,
        }
    }

    /// A server whose node tools talk to the socket at `path`.
    pub fn with_socket(path: PathBuf) -> Self {
        Self::new(Arc::new(move || Ok(path.clone())))
    }

    /// Sets how long node tools wait for the node.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    async fn node(&self, request: Value) -> Result<Value, ToolError> {
        let socket = (self.socket)().map_err(|e| ToolError(format!("node: {e}")))?;
        control::call(&socket, &request, self.timeout)
            .await
            .map_err(|e| ToolError(e.to_string()))
    }

    /// Runs one tool by name (unknown names are a tool error too).
    pub async fn run_tool(&self, name: &str, args: &Map<String, Value>) -> ToolReply {
        self.dispatch(name, args).await.into()
    }

    async fn dispatch(
        &self,
        name: &str,
        args: &Map<String, Value>,
    ) -> Result<ToolReply, ToolError> {
        match name {
            "validate_obligation" => tools::validate_obligation(args),
            "validate_custody_ack" => tools::validate_custody_ack(args),
            "validate_abhyasa_service_ref" => tools::validate_abhyasa_service_ref(args),
            "check_admissibility" => tools::check_admissibility(args),
            "compute_safe_action" => tools::compute_safe_action(args),
            "run_custody_transfer" => tools::run_custody_transfer(args),
            "send_obligation" => {
                let ob = tools::object_arg(args, "obligation")?;
                // Validate here, so a bad obligation names its field before
                // any socket is touched.
                abhyasa_core::Obligation::from_json_map(ob)
                    .map_err(|e| ToolError(format!("invalid obligation: {e}")))?;
                let wait = match args.get("wait") {
                    None | Some(Value::Null) => false,
                    Some(Value::Bool(b)) => *b,
                    Some(other) => {
                        return Err(ToolError(format!(
                            "argument \"wait\" must be a boolean, found {}",
                            json_type(other)
                        )))
                    }
                };
                let r = self
                    .node(json!({"op": "offer", "obligation": ob, "wait": wait}))
                    .await?;
                Ok(ToolReply::ok(json!({ "offer": r })))
            }
            "obligation_status" => {
                let id = str_arg(args, "obligation_id")?.ok_or_else(|| {
                    ToolError("missing argument \"obligation_id\" (a string)".into())
                })?;
                let r = self.node(json!({"op": "status", "id": id})).await?;
                Ok(ToolReply::ok(json!({ "status": r })))
            }
            "inbox" => {
                no_args(args)?;
                let r = self.node(json!({"op": "inbox"})).await?;
                Ok(ToolReply::ok(json!({ "inbox": r })))
            }
            "escalations" => {
                no_args(args)?;
                let r = self.node(json!({"op": "escalations"})).await?;
                let mut fields = Map::new();
                if let Value::Object(m) = r {
                    fields.extend(m);
                }
                Ok(ToolReply::ok(Value::Object(fields)))
            }
            "decide" => {
                let key = str_arg(args, "key")?;
                let id = str_arg(args, "obligation_id")?;
                let request = match (key, id) {
                    (Some(key), None) => {
                        let decision = str_arg(args, "decision")?.ok_or_else(|| {
                            ToolError("with \"key\", \"decision\" is required (granted|withheld)".into())
                        })?;
                        if !["granted", "withheld"].contains(&decision) {
                            return Err(ToolError(format!(
                                "decision must be granted|withheld, got {decision:?}"
                            )));
                        }
                        let sequence = match args.get("sequence") {
                            None | Some(Value::Null) => None,
                            Some(Value::Number(n)) => Some(n.as_u64().ok_or_else(|| {
                                ToolError(format!("sequence must be a non-negative integer, got {n}"))
                            })?),
                            Some(other) => {
                                return Err(ToolError(format!(
                                    "sequence must be an integer, found {}",
                                    json_type(other)
                                )))
                            }
                        };
                        json!({"op": "decide", "key": key, "decision": decision, "sequence": sequence})
                    }
                    (None, Some(id)) => {
                        let resolution = str_arg(args, "resolution")?.ok_or_else(|| {
                            ToolError(
                                "with \"obligation_id\", \"resolution\" is required (apply_safe|dismiss)"
                                    .into(),
                            )
                        })?;
                        if !["apply_safe", "dismiss"].contains(&resolution) {
                            return Err(ToolError(format!(
                                "resolution must be apply_safe|dismiss, got {resolution:?}"
                            )));
                        }
                        json!({"op": "resolve", "obligation_id": id, "resolution": resolution})
                    }
                    (Some(_), Some(_)) => {
                        return Err(ToolError(
                            "give either \"key\" (with decision) or \"obligation_id\" (with resolution), not both"
                                .into(),
                        ))
                    }
                    (None, None) => {
                        return Err(ToolError(
                            "give \"key\" (with decision) or \"obligation_id\" (with resolution)".into(),
                        ))
                    }
                };
                let r = self.node(request).await?;
                Ok(ToolReply::ok(json!({ "decision": r })))
            }
            other => Err(ToolError(format!(
                "unknown tool {other:?} (one of {})",
                TOOL_NAMES.join(", ")
            ))),
        }
    }
}

impl ServerHandler for ReferenceServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("abhyasa", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Abhyasa: custody transfer of governance obligations (deliver-or-report). \
                 Validators for Obligation, CustodyAck and AbhyasaServiceRef; the AC-1 \
                 admissibility check; safe(O); a custody transfer over a seeded lossy channel \
                 on the real core; and tools that drive a running node. All tools take and \
                 return JSON.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(tool_list()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let args = request.arguments.unwrap_or_default();
        let reply = self.run_tool(&request.name, &args).await;
        Ok(CallToolResponse::Complete(to_result(reply)))
    }
}
