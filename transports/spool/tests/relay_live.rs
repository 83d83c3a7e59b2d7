//! The relay beyond one QUIC listener and a fixed peer set, in process on
//! loopback, every node durable on redb:
//!
//! * a relay listening on QUIC **and** WebSocket, the custodian on QUIC
//!   and the edge dialling out over WebSocket (C-TR-3 over WS: held while
//!   the edge is away, applied exactly once, never acked by the relay);
//! * edges enrolled and unenrolled while the relay runs (no restart), with
//!   an unknown key still refused;
//! * a custodian with two relays, each edge behind its own.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use abhyasa::{Node, NodeEvent};
use abhyasa_core::custody::TerminalState;
use abhyasa_core::wire::RefusalCode;
use abhyasa_core::{Obligation, ObligationId};
use abhyasa_identity::{generate_identity, Identity};
use abhyasa_quic::QuicConfig;
use abhyasa_spool::{relayed_via, RelayConfig, RelayHandle, RelayedConfig, SpoolLimits};
use abhyasa_transport::{Backoff, LinkConfig, Transport};
use abhyasa_ws::WsConfig;
use common::{agent, options, store, until};
use serde_json::json;

fn id(name: &str) -> Identity {
    generate_identity(&agent(name)).unwrap()
}

/// Redials every 50..200 ms, so a peer enrolled late connects at once.
fn fast_link() -> LinkConfig {
    LinkConfig {
        backoff: Backoff {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(200),
        },
        ..LinkConfig::default()
    }
}

/// A revocation for `target`, with retries enough to span its deadline.
fn revoke(node: &Node, target: &str, ob: &str, deadline: i64) -> Obligation {
    Obligation::builder()
        .id(ob)
        .kind("anumati.consent")
        .target(target)
        .payload(json!({"decision": "revoke", "scope": ob}))
        .deadline_seconds(deadline)
        .max_retries(abhyasa_core::min_retries_to_span(deadline as u64, 0.1, 0.4) as i64 + 2)
        .created_at(node.now())
        .build()
        .unwrap()
}

/// A relay `name` pinning `peers`, on QUIC and/or WebSocket.
async fn relay(
    dir: &Path,
    name: &str,
    ident: &Identity,
    peers: &[(&str, &Identity)],
    quic: bool,
    ws: bool,
) -> RelayHandle {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut q = QuicConfig::new(agent(name), ident.clone(), any);
    let mut w = WsConfig::new(agent(name), ident.clone(), Some(any));
    for (p, i) in peers {
        q = q.with_peer(i.pin(agent(p)), None);
        w = w.with_peer(i.pin(agent(p)), None);
    }
    abhyasa_spool::start(RelayConfig {
        quic: quic.then_some(q),
        ws: ws.then_some(w),
        spool_path: dir.join(format!("{name}.redb")),
        limits: SpoolLimits::default(),
        status_path: None,
    })
    .await
    .unwrap()
}

/// How a node dials one relay.
enum Dial {
    Quic(SocketAddr),
    Ws(SocketAddr),
}

/// A named agent and its identity.
type Named<'a> = (&'a str, &'a Identity);

/// One relay a node uses: its name and identity, how to dial it, and the
/// peers reached through it.
type Via<'a> = (&'a str, &'a Identity, Dial, Vec<Named<'a>>);

