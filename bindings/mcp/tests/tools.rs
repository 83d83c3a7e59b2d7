//! C-MCP-2: the `abhyasa mcp` tools, driven in-process by rmcp's own client
//! over a duplex stream, in both lifecycles (`initialize`, and 2026-07-28
//! `server/discover`). Bad arguments give tool errors (`isError`), never a
//! protocol error or a crash.

use std::path::PathBuf;
use std::time::Duration;

use abhyasa_mcp::server::TOOL_NAMES;
use abhyasa_mcp::ReferenceServer;
use rmcp::model::{CallToolRequestParams, CallToolResult, ProtocolVersion};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RoleClient, RunningService};
use rmcp::ServiceExt;
use serde_json::{json, Map, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

type Client = RunningService<RoleClient, ()>;

async fn connect(server: ReferenceServer, lifecycle: ClientLifecycleMode) -> Client {
    let (s, c) = tokio::io::duplex(1 << 20);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(s).await {
            let _ = running.waiting().await;
        }
    });
    ().serve_with_lifecycle(c, lifecycle)
        .await
        .expect("client connects")
}

fn legacy() -> ClientLifecycleMode {
    ClientLifecycleMode::Initialize
}

fn discover() -> ClientLifecycleMode {
    ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    }
}

fn no_node() -> ReferenceServer {
    ReferenceServer::with_socket(PathBuf::from("/nonexistent/abhyasa-test/control.sock"))
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("not an object"),
    }
}

async fn call(client: &Client, name: &str, args: Value) -> (bool, Value) {
    let p = CallToolRequestParams::new(name.to_string()).with_arguments(obj(args));
    let r: CallToolResult = client.call_tool(p).await.expect("no protocol error");
    let text = r.content[0].as_text().expect("text content").text.clone();
    let body: Value = serde_json::from_str(&text).expect("result text is JSON");
    // The structured content is the same object as the text.
    assert_eq!(r.structured_content.as_ref(), Some(&body));
    (r.is_error.unwrap_or(false), body)
}

fn revoke() -> Value {
    json!({
        "obligation_id": "consent-1",
        "kind": "anumati.consent",
        "target": "bob",
        "payload": {"decision": "revoke", "scope": "email.read"},
        "deadline_seconds": 60,
        "max_retries": 10,
        "created_at": "2026-06-01T00:00:00Z",
    })
}

fn grant() -> Value {
    let mut g = revoke();
    g["obligation_id"] = json!("consent-2");
    g["payload"]["decision"] = json!("grant");
    g
}

// C-MCP-3 (Rust side): rmcp 3.11's official client in both eras, the
// `initialize` handshake and 2026-07-28 `server/discover`, against the
// server `abhyasa mcp` runs (in process, over a duplex stream). The stdio
// process itself is driven by the Python SDK in run_clients.sh.
#[tokio::test]
async fn c_mcp_2_tools_list_in_both_lifecycles() {
    for mode in [legacy(), discover()] {
        let client = connect(no_node(), mode).await;
        let tools = client.list_all_tools().await.expect("tools/list");
        let names: Vec<&str> = tools.iter().map(|t| &*t.name).collect();
        assert_eq!(names, TOOL_NAMES.to_vec());
        // The reference's argument keys are required where it requires them.
        for t in &tools {
            assert_eq!(
                t.input_schema.get("type"),
                Some(&json!("object")),
                "{}",
                t.name
            );
        }
        client.cancel().await.expect("cancel");
    }
}

