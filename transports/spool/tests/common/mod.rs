//! What the spool's end-to-end tests share: three identities (alice the
//! custodian, the edge, relay-1), the relay daemon on loopback QUIC, nodes
//! that reach their peer only through it, durable on redb, and waiting.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // each test uses a subset

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use abhyasa::{Node, NodeOptions};
use abhyasa_core::custody::CustodyProfile;
use abhyasa_core::{AgentId, Obligation, RetryBackoff};
use abhyasa_identity::{generate_identity, Identity};
use abhyasa_quic::QuicConfig;
use abhyasa_spool::{relayed, RelayConfig, RelayHandle, RelayedConfig, RelayedStats, SpoolLimits};
use abhyasa_store::{StoreKind, StoreOptions};
use serde_json::json;

pub(crate) fn agent(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

pub(crate) struct Ids {
    pub(crate) alice: Identity,
    pub(crate) edge: Identity,
    pub(crate) relay: Identity,
}

pub(crate) fn ids() -> Ids {
    Ids {
        alice: generate_identity(&agent("alice")).unwrap(),
        edge: generate_identity(&agent("edge")).unwrap(),
        relay: generate_identity(&agent("relay-1")).unwrap(),
    }
}

/// Fast retries (100 ms, capped at 400 ms) and a small skew margin.
pub(crate) fn options(name: &str) -> NodeOptions {
    let mut o = NodeOptions::new(agent(name));
    o.custodian.default_profile = CustodyProfile {
        backoff: RetryBackoff {
            base: Duration::from_millis(100),
            cap: Duration::from_millis(400),
            jitter: 0.1,
        },
        ..CustodyProfile::default()
    };
    o.receiver.skew_margin = Duration::from_millis(100);
    o
}

/// A revocation for the edge, with retries enough to span its deadline.
pub(crate) fn revoke(node: &Node, id: &str, deadline: i64) -> Obligation {
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

pub(crate) fn store(dir: &Path, name: &str) -> Box<dyn abhyasa_core::store::Store> {
    StoreKind::Redb
        .open(dir.join(name), &StoreOptions::default())
        .unwrap()
}

/// The relay daemon, pinning alice and the edge, with `limits`.
pub(crate) async fn relay(ids: &Ids, dir: &Path, limits: SpoolLimits) -> RelayHandle {
    let quic = QuicConfig::new(
        agent("relay-1"),
        ids.relay.clone(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .with_peer(ids.alice.pin(agent("alice")), None)
    .with_peer(ids.edge.pin(agent("edge")), None);
    abhyasa_spool::start(RelayConfig {
        quic: Some(quic),
        ws: None,
        spool_path: dir.join("spool.redb"),
        limits,
        status_path: None,
    })
    .await
    .unwrap()
}

/// A node `me` that reaches `peer` only through the relay at `relay_addr`.
pub(crate) async fn relayed_node(
    dir: &Path,
    me: (&str, &Identity),
    peer: (&str, &Identity),
    relay: (&Identity, SocketAddr),
) -> (Node, Arc<RelayedStats>) {
    let t = abhyasa_quic::start(
        QuicConfig::new(agent(me.0), me.1.clone(), "127.0.0.1:0".parse().unwrap())
            .with_peer(relay.0.pin(agent("relay-1")), Some(relay.1)),
    )
    .await
    .unwrap();
    let (t, stats) = relayed(
        t,
        RelayedConfig::new(
            agent("relay-1"),
            vec![peer.1.pin(agent(peer.0))],
            me.1.clone(),
        ),
    );
    let node = Node::open(options(me.0), store(dir, &format!("{}.redb", me.0)), t)
        .await
        .unwrap();
    (node, stats)
}

/// Polls `f` every 20 ms; panics after `secs`.
pub(crate) async fn until(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    tokio::time::timeout(Duration::from_secs(secs), async {
        while !f() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
}