/// A node `me` that reaches each relay's peers only through that relay.
async fn node(dir: &Path, me: Named<'_>, relays: Vec<Via<'_>>) -> Node {
    let mut q = QuicConfig::new(agent(me.0), me.1.clone(), "127.0.0.1:0".parse().unwrap());
    q.link = fast_link();
    let mut w = WsConfig::new(agent(me.0), me.1.clone(), None);
    w.link = fast_link();
    let (mut any_q, mut any_w) = (false, false);
    let mut configs = Vec::new();
    for (name, ident, dial, peers) in relays {
        match dial {
            Dial::Quic(a) => {
                q = q.with_peer(ident.pin(agent(name)), Some(a));
                any_q = true;
            }
            Dial::Ws(a) => {
                w = w.with_peer(ident.pin(agent(name)), Some(format!("ws://{a}/")));
                any_w = true;
            }
        }
        let pins = peers.iter().map(|(p, i)| i.pin(agent(p))).collect();
        configs.push(RelayedConfig::new(agent(name), pins, me.1.clone()));
    }
    let mut parts: Vec<Transport> = Vec::new();
    if any_q {
        parts.push(abhyasa_quic::start(q).await.unwrap());
    }
    if any_w {
        parts.push(abhyasa_ws::start(w).await.unwrap());
    }
    let t = if parts.len() == 1 {
        parts.pop().unwrap()
    } else {
        abhyasa_transport::routed::compose(parts, 4096).unwrap()
    };
    let (t, _stats) = relayed_via(t, configs);
    Node::open(options(me.0), store(dir, &format!("{}.redb", me.0)), t)
        .await
        .unwrap()
}

async fn outcome(node: &Node, ob: &ObligationId, secs: u64) -> TerminalState {
    tokio::time::timeout(Duration::from_secs(secs), node.outcome(ob))
        .await
        .unwrap_or_else(|_| panic!("no outcome for {ob} in {secs} s"))
        .unwrap()
        .state
}

// C-TR-3 + C-TR-1 over WebSocket: the relay listens on QUIC and
// WebSocket; alice spools over QUIC while the edge is away, the edge dials
// out over WebSocket and gets each obligation applied exactly once; the
// relay's receipts discharged nothing in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_tr_3_relay_over_websocket_holds_and_forwards_once() {
    let dir = tempfile::tempdir().unwrap();
    let (alice_id, edge_id, relay_id) = (id("alice"), id("edge"), id("relay-1"));
    let peers = [("alice", &alice_id), ("edge", &edge_id)];
    let relay = relay(dir.path(), "relay-1", &relay_id, &peers, true, true).await;
    let (qa, wa) = (relay.quic_addr().unwrap(), relay.ws_addr().unwrap());
    assert_ne!(qa, wa, "two listeners");

    let alice = node(
        dir.path(),
        ("alice", &alice_id),
        vec![(
            "relay-1",
            &relay_id,
            Dial::Quic(qa),
            vec![("edge", &edge_id)],
        )],
    )
    .await;
    until("alice to reach the relay", 10, || {
        alice.is_connected(&agent("edge"))
    })
    .await;
    let mut obs = Vec::new();
    for i in 0..3 {
        let ob = revoke(&alice, "edge", &format!("ws-{i}"), 30);
        alice.offer(ob.clone()).await.unwrap();
        obs.push(ob.id().clone());
    }
    let depth = |r: &RelayHandle| {
        r.status()
            .destinations
            .iter()
            .find(|d| d.destination.as_str() == "edge")
            .map_or(0, |d| d.depth)
    };
    until("three frames spooled", 10, || depth(&relay) >= 3).await;
    // Let custody retry against the receipts: none of them discharges.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let st = alice.durable_state().await.unwrap();
    assert_eq!(st.custodian.pending.len(), 3, "the relay acked nothing");

    let edge = node(
        dir.path(),
        ("edge", &edge_id),
        vec![(
            "relay-1",
            &relay_id,
            Dial::Ws(wa),
            vec![("alice", &alice_id)],
        )],
    )
    .await;
    for ob in &obs {
        assert_eq!(
            outcome(&alice, ob, 20).await,
            TerminalState::Applied,
            "{ob}"
        );
    }
    assert_eq!(
        edge.metrics().await.unwrap().receiver_applied,
        3,
        "each applied exactly once"
    );
    until("the spool to drain", 10, || relay.status().frames == 0).await;
    alice.shutdown().await.unwrap();
    edge.shutdown().await.unwrap();
    relay.shutdown().await;
}

