//! The HTTP binding in front of a real node (C-A2A-2, C-A2A-3, AB-3 over
//! HTTP) and a custodian node reaching a receiver only over HTTP.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::eventually;
// Listening ports fixed before the listener binds (a peer's config names
// them): ones the kernel hands no other socket meanwhile.
use abhyasa_testkit::loopback_port;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use abhyasa::{Node, NodeEvent, NodeOptions};
use abhyasa_a2a::card::kind_profile;
use abhyasa_a2a::{HttpConfig, HttpPeer, HttpServer, EXTENSION_URI};
use abhyasa_core::custody::{
    Applier, ApplyContext, ApplyDecision, CustodyProfile, ReceiverEvent, StandardApplier,
    TerminalState,
};
use abhyasa_core::store::SimStore;
use abhyasa_core::{AgentId, DeclineReason, Kind, Obligation, ObligationId, RetryBackoff};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

type Stash = Arc<Mutex<HashMap<ObligationId, ApplyDecision>>>;

/// Standard applier; payload `demo: decline|defer` switches.
struct Demo {
    standard: StandardApplier,
    stash: Stash,
}

impl Applier for Demo {
    fn decide(&mut self, ctx: &ApplyContext<'_>, ob: &Obligation) -> ApplyDecision {
        match ob.payload().get("demo").and_then(Value::as_str) {
            Some("decline") => ApplyDecision::Decline {
                reason: DeclineReason::Policy,
                detail: None,
            },
            Some("defer") if !ctx.previously_deferred => {
                let d = self.standard.decide(ctx, ob);
                self.stash.lock().unwrap().insert(ob.id().clone(), d);
                ApplyDecision::Defer { detail: None }
            }
            _ => self.standard.decide(ctx, ob),
        }
    }
}

