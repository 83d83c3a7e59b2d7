//! C-ND-4: a frame that was not queued is never reported sent; oversized
//! coalesced acks are split; backpressure reaches `offer` before a send
//! queue overflows.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use abhyasa::{Node, NodeError, NodeOptions};
use abhyasa_core::custody::{CustodyProfile, Offered, TerminalState};
use abhyasa_core::store::SimStore;
use abhyasa_core::{AgentId, Obligation, RetryBackoff};
use abhyasa_transport::link::Registry;
use abhyasa_transport::mem::MemNetwork;
use abhyasa_transport::{LinkConfig, SendError};
use serde_json::json;

fn agent(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

/// A peer that is in the transport's peer table (so `offer` takes it as a
/// target) but never reachable: it joined the network once and left.
async fn gone(net: &MemNetwork, name: &str) {
    let t = net.join(agent(name), LinkConfig::default()).await.unwrap();
    t.handle.shutdown().await;
}

fn options(name: &str, base: Duration) -> NodeOptions {
    let mut o = NodeOptions::new(agent(name));
    o.custodian.default_profile = CustodyProfile {
        backoff: RetryBackoff {
            base,
            cap: base * 4,
            jitter: 0.0,
        },
        ..CustodyProfile::default()
    };
    o
}

fn consent(node: &Node, id: &str, target: &str, decision: &str, base: Duration) -> Obligation {
    let b = base.as_secs_f64();
    Obligation::builder()
        .id(id)
        .kind("anumati.consent")
        .target(target)
        .payload(json!({"decision": decision, "scope": format!("scope.{id}")}))
        .deadline_seconds(60)
        .max_retries(abhyasa_core::min_retries_to_span(60, b, 4.0 * b) as i64 + 1)
        .created_at(node.now())
        .build()
        .unwrap()
}

async fn alone(name: &str, base: Duration) -> (MemNetwork, Node) {
    let net = MemNetwork::new(5);
    let t = net.join(agent(name), LinkConfig::default()).await.unwrap();
    let node = Node::open(options(name, base), Box::new(SimStore::new()), t)
        .await
        .unwrap();
    (net, node)
}

// C-ND-4: a best-effort obligation whose one send is refused is reported
// not sent (typed error, metric, 0 attempts), never `best_effort`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_nd_4_refused_best_effort_send_is_reported() {
    let base = Duration::from_millis(50);
    let (net, alice) = alone("alice", base).await;
    // A grant is best-effort; carol has left the network.
    gone(&net, "carol").await;
    let ob = consent(&alice, "grant-1", "carol", "grant", base);
    let r = alice.offer(ob.clone()).await;
    match r {
        Err(NodeError::NotSent {
            obligation_id,
            reason,
        }) => {
            assert_eq!(&obligation_id, ob.id());
            assert!(
                matches!(
                    reason,
                    SendError::UnknownPeer(_) | SendError::NotConnected(_)
                ),
                "{reason:?}"
            );
        }
        other => panic!("a refused send was answered {other:?}"),
    }
    let out = alice.outcome(ob.id()).await.unwrap();
    assert_eq!(out.state, TerminalState::BestEffort);
    assert_eq!(out.attempts, Some(0), "nothing left this node");
    let m = alice.metrics().await.unwrap();
    assert_eq!(m.best_effort_refused, 1);
    assert_eq!(m.frames_out, 0);
    assert_eq!(m.peers_connected, 0, "carol left: no link is up");
}

// C-ND-4: custody attempts the transport refuses are not counted as sent;
// custody stays open and the schedule retries them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_nd_4_refused_custody_attempts_are_not_counted_sent() {
    let base = Duration::from_millis(20);
    let (net, alice) = alone("alice", base).await;
    gone(&net, "carol").await;
    let ob = consent(&alice, "revoke-1", "carol", "revoke", base);
    assert!(matches!(
        alice.offer(ob.clone()).await.unwrap(),
        Offered::Custody { .. }
    ));
    let mut m = alice.metrics().await.unwrap();
    for _ in 0..200 {
        if m.attempts_refused >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        m = alice.metrics().await.unwrap();
    }
    assert!(m.attempts_refused >= 3, "retried on schedule: {m:?}");
    assert_eq!(m.attempts_sent, 0, "no attempt left this node: {m:?}");
    assert_eq!(m.frames_out, 0);
    let s = alice.status(ob.id()).await.unwrap();
    assert_eq!(s.custodian, Some(abhyasa::CustodianState::Pending));
}