// Enrolment without a restart: a relay started with alice and edge-1
// enrols edge-2 while running; edge-2 connects and gets its obligation
// once. A never-enrolled key (edge-3, and an impostor under edge-2's
// name) is refused. Unenrolled, edge-2 is disconnected and frames for it
// are refused `unknown_destination` (custody keeps them); enrolled again,
// it gets them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_enrols_and_unenrols_edges_while_running() {
    let dir = tempfile::tempdir().unwrap();
    let (alice_id, e1, e2, e3, relay_id) = (
        id("alice"),
        id("edge-1"),
        id("edge-2"),
        id("edge-3"),
        id("relay-1"),
    );
    let impostor = id("edge-2");
    let relay = relay(
        dir.path(),
        "relay-1",
        &relay_id,
        &[("alice", &alice_id), ("edge-1", &e1)],
        true,
        false,
    )
    .await;
    let qa = relay.quic_addr().unwrap();
    let alice = node(
        dir.path(),
        ("alice", &alice_id),
        vec![(
            "relay-1",
            &relay_id,
            Dial::Quic(qa),
            vec![("edge-1", &e1), ("edge-2", &e2)],
        )],
    )
    .await;
    until("alice to reach the relay", 10, || {
        relay.is_connected(&agent("alice"))
    })
    .await;
    let mut events = alice.subscribe();

    // Not enrolled yet: edge-3 (unknown key) and edge-2 both stay out.
    let edge3 = node(
        dir.path(),
        ("edge-3", &e3),
        vec![(
            "relay-1",
            &relay_id,
            Dial::Quic(qa),
            vec![("alice", &alice_id)],
        )],
    )
    .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!relay.is_connected(&agent("edge-3")), "unknown key refused");

    // Enrol edge-2 while running; it connects and receives.
    assert!(relay.enrol(&e2.pin(agent("edge-2"))).await.unwrap());
    assert!(
        !relay.enrol(&e2.pin(agent("edge-2"))).await.unwrap(),
        "enrolling again is a no-op"
    );
    assert!(
        relay.enrol(&impostor.pin(agent("edge-2"))).await.is_err(),
        "another key under an enrolled name is refused"
    );
    assert!(relay.peers().contains(&agent("edge-2")));
    let edge2 = node(
        dir.path(),
        ("edge-2", &e2),
        vec![(
            "relay-1",
            &relay_id,
            Dial::Quic(qa),
            vec![("alice", &alice_id)],
        )],
    )
    .await;
    until("edge-2 to connect", 10, || {
        relay.is_connected(&agent("edge-2"))
    })
    .await;
    let first = revoke(&alice, "edge-2", "enrolled-1", 30);
    alice.offer(first.clone()).await.unwrap();
    assert_eq!(
        outcome(&alice, first.id(), 20).await,
        TerminalState::Applied
    );
    assert!(!relay.is_connected(&agent("edge-3")), "still refused");

    // An impostor under edge-2's name, with another key, is refused too.
    let fake_dir = tempfile::tempdir().unwrap();
    let fake = node(
        fake_dir.path(),
        ("edge-2", &impostor),
        vec![(
            "relay-1",
            &relay_id,
            Dial::Quic(qa),
            vec![("alice", &alice_id)],
        )],
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !fake.is_connected(&agent("relay-1")),
        "a key that was never enrolled is refused"
    );
    fake.shutdown().await.unwrap();

    // Unenrol: its connection closes and stays closed (its redials are
    // refused); a new obligation for it is refused by the relay and kept
    // under custody.
    assert!(relay.unenrol(&agent("edge-2")).await.unwrap());
    until("edge-2's connection to close", 10, || {
        !relay.is_connected(&agent("edge-2"))
    })
    .await;
    let second = revoke(&alice, "edge-2", "enrolled-2", 30);
    alice.offer(second.clone()).await.unwrap();
    let code = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match events.recv().await.unwrap() {
                NodeEvent::RelayRefused {
                    obligation_id: Some(o),
                    code,
                    ..
                } if &o == second.id() => break code,
                _ => {}
            }
        }
    })
    .await
    .expect("the relay refuses frames for an unenrolled edge");
    assert_eq!(code, RefusalCode::UnknownDestination);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!relay.is_connected(&agent("edge-2")), "no reconnect");
    let st = alice.durable_state().await.unwrap();
    assert!(
        st.custodian.pending.contains_key(second.id()),
        "custody kept the refused obligation"
    );

    // Enrolled again: it reconnects and gets the obligation, once.
    assert!(relay.enrol(&e2.pin(agent("edge-2"))).await.unwrap());
    assert_eq!(
        outcome(&alice, second.id(), 20).await,
        TerminalState::Applied
    );
    assert_eq!(edge2.metrics().await.unwrap().receiver_applied, 2);
    assert!(!relay.is_connected(&agent("edge-3")));

    for n in [alice, edge2, edge3] {
        n.shutdown().await.unwrap();
    }
    relay.shutdown().await;
}

