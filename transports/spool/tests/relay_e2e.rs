//! Store-and-forward end to end, in process, over loopback QUIC: a custodian
//! node, the relay daemon and an edge node that dials out, each durable on
//! redb.
//!
//! C-TR-3: the relay holds frames across the edge's absence, forwards them
//! when the edge connects, drops one at its deadline (never delivered
//! late), collapses the custodian's retries to one copy, and never acks
//! (nothing is discharged while the edge is away). C-TR-1: the custody
//! scenarios (applied once each; escalation with the fail-safe) over the
//! relayed link. C-TR-5: a hostile relay that tampers, replays under
//! another key and fabricates acks gets nothing applied or discharged.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use abhyasa_core::custody::TerminalState;
use abhyasa_core::wire::{DedupKey, Envelope, Message, RelayMessage, Sealed};
use abhyasa_core::{AckStatus, CustodyAck, EscalationCause, Obligation};
use abhyasa_quic::QuicConfig;
use abhyasa_spool::SpoolLimits;
use abhyasa_transport::Incoming;
use common::{agent, ids, relay, relayed_node, revoke, until, Ids};
use serde_json::json;

// C-TR-3 + C-TR-1 over the relayed transport.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_tr_3_relay_holds_forwards_drops_dedups_and_never_acks() {
    let dir = tempfile::tempdir().unwrap();
    let ids = ids();
    let relay = relay(&ids, dir.path(), SpoolLimits::default()).await;
    let addr = relay.local_addr().unwrap();
    let (alice, alice_stats) = relayed_node(
        dir.path(),
        ("alice", &ids.alice),
        ("edge", &ids.edge),
        (&ids.relay, addr),
    )
    .await;
    until("alice to reach the relay", 10, || {
        alice.is_connected(&agent("edge"))
    })
    .await;

    // The edge is away. Three obligations that outlast its absence, one
    // that does not.
    let mut long = Vec::new();
    for i in 0..3 {
        let ob = revoke(&alice, &format!("ob-{i}"), 30);
        alice.offer(ob.clone()).await.unwrap();
        long.push(ob.id().clone());
    }
    let short = revoke(&alice, "short", 4);
    alice.offer(short.clone()).await.unwrap();

    let edge_q = |r: &abhyasa_spool::RelayHandle| {
        r.status()
            .destinations
            .iter()
            .find(|d| d.destination.as_str() == "edge")
            .map_or(0, |d| d.depth)
    };
    until("four frames spooled", 10, || edge_q(&relay) >= 4).await;
    // Retries keep coming (backoff 100..400 ms) and collapse to one copy.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // Four obligation frames, and at most one status query: alice asks
    // what became of what it holds for the edge when its driver sees the
    // edge "up" (the relay is reachable), which on a loaded machine can
    // come after the offers. Every status query to one destination shares
    // one key, so that is one frame however often it is asked.
    let held = edge_q(&relay);
    assert!(
        (4..=5).contains(&held),
        "retries collapse to one copy each, held {held}"
    );
    assert!(
        alice_stats.sealed_sent.load(Ordering::Relaxed) > 4,
        "custody retried"
    );
    assert!(
        alice_stats.accepted.load(Ordering::Relaxed) > 4,
        "every retry receipted"
    );
    // Receipts are not acks: nothing is discharged while the edge is away.
    let st = alice.durable_state().await.unwrap();
    // (The short one may already have escalated on a loaded machine.)
    assert!(st.custodian.pending.len() >= 3, "the relay acked nothing");

    // The short one escalates at its deadline at the custodian and is
    // dropped by the relay, never delivered late.
    let out = tokio::time::timeout(Duration::from_secs(10), alice.outcome(short.id()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.state, TerminalState::Escalated);
    assert_eq!(out.escalation.unwrap().cause, EscalationCause::Unreachable);
    let expired = |r: &abhyasa_spool::RelayHandle| {
        r.status()
            .destinations
            .iter()
            .find(|d| d.destination.as_str() == "edge")
            .map_or(0, |d| d.expired)
    };
    until("the short frame to expire at the relay", 20, || {
        expired(&relay) == 1
    })
    .await;
    assert_eq!(edge_q(&relay), held - 1, "only the short frame expired");

    // The edge dials out to the relay and gets everything still held.
    let (edge, edge_stats) = relayed_node(
        dir.path(),
        ("edge", &ids.edge),
        ("alice", &ids.alice),
        (&ids.relay, addr),
    )
    .await;
    for id in &long {
        let out = tokio::time::timeout(Duration::from_secs(20), alice.outcome(id))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(out.state, TerminalState::Applied, "{id}");
    }
    let m = edge.metrics().await.unwrap();
    assert_eq!(
        m.receiver_applied, 3,
        "each applied exactly once; the expired one never"
    );
    assert_eq!(edge_stats.rejected.load(Ordering::Relaxed), 0);
    // Delivered and the acks passing back empty the spool.
    until("the spool to drain", 10, || relay.status().frames == 0).await;

    alice.shutdown().await.unwrap();
    edge.shutdown().await.unwrap();
    relay.shutdown().await;
}

