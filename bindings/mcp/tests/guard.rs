//! C-MCP-1: an envelope in `_meta` is processed before the tool call it
//! rides; a withdrawn authority stops that very call. Driven in-process by
//! rmcp's client over a duplex stream, on a durable receiver (the default store).

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use abhyasa_core::polarity::{PolarityRegistry, ANUMATI_KIND};
use abhyasa_core::principal::Authorization;
use abhyasa_core::{AckStatus, AgentId, GovernedKey, Obligation, ObligationId, Timestamp};
use abhyasa_mcp::{Envelope, EnvelopeReply, GuardReceiver, Guarded, ToolPolicy, ENVELOPE_KEY};
use abhyasa_store::{StoreKind, StoreOptions};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, ProtocolVersion, RequestMetaObject, ServerCapabilities, ServerConfig,
    Tool,
};
use rmcp::service::{
    ClientLifecycleMode, ClientServiceExt, RequestContext, RoleClient, RoleServer, RunningService,
};
use rmcp::{ErrorData as McpError, ServerHandler, ServiceExt};
use serde_json::{json, Map, Value};

/// Counts how often each tool really ran.
#[derive(Clone, Default)]
struct Mail {
    read_email: Arc<AtomicU32>,
    list_folders: Arc<AtomicU32>,
}

impl ServerHandler for Mail {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let s = obj(json!({"type": "object"}));
        Ok(ListToolsResult::with_all_items(vec![
            Tool::new("read_email", "read", s.clone()),
            Tool::new("list_folders", "list", s),
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let counter = match &*request.name {
            "read_email" => &self.read_email,
            "list_folders" => &self.list_folders,
            _ => return Err(McpError::invalid_params("unknown tool", None)),
        };
        counter.fetch_add(1, Ordering::SeqCst);
        Ok(CallToolResult::success(vec![ContentBlock::text("done")]).into())
    }
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("not an object"),
    }
}

const NOW: Timestamp = Timestamp::from_unix_seconds(1_780_000_000);

fn agent(s: &str) -> AgentId {
    AgentId::new(s).expect("agent id")
}

fn consent(id: &str, decision: &str, sequence: u64) -> Obligation {
    Obligation::builder()
        .id(id)
        .kind(ANUMATI_KIND)
        .target("mail-server")
        .payload(json!({"decision": decision, "scope": "email.read"}))
        .deadline_seconds(3600)
        .max_retries(100)
        .sequence(sequence)
        .created_at(NOW)
        .build()
        .expect("obligation")
}

fn key() -> GovernedKey {
    GovernedKey::new("anumati.consent/mail-server/scope:email.read").expect("key")
}

fn open_receiver(path: &Path) -> Arc<Mutex<GuardReceiver>> {
    let store = StoreKind::default()
        .open(path, &StoreOptions::default())
        .expect("store");
    let r = GuardReceiver::open(
        agent("mail-server"),
        PolarityRegistry::standard(),
        store,
        NOW,
    )
    .expect("receiver");
    Arc::new(Mutex::new(r))
}

fn policy() -> ToolPolicy {
    ToolPolicy::new(agent("mail-server"), PolarityRegistry::standard())
        .require("read_email", ANUMATI_KIND, json!({"scope": "email.read"}))
        .expect("policy")
}

type Client = RunningService<RoleClient, ()>;

async fn connect(
    mail: &Mail,
    receiver: &Arc<Mutex<GuardReceiver>>,
    custodian: &str,
    lifecycle: ClientLifecycleMode,
) -> Client {
    let guarded = Guarded::new(mail.clone(), policy(), receiver.clone(), agent(custodian))
        .with_clock(Arc::new(|| {
            NOW.saturating_add(std::time::Duration::from_secs(5))
        }));
    let (s, c) = tokio::io::duplex(1 << 20);
    tokio::spawn(async move {
        if let Ok(running) = guarded.serve(s).await {
            let _ = running.waiting().await;
        }
    });
    ().serve_with_lifecycle(c, lifecycle).await.expect("client")
}

fn modes() -> [ClientLifecycleMode; 2] {
    [
        ClientLifecycleMode::Initialize,
        ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        },
    ]
}