// Two relays for one node: alice reaches edge-a through relay-1 and
// edge-b through relay-2 with one relayed link; each edge gets its own
// obligation exactly once, and neither relay carries the other's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_each_edge_behind_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let (alice_id, ea, eb, r1, r2) = (
        id("alice"),
        id("edge-a"),
        id("edge-b"),
        id("relay-1"),
        id("relay-2"),
    );
    let relay1 = relay(
        dir.path(),
        "relay-1",
        &r1,
        &[("alice", &alice_id), ("edge-a", &ea)],
        true,
        false,
    )
    .await;
    let relay2 = relay(
        dir.path(),
        "relay-2",
        &r2,
        &[("alice", &alice_id), ("edge-b", &eb)],
        false,
        true,
    )
    .await;
    let alice = node(
        dir.path(),
        ("alice", &alice_id),
        vec![
            (
                "relay-1",
                &r1,
                Dial::Quic(relay1.quic_addr().unwrap()),
                vec![("edge-a", &ea)],
            ),
            (
                "relay-2",
                &r2,
                Dial::Ws(relay2.ws_addr().unwrap()),
                vec![("edge-b", &eb)],
            ),
        ],
    )
    .await;
    let edge_a = node(
        dir.path(),
        ("edge-a", &ea),
        vec![(
            "relay-1",
            &r1,
            Dial::Quic(relay1.quic_addr().unwrap()),
            vec![("alice", &alice_id)],
        )],
    )
    .await;
    let edge_b = node(
        dir.path(),
        ("edge-b", &eb),
        vec![(
            "relay-2",
            &r2,
            Dial::Ws(relay2.ws_addr().unwrap()),
            vec![("alice", &alice_id)],
        )],
    )
    .await;
    until("both edges up at alice", 10, || {
        alice.is_connected(&agent("edge-a")) && alice.is_connected(&agent("edge-b"))
    })
    .await;
    let to_a = revoke(&alice, "edge-a", "to-a", 30);
    let to_b = revoke(&alice, "edge-b", "to-b", 30);
    alice.offer(to_a.clone()).await.unwrap();
    alice.offer(to_b.clone()).await.unwrap();
    assert_eq!(outcome(&alice, to_a.id(), 20).await, TerminalState::Applied);
    assert_eq!(outcome(&alice, to_b.id(), 20).await, TerminalState::Applied);
    assert_eq!(edge_a.metrics().await.unwrap().receiver_applied, 1);
    assert_eq!(edge_b.metrics().await.unwrap().receiver_applied, 1);
    // Each relay only ever held frames for its own edge (and alice).
    for (r, other) in [(&relay1, "edge-b"), (&relay2, "edge-a")] {
        assert!(
            r.status()
                .destinations
                .iter()
                .all(|d| d.destination.as_str() != other),
            "a relay carried another relay's edge"
        );
    }
    for n in [alice, edge_a, edge_b] {
        n.shutdown().await.unwrap();
    }
    relay1.shutdown().await;
    relay2.shutdown().await;
}
