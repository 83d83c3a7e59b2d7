//! Lag-safe subscription (issue 11 §6, C-ND-5): a subscriber that stops
//! reading while ten times its channel's capacity of events pass still
//! sees every durable event exactly once, in order, refilled from the
//! store's event log; `subscribe_from` replays the log from a position.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use abhyasa::{Node, NodeEvent, NodeOptions, Subscription};
use abhyasa_core::custody::{CustodyProfile, TerminalState};
use abhyasa_core::store::{EventId, SimStore, StoredEvent};
use abhyasa_core::{AgentId, Obligation, RetryBackoff};
use abhyasa_transport::mem::MemNetwork;
use abhyasa_transport::LinkConfig;
use serde_json::json;

const CAPACITY: usize = 64;

fn agent(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

fn options(name: &str) -> NodeOptions {
    let mut o = NodeOptions::new(agent(name));
    o.custodian.default_profile = CustodyProfile {
        backoff: RetryBackoff {
            base: Duration::from_millis(200),
            cap: Duration::from_millis(800),
            jitter: 0.0,
        },
        ..CustodyProfile::default()
    };
    o.event_capacity = CAPACITY;
    o
}

fn revoke(node: &Node, id: &str) -> Obligation {
    Obligation::builder()
        .id(id)
        .kind("anumati.consent")
        .target("bob")
        .payload(json!({"decision": "revoke", "scope": format!("scope.{id}")}))
        .deadline_seconds(60)
        .max_retries(abhyasa_core::min_retries_to_span(60, 0.2, 0.8) as i64 + 1)
        .created_at(node.now())
        .build()
        .unwrap()
}

async fn pair() -> (MemNetwork, Node, Node) {
    let net = MemNetwork::new(9);
    let ta = net
        .join(agent("alice"), LinkConfig::default())
        .await
        .unwrap();
    let tb = net.join(agent("bob"), LinkConfig::default()).await.unwrap();
    let alice = Node::open(options("alice"), Box::new(SimStore::new()), ta)
        .await
        .unwrap();
    let bob = Node::open(options("bob"), Box::new(SimStore::new()), tb)
        .await
        .unwrap();
    (net, alice, bob)
}

/// Reads durable events from `sub` until `n` arrived (bounded).
async fn durable(sub: &mut Subscription, n: usize) -> Vec<StoredEvent> {
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), async {
        while out.len() < n {
            if let NodeEvent::Logged(e) = sub.recv().await.unwrap() {
                out.push(e);
            }
        }
    })
    .await
    .expect("every durable event is delivered");
    out
}

// C-ND-5 / issue 11 §6: the subscriber stops reading while more than ten
// times its channel capacity of durable events pass; when it resumes it
// sees each of them exactly once, in order, equal to the store's log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_nd_5_a_lagging_subscriber_misses_no_durable_event() {
    let (_net, alice, bob) = pair().await;
    let mut sub = alice.subscribe();
    let start = sub.resume_from();
    let mut ids = Vec::new();
    for i in 0..400 {
        let ob = revoke(&alice, &format!("ob-{i:03}"));
        ids.push(ob.id().clone());
        alice.offer(ob).await.unwrap();
    }
    for id in &ids {
        let o = tokio::time::timeout(Duration::from_secs(20), alice.outcome(id))
            .await
            .expect("an outcome")
            .unwrap();
        assert_eq!(o.state, TerminalState::Applied);
    }
    let log = alice.events(start, 1_000_000).await.unwrap();
    assert!(
        log.len() > 10 * CAPACITY,
        "only {} durable events passed; the lag is not shown",
        log.len()
    );
    let got = durable(&mut sub, log.len()).await;
    assert!(sub.refills() > 0, "the subscriber never lagged");
    assert_eq!(got.len(), log.len());
    for (g, l) in got.iter().zip(&log) {
        assert_eq!(g, l, "delivered out of order, twice or altered");
    }
    assert_eq!(sub.resume_from(), EventId(log.last().unwrap().id.0 + 1));

    // And what follows arrives live, still without a gap or a repeat.
    let ob = revoke(&alice, "ob-after");
    alice.offer(ob.clone()).await.unwrap();
    alice.outcome(ob.id()).await.unwrap();
    let more = alice.events(sub.resume_from(), 1000).await.unwrap();
    assert!(!more.is_empty());
    let got = durable(&mut sub, more.len()).await;
    assert_eq!(got, more);
    bob.shutdown().await.unwrap();
    alice.shutdown().await.unwrap();
}

// C-ND-5 / issue 11 §6: `subscribe_from` replays the retained log from a
// saved position, then continues live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_nd_5_subscribe_from_replays_the_log() {
    let (_net, alice, bob) = pair().await;
    let ob = revoke(&alice, "ob-1");
    alice.offer(ob.clone()).await.unwrap();
    alice.outcome(ob.id()).await.unwrap();
    let log = alice.events(EventId(0), 1000).await.unwrap();
    assert!(log.len() >= 2, "{log:?}");
    let mut sub = alice.subscribe_from(EventId(1));
    let got = durable(&mut sub, log.len() - 1).await;
    assert_eq!(got, log[1..].to_vec());
    bob.shutdown().await.unwrap();
    alice.shutdown().await.unwrap();
}