fn params(tool: &str, envelope: Option<Value>) -> CallToolRequestParams {
    let mut p = CallToolRequestParams::new(tool.to_string());
    if let Some(e) = envelope {
        let mut meta = Map::new();
        meta.insert(ENVELOPE_KEY.into(), e);
        p.meta = Some(RequestMetaObject::from(meta));
    }
    p
}

fn env(ob: &Obligation) -> Value {
    Envelope {
        obligation: ob.clone(),
    }
    .to_value()
}

fn reply(r: &CallToolResult) -> Option<EnvelopeReply> {
    r.meta
        .as_ref()
        .and_then(|m| EnvelopeReply::from_meta(m).expect("readable reply"))
}

fn ack_status(r: &CallToolResult) -> Option<AckStatus> {
    match reply(r) {
        Some(EnvelopeReply::Ack(a)) => Some(a.status),
        _ => None,
    }
}

#[tokio::test]
async fn c_mcp_1_revocation_in_meta_stops_that_very_call_in_both_lifecycles() {
    for mode in modes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let receiver = open_receiver(&dir.path().join("guard"));
        let mail = Mail::default();
        let client = connect(&mail, &receiver, "assistant", mode).await;

        let r = client
            .call_tool(params("read_email", None))
            .await
            .expect("call");
        assert_eq!(r.is_error, Some(false));
        assert_eq!(mail.read_email.load(Ordering::SeqCst), 1);
        assert!(reply(&r).is_none(), "no envelope, no ack");

        let revoke = consent("consent-42", "revoke", 1);
        let r = client
            .call_tool(params("read_email", Some(env(&revoke))))
            .await
            .expect("call");
        // Refused: the call did not run ...
        assert_eq!(r.is_error, Some(true));
        assert_eq!(mail.read_email.load(Ordering::SeqCst), 1);
        let text = &r.content[0].as_text().expect("text").text;
        let body: Value = serde_json::from_str(text).expect("json");
        assert_eq!(body["ok"], false);
        assert_eq!(body["refused"]["key"], key().as_str());
        // ... after the revocation was applied and acked, with the ack in
        // the result's _meta.
        match reply(&r) {
            Some(EnvelopeReply::Ack(a)) => {
                assert_eq!(a.obligation_id.as_str(), "consent-42");
                assert_eq!(a.status, AckStatus::Applied);
                assert_eq!(a.target.as_str(), "mail-server");
                assert_eq!(a.digest, Some(revoke.digest()));
            }
            other => panic!("expected an ack, got {other:?}"),
        }
        {
            let g = receiver.lock().expect("lock");
            assert_eq!(g.authorization(&key()), Some(Authorization::Withheld));
            assert!(g.knows(
                &agent("assistant"),
                &ObligationId::new("consent-42").expect("id")
            ));
        }

        // The authority stays withdrawn for later calls; other tools run.
        let r = client
            .call_tool(params("read_email", None))
            .await
            .expect("call");
        assert_eq!(r.is_error, Some(true));
        let r = client
            .call_tool(params("list_folders", None))
            .await
            .expect("call");
        assert_eq!(r.is_error, Some(false));
        assert_eq!(mail.read_email.load(Ordering::SeqCst), 1);
        assert_eq!(mail.list_folders.load(Ordering::SeqCst), 1);
        client.cancel().await.expect("cancel");
    }
}

#[tokio::test]
async fn c_mcp_1_an_ungoverned_tool_runs_with_the_ack_in_meta() {
    let dir = tempfile::tempdir().expect("tempdir");
    let receiver = open_receiver(&dir.path().join("guard"));
    let mail = Mail::default();
    let client = connect(
        &mail,
        &receiver,
        "assistant",
        ClientLifecycleMode::Initialize,
    )
    .await;
    let r = client
        .call_tool(params(
            "list_folders",
            Some(env(&consent("consent-7", "revoke", 1))),
        ))
        .await
        .expect("call");
    assert_eq!(r.is_error, Some(false));
    assert_eq!(mail.list_folders.load(Ordering::SeqCst), 1);
    assert_eq!(ack_status(&r), Some(AckStatus::Applied));
    client.cancel().await.expect("cancel");
}

