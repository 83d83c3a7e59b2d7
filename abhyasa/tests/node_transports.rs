//! The custody scenarios through the node over the real transports (C-TR-1):
//! QUIC (mutual TLS, pinned keys) and WebSocket (signed hello), both durable
//! on redb. The in-memory transport runs the same scenarios in node_mem.rs.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use abhyasa::{Node, NodeOptions};
use abhyasa_core::custody::{CustodyProfile, TerminalState};
use abhyasa_core::{AgentId, EscalationCause, Obligation, RetryBackoff};
use abhyasa_identity::{generate_identity, Identity};
use abhyasa_quic::QuicConfig;
use abhyasa_store::{StoreKind, StoreOptions};
use abhyasa_transport::Transport;
use abhyasa_ws::WsConfig;
use serde_json::json;

fn agent(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

fn options(name: &str) -> NodeOptions {
    let mut o = NodeOptions::new(agent(name));
    o.custodian.default_profile = CustodyProfile {
        backoff: RetryBackoff {
            base: Duration::from_millis(50),
            cap: Duration::from_millis(200),
            jitter: 0.1,
        },
        ..CustodyProfile::default()
    };
    o.receiver.skew_margin = Duration::from_millis(100);
    o
}

fn revoke(node: &Node, id: &str, deadline: i64) -> Obligation {
    Obligation::builder()
        .id(id)
        .kind("anumati.consent")
        .target("bob")
        .payload(json!({"decision": "revoke", "scope": id}))
        .deadline_seconds(deadline)
        .max_retries(abhyasa_core::min_retries_to_span(deadline as u64, 0.05, 0.2) as i64 + 2)
        .created_at(node.now())
        .build()
        .unwrap()
}

#[derive(Clone, Copy)]
enum Kind {
    Quic,
    Ws,
}

async fn start(
    kind: Kind,
    me: &str,
    id: &Identity,
    peer: &str,
    peer_id: &Identity,
    dial: Option<std::net::SocketAddr>,
) -> Transport {
    match kind {
        Kind::Quic => abhyasa_quic::start(
            QuicConfig::new(agent(me), id.clone(), "127.0.0.1:0".parse().unwrap())
                .with_peer(peer_id.pin(agent(peer)), dial),
        )
        .await
        .unwrap(),
        Kind::Ws => abhyasa_ws::start(
            WsConfig::new(agent(me), id.clone(), Some("127.0.0.1:0".parse().unwrap()))
                .with_peer(peer_id.pin(agent(peer)), dial.map(|a| format!("ws://{a}"))),
        )
        .await
        .unwrap(),
    }
}

/// Clean link: applied once each; then the receiver goes away and an
/// obligation escalates at its deadline with the fail-safe applied.
async fn scenarios(kind: Kind) {
    let dir = tempfile::tempdir().unwrap();
    let (a_id, b_id) = (
        generate_identity(&agent("alice")).unwrap(),
        generate_identity(&agent("bob")).unwrap(),
    );
    let open = |n: &str| {
        StoreKind::Redb
            .open(dir.path().join(n), &StoreOptions::default())
            .unwrap()
    };
    let bob_t = start(kind, "bob", &b_id, "alice", &a_id, None).await;
    let bob_addr = bob_t.handle.local_addr().unwrap();
    let bob = Node::open(options("bob"), open("bob.redb"), bob_t)
        .await
        .unwrap();
    let alice_t = start(kind, "alice", &a_id, "bob", &b_id, Some(bob_addr)).await;
    let alice = Node::open(options("alice"), open("alice.redb"), alice_t)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        while !alice.is_connected(&agent("bob")) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();

    let mut ids = Vec::new();
    for i in 0..50 {
        let ob = revoke(&alice, &format!("ob-{i}"), 20);
        alice.offer(ob.clone()).await.unwrap();
        ids.push(ob.id().clone());
    }
    for id in &ids {
        let out = tokio::time::timeout(Duration::from_secs(20), alice.outcome(id))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(out.state, TerminalState::Applied, "{id}");
    }
    let m = bob.metrics().await.unwrap();
    assert_eq!(m.receiver_applied, 50, "each applied exactly once");

    // The receiver goes away: deliver-or-report says escalate, with the
    // fail-safe applied.
    bob.shutdown().await.unwrap();
    drop(bob);
    let ob = revoke(&alice, "ob-lost", 1);
    alice.offer(ob.clone()).await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), alice.outcome(ob.id()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.state, TerminalState::Escalated);
    assert_eq!(out.escalation.unwrap().cause, EscalationCause::Unreachable);
    let st = alice.durable_state().await.unwrap();
    assert_eq!(st.custodian.escalations.len(), 1);
    assert!(st.custodian.pending.is_empty());
    alice.shutdown().await.unwrap();
}

// C-TR-1 over QUIC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_tr_1_quic_custody_scenarios() {
    scenarios(Kind::Quic).await;
}

// C-TR-1 over WebSocket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_tr_1_websocket_custody_scenarios() {
    scenarios(Kind::Ws).await;
}