/// A relay that tampers with what it forwards, re-labels frames under
/// another origin and fabricates acks.
async fn hostile_relay(ids: &Ids) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let t = abhyasa_quic::start(
        QuicConfig::new(
            agent("relay-1"),
            ids.relay.clone(),
            "127.0.0.1:0".parse().unwrap(),
        )
        .with_peer(ids.alice.pin(agent("alice")), None)
        .with_peer(ids.edge.pin(agent("edge")), None),
    )
    .await
    .unwrap();
    let addr = t.handle.local_addr().unwrap();
    let relay_key = ids.relay.clone();
    let handle = t.handle.clone();
    let mut incoming = t.incoming;
    let task = tokio::spawn(async move {
        let me = agent("relay-1");
        let send = |to: &str, s: Sealed| {
            let _ = handle.send(
                &agent(to),
                &Envelope::new(
                    me.clone(),
                    Message::Relay(RelayMessage::Sealed(Box::new(s))),
                ),
            );
        };
        while let Some(i) = incoming.recv().await {
            let Incoming::Frame { envelope, .. } = i else {
                continue;
            };
            let Message::Relay(RelayMessage::Sealed(s)) = envelope.message else {
                continue;
            };
            let Ok(inner) = Envelope::decode(&s.inner) else {
                continue;
            };
            let Message::Obligation(ob) = inner.message else {
                continue;
            };
            // 1. Tampered inner: another scope, re-encoded, old signature.
            let other = Obligation::builder()
                .id(ob.id().as_str())
                .kind("anumati.consent")
                .target("edge")
                .payload(json!({"decision": "revoke", "scope": "tampered"}))
                .deadline_seconds(ob.deadline_seconds() as i64)
                .max_retries(i64::from(ob.max_retries()))
                .created_at(ob.created_at())
                .build()
                .unwrap();
            let mut t = (*s).clone();
            t.inner = Envelope::new(agent("alice"), Message::Obligation(other)).encode();
            send("edge", t);
            // 2. Replay under another key: signed by the relay as "alice".
            let mut r = (*s).clone();
            r.origin_cert = relay_key.cert_der.to_vec();
            r.signature = relay_key.sign(&r.signing_input()).unwrap();
            send("edge", r);
            // 3. A fabricated `applied` ack "from the edge" to alice.
            let ack = CustodyAck::new(
                ob.id().clone(),
                agent("edge"),
                AckStatus::Applied,
                ob.created_at(),
                Some(ob.digest()),
            );
            let fake = Envelope::new(agent("edge"), Message::Acks(vec![ack]));
            let bytes = fake.encode();
            let mut f = Sealed {
                origin: agent("edge"),
                destination: agent("alice"),
                expires_at: ob.deadline_at(),
                dedup_key: DedupKey::for_message(&fake.message, &bytes),
                inner: bytes,
                origin_cert: relay_key.cert_der.to_vec(),
                signature: Vec::new(),
            };
            f.signature = relay_key.sign(&f.signing_input()).unwrap();
            send("alice", f);
            // 4. A plain (unsealed) ack in the edge's name: the hop is the
            // relay, so the transport refuses it as a foreign sender.
        }
    });
    (addr, task)
}

// C-TR-5: nothing a hostile relay does applies or discharges anything; the
// obligation escalates at its deadline with the fail-safe applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_tr_5_hostile_relay_applies_and_discharges_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ids = ids();
    let (addr, task) = hostile_relay(&ids).await;
    let (alice, alice_stats) = relayed_node(
        dir.path(),
        ("alice", &ids.alice),
        ("edge", &ids.edge),
        (&ids.relay, addr),
    )
    .await;
    let (edge, edge_stats) = relayed_node(
        dir.path(),
        ("edge", &ids.edge),
        ("alice", &ids.alice),
        (&ids.relay, addr),
    )
    .await;
    until("both to reach the relay", 10, || {
        alice.is_connected(&agent("edge")) && edge.is_connected(&agent("alice"))
    })
    .await;
    let ob = revoke(&alice, "ob-hostile", 3);
    alice.offer(ob.clone()).await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(15), alice.outcome(ob.id()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        out.state,
        TerminalState::Escalated,
        "a fabricated ack discharged custody"
    );
    let m = edge.metrics().await.unwrap();
    assert_eq!(
        m.receiver_applied, 0,
        "a tampered or replayed frame was applied"
    );
    assert!(edge_stats.rejected.load(Ordering::Relaxed) >= 2);
    assert!(alice_stats.rejected.load(Ordering::Relaxed) >= 1);
    assert_eq!(edge_stats.opened.load(Ordering::Relaxed), 0);
    assert_eq!(alice_stats.opened.load(Ordering::Relaxed), 0);
    alice.shutdown().await.unwrap();
    edge.shutdown().await.unwrap();
    task.abort();
}