fn agent(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

fn profiles() -> Vec<abhyasa_core::KindProfile> {
    vec![kind_profile(
        Kind::new("anumati.consent").unwrap(),
        "",
        600,
        &RetryBackoff::DEFAULT,
    )
    .unwrap()]
}

struct Receiver {
    node: Node,
    server: HttpServer,
    stash: Stash,
    applied: Arc<Mutex<HashMap<String, u32>>>,
}

async fn receiver(peers: Vec<HttpPeer>, port: u16) -> Receiver {
    let mut cfg = HttpConfig::loopback("bob", peers, profiles());
    cfg.listen = SocketAddr::from(([127, 0, 0, 1], port));
    cfg.max_body = 8 * 1024;
    let (t, server) = abhyasa_a2a::start(agent("bob"), cfg).await.unwrap();
    let stash = Stash::default();
    let mut o = NodeOptions::new(agent("bob"));
    o.applier = Box::new(Demo {
        standard: StandardApplier::default(),
        stash: stash.clone(),
    });
    let node = Node::open(o, Box::new(SimStore::new()), t).await.unwrap();
    let applied = Arc::new(Mutex::new(HashMap::new()));
    let (a, mut rx) = (applied.clone(), node.subscribe());
    tokio::spawn(async move {
        while let Ok(e) = rx.recv().await {
            if let NodeEvent::Receiver(ReceiverEvent::Applied { obligation_id, .. }) = e {
                *a.lock()
                    .unwrap()
                    .entry(obligation_id.to_string())
                    .or_insert(0) += 1;
            }
        }
    });
    Receiver {
        node,
        server,
        stash,
        applied,
    }
}

fn alice_peer(ack: Option<String>) -> HttpPeer {
    HttpPeer {
        agent: agent("alice"),
        token: Some("alice-secret".into()),
        fingerprint: None,
        custody_ack_endpoint: ack,
        obligation_endpoint: None,
        outbound_token: Some("bob-to-alice".into()),
    }
}

fn obligation(id: &str, demo: Option<&str>) -> Value {
    let mut payload = json!({"decision": "revoke", "scope": format!("scope-{id}")});
    if let Some(d) = demo {
        payload["demo"] = json!(d);
    }
    json!({
        "obligation_id": id,
        "kind": "anumati.consent",
        "target": "bob",
        "payload": payload,
        "deadline_seconds": 60,
        "max_retries": 20,
        "created_at": chrono_now(),
    })
}

fn chrono_now() -> String {
    use abhyasa::clock::Clock;
    abhyasa::clock::SystemClock.now().to_rfc3339()
}

struct Resp {
    status: u16,
    headers: hyper::HeaderMap,
    body: Value,
}

async fn post(url: &str, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Resp {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut req = hyper::Request::post(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = client
        .request(req.body(Full::new(body.into())).unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let b = resp.into_body().collect().await.unwrap().to_bytes();
    let body = if b.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&b).unwrap_or(Value::String(String::from_utf8_lossy(&b).into()))
    };
    Resp {
        status,
        headers,
        body,
    }
}

const AUTH: (&str, &str) = ("authorization", "Bearer alice-secret");
const JSON: (&str, &str) = ("content-type", "application/json");

/// A custodian-side ack endpoint that records what is POSTed to it.
async fn ack_sink() -> (String, Arc<Mutex<Vec<(Option<String>, Value)>>>) {
    use axum::http::HeaderMap;
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    let app = axum::Router::new().route(
        "/abhyasa/custody_ack",
        axum::routing::post(move |h: HeaderMap, body: Bytes| {
            let g = g.clone();
            async move {
                let auth = h
                    .get("authorization")
                    .map(|v| v.to_str().unwrap().to_string());
                g.lock()
                    .unwrap()
                    .push((auth, serde_json::from_slice(&body).unwrap()));
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/abhyasa/custody_ack", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (url, got)
}

// C-A2A-2: applied and declined settle synchronously: 200 + the ack; a
// redelivery is re-acked applied without reapplying (AB-3 over HTTP).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_a2a_2_sync_200_with_ack_and_idempotent_redelivery() {
    let r = receiver(vec![alice_peer(None)], 0).await;
    let url = format!("{}/abhyasa/obligations", r.server.base_url);
    let body = obligation("ob-1", None).to_string();
    let a = post(&url, &[AUTH, JSON], body.clone()).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(a.body["status"], json!("applied"));
    assert_eq!(a.body["obligation_id"], json!("ob-1"));
    assert_eq!(a.body["target"], json!("bob"));
    let digest = Obligation::from_json(body.as_bytes()).unwrap().digest();
    assert_eq!(a.body["digest"], json!(digest.to_hex()));
    let again = post(&url, &[AUTH, JSON], body).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.body["status"], json!("applied"));

    let d = post(
        &url,
        &[AUTH, JSON],
        obligation("ob-2", Some("decline")).to_string(),
    )
    .await;
    assert_eq!(d.status, 200);
    assert_eq!(d.body["status"], json!("declined"));
    assert_eq!(d.body["reason"], json!("policy"));

    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(r.applied.lock().unwrap().get("ob-1"), Some(&1));
    assert_eq!(r.applied.lock().unwrap().get("ob-2"), None);
    r.node.shutdown().await.unwrap();
}

// C-A2A-2: deferred answers 202 with the deferred ack; the final ack is
// POSTed later to the custodian's custody_ack_endpoint, with our
// credential.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_a2a_2_deferred_202_then_final_ack_pushed() {
    let (ack_url, got) = ack_sink().await;
    let r = receiver(vec![alice_peer(Some(ack_url))], 0).await;
    let url = format!("{}/abhyasa/obligations", r.server.base_url);
    let a = post(
        &url,
        &[AUTH, JSON],
        obligation("ob-d", Some("defer")).to_string(),
    )
    .await;
    assert_eq!(a.status, 202, "{:?}", a.body);
    assert_eq!(a.body["status"], json!("deferred"));
    assert!(got.lock().unwrap().is_empty(), "nothing final yet");
    let id = ObligationId::new("ob-d").unwrap();
    let d = r.stash.lock().unwrap().remove(&id).unwrap();
    r.node
        .complete_deferred(agent("alice"), id, d)
        .await
        .unwrap();
    assert!(eventually(|| !got.lock().unwrap().is_empty()).await);
    let (auth, ack) = got.lock().unwrap()[0].clone();
    assert_eq!(auth.as_deref(), Some("Bearer bob-to-alice"));
    assert_eq!(ack["obligation_id"], json!("ob-d"));
    assert_eq!(ack["status"], json!("applied"));
    assert_eq!(
        r.server
            .stats
            .acks_pushed
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    r.node.shutdown().await.unwrap();
}

// C-A2A-2: JSON-RPC SendMessage (1.0) and message/send (0.3) carry the
// obligation in message.metadata[URI] and answer the ack in the reply's
// metadata; the A2A-Extensions header is honored and echoed; an
// unsupported A2A-Version gets -32009; HTTP+JSON POST /message:send too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_a2a_2_jsonrpc_and_rest_send_message() {
    let r = receiver(vec![alice_peer(None)], 0).await;
    let base = r.server.base_url.clone();
    let msg = |id: &str, listed: bool| {
        let mut ob = obligation(id, None);
        // As the official client's protobuf Struct sends it: doubles.
        ob["deadline_seconds"] = json!(60.0);
        ob["max_retries"] = json!(20.0);
        let mut m = json!({
            "messageId": format!("m-{id}"),
            "role": "ROLE_USER",
            "parts": [{"text": "obligation"}],
            "metadata": {EXTENSION_URI: ob},
        });
        if listed {
            m["extensions"] = json!([EXTENSION_URI]);
        }
        m
    };
    let rpc = |method: &str, m: Value| {
        json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": {"message": m}}).to_string()
    };
    let ext = ("a2a-extensions", EXTENSION_URI);
    let v1 = ("a2a-version", "1.0");
    let a = post(
        &base,
        &[AUTH, JSON, v1, ext],
        rpc("SendMessage", msg("j-1", true)),
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(a.body["id"], json!(7));
    let m = &a.body["result"]["message"];
    assert_eq!(m["role"], json!("ROLE_AGENT"));
    assert_eq!(m["metadata"][EXTENSION_URI]["status"], json!("applied"));
    assert_eq!(a.headers["a2a-extensions"], EXTENSION_URI);

    // Header activation alone is enough; 0.3 without A2A-Version and with
    // the X- header answers a bare 0.3 message.
    let xext = ("x-a2a-extensions", EXTENSION_URI);
    let b = post(
        &base,
        &[AUTH, JSON, xext],
        rpc("message/send", msg("j-2", false)),
    )
    .await;
    assert_eq!(b.body["result"]["kind"], json!("message"), "{:?}", b.body);
    assert_eq!(
        b.body["result"]["metadata"][EXTENSION_URI]["status"],
        json!("applied")
    );
    assert_eq!(b.headers["x-a2a-extensions"], EXTENSION_URI);

    // Not activated anywhere: invalid params naming the field, no echo.
    let c = post(
        &base,
        &[AUTH, JSON, v1],
        rpc("SendMessage", msg("j-3", false)),
    )
    .await;
    assert_eq!(c.body["error"]["code"], json!(-32602));
    assert_eq!(
        c.body["error"]["data"]["field"],
        json!("message.extensions")
    );
    assert!(c.headers.get("a2a-extensions").is_none());

    let d = post(
        &base,
        &[AUTH, JSON, ("a2a-version", "9.1"), ext],
        rpc("SendMessage", msg("j-4", true)),
    )
    .await;
    assert_eq!(d.body["error"]["code"], json!(-32009));

    let mut bad = msg("j-5", true);
    bad["metadata"][EXTENSION_URI]["deadline_seconds"] = json!("600");
    let e = post(&base, &[AUTH, JSON, v1], rpc("SendMessage", bad)).await;
    assert_eq!(e.body["error"]["code"], json!(-32602));
    assert_eq!(
        e.body["error"]["data"]["field"],
        json!(format!(
            "message.metadata[\"{EXTENSION_URI}\"].deadline_seconds"
        ))
    );
    let f = post(&base, &[AUTH, JSON, v1], "{nope").await;
    assert_eq!(f.body["error"]["code"], json!(-32700));
    let g = post(&base, &[AUTH, JSON, v1], rpc("GetTask", msg("j-6", true))).await;
    assert_eq!(g.body["error"]["code"], json!(-32601));

    let rest = post(
        &format!("{base}/message:send"),
        &[AUTH, ("content-type", "application/a2a+json"), v1, ext],
        json!({"message": msg("j-7", true)}).to_string(),
    )
    .await;
    assert_eq!(rest.status, 200, "{:?}", rest.body);
    assert_eq!(rest.headers["content-type"], "application/a2a+json");
    assert_eq!(
        rest.body["message"]["metadata"][EXTENSION_URI]["status"],
        json!("applied")
    );
    let rest_bad = post(
        &format!("{base}/message:send"),
        &[
            AUTH,
            ("content-type", "application/a2a+json"),
            ("a2a-version", "3.0"),
        ],
        json!({"message": msg("j-8", true)}).to_string(),
    )
    .await;
    assert_eq!(rest_bad.status, 400);
    assert_eq!(
        rest_bad.body["error"]["status"],
        json!("FAILED_PRECONDITION")
    );

    tokio::time::sleep(Duration::from_millis(100)).await;
    let applied = r.applied.lock().unwrap().clone();
    assert_eq!(applied.len(), 3, "{applied:?}");
    r.node.shutdown().await.unwrap();
}

// C-A2A-3: no credential or a wrong one: 401 on every endpoint and
// nothing accepted; the same obligation, authenticated, is then applied
// for the first time. The card itself is public.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_a2a_3_unauthenticated_gets_401_and_nothing_is_accepted() {
    let r = receiver(vec![alice_peer(None)], 0).await;
    let base = r.server.base_url.clone();
    let body = obligation("ob-u", None).to_string();
    for path in [
        "/abhyasa/obligations",
        "/abhyasa/custody_ack",
        "/",
        "/message:send",
    ] {
        for auth in [None, Some("Bearer wrong"), Some("Basic alice-secret")] {
            let mut h = vec![JSON];
            if let Some(a) = auth {
                h.push(("authorization", a));
            }
            let resp = post(&format!("{base}{path}"), &h, body.clone()).await;
            assert_eq!(resp.status, 401, "{path} {auth:?}");
            assert_eq!(resp.body["error"]["code"], json!("unauthenticated"));
            assert_eq!(resp.headers["www-authenticate"], "Bearer");
        }
    }
    assert_eq!(
        r.server
            .stats
            .unauthenticated
            .load(std::sync::atomic::Ordering::Relaxed),
        12
    );
    let ok = post(&format!("{base}/abhyasa/obligations"), &[AUTH, JSON], body).await;
    assert_eq!(ok.status, 200);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(r.applied.lock().unwrap().get("ob-u"), Some(&1));
    // The card declares the bearer scheme and is served without auth.
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let card = client
        .get(
            format!("{base}/.well-known/agent-card.json")
                .parse()
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(card.status(), 200);
    let card: Value =
        serde_json::from_slice(&card.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(
        card["securityRequirements"][0]["schemes"]["abhyasa_bearer"],
        json!({"list": []})
    );
    let params = &card["capabilities"]["extensions"][0]["params"];
    assert_eq!(
        params["custody_ack_endpoint"],
        json!(format!("{base}/abhyasa/custody_ack"))
    );
    assert_eq!(
        params["supported_kinds"][0]["obligation_endpoint"],
        json!(format!("{base}/abhyasa/obligations"))
    );
    r.node.shutdown().await.unwrap();
}

// Strict v1 bodies: each bad input answered with a JSON error naming the
// field; oversize bodies refused by the size limit (C-T-2 over HTTP).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_bodies_and_size_limit() {
    let r = receiver(vec![alice_peer(None)], 0).await;
    let url = format!("{}/abhyasa/obligations", r.server.base_url);
    let cases: Vec<(String, u16, &str)> = vec![
        ("{not json".into(), 400, "(body)"),
        ("[1]".into(), 400, "(document)"),
        (
            {
                let mut o = obligation("x", None);
                o["deadline_seconds"] = json!("600");
                o.to_string()
            },
            400,
            "deadline_seconds",
        ),
        (
            {
                let mut o = obligation("x", None);
                o.as_object_mut().unwrap().remove("obligation_id");
                o.to_string()
            },
            400,
            "obligation_id",
        ),
        (
            {
                let mut o = obligation("x", None);
                o["payload"]["pad"] = json!("x".repeat(9000));
                o.to_string()
            },
            413,
            "(body)",
        ),
    ];
    for (body, status, field) in cases {
        let resp = post(&url, &[AUTH, JSON], body).await;
        assert_eq!(resp.status, status, "{:?}", resp.body);
        assert_eq!(resp.body["error"]["field"], json!(field), "{:?}", resp.body);
    }
    let ct = post(&url, &[AUTH, ("content-type", "text/plain")], "{}").await;
    assert_eq!(ct.status, 415);
    let ack_url = format!("{}/abhyasa/custody_ack", r.server.base_url);
    let bad_ack = post(
        &ack_url,
        &[AUTH, JSON],
        json!({"obligation_id": "a", "target": "bob", "status": "done", "acked_at": chrono_now()})
            .to_string(),
    )
    .await;
    assert_eq!(bad_ack.status, 400);
    assert_eq!(bad_ack.body["error"]["field"], json!("status"));
    let good_ack = post(
        &ack_url,
        &[AUTH, JSON],
        json!({"obligation_id": "a", "target": "alice", "status": "applied", "acked_at": chrono_now()})
            .to_string(),
    )
    .await;
    assert_eq!(good_ack.status, 204);
    assert!(r.applied.lock().unwrap().is_empty());
    r.node.shutdown().await.unwrap();
}

fn fast_options(name: &str) -> NodeOptions {
    let mut o = NodeOptions::new(agent(name));
    o.custodian.default_profile = CustodyProfile {
        backoff: RetryBackoff {
            base: Duration::from_millis(100),
            cap: Duration::from_millis(400),
            jitter: 0.1,
        },
        ..CustodyProfile::default()
    };
    o
}

// A custodian node reaches a receiver only through the HTTP binding:
// applied synchronously, and deferred-then-final through the receiver's
// POST to the custodian's /abhyasa/custody_ack (C-TR-1 over HTTP).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custodian_node_over_http_applied_and_deferred_then_final() {
    let (a_port, b_port) = (loopback_port(), loopback_port());
    let a_url = format!("http://127.0.0.1:{a_port}");
    let b_url = format!("http://127.0.0.1:{b_port}");
    let bob = receiver(
        vec![HttpPeer {
            agent: agent("alice"),
            token: Some("alice-secret".into()),
            fingerprint: None,
            custody_ack_endpoint: Some(format!("{a_url}/abhyasa/custody_ack")),
            obligation_endpoint: None,
            outbound_token: Some("bob-secret".into()),
        }],
        b_port,
    )
    .await;
    let mut cfg = HttpConfig::loopback(
        "alice",
        vec![HttpPeer {
            agent: agent("bob"),
            token: Some("bob-secret".into()),
            fingerprint: None,
            custody_ack_endpoint: None,
            obligation_endpoint: Some(format!("{b_url}/abhyasa/obligations")),
            outbound_token: Some("alice-secret".into()),
        }],
        profiles(),
    );
    cfg.listen = SocketAddr::from(([127, 0, 0, 1], a_port));
    let (t, _a_server) = abhyasa_a2a::start(agent("alice"), cfg).await.unwrap();
    let alice = Node::open(fast_options("alice"), Box::new(SimStore::new()), t)
        .await
        .unwrap();
    let ob = |id: &str, demo: Option<&str>| {
        let mut payload = json!({"decision": "revoke", "scope": format!("s-{id}")});
        if let Some(d) = demo {
            payload["demo"] = json!(d);
        }
        Obligation::builder()
            .id(id)
            .kind("anumati.consent")
            .target("bob")
            .payload(payload)
            .deadline_seconds(20)
            .max_retries(abhyasa_core::min_retries_to_span(20, 0.1, 0.4) as i64 + 2)
            .created_at(alice.now())
            .build()
            .unwrap()
    };
    let first = ob("h-1", None);
    alice.offer(first.clone()).await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), alice.outcome(first.id()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.state, TerminalState::Applied);

    let deferred = ob("h-2", Some("defer"));
    alice.offer(deferred.clone()).await.unwrap();
    assert!(eventually(|| bob.stash.lock().unwrap().contains_key(deferred.id())).await);
    let d = bob.stash.lock().unwrap().remove(deferred.id()).unwrap();
    bob.node
        .complete_deferred(agent("alice"), deferred.id().clone(), d)
        .await
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), alice.outcome(deferred.id()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.state, TerminalState::Applied);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let applied = bob.applied.lock().unwrap().clone();
    assert!(applied.values().all(|n| *n == 1), "{applied:?}");
    assert_eq!(applied.len(), 2);
    alice.shutdown().await.unwrap();
    bob.node.shutdown().await.unwrap();
}

// C-T-6 over the live server: arbitrary bytes to every endpoint get a JSON
// error (never a 5xx, never a dropped connection) and the node keeps
// serving; nothing is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_t_6_arbitrary_bodies_get_json_errors() {
    use proptest::strategy::{Strategy, ValueTree};
    let r = receiver(vec![alice_peer(None)], 0).await;
    let base = r.server.base_url.clone();
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let bytes = proptest::collection::vec(proptest::num::u8::ANY, 0..600);
    let v1 = ("a2a-version", "1.0");
    for _ in 0..48 {
        let body = bytes.new_tree(&mut runner).unwrap().current();
        for path in [
            "/",
            "/message:send",
            "/abhyasa/obligations",
            "/abhyasa/custody_ack",
        ] {
            let resp = post(&format!("{base}{path}"), &[AUTH, JSON, v1], body.clone()).await;
            assert!(
                matches!(resp.status, 200 | 400 | 413),
                "{path}: {} {:?}",
                resp.status,
                resp.body
            );
            assert!(
                resp.body.get("error").is_some(),
                "{path}: not a JSON error: {:?}",
                resp.body
            );
        }
    }
    let ok = post(
        &format!("{base}/abhyasa/obligations"),
        &[AUTH, JSON],
        obligation("after-fuzz", None).to_string(),
    )
    .await;
    assert_eq!(ok.status, 200);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let applied = r.applied.lock().unwrap().clone();
    assert_eq!(applied.len(), 1, "{applied:?}");
    r.node.shutdown().await.unwrap();
}

