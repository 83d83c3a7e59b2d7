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

mod common;

use std::collections::HashSet;
use std::time::Duration;

use abhyasa::NodeEvent;
use abhyasa_core::custody::TerminalState;
use abhyasa_core::wire::RefusalCode;
use abhyasa_core::{EscalationCause, ObligationId};
use abhyasa_spool::SpoolLimits;
use common::{agent, ids, relay, relayed_node, revoke, until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_refusal_is_an_event_and_a_metric_and_custody_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let ids = ids();
    let mut limits = SpoolLimits::default();
    limits.per_destination = 1;
    limits.retry_hint = Duration::from_secs(7);
    let relay = relay(&ids, dir.path(), limits).await;
    let addr = relay.local_addr().unwrap();
    let (alice, _) = relayed_node(
        dir.path(),
        ("alice", &ids.alice),
        ("edge", &ids.edge),
        (&ids.relay, addr),
    )
    .await;
    let mut events = alice.subscribe();
    let refused: std::sync::Arc<std::sync::Mutex<Vec<NodeEvent>>> = Default::default();
    let sink = refused.clone();
    let edge_up = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let up = edge_up.clone();
    let listener = tokio::spawn(async move {
        while let Ok(e) = events.recv().await {
            match &e {
                NodeEvent::RelayRefused { .. } => sink.lock().unwrap().push(e),
                NodeEvent::PeerUp(p) if p.as_str() == "edge" => {
                    up.store(true, std::sync::atomic::Ordering::SeqCst)
                }
                _ => {}
            }
        }
    });
    until("alice to reach the relay", 10, || {
        alice.is_connected(&agent("edge"))
    })
    .await;
    // When alice's driver sees the edge "up" (the relay is reachable) it
    // asks the edge what became of what it holds; a question asked after
    // `first` is offered would be sealed too and could take the queue's
    // one slot. Wait for the driver to have seen it (or 2 s: it saw it
    // before we subscribed, when nothing was held, so it asked nothing).
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while !edge_up.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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
    let (edge, _) = relayed_node(
        dir.path(),
        ("edge", &ids.edge),
        ("alice", &ids.alice),
        (&ids.relay, addr),
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
