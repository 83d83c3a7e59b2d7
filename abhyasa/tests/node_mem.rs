//! Custody scenarios through the node runtime over the in-memory transport
//! (C-TR-1, C-TR-2), durable on the simulated store.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use abhyasa::{Node, NodeEvent, NodeOptions};
use abhyasa_core::custody::{CustodyProfile, ReceiverEvent, Record, TerminalState};
use abhyasa_core::store::{
    Compacted, DurableState, EventId, SimStore, Store, StoreError, StoredEvent,
};
use abhyasa_core::wire::{Envelope, Message};
use abhyasa_core::{
    AckStatus, AgentId, Backoff, CustodyAck, EscalationCause, GuardOutcome, Obligation, OfferError,
    Timestamp,
};
use abhyasa_transport::mem::{Faults, MemNetwork};
use abhyasa_transport::LinkConfig;
use serde_json::json;

/// A SimStore that outlives the node using it, for restarts.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<SimStore>>);

impl Store for Shared {
    fn backend(&self) -> &'static str {
        "sim"
    }
    fn format_version(&self) -> u32 {
        self.0.lock().unwrap().format_version()
    }
    fn commit(
        &mut self,
        now: Timestamp,
        batches: &[&[Record]],
    ) -> Result<abhyasa_core::store::Committed, StoreError> {
        self.0.lock().unwrap().commit(now, batches)
    }
    fn load(&self) -> Result<DurableState, StoreError> {
        self.0.lock().unwrap().load()
    }
    fn events(&self, from: EventId, limit: usize) -> Result<Vec<StoredEvent>, StoreError> {
        self.0.lock().unwrap().events(from, limit)
    }
    fn compact(&mut self, now: Timestamp, retention: Duration) -> Result<Compacted, StoreError> {
        self.0.lock().unwrap().compact(now, retention)
    }
}

fn agent(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

fn options(name: &str) -> NodeOptions {
    let mut o = NodeOptions::new(agent(name));
    o.custodian.default_profile = CustodyProfile {
        backoff: Backoff {
            base: Duration::from_millis(50),
            cap: Duration::from_millis(200),
            jitter: 0.1,
        },
        ..CustodyProfile::default()
    };
    o.receiver.skew_margin = Duration::from_millis(100);
    o
}

async fn node(net: &MemNetwork, name: &str, store: Box<dyn Store>) -> Node {
    node_with(net, options(name), store).await
}

async fn node_with(net: &MemNetwork, o: NodeOptions, store: Box<dyn Store>) -> Node {
    let t = net
        .join(o.custodian.agent.clone(), LinkConfig::default())
        .await
        .unwrap();
    Node::open(o, store, t).await.unwrap()
}

fn revoke(node: &Node, id: &str, scope: &str, deadline: i64) -> Obligation {
    Obligation::builder()
        .id(id)
        .kind("anumati.consent")
        .target("bob")
        .payload(json!({"decision": "revoke", "scope": scope}))
        .deadline_seconds(deadline)
        // AB-2 sizing rule for the fast test backoff (50 ms doubling to 200 ms).
        .max_retries(abhyasa_core::min_retries_to_span(deadline as u64, 0.05, 0.2) as i64 + 2)
        .created_at(node.now())
        .build()
        .unwrap()
}

/// Counts receiver-side applications per obligation id from the events.
fn count_applications(
    mut rx: tokio::sync::broadcast::Receiver<NodeEvent>,
) -> Arc<Mutex<HashMap<String, u32>>> {
    let counts = Arc::new(Mutex::new(HashMap::new()));
    let c = counts.clone();
    tokio::spawn(async move {
        while let Ok(e) = rx.recv().await {
            if let NodeEvent::Receiver(ReceiverEvent::Applied { obligation_id, .. }) = e {
                *c.lock()
                    .unwrap()
                    .entry(obligation_id.to_string())
                    .or_insert(0) += 1;
            }
        }
    });
    counts
}

/// Waits (bounded) until `cond` holds; the event counters are fed by a
/// subscriber task, so they lag the outcome a little.
async fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..500 {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cond()
}

// C-TR-1 (in-memory): clean link, applied on the first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_tr_1_mem_clean_link_applies() {
    let net = MemNetwork::new(1);
    let alice = node(&net, "alice", Box::new(SimStore::new())).await;
    let bob = node(&net, "bob", Box::new(SimStore::new())).await;
    let applied = count_applications(bob.subscribe());
    let ob = revoke(&alice, "ob-1", "email.read", 30);
    alice.offer(ob.clone()).await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), alice.outcome(ob.id()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.state, TerminalState::Applied);
    assert_eq!(out.attempts, Some(1));
    assert!(eventually(|| applied.lock().unwrap().get("ob-1") == Some(&1)).await);
    let inbox = alice.inbox().await.unwrap();
    assert_eq!(inbox.pending, 0);
    let m = alice.metrics().await.unwrap();
    assert_eq!(m.applied, 1);
    assert!(m.commits >= 1);
    alice.shutdown().await.unwrap();
    bob.shutdown().await.unwrap();
}