/// A lossy HTTP hop in front of `target`: per request, seeded, it drops the
/// request (502, nothing forwarded), forwards it twice (duplicate), or
/// forwards it and drops the answer (502: the ack is lost after apply).
async fn lossy_hop(
    target: String,
    seed: u64,
    p_drop: u64,
    p_dup: u64,
    p_ack_loss: u64,
) -> (String, Arc<std::sync::atomic::AtomicU64>) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let faults = Arc::new(AtomicU64::new(0));
    let f = faults.clone();
    use axum::http::{HeaderMap, Uri};
    let rng = Arc::new(Mutex::new(seed | 1));
    let draw = move || {
        // xorshift64*: deterministic per request order; percent in 0..100.
        let mut s = rng.lock().unwrap();
        *s ^= *s >> 12;
        *s ^= *s << 25;
        *s ^= *s >> 27;
        (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) % 100
    };
    let app = axum::Router::new().fallback(move |uri: Uri, h: HeaderMap, body: Bytes| {
        let target = target.clone();
        let draw = draw.clone();
        let f = f.clone();
        async move {
            let bad = axum::http::StatusCode::BAD_GATEWAY;
            let (d, dup, loss) = (draw(), draw(), draw());
            if d < p_drop {
                f.fetch_add(1, Ordering::Relaxed);
                return (bad, Bytes::new());
            }
            let url = format!("{target}{}", uri.path());
            let hdrs: Vec<(String, String)> = h
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_string()))
                .collect();
            let hv: Vec<(&str, &str)> =
                hdrs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            if dup < p_dup {
                f.fetch_add(1, Ordering::Relaxed);
                let _ = post(&url, &hv, body.clone()).await;
            }
            let r = post(&url, &hv, body).await;
            if loss < p_ack_loss {
                f.fetch_add(1, Ordering::Relaxed);
                return (bad, Bytes::new());
            }
            let status = axum::http::StatusCode::from_u16(r.status).unwrap();
            let out = if r.body.is_null() {
                Bytes::new()
            } else {
                Bytes::from(r.body.to_string())
            };
            (status, out)
        }
    });
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (url, faults)
}

