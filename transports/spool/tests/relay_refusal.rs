//! Relay refusals reach the embedding app, and custody is kept.
//!
//! A relay whose per-destination quota is one frame refuses what alice
//! seals for the absent edge beyond the first. Each refusal is a
//! `NodeEvent::RelayRefused` naming the obligation, with the typed code
//! and the relay's retry hint, and counts in `relay_refused`. A receipt is
//! hop acceptance only (spec/protocol.md §7): the refused obligations stay
//! under custody, so one whose deadline passes while refused escalates
//! with its fail-safe, and one that outlasts the edge's absence is applied
//! exactly once after the quota frees. Nothing is dropped. (C-TR-3 quota
//! refusals; C-TR-5 receipts never discharge.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use abhyasa::{Node, NodeEvent, NodeOptions};
use abhyasa_core::custody::{CustodyProfile, TerminalState};
use abhyasa_core::wire::RefusalCode;
use abhyasa_core::{AgentId, EscalationCause, Obligation, ObligationId, RetryBackoff};
use abhyasa_quic::{generate_identity, Identity, QuicConfig};
use abhyasa_spool::{relayed, RelayConfig, RelayedConfig, SpoolLimits};
use abhyasa_store::{StoreKind, StoreOptions};
use serde_json::json;

fn agent(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

fn revoke(node: &Node, id: &str, deadline: i64) -> Obligation {
    Obligation::builder()
        .id(id)
        .kind("anumati.consent")
        .target("edge")
        .payload(json!({"decision": "revoke", "scope": id}))
        .deadline_seconds(deadline)
        .max_retries(abhyasa_core::min_retries_to_span(deadline as u64, 0.1, 0.4) as i64 + 2)
        .created_at(node.now())
        .build()
        .unwrap()
}

async fn node_via_relay(
    dir: &std::path::Path,
    me: (&str, &Identity),
    peer: (&str, &Identity),
    relay: (&Identity, SocketAddr),
) -> Node {
    let t = abhyasa_quic::start(
        QuicConfig::new(agent(me.0), me.1.clone(), "127.0.0.1:0".parse().unwrap())
            .with_peer(relay.0.pin(agent("relay-1")), Some(relay.1)),
    )
    .await
    .unwrap();
    let (t, _) = relayed(
        t,
        RelayedConfig::new(
            agent("relay-1"),
            vec![peer.1.pin(agent(peer.0))],
            me.1.clone(),
        ),
    );
    let mut o = NodeOptions::new(agent(me.0));
    o.custodian.default_profile = CustodyProfile {
        backoff: RetryBackoff {
            base: Duration::from_millis(100),
            cap: Duration::from_millis(400),
            jitter: 0.1,
        },
        ..CustodyProfile::default()
    };
    o.receiver.skew_margin = Duration::from_millis(100);
    let store = StoreKind::Redb
        .open(dir.join(format!("{}.redb", me.0)), &StoreOptions::default())
        .unwrap();
    Node::open(o, store, t).await.unwrap()
}

async fn until(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    tokio::time::timeout(Duration::from_secs(secs), async {
        while !f() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_refusal_is_an_event_and_a_metric_and_custody_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let alice_id = generate_identity(&agent("alice")).unwrap();
    let edge_id = generate_identity(&agent("edge")).unwrap();
    let relay_id = generate_identity(&agent("relay-1")).unwrap();
    let mut limits = SpoolLimits::default();
    limits.per_destination = 1;
    limits.retry_hint = Duration::from_secs(7);
    let relay = abhyasa_spool::start(RelayConfig {
        quic: QuicConfig::new(
            agent("relay-1"),
            relay_id.clone(),
            "127.0.0.1:0".parse().unwrap(),
        )
        .with_peer(alice_id.pin(agent("alice")), None)
        .with_peer(edge_id.pin(agent("edge")), None),
        spool_path: dir.path().join("spool.redb"),
        limits,
        status_path: None,
    })
    .await
    .unwrap();
    let addr = relay.local_addr().unwrap();
    let alice = node_via_relay(
        dir.path(),
        ("alice", &alice_id),
        ("edge", &edge_id),
        (&relay_id, addr),
    )
    .await;
    let mut events = alice.subscribe();
    let refused: std::sync::Arc<std::sync::Mutex<Vec<NodeEvent>>> = Default::default();
    let sink = refused.clone();
    let listener = tokio::spawn(async move {
        while let Ok(e) = events.recv().await {
            if matches!(e, NodeEvent::RelayRefused { .. }) {
                sink.lock().unwrap().push(e);
            }
        }
    });
    until("alice to reach the relay", 10, || {
        alice.is_connected(&agent("edge"))
    })
    .await;

    // The edge is away. `first` takes the one slot of its queue.
    let first = revoke(&alice, "first", 30);
    alice.offer(first.clone()).await.unwrap();
    let depth = |r: &abhyasa_spool::RelayHandle| {
        r.status()
            .destinations
            .iter()
            .find(|d| d.destination.as_str() == "edge")
            .map_or(0, |d| d.depth)
    };
    until("the first frame spooled", 10, || depth(&relay) == 1).await;
    // `short` cannot outlast the refusals; `later` can.
    let short = revoke(&alice, "short", 3);
    let later = revoke(&alice, "later", 30);
    alice.offer(short.clone()).await.unwrap();
    alice.offer(later.clone()).await.unwrap();

    let named = |id: &ObligationId| {
        refused.lock().unwrap().iter().any(|e| {
            matches!(e, NodeEvent::RelayRefused {
                relay,
                destination: Some(d),
                obligation_id: Some(o),
                code: RefusalCode::DestinationQuota,
                retry_after_seconds: 7,
            } if relay.as_str() == "relay-1" && d.as_str() == "edge" && o == id)
        })
    };
    until("refusals of both naming the obligation", 10, || {
        named(short.id()) && named(later.id())
    })
    .await;
    assert!(!named(first.id()), "the accepted frame was never refused");
    let m = alice.metrics().await.unwrap();
    assert!(
        m.relay_refused >= 2,
        "refusals counted: {}",
        m.relay_refused
    );

    // A refusal is not an outcome: the refused obligations are still under
    // custody, and the one whose deadline passes escalates with its
    // fail-safe (never dropped).
    let st = alice.durable_state().await.unwrap();
    assert!(
        st.custodian.pending.contains_key(later.id()),
        "custody kept"
    );
    let out = tokio::time::timeout(Duration::from_secs(10), alice.outcome(short.id()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.state, TerminalState::Escalated);
    assert_eq!(out.escalation.unwrap().cause, EscalationCause::Unreachable);

    // The edge dials out: it takes `first`, the quota frees, and alice's
    // next retry of `later` is spooled and delivered.
    let edge = node_via_relay(
        dir.path(),
        ("edge", &edge_id),
        ("alice", &alice_id),
        (&relay_id, addr),
    )
    .await;
    for ob in [&first, &later] {
        let out = tokio::time::timeout(Duration::from_secs(20), alice.outcome(ob.id()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(out.state, TerminalState::Applied, "{}", ob.id());
    }
    let m = edge.metrics().await.unwrap();
    assert_eq!(m.receiver_applied, 2, "each applied exactly once");
    let inbox: HashSet<String> = alice
        .durable_state()
        .await
        .unwrap()
        .custodian
        .pending
        .keys()
        .map(|k| k.to_string())
        .collect();
    assert!(inbox.is_empty(), "nothing left under custody: {inbox:?}");

    listener.abort();
    alice.shutdown().await.unwrap();
    edge.shutdown().await.unwrap();
    relay.shutdown().await;
}
