//! Leases through the node (issue 13, C-TR-4): `Node::authorized` reads
//! the authority at the moment of asking, so a partitioned agent stops
//! at lease expiry though no revocation arrives.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use abhyasa::{Node, NodeOptions};
use abhyasa_core::custody::lease::Authority;
use abhyasa_core::store::SimStore;
use abhyasa_core::{AgentId, Obligation};
use abhyasa_transport::mem::MemNetwork;
use abhyasa_transport::LinkConfig;
use serde_json::json;

const KEY: &str = "anumati.consent/bob/scope:email.read";

async fn node(net: &MemNetwork, name: &str) -> Node {
    let mut o = NodeOptions::new(AgentId::new(name).unwrap());
    o.receiver.skew_margin = Duration::from_millis(100);
    let t = net
        .join(o.custodian.agent.clone(), LinkConfig::default())
        .await
        .unwrap();
    Node::open(o, Box::new(SimStore::new()), t).await.unwrap()
}

// C-TR-4 (node): a leased grant, then a partition: authorized until the
// lease ends, lapsed after, with no revocation ever sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_tr_4_node_partitioned_lease_lapses_at_expiry() {
    let net = MemNetwork::new(21);
    let alice = node(&net, "alice").await;
    let bob = node(&net, "bob").await;
    assert_eq!(bob.authorized(KEY).await.unwrap(), Authority::Unknown);
    let grant = Obligation::builder()
        .id("grant-1")
        .kind("anumati.consent")
        .target("bob")
        .payload(json!({"decision": "grant", "scope": "email.read", "lease_seconds": 2}))
        .deadline_seconds(60)
        .max_retries(0)
        .created_at(alice.now())
        .sequence(1)
        .build()
        .unwrap();
    let lease_until = grant.created_at().saturating_add(Duration::from_secs(2));
    alice.offer(grant).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while !bob.authorized(KEY).await.unwrap().is_authorized() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "grant never applied"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    net.partition(
        &AgentId::new("alice").unwrap(),
        &AgentId::new("bob").unwrap(),
    );
    let leases = bob.leases().await.unwrap();
    assert_eq!(leases.len(), 1);
    assert_eq!(leases[0].key, KEY);
    assert_eq!(leases[0].lease_until, lease_until);
    assert!(leases[0].authorized);
    // Past the lease end (less the skew margin) with nothing renewed.
    let wait = lease_until.saturating_duration_since(bob.now());
    tokio::time::sleep(wait).await;
    assert_eq!(
        bob.authorized(KEY).await.unwrap(),
        Authority::Lapsed { lease_until }
    );
    let leases = bob.leases().await.unwrap();
    assert_eq!(leases[0].state, "lapsed");
    assert!(!leases[0].authorized);
    alice.shutdown().await.unwrap();
    bob.shutdown().await.unwrap();
}