// C-TR-1 over the HTTP binding: a custodian node reaches its receiver only
// through a lossy hop (drops, duplicates, lost acks). Every obligation ends
// applied or escalated, none is applied twice, and most get through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_tr_1_http_lossy_hop_delivers_or_reports() {
    let a_port = loopback_port();
    let a_url = format!("http://127.0.0.1:{a_port}");
    let bob = receiver(
        vec![HttpPeer {
            agent: agent("alice"),
            token: Some("alice-secret".into()),
            fingerprint: None,
            custody_ack_endpoint: Some(format!("{a_url}/abhyasa/custody_ack")),
            obligation_endpoint: None,
            outbound_token: Some("bob-secret".into()),
        }],
        0,
    )
    .await;
    let (hop, faults) = lossy_hop(bob.server.base_url.clone(), 11, 30, 20, 30).await;
    let mut cfg = HttpConfig::loopback(
        "alice",
        vec![HttpPeer {
            agent: agent("bob"),
            token: Some("bob-secret".into()),
            fingerprint: None,
            custody_ack_endpoint: None,
            obligation_endpoint: Some(format!("{hop}/abhyasa/obligations")),
            outbound_token: Some("alice-secret".into()),
        }],
        profiles(),
    );
    cfg.listen = SocketAddr::from(([127, 0, 0, 1], a_port));
    let (t, _a_server) = abhyasa_a2a::start(agent("alice"), cfg).await.unwrap();
    let alice = Node::open(fast_options("alice"), Box::new(SimStore::new()), t)
        .await
        .unwrap();
    let mut ids = Vec::new();
    for i in 0..40 {
        let ob = Obligation::builder()
            .id(format!("lossy-{i}"))
            .kind("anumati.consent")
            .target("bob")
            .payload(json!({"decision": "revoke", "scope": format!("s-{i}")}))
            .deadline_seconds(15)
            .max_retries(abhyasa_core::min_retries_to_span(15, 0.1, 0.4) as i64 + 2)
            .created_at(alice.now())
            .build()
            .unwrap();
        alice.offer(ob.clone()).await.unwrap();
        ids.push(ob.id().clone());
    }
    let mut states = HashMap::new();
    for id in &ids {
        let out = tokio::time::timeout(Duration::from_secs(25), alice.outcome(id))
            .await
            .unwrap()
            .unwrap();
        *states.entry(out.state).or_insert(0) += 1;
    }
    assert!(
        states
            .keys()
            .all(|s| matches!(s, TerminalState::Applied | TerminalState::Escalated)),
        "{states:?}"
    );
    assert!(
        states.get(&TerminalState::Applied).copied().unwrap_or(0) >= 36,
        "{states:?}"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let applied = bob.applied.lock().unwrap().clone();
    assert!(
        applied.values().all(|n| *n == 1),
        "applied twice: {applied:?}"
    );
    let faults = faults.load(std::sync::atomic::Ordering::Relaxed);
    assert!(faults >= 20, "the hop injected only {faults} faults");
    assert_eq!(alice.inbox().await.unwrap().pending, 0);
    alice.shutdown().await.unwrap();
    bob.node.shutdown().await.unwrap();
}

