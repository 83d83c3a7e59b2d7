//! Custody scenarios through the node runtime over the in-memory transport
//! (C-TR-1, C-TR-2), durable on the simulated store.
#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use abhyasa::{CustodianState, Node, NodeOptions};
use abhyasa_core::custody::{CustodyProfile, LedgerOutcome, Record, TerminalState};
use abhyasa_core::store::{
    Compacted, DurableState, EventId, LogEvent, SimStore, Store, StoreError, StoredEvent,
};
use abhyasa_core::wire::{Envelope, Message};
use abhyasa_core::{
    AckStatus, AgentId, CustodyAck, EscalationCause, GuardOutcome, Obligation, OfferError,
    RetryBackoff, Timestamp,
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

async fn node(net: &MemNetwork, name: &str, store: Box<dyn Store>) -> Node {
    node_with(net, options(name), store).await
}

async fn node_with(net: &MemNetwork, o: NodeOptions, store: Box<dyn Store>) -> Node {
    let t = net
        .join(o.custodian.agent.clone(), LinkConfig::default())
        .await
        .unwrap();
    Node::builder(o.agent().clone())
        .options(o)
        .boxed_store(store)
        .transport(t)
        .open()
        .await
        .unwrap()
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

/// Receiver-side applications per obligation id, counted from the
/// receiver's durable event log (every committed `Applied` ledger record),
/// after checking that the log and the durable ledger agree and that the
/// receiver released as many applications as it made durable. An applier
/// run twice for one id shows up here as a count of 2 (or as a mismatch
/// with `receiver_applied`); an empty log with applied outcomes fails the
/// caller's equality with the custodian's view.
async fn durable_applications(bob: &Node) -> HashMap<String, u32> {
    let mut counts: HashMap<String, u32> = HashMap::new();
    let mut from = EventId(0);
    loop {
        let page = bob.events(from, 1024).await.unwrap();
        let Some(last) = page.last() else { break };
        from = EventId(last.id.0 + 1);
        for e in &page {
            if let LogEvent::Ledger {
                obligation_id,
                outcome: LedgerOutcome::Applied,
                ..
            } = &e.event
            {
                *counts.entry(obligation_id.to_string()).or_insert(0) += 1;
            }
        }
    }
    let ledger: HashSet<String> = bob
        .durable_state()
        .await
        .unwrap()
        .receiver
        .ledger
        .values()
        .filter(|l| l.outcome == LedgerOutcome::Applied)
        .map(|l| l.obligation_id.to_string())
        .collect();
    let logged: HashSet<String> = counts.keys().cloned().collect();
    assert_eq!(logged, ledger, "event log and durable ledger agree");
    let released = bob.metrics().await.unwrap().receiver_applied;
    assert_eq!(
        released,
        counts.values().map(|n| u64::from(*n)).sum::<u64>(),
        "applications released = applications made durable"
    );
    counts
}

// C-TR-1 (in-memory): clean link, applied on the first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_tr_1_mem_clean_link_applies() {
    let net = MemNetwork::new(1);
    let alice = node(&net, "alice", Box::new(SimStore::new())).await;
    let bob = node(&net, "bob", Box::new(SimStore::new())).await;
    let ob = revoke(&alice, "ob-1", "email.read", 30);
    alice.offer(ob.clone()).await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), alice.outcome(ob.id()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.state, TerminalState::Applied);
    assert_eq!(out.attempts, Some(1));
    let applied = durable_applications(&bob).await;
    assert_eq!(applied, HashMap::from([("ob-1".to_string(), 1)]));
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
    let mut ids = Vec::new();
    for i in 0..150 {
        let ob = revoke(&alice, &format!("ob-{i}"), &format!("scope-{i}"), 4);
        alice.offer(ob.clone()).await.unwrap();
        ids.push(ob.id().clone());
    }
    let mut states = HashMap::new();
    let mut custodian_applied = HashSet::new();
    for id in &ids {
        let out = tokio::time::timeout(Duration::from_secs(20), alice.outcome(id))
            .await
            .unwrap()
            .unwrap();
        *states.entry(out.state).or_insert(0) += 1;
        if out.state == TerminalState::Applied {
            custodian_applied.insert(id.to_string());
        }
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
    // Let frames still in flight to bob land before reading its store.
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Applied at most once, from bob's durable ledger: every id applied
    // exactly once, and every outcome alice reports applied is among them
    // (an ack attests application). An id bob applied whose ack never got
    // back escalated at alice (bounded to over-protection).
    let applied = durable_applications(&bob).await;
    assert!(
        applied.values().all(|n| *n == 1),
        "applied at most once: {applied:?}"
    );
    let durable: HashSet<String> = applied.keys().cloned().collect();
    assert!(
        custodian_applied.is_subset(&durable),
        "applied outcomes without a durable application: {:?}",
        custodian_applied.difference(&durable).collect::<Vec<_>>()
    );
    let late = durable.difference(&custodian_applied).count();
    assert!(
        late <= states.get(&TerminalState::Escalated).copied().unwrap_or(0) as usize,
        "an application alice does not report applied escalated"
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
    // A bare endpoint: `offer` takes only targets in the peer table.
    let _bob = net.join(agent("bob"), LinkConfig::default()).await.unwrap();
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

// C-AB2-3 through the node: a restarted custodian resumes its pending set
// from the store with the absolute deadline and the attempts already made
// (the remaining window, not a fresh one), and finishes it when the link
// heals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_ab2_3_restart_resumes_remaining_window_and_discharges_after_heal() {
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
    let before = store.load().unwrap().custodian.pending;
    assert_eq!(before.len(), 1);
    let attempts_before = before[ob.id()].attempts;
    // 300 ms at a 50 ms base doubling to 200 ms: several attempts made.
    assert!(
        attempts_before >= 2,
        "attempts before the crash: {attempts_before}"
    );
    let alice = node(&net, "alice", Box::new(store.clone())).await;
    // Still partitioned: the restored custody keeps the absolute deadline
    // (created_at + 20 s; a fresh window would end 20 s after the restart)
    // and counts on from the attempts already made.
    let st = alice.status(ob.id()).await.unwrap();
    assert_eq!(st.custodian, Some(CustodianState::Pending));
    assert_eq!(st.deadline_at, Some(ob.deadline_at()), "absolute deadline");
    let resumed = st.attempts.unwrap();
    assert!(resumed >= attempts_before, "{resumed} < {attempts_before}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let later = alice.status(ob.id()).await.unwrap().attempts.unwrap();
    assert!(
        later > resumed,
        "retrying after restart: {later} <= {resumed}"
    );
    net.heal(&agent("alice"), &agent("bob"));
    let out = tokio::time::timeout(Duration::from_secs(15), alice.outcome(ob.id()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.state, TerminalState::Applied);
    assert!(
        out.attempts.unwrap() >= later,
        "the attempt count spans the restart: {:?} < {later}",
        out.attempts
    );
    let st = store.load().unwrap();
    assert!(st.custodian.pending.is_empty());
    assert_eq!(st.custodian.terminal[ob.id()].state, TerminalState::Applied);
    alice.shutdown().await.unwrap();
    bob.shutdown().await.unwrap();
}

// C-ND-5: compaction is one input the node runs on its schedule: the
// custodian's terminal summaries, the receiver's ledger and both stores
// drop the same entries (past deadline + retention), and keep the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_nd_5_scheduled_compaction_drops_the_same_entries_in_memory_and_store() {
    let net = MemNetwork::new(13);
    let policy = abhyasa::CompactionPolicy::new(Duration::from_secs(1), Duration::from_millis(200));
    let mut oa = options("alice");
    oa.compaction = policy;
    let mut ob_ = options("bob");
    ob_.compaction = policy;
    let (sa, sb) = (Shared::default(), Shared::default());
    let alice = node_with(&net, oa, Box::new(sa.clone())).await;
    let bob = node_with(&net, ob_, Box::new(sb.clone())).await;
    let short = revoke(&alice, "short", "s1", 2);
    let long = revoke(&alice, "long", "s2", 60);
    for ob in [&short, &long] {
        alice.offer(ob.clone()).await.unwrap();
        let out = tokio::time::timeout(Duration::from_secs(10), alice.outcome(ob.id()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(out.state, TerminalState::Applied);
    }
    let applied = |v: &abhyasa::StatusView| v.custodian == Some(CustodianState::Applied);
    let held =
        |v: &abhyasa::StatusView| v.receiver == vec![(agent("alice"), LedgerOutcome::Applied)];
    // Before the short deadline + retention: held everywhere.
    assert!(applied(&alice.status(short.id()).await.unwrap()));
    assert!(held(&bob.status(short.id()).await.unwrap()));
    assert!(sa
        .load()
        .unwrap()
        .custodian
        .terminal
        .contains_key(short.id()));
    let ledger_ids = |s: &Shared| -> HashSet<String> {
        s.load()
            .unwrap()
            .receiver
            .ledger
            .keys()
            .map(|(_, id)| id.to_string())
            .collect()
    };
    assert_eq!(ledger_ids(&sb).len(), 2);
    // After it (2 s + 1 s, and a schedule turn): gone from the machines
    // (status no longer knows it) and from the stores, with no call to
    // `compact` from here.
    let mut gone = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let a = alice.status(short.id()).await.unwrap();
        let b = bob.status(short.id()).await.unwrap();
        if a.custodian.is_none() && b.receiver.is_empty() {
            gone = true;
            break;
        }
    }
    assert!(gone, "the schedule compacted the machines");
    // The store compaction is queued behind the machines'; give it a turn.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let terminal: Vec<String> = sa
        .load()
        .unwrap()
        .custodian
        .terminal
        .keys()
        .map(|k| k.to_string())
        .collect();
    assert_eq!(terminal, vec!["long".to_string()], "custodian store");
    assert_eq!(
        ledger_ids(&sb),
        HashSet::from(["long".to_string()]),
        "receiver store"
    );
    // The long-deadline obligation is kept by machines and stores alike.
    assert!(applied(&alice.status(long.id()).await.unwrap()));
    assert!(held(&bob.status(long.id()).await.unwrap()));
    // An explicit run reports what each part dropped (nothing new here).
    let r = alice.compact(Duration::from_secs(1)).await.unwrap();
    assert_eq!((r.custodian_terminal, r.store.terminal), (0, 0));
    alice.shutdown().await.unwrap();
    bob.shutdown().await.unwrap();
}