#[tokio::test]
async fn c_mcp_2_validators_good_and_bad() {
    let client = connect(no_node(), discover()).await;
    let (err, body) = call(
        &client,
        "validate_obligation",
        json!({"obligation": revoke()}),
    )
    .await;
    assert!(!err, "{body}");
    assert_eq!(body["ok"], true);
    assert_eq!(body["obligation"], "valid");

    let mut bad = revoke();
    bad["deadline_seconds"] = json!("60");
    let (err, body) = call(&client, "validate_obligation", json!({"obligation": bad})).await;
    assert!(err);
    assert_eq!(body["ok"], false);
    assert!(
        body["error"].as_str().unwrap().contains("deadline_seconds"),
        "{body}"
    );

    let (err, body) = call(&client, "validate_obligation", json!({})).await;
    assert!(err);
    assert!(
        body["error"].as_str().unwrap().contains("obligation"),
        "{body}"
    );
    let (err, _) = call(
        &client,
        "validate_obligation",
        json!({"obligation": [1, 2]}),
    )
    .await;
    assert!(err);

    let ack = json!({
        "obligation_id": "consent-1", "target": "bob", "status": "applied",
        "acked_at": "2026-06-01T00:00:01Z",
    });
    let (err, body) = call(&client, "validate_custody_ack", json!({"ack": ack})).await;
    assert!(!err, "{body}");
    assert_eq!(body["ack"], "valid");
    let mut bad_ack = ack.clone();
    bad_ack["status"] = json!("lost");
    let (err, body) = call(&client, "validate_custody_ack", json!({"ack": bad_ack})).await;
    assert!(err);
    assert!(body["error"].as_str().unwrap().contains("status"), "{body}");

    let kind = json!({
        "kind": "anumati.consent", "obligation_endpoint": "https://bob.example/abhyasa/obligations",
        "deadline_seconds": 3600, "max_retries": 100, "backoff": "exponential",
        "backoff_base_seconds": 1.0, "backoff_cap_seconds": 60,
    });
    let good_ref = json!({
        "version": "1.0.0",
        "custody_ack_endpoint": "https://alice.example/abhyasa/custody_ack",
        "supported_kinds": [kind],
    });
    let (err, body) = call(
        &client,
        "validate_abhyasa_service_ref",
        json!({"ref": good_ref}),
    )
    .await;
    assert!(!err, "{body}");
    assert_eq!(body["ref"], "valid");
    // AB-2: six retries cannot span an hour at a 60 s cap.
    let mut incoherent = good_ref.clone();
    incoherent["supported_kinds"][0]["max_retries"] = json!(6);
    let (err, body) = call(
        &client,
        "validate_abhyasa_service_ref",
        json!({"ref": incoherent}),
    )
    .await;
    assert!(err);
    assert!(
        body["error"].as_str().unwrap().contains("max_retries"),
        "{body}"
    );
    let mut empty = good_ref;
    empty["supported_kinds"] = json!([]);
    let (err, _) = call(
        &client,
        "validate_abhyasa_service_ref",
        json!({"ref": empty}),
    )
    .await;
    assert!(err);
    client.cancel().await.expect("cancel");
}

#[tokio::test]
async fn c_mcp_2_admissibility_and_safe_action() {
    let client = connect(no_node(), legacy()).await;
    let (err, body) = call(
        &client,
        "check_admissibility",
        json!({"obligation": revoke()}),
    )
    .await;
    assert!(!err);
    assert_eq!(body["admissible"], true);
    assert_eq!(body["carried"], "custody");
    let (err, body) = call(
        &client,
        "check_admissibility",
        json!({"obligation": grant()}),
    )
    .await;
    assert!(!err);
    assert_eq!(body["admissible"], false);
    assert_eq!(body["carried"], "best_effort");

    let (err, body) = call(
        &client,
        "compute_safe_action",
        json!({"obligation": revoke()}),
    )
    .await;
    assert!(!err);
    assert_eq!(body["safe_action"]["effect"], "fail_closed");
    assert_eq!(
        body["safe_action"]["key"],
        "anumati.consent/bob/scope:email.read"
    );
    // Like the reference: an inadmissible obligation is an `ok: false`
    // answer, not a tool error.
    let (err, body) = call(
        &client,
        "compute_safe_action",
        json!({"obligation": grant()}),
    )
    .await;
    assert!(!err);
    assert_eq!(body["ok"], false);
    assert!(body["error"].as_str().unwrap().contains("not admissible"));

    // A payload the rule cannot read is a bad argument.
    let mut unreadable = revoke();
    unreadable["payload"]["decision"] = json!("maybe");
    let (err, body) = call(
        &client,
        "check_admissibility",
        json!({"obligation": unreadable}),
    )
    .await;
    assert!(err);
    assert!(
        body["error"].as_str().unwrap().contains("payload.decision"),
        "{body}"
    );
    client.cancel().await.expect("cancel");
}