// C-ND-5: requests in flight are bounded before anything is read: while a
// slow client holds the only slot, the next request gets 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inflight_requests_are_bounded() {
    use tokio::io::AsyncWriteExt;
    let mut cfg = HttpConfig::loopback("bob", vec![alice_peer(None)], profiles());
    cfg.max_inflight = 1;
    let (t, server) = abhyasa_a2a::start(agent("bob"), cfg).await.unwrap();
    let node = Node::open(NodeOptions::new(agent("bob")), Box::new(SimStore::new()), t)
        .await
        .unwrap();
    let mut slow = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    slow.write_all(
        b"POST /abhyasa/obligations HTTP/1.1\r\nhost: x\r\nauthorization: Bearer alice-secret\r\n\
          content-type: application/json\r\ncontent-length: 100\r\n\r\n{\"obl",
    )
    .await
    .unwrap();
    let url = format!("{}/abhyasa/obligations", server.base_url);
    let mut refused = false;
    for _ in 0..100 {
        let r = post(&url, &[AUTH, JSON], obligation("x", None).to_string()).await;
        if r.status == 503 {
            assert_eq!(r.body["error"]["code"], json!("overloaded"));
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        refused,
        "a second request was served while the slot was held"
    );
    drop(slow);
    let mut served = false;
    for _ in 0..100 {
        if post(&url, &[AUTH, JSON], obligation("y", None).to_string())
            .await
            .status
            == 200
        {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(served, "the slot was not released");
    node.shutdown().await.unwrap();
}

// AB-3 and target binding over HTTP: the same id with a different digest
// is never a duplicate, and an obligation for another agent is refused;
// neither applies anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflict_and_wrong_target_are_refused() {
    let r = receiver(vec![alice_peer(None)], 0).await;
    let url = format!("{}/abhyasa/obligations", r.server.base_url);
    let first = obligation("c-1", None);
    assert_eq!(
        post(&url, &[AUTH, JSON], first.to_string()).await.status,
        200
    );
    let mut other = first.clone();
    other["payload"]["scope"] = json!("another-scope");
    let c = post(&url, &[AUTH, JSON], other.to_string()).await;
    assert_ne!(
        c.body["status"],
        json!("applied"),
        "{} {:?}",
        c.status,
        c.body
    );
    let mut carol = obligation("c-2", None);
    carol["target"] = json!("carol");
    let w = post(&url, &[AUTH, JSON], carol.to_string()).await;
    assert_ne!(w.status, 200, "{:?}", w.body);
    assert!(w.body.get("error").is_some(), "{} {:?}", w.status, w.body);
    println!(
        "conflict: {} {}; wrong target: {} {}",
        c.status, c.body, w.status, w.body
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let applied = r.applied.lock().unwrap().clone();
    assert_eq!(applied.len(), 1, "{applied:?}");
    r.node.shutdown().await.unwrap();
}