// C-TR-1 (in-memory): loss, duplication and reordering both ways; every
// obligation ends applied or escalated, none applied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_tr_1_mem_lossy_link_delivers_or_reports() {
    let net = MemNetwork::new(7);
    let (a, b) = (agent("alice"), agent("bob"));
    net.set_faults_between(
        &a,
        &b,
        Faults {
            loss: 0.4,
            duplicate: 0.2,
            reorder: 0.2,
        },
    );
    let alice = node(&net, "alice", Box::new(SimStore::new())).await;
    let bob = node(&net, "bob", Box::new(SimStore::new())).await;
    let applied = count_applications(bob.subscribe());
    let mut ids = Vec::new();
    for i in 0..150 {
        let ob = revoke(&alice, &format!("ob-{i}"), &format!("scope-{i}"), 4);
        alice.offer(ob.clone()).await.unwrap();
        ids.push(ob.id().clone());
    }
    let mut states = HashMap::new();
    for id in &ids {
        let out = tokio::time::timeout(Duration::from_secs(20), alice.outcome(id))
            .await
            .unwrap()
            .unwrap();
        *states.entry(out.state).or_insert(0) += 1;
    }
    assert_eq!(states.values().sum::<i32>(), 150);
    assert!(
        states
            .keys()
            .all(|s| matches!(s, TerminalState::Applied | TerminalState::Escalated)),
        "{states:?}"
    );
    assert!(
        states.get(&TerminalState::Applied).copied().unwrap_or(0) > 100,
        "{states:?}"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        applied.lock().unwrap().values().all(|n| *n == 1),
        "applied at most once"
    );
    assert_eq!(alice.inbox().await.unwrap().pending, 0);
    alice.shutdown().await.unwrap();
    bob.shutdown().await.unwrap();
}

// C-TR-1 (in-memory): total partition escalates at the deadline with the
// fail-safe applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_tr_1_mem_partition_escalates() {
    let net = MemNetwork::new(3);
    let alice = node(&net, "alice", Box::new(SimStore::new())).await;
    let bob = node(&net, "bob", Box::new(SimStore::new())).await;
    net.partition(&agent("alice"), &agent("bob"));
    let ob = revoke(&alice, "ob-1", "s", 1);
    alice.offer(ob.clone()).await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), alice.outcome(ob.id()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.state, TerminalState::Escalated);
    let esc = out.escalation.unwrap();
    assert_eq!(esc.cause, EscalationCause::Unreachable);
    assert_eq!(
        esc.guard,
        GuardOutcome::AlreadyInEffect,
        "withheld at offer"
    );
    assert!(esc.escalated_at >= ob.deadline_at());
    assert_eq!(alice.inbox().await.unwrap().escalated, 1);
    assert_eq!(
        alice
            .durable_state()
            .await
            .unwrap()
            .custodian
            .escalations
            .len(),
        1
    );
    alice.shutdown().await.unwrap();
    bob.shutdown().await.unwrap();
}

// C-TR-2 (node): acks forged by another authenticated peer never discharge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_tr_2_forged_acks_from_another_peer_are_ignored() {
    let net = MemNetwork::new(5);
    let alice = node(&net, "alice", Box::new(SimStore::new())).await;
    let bob = node(&net, "bob", Box::new(SimStore::new())).await;
    let mallory = net
        .join(agent("mallory"), LinkConfig::default())
        .await
        .unwrap();
    net.partition(&agent("alice"), &agent("bob"));
    let ob = revoke(&alice, "ob-1", "s", 2);
    alice.offer(ob.clone()).await.unwrap();
    // Mallory forges bob's applied ack, with the right digest.
    let forged = CustodyAck::new(
        ob.id().clone(),
        agent("bob"),
        AckStatus::Applied,
        alice.now(),
        Some(ob.digest()),
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    mallory
        .handle
        .send(
            &agent("alice"),
            &Envelope::new(agent("mallory"), Message::Acks(vec![forged])),
        )
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), alice.outcome(ob.id()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        out.state,
        TerminalState::Escalated,
        "the forged ack did not discharge custody"
    );
    assert!(alice.metrics().await.unwrap().acks_ignored >= 1);
    alice.shutdown().await.unwrap();
    bob.shutdown().await.unwrap();
}

// Admission control: beyond the bound, a clear backpressure error and
// nothing half-accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backpressure_refuses_whole() {
    let net = MemNetwork::new(9);
    let mut o = options("alice");
    o.custodian.max_pending = 2;
    let alice = node_with(&net, o, Box::new(SimStore::new())).await;
    net.partition(&agent("alice"), &agent("bob"));
    alice.offer(revoke(&alice, "a", "a", 30)).await.unwrap();
    alice.offer(revoke(&alice, "b", "b", 30)).await.unwrap();
    let err = alice.offer(revoke(&alice, "c", "c", 30)).await.unwrap_err();
    assert!(
        matches!(
            err,
            abhyasa::NodeError::Offer(OfferError::Backpressure {
                pending: 2,
                limit: 2
            })
        ),
        "{err}"
    );
    assert!(alice
        .status(&abhyasa_core::ObligationId::new("c").unwrap())
        .await
        .unwrap()
        .custodian
        .is_none());
    alice.shutdown().await.unwrap();
}

// A restarted custodian resumes its pending set from the store and
// finishes it when the link heals (C-AB2-3 through the node).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_resumes_pending_and_discharges_after_heal() {
    let net = MemNetwork::new(11);
    let store = Shared::default();
    let alice = node(&net, "alice", Box::new(store.clone())).await;
    let bob = node(&net, "bob", Box::new(SimStore::new())).await;
    net.partition(&agent("alice"), &agent("bob"));
    let ob = revoke(&alice, "ob-1", "s", 20);
    alice.offer(ob.clone()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    alice.shutdown().await.unwrap();
    drop(alice);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(store.load().unwrap().custodian.pending.len(), 1);
    net.heal(&agent("alice"), &agent("bob"));
    let alice = node(&net, "alice", Box::new(store.clone())).await;
    let out = tokio::time::timeout(Duration::from_secs(15), alice.outcome(ob.id()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.state, TerminalState::Applied);
    let st = store.load().unwrap();
    assert!(st.custodian.pending.is_empty());
    assert_eq!(st.custodian.terminal[ob.id()].state, TerminalState::Applied);
    alice.shutdown().await.unwrap();
    bob.shutdown().await.unwrap();
}