#[tokio::test]
async fn ab_3_redelivery_is_reacked_not_reapplied_and_survives_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("guard");
    let revoke = consent("consent-42", "revoke", 1);
    {
        let receiver = open_receiver(&path);
        let mail = Mail::default();
        let client = connect(
            &mail,
            &receiver,
            "assistant",
            ClientLifecycleMode::Initialize,
        )
        .await;
        for _ in 0..3 {
            let r = client
                .call_tool(params("read_email", Some(env(&revoke))))
                .await
                .expect("call");
            assert_eq!(ack_status(&r), Some(AckStatus::Applied));
        }
        assert_eq!(receiver.lock().expect("lock").applications(), 1);
        client.cancel().await.expect("cancel");
        // Let the server task drop its handle on the store.
        for _ in 0..1000 {
            if Arc::strong_count(&receiver) == 1 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(
            Arc::strong_count(&receiver),
            1,
            "the server released the store"
        );
    }
    // A new process: the ledger and the effect come back from the store.
    let receiver = open_receiver(&path);
    assert_eq!(
        receiver.lock().expect("lock").authorization(&key()),
        Some(Authorization::Withheld)
    );
    let mail = Mail::default();
    let client = connect(
        &mail,
        &receiver,
        "assistant",
        ClientLifecycleMode::Initialize,
    )
    .await;
    let r = client
        .call_tool(params("read_email", Some(env(&revoke))))
        .await
        .expect("call");
    assert_eq!(ack_status(&r), Some(AckStatus::Applied));
    assert_eq!(r.is_error, Some(true));
    assert_eq!(
        receiver.lock().expect("lock").applications(),
        0,
        "re-acked from the ledger"
    );
    assert_eq!(mail.read_email.load(Ordering::SeqCst), 0);
    client.cancel().await.expect("cancel");
}

#[tokio::test]
async fn the_ledger_is_keyed_on_the_custodian() {
    let dir = tempfile::tempdir().expect("tempdir");
    let receiver = open_receiver(&dir.path().join("guard"));
    let mail = Mail::default();
    let revoke = consent("consent-1", "revoke", 1);
    for custodian in ["alice", "carol"] {
        let client = connect(&mail, &receiver, custodian, ClientLifecycleMode::Initialize).await;
        let r = client
            .call_tool(params("list_folders", Some(env(&revoke))))
            .await
            .expect("call");
        assert_eq!(ack_status(&r), Some(AckStatus::Applied));
        client.cancel().await.expect("cancel");
    }
    let g = receiver.lock().expect("lock");
    let id = ObligationId::new("consent-1").expect("id");
    assert!(g.knows(&agent("alice"), &id));
    assert!(g.knows(&agent("carol"), &id));
}

#[tokio::test]
async fn a_newer_grant_restores_the_tool_and_an_older_revocation_does_not_win() {
    let dir = tempfile::tempdir().expect("tempdir");
    let receiver = open_receiver(&dir.path().join("guard"));
    let mail = Mail::default();
    let client = connect(
        &mail,
        &receiver,
        "assistant",
        ClientLifecycleMode::Initialize,
    )
    .await;
    let r = client
        .call_tool(params(
            "read_email",
            Some(env(&consent("c-2", "revoke", 2))),
        ))
        .await
        .expect("call");
    assert_eq!(r.is_error, Some(true));
    let r = client
        .call_tool(params("read_email", Some(env(&consent("c-3", "grant", 3)))))
        .await
        .expect("call");
    assert_eq!(r.is_error, Some(false), "granted again at sequence 3");
    assert_eq!(ack_status(&r), Some(AckStatus::Applied));
    // A stale revocation (sequence 1) arrives late: declined, tool runs.
    let r = client
        .call_tool(params(
            "read_email",
            Some(env(&consent("c-1", "revoke", 1))),
        ))
        .await
        .expect("call");
    assert_eq!(ack_status(&r), Some(AckStatus::Declined));
    assert_eq!(r.is_error, Some(false));
    assert_eq!(mail.read_email.load(Ordering::SeqCst), 2);
    client.cancel().await.expect("cancel");
}