// C-ND-4: acks coalesced past the frame limit are split so every frame
// fits; every obligation is applied on its first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_nd_4_oversized_coalesced_acks_are_split() {
    let base = Duration::from_secs(2);
    let net = MemNetwork::new(6);
    let link = LinkConfig {
        max_frame: 1024,
        ..LinkConfig::default()
    };
    let ta = net.join(agent("alice"), link.clone()).await.unwrap();
    let tb = net.join(agent("bob"), link).await.unwrap();
    let alice = Node::open(options("alice", base), Box::new(SimStore::new()), ta)
        .await
        .unwrap();
    let bob = Node::open(options("bob", base), Box::new(SimStore::new()), tb)
        .await
        .unwrap();
    let obs: Vec<Obligation> = (0..300)
        .map(|i| consent(&alice, &format!("ob-{i:04}"), "bob", "revoke", base))
        .collect();
    let mut tasks = Vec::new();
    for ob in obs.clone() {
        let a = alice.clone();
        tasks.push(tokio::spawn(async move { a.offer(ob).await }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    for ob in &obs {
        let out = tokio::time::timeout(Duration::from_secs(10), alice.outcome(ob.id()))
            .await
            .expect("applied before any retry")
            .unwrap();
        assert_eq!(out.state, TerminalState::Applied);
        assert_eq!(out.attempts, Some(1), "{}: an ack frame was lost", ob.id());
    }
    let m = bob.metrics().await.unwrap();
    assert!(m.frames_split > 0, "no ack frame needed splitting: {m:?}");
    assert_eq!(m.send_too_large, 0, "{m:?}");
    assert_eq!(m.peers_connected, 1, "bob's link to alice is up: {m:?}");
}

// C-ND-4: offers towards a peer whose send queue is near its byte budget
// get `Backpressure` (nothing accepted) before the queue refuses a frame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_nd_4_backpressure_reaches_offer_before_the_queue_overflows() {
    let base = Duration::from_secs(5);
    let config = LinkConfig {
        send_queue_bytes: 64 * 1024,
        ..LinkConfig::default()
    };
    // A connection to bob that nobody writes to the wire.
    let (registry, transport) = Registry::new(agent("alice"), config);
    registry.add_peer(agent("bob"));
    let mut stuck = registry.attach(&agent("bob")).await.unwrap();
    let alice = Node::open(options("alice", base), Box::new(SimStore::new()), transport)
        .await
        .unwrap();
    let mut accepted = 0;
    let refused = loop {
        let ob = consent(&alice, &format!("ob-{accepted:05}"), "bob", "revoke", base);
        match alice.offer(ob.clone()).await {
            Ok(Offered::Custody { .. }) => accepted += 1,
            Err(NodeError::Backpressure {
                queued_bytes,
                limit,
                ..
            }) => {
                assert!(queued_bytes <= limit && limit <= 64 * 1024);
                break ob;
            }
            other => panic!("offer {accepted}: {other:?}"),
        }
        assert!(accepted < 10_000, "no backpressure");
    };
    assert!(accepted > 10, "only {accepted} offers fit");
    let m = alice.metrics().await.unwrap();
    assert_eq!(m.send_queue_full, 0, "the queue overflowed first: {m:?}");
    assert_eq!(m.frames_unsent, 0, "{m:?}");
    assert_eq!(m.opened, accepted, "nothing half-accepted");
    let s = alice.status(refused.id()).await;
    assert!(
        matches!(&s, Ok(v) if v.custodian.is_none()),
        "the refused offer left state behind: {s:?}"
    );
    // Once the queue drains, the same offer is taken.
    while let Ok(f) = stuck.outbound.try_recv() {
        drop(f);
    }
    assert!(matches!(
        alice.offer(refused).await.unwrap(),
        Offered::Custody { .. }
    ));
    stuck.guard.close().await;
}

// A best-effort obligation whose one send went out ends `best_effort`
// after one attempt, and its outcome says so in full whenever it is asked
// (the node answers it from the terminal summary, not a copy of the
// event: issue 14).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sent_best_effort_outcome_is_one_attempt() {
    let base = Duration::from_millis(50);
    let (net, alice) = alone("alice", base).await;
    // Bob is reachable (his end of the link stays up); no node behind it.
    let _bob = net.join(agent("bob"), LinkConfig::default()).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !alice.is_connected(&agent("bob")) {
        assert!(std::time::Instant::now() < deadline, "no link to bob");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ob = consent(&alice, "grant-2", "bob", "grant", base);
    assert_eq!(alice.offer(ob.clone()).await.unwrap(), Offered::BestEffort);
    for _ in 0..2 {
        let out = alice.outcome(ob.id()).await.unwrap();
        assert_eq!(out.obligation_id, *ob.id());
        assert_eq!(out.state, TerminalState::BestEffort);
        assert_eq!(out.attempts, Some(1));
        assert_eq!((out.reason, out.escalation), (None, None));
    }
    let m = alice.metrics().await.unwrap();
    assert_eq!((m.best_effort_refused, m.frames_out), (0, 1));
}