#[tokio::test]
async fn c_mcp_2_custody_transfer_on_the_real_core() {
    let client = connect(no_node(), discover()).await;
    let (err, body) = call(
        &client,
        "run_custody_transfer",
        json!({"obligation": revoke()}),
    )
    .await;
    assert!(!err, "{body}");
    assert_eq!(body["terminal"], "applied");
    assert_eq!(body["discharged"], true);
    assert_eq!(body["attempts"], 1);
    assert_eq!(body["escalations"], json!([]));
    // The Anumati withhold is applied at offer (principal side).
    assert_eq!(
        body["authorizations"]["anumati.consent/bob/scope:email.read"],
        "withheld"
    );

    let (_, body) = call(
        &client,
        "run_custody_transfer",
        json!({"obligation": revoke(), "receiver_decision": "declined"}),
    )
    .await;
    assert_eq!(body["terminal"], "declined");
    assert_eq!(body["discharged"], true);

    // Total loss: the deadline ends custody, escalated with safe(O).
    let (_, body) = call(
        &client,
        "run_custody_transfer",
        json!({"obligation": revoke(), "channel": {"drop_prob": 1.0, "seed": 3}}),
    )
    .await;
    assert_eq!(body["terminal"], "escalated");
    assert_eq!(body["discharged"], false);
    assert_eq!(body["escalations"].as_array().unwrap().len(), 1);
    assert_eq!(
        body["escalations"][0]["safe_action"]["effect"],
        "fail_closed"
    );
    let attempts = body["attempts"].as_u64().unwrap();
    assert!(attempts > 1 && attempts <= 11, "{attempts}");

    let (_, body) = call(
        &client,
        "run_custody_transfer",
        json!({"obligation": revoke(), "receiver_decision": "deferred"}),
    )
    .await;
    assert_eq!(body["terminal"], "escalated");

    // Corrective Phala: the routing weight is pushed down on escalation.
    let phala = json!({
        "obligation_id": "bu-1", "kind": "phala.belief_update", "target": "bob",
        "payload": {"weight_delta": -0.4, "weight_key": "w"},
        "deadline_seconds": 30, "max_retries": 10, "created_at": "2026-06-01T00:00:00Z",
    });
    let (_, body) = call(
        &client,
        "run_custody_transfer",
        json!({"obligation": phala, "channel": {"drop_prob": 1.0}}),
    )
    .await;
    assert_eq!(body["terminal"], "escalated");
    assert_eq!(
        body["routing_weights"].as_object().unwrap().len(),
        1,
        "{body}"
    );

    // Seeded: the same seed gives the same run.
    let lossy = json!({"obligation": revoke(), "channel": {
        "drop_prob": 0.6, "duplicate_prob": 0.3, "ack_drop_prob": 0.5, "seed": 42}});
    let (_, a) = call(&client, "run_custody_transfer", lossy.clone()).await;
    let (_, b) = call(&client, "run_custody_transfer", lossy).await;
    assert_eq!(a, b);
    assert!(a["applications"].as_u64().unwrap() <= 1, "AB-3: {a}");

    // Benign: best-effort, one attempt.
    let (_, body) = call(
        &client,
        "run_custody_transfer",
        json!({"obligation": grant()}),
    )
    .await;
    assert_eq!(body["terminal"], "best_effort");
    assert_eq!(body["attempts"], 1);

    for (args, needle) in [
        (
            json!({"obligation": revoke(), "channel": {"drop_prob": 2.0}}),
            "drop_prob",
        ),
        (
            json!({"obligation": revoke(), "channel": {"drop_prob": "0.5"}}),
            "drop_prob",
        ),
        (
            json!({"obligation": revoke(), "channel": {"seed": -1}}),
            "seed",
        ),
        (json!({"obligation": revoke(), "channel": 7}), "channel"),
        (
            json!({"obligation": revoke(), "receiver_decision": "maybe"}),
            "receiver_decision",
        ),
        (
            json!({"obligation": revoke(), "receiver_decision": 1}),
            "receiver_decision",
        ),
        (json!({"obligation": "x"}), "obligation"),
    ] {
        let (err, body) = call(&client, "run_custody_transfer", args.clone()).await;
        assert!(err, "{args}");
        assert!(
            body["error"].as_str().unwrap().contains(needle),
            "{args} -> {body}"
        );
    }
    client.cancel().await.expect("cancel");
}

#[tokio::test]
async fn c_mcp_2_unknown_tool_and_missing_arguments_are_tool_errors() {
    let client = connect(no_node(), legacy()).await;
    let (err, body) = call(&client, "no_such_tool", json!({})).await;
    assert!(err);
    assert!(body["error"].as_str().unwrap().contains("unknown tool"));
    // No `arguments` at all.
    let r = client
        .call_tool(CallToolRequestParams::new("check_admissibility"))
        .await
        .expect("no protocol error");
    assert_eq!(r.is_error, Some(true));
    client.cancel().await.expect("cancel");
}