#[tokio::test]
async fn an_unreadable_envelope_refuses_the_call_and_names_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let receiver = open_receiver(&dir.path().join("guard"));
    let mail = Mail::default();
    let client = connect(
        &mail,
        &receiver,
        "assistant",
        ClientLifecycleMode::Initialize,
    )
    .await;
    let mut bad = consent("c-1", "revoke", 1).to_json_value();
    bad["max_retries"] = json!(-1);
    for (envelope, needle) in [
        (json!("revoke everything"), "must be an object"),
        (json!({}), "obligation is missing"),
        (json!({"obligation": 3}), "must be an object"),
        (json!({"obligation": bad}), "max_retries"),
    ] {
        let r = client
            .call_tool(params("list_folders", Some(envelope.clone())))
            .await
            .expect("call");
        assert_eq!(r.is_error, Some(true), "{envelope}");
        match reply(&r) {
            Some(EnvelopeReply::Error { message, .. }) => {
                assert!(message.contains(needle), "{envelope}: {message}")
            }
            other => panic!("{envelope}: {other:?}"),
        }
    }
    assert_eq!(mail.list_folders.load(Ordering::SeqCst), 0);
    // An obligation for another agent is refused by the receiver; the
    // call itself is not governed by it.
    let mut other = consent("c-9", "revoke", 1).to_json_value();
    other["target"] = json!("someone-else");
    other.as_object_mut().expect("obj").remove("digest");
    let r = client
        .call_tool(params("list_folders", Some(json!({"obligation": other}))))
        .await
        .expect("call");
    assert_eq!(r.is_error, Some(false));
    match reply(&r) {
        Some(EnvelopeReply::Error { code, .. }) => assert_eq!(code, "invalid_obligation"),
        other => panic!("{other:?}"),
    }
    // tools/list passes through untouched.
    let tools = client.list_all_tools().await.expect("list");
    assert_eq!(tools.len(), 2);
    client.cancel().await.expect("cancel");
}

#[test]
fn policy_keys_come_from_the_polarity_rule() {
    let p = policy();
    assert_eq!(p.key_for("read_email"), Some(&key()));
    assert_eq!(p.key_for("list_folders"), None);
    let unknown = ToolPolicy::new(agent("mail-server"), PolarityRegistry::standard()).require(
        "x",
        "no.such.kind",
        json!({}),
    );
    assert!(unknown.is_err());
    let unreadable = ToolPolicy::new(agent("mail-server"), PolarityRegistry::standard()).require(
        "x",
        ANUMATI_KIND,
        json!({}),
    );
    assert!(unreadable.is_err(), "no scope, no key");
}

/// C-T-6: the envelope decoder answers arbitrary JSON with a typed error
/// and never panics.
#[test]
fn c_t_6_envelope_decoder_never_panics() {
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    fn random_json(rng: &mut ChaCha8Rng, depth: u32) -> Value {
        match rng.random_range(0..if depth > 3 { 5 } else { 7 }) {
            0 => Value::Null,
            1 => json!(rng.random::<bool>()),
            2 => json!(rng.random::<i64>()),
            3 => json!(rng.random::<f64>()),
            4 => {
                let words = [
                    "",
                    "revoke",
                    "anumati.consent",
                    "2026-06-01T00:00:00Z",
                    "x/y",
                ];
                json!(words[rng.random_range(0..words.len())])
            }
            5 => Value::Array(
                (0..rng.random_range(0..4))
                    .map(|_| random_json(rng, depth + 1))
                    .collect(),
            ),
            _ => {
                let keys = [
                    "obligation",
                    "obligation_id",
                    "kind",
                    "target",
                    "payload",
                    "deadline_seconds",
                    "max_retries",
                    "created_at",
                    "sequence",
                    "digest",
                ];
                let mut m = Map::new();
                for _ in 0..rng.random_range(0..8) {
                    m.insert(
                        keys[rng.random_range(0..keys.len())].into(),
                        random_json(rng, depth + 1),
                    );
                }
                Value::Object(m)
            }
        }
    }
    let base = consent("c-1", "revoke", 1).to_json_value();
    for i in 0..5_000 {
        let v = if i % 2 == 0 {
            random_json(&mut rng, 0)
        } else {
            // A valid obligation with one field replaced.
            let mut o = base.clone();
            let k = [
                "obligation_id",
                "kind",
                "deadline_seconds",
                "created_at",
                "payload",
                "sequence",
            ][rng.random_range(0..6)];
            o[k] = random_json(&mut rng, 2);
            json!({"obligation": o})
        };
        let _ = Envelope::from_value(&v);
        let mut meta = Map::new();
        meta.insert(ENVELOPE_KEY.into(), v);
        let _ = Envelope::from_meta(&meta);
        let _ = EnvelopeReply::from_meta(&meta);
    }
}