#[tokio::test]
async fn c_mcp_2_node_tools_without_a_node_say_so() {
    let client = connect(no_node(), discover()).await;
    let (err, body) = call(&client, "inbox", json!({})).await;
    assert!(err);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("no node is running"),
        "{body}"
    );
    // Argument errors are caught before the socket is touched.
    let (err, body) = call(&client, "obligation_status", json!({"obligation_id": 5})).await;
    assert!(err);
    assert!(body["error"].as_str().unwrap().contains("obligation_id"));
    let (err, body) = call(&client, "decide", json!({"key": "k"})).await;
    assert!(err);
    assert!(body["error"].as_str().unwrap().contains("decision"));
    let (err, body) = call(&client, "decide", json!({"key": "k", "decision": "yes"})).await;
    assert!(err);
    assert!(body["error"].as_str().unwrap().contains("granted|withheld"));
    let (err, _) = call(&client, "decide", json!({})).await;
    assert!(err);
    let (err, body) = call(
        &client,
        "send_obligation",
        json!({"obligation": {"kind": 1}}),
    )
    .await;
    assert!(err);
    assert!(body["error"]
        .as_str()
        .unwrap()
        .contains("invalid obligation"));
    let (err, _) = call(&client, "inbox", json!({"extra": 1})).await;
    assert!(err);
    client.cancel().await.expect("cancel");
}

/// A scripted control socket: answers each request line with `answer(req)`
/// and records the requests.
async fn scripted_node(
    path: PathBuf,
    answer: fn(&Value) -> Value,
) -> tokio::sync::mpsc::UnboundedReceiver<Value> {
    let listener = tokio::net::UnixListener::bind(&path).expect("bind");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let (r, mut w) = stream.into_split();
                let mut lines = BufReader::new(r).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let req: Value = serde_json::from_str(&line).expect("request is JSON");
                    let _ = tx.send(req.clone());
                    let mut out = answer(&req).to_string();
                    out.push('\n');
                    if w.write_all(out.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    rx
}

#[tokio::test]
async fn c_mcp_2_node_tools_speak_the_control_protocol() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("control.sock");
    let mut seen = scripted_node(sock.clone(), |req| match req["op"].as_str() {
        Some("status") if req["id"] == "missing" => json!({"ok": false, "error": {
            "code": "unknown", "message": "obligation missing is not known to this node"}}),
        Some("escalations") => json!({"ok": true, "result": {"escalations": [], "decisions": []}}),
        _ => json!({"ok": true, "result": {"echo": req}}),
    })
    .await;
    let server = ReferenceServer::with_socket(sock).with_timeout(Duration::from_secs(5));
    let client = connect(server, legacy()).await;

    let (err, body) = call(
        &client,
        "send_obligation",
        json!({"obligation": revoke(), "wait": true}),
    )
    .await;
    assert!(!err, "{body}");
    let req = seen.recv().await.expect("offer sent");
    assert_eq!(req["op"], "offer");
    assert_eq!(req["wait"], true);
    assert_eq!(req["obligation"], revoke());
    assert_eq!(body["offer"]["echo"], req);

    let (err, body) = call(
        &client,
        "obligation_status",
        json!({"obligation_id": "c-1"}),
    )
    .await;
    assert!(!err);
    assert_eq!(
        seen.recv().await.expect("status"),
        json!({"op": "status", "id": "c-1"})
    );
    assert_eq!(body["status"]["echo"]["id"], "c-1");

    let (err, body) = call(
        &client,
        "obligation_status",
        json!({"obligation_id": "missing"}),
    )
    .await;
    assert!(err);
    assert!(
        body["error"].as_str().unwrap().contains("not known"),
        "{body}"
    );
    let _ = seen.recv().await;

    let (err, _) = call(&client, "inbox", json!({})).await;
    assert!(!err);
    assert_eq!(seen.recv().await.expect("inbox"), json!({"op": "inbox"}));

    let (err, body) = call(&client, "escalations", json!({})).await;
    assert!(!err);
    assert_eq!(body["escalations"], json!([]));
    let _ = seen.recv().await;

    let (err, _) = call(
        &client,
        "decide",
        json!({"key": "anumati.consent/bob/scope:email.read", "decision": "granted", "sequence": 3}),
    )
    .await;
    assert!(!err);
    assert_eq!(
        seen.recv().await.expect("decide"),
        json!({"op": "decide", "key": "anumati.consent/bob/scope:email.read",
               "decision": "granted", "sequence": 3})
    );
    let (err, _) = call(
        &client,
        "decide",
        json!({"obligation_id": "c-9", "resolution": "dismiss"}),
    )
    .await;
    assert!(!err);
    assert_eq!(
        seen.recv().await.expect("resolve"),
        json!({"op": "resolve", "obligation_id": "c-9", "resolution": "dismiss"})
    );
    client.cancel().await.expect("cancel");
}
