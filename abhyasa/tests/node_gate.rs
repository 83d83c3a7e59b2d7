//! C-ND-2: no reply claims what is not durable. Every state-changing
//! command (and every read of a terminal state) answers only after the
//! records behind it commit; a commit that fails (or a node that stops)
//! before that leaves the caller with an error, never a success.
//!
//! The store here is a `SimStore` behind a gate the test closes and opens:
//! a commit reaching a closed gate blocks (the store thread waits) until
//! the test releases it, or fails it as a crash would.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use abhyasa::{Node, NodeError, NodeEvent, NodeOptions};
use abhyasa_core::custody::{
    ApplyDecision, CustodyProfile, EffectValue, EffectWrite, ExternalIntent, ExternalOutcome,
    Offered, Received, ReceiverEvent, Record, TerminalState,
};
use abhyasa_core::principal::{Authorization, Resolution};
use abhyasa_core::store::{
    Committed, Compacted, DurableState, EventId, SimStore, Store, StoreError, StoredEvent,
};
use abhyasa_core::{
    AgentId, DeclinePolicy, DeclineReason, GovernedKey, GuardOutcome, Kind, Obligation,
    RetryBackoff, Timestamp,
};
use abhyasa_transport::mem::MemNetwork;
use abhyasa_transport::LinkConfig;
use serde_json::json;

#[derive(Default)]
struct GateState {
    closed: bool,
    /// Commits waiting at the closed gate.
    waiting: usize,
    /// Fail the commits waiting at the gate instead of running them.
    fail: bool,
}

/// The test's side of a gated store.
#[derive(Clone, Default)]
struct Gate(Arc<(Mutex<GateState>, Condvar)>);

impl Gate {
    fn close(&self) {
        self.0 .0.lock().unwrap().closed = true;
    }
    fn open(&self) {
        self.0 .0.lock().unwrap().closed = false;
        self.0 .1.notify_all();
    }
    /// Fails the commits at the gate (a crash before they were durable).
    fn fail(&self) {
        let mut g = self.0 .0.lock().unwrap();
        g.fail = true;
        g.closed = false;
        drop(g);
        self.0 .1.notify_all();
    }
    fn waiting(&self) -> usize {
        self.0 .0.lock().unwrap().waiting
    }
    /// Waits (bounded) until a commit is held at the gate.
    async fn until_held(&self) {
        for _ in 0..1000 {
            if self.waiting() > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("no commit reached the gate");
    }
}

/// A SimStore that outlives its node, behind a [`Gate`].
#[derive(Clone, Default)]
struct GatedStore {
    inner: Arc<Mutex<SimStore>>,
    gate: Gate,
}

impl Store for GatedStore {
    fn backend(&self) -> &'static str {
        "sim"
    }
    fn format_version(&self) -> u32 {
        self.inner.lock().unwrap().format_version()
    }
    fn commit(&mut self, now: Timestamp, batches: &[&[Record]]) -> Result<Committed, StoreError> {
        let (m, cv) = &*self.gate.0;
        let mut g = m.lock().unwrap();
        if g.closed {
            g.waiting += 1;
            while g.closed {
                g = cv.wait(g).unwrap();
            }
            g.waiting -= 1;
        }
        if g.fail {
            return Err(StoreError::Io {
                op: "commit",
                source: std::io::Error::other("crashed before the commit was durable"),
            });
        }
        drop(g);
        self.inner.lock().unwrap().commit(now, batches)
    }
    fn load(&self) -> Result<DurableState, StoreError> {
        self.inner.lock().unwrap().load()
    }
    fn events(&self, from: EventId, limit: usize) -> Result<Vec<StoredEvent>, StoreError> {
        self.inner.lock().unwrap().events(from, limit)
    }
    fn compact(&mut self, now: Timestamp, retention: Duration) -> Result<Compacted, StoreError> {
        self.inner.lock().unwrap().compact(now, retention)
    }
}

fn agent(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

/// Slow retries, so the only commits in a test are the ones it causes.
fn options(name: &str) -> NodeOptions {
    let mut o = NodeOptions::new(agent(name));
    o.custodian.default_profile = CustodyProfile {
        backoff: RetryBackoff {
            base: Duration::from_secs(2),
            cap: Duration::from_secs(4),
            jitter: 0.0,
        },
        ..CustodyProfile::default()
    };
    o
}

async fn open(net: &MemNetwork, o: NodeOptions, store: GatedStore) -> Node {
    let t = net
        .join(o.custodian.agent.clone(), LinkConfig::default())
        .await
        .unwrap();
    Node::builder(o.agent().clone())
        .options(o)
        .store(store)
        .transport(t)
        .open()
        .await
        .unwrap()
}

fn revoke(node: &Node, id: &str, target: &str) -> Obligation {
    Obligation::builder()
        .id(id)
        .kind("anumati.consent")
        .target(target)
        .payload(json!({"decision": "revoke", "scope": format!("scope.{id}")}))
        .deadline_seconds(60)
        .max_retries(abhyasa_core::min_retries_to_span(60, 2.0, 4.0) as i64 + 1)
        .created_at(node.now())
        .build()
        .unwrap()
}

/// Asserts `task` has not answered while its commit is held.
async fn assert_no_reply<T: Send + 'static>(task: &tokio::task::JoinHandle<T>, gate: &Gate) {
    gate.until_held().await;
    // Give the node every chance to answer early (it would on the old path).
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(!task.is_finished(), "answered while its commit was held");
    assert!(gate.waiting() > 0);
}

async fn join<T>(task: tokio::task::JoinHandle<T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("an answer after the gate opened")
        .unwrap()
}

async fn pair(
    alice: NodeOptions,
    bob: NodeOptions,
) -> (MemNetwork, Node, GatedStore, Node, GatedStore) {
    let net = MemNetwork::new(7);
    let sa = GatedStore::default();
    let sb = GatedStore::default();
    let a = open(&net, alice, sa.clone()).await;
    let b = open(&net, bob, sb.clone()).await;
    (net, a, sa, b, sb)
}

// C-ND-2: `decide` answers only after its `Record::Principal` commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_nd_2_decide_answers_after_its_record_commits() {
    let net = MemNetwork::new(1);
    let store = GatedStore::default();
    let node = open(&net, options("alice"), store.clone()).await;
    let key = GovernedKey::new("email.read").unwrap();
    store.gate.close();
    let n = node.clone();
    let k = key.clone();
    let task = tokio::spawn(async move { n.decide(k, Authorization::Withheld, None).await });
    assert_no_reply(&task, &store.gate).await;
    assert!(store.load().unwrap().custodian.principal.is_empty());
    store.gate.open();
    assert_eq!(join(task).await.unwrap(), GuardOutcome::Applied);
    let p = store.load().unwrap().custodian.principal;
    assert_eq!(p.len(), 1, "the decision is durable when answered: {p:?}");
}

// C-ND-2: a crash before the decision commits leaves the caller with an
// error, and nothing durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_nd_2_decide_crash_before_commit_is_an_error() {
    let net = MemNetwork::new(2);
    let store = GatedStore::default();
    let node = open(&net, options("alice"), store.clone()).await;
    store.gate.close();
    let n = node.clone();
    let task = tokio::spawn(async move {
        n.decide(
            GovernedKey::new("email.read").unwrap(),
            Authorization::Withheld,
            None,
        )
        .await
    });
    assert_no_reply(&task, &store.gate).await;
    store.gate.fail();
    let r = join(task).await;
    assert!(matches!(r, Err(NodeError::Stopped)), "{r:?}");
    assert!(store.load().unwrap().custodian.principal.is_empty());
}

/// A receiver whose applier answers `decision` for every obligation.
fn bob_with(decision: ApplyDecision) -> NodeOptions {
    let mut o = options("bob");
    o.applier = Box::new(
        move |_: &abhyasa_core::custody::ApplyContext<'_>, _: &Obligation| decision.clone(),
    );
    o
}

/// Waits for a receiver event on `rx` matching `f`.
async fn receiver_event(rx: &mut abhyasa::Subscription, f: impl Fn(&ReceiverEvent) -> bool) {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Ok(NodeEvent::Receiver(e)) = rx.recv().await {
                if f(&e) {
                    return;
                }
            }
        }
    })
    .await
    .expect("the receiver event");
}

fn effect() -> Vec<EffectWrite> {
    vec![EffectWrite {
        key: "scope.ob-1".into(),
        value: EffectValue::Authorization(Authorization::Withheld),
    }]
}

// C-ND-2: `complete_deferred` answers `Applied` only after the ledger
// entry commits; a crash first is an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_nd_2_complete_deferred_answers_after_the_ledger_commits() {
    for crash in [false, true] {
        let (_net, alice, _sa, bob, sb) = pair(
            options("alice"),
            bob_with(ApplyDecision::Defer { detail: None }),
        )
        .await;
        let mut rx = bob.subscribe();
        let ob = revoke(&alice, "ob-1", "bob");
        alice.offer(ob.clone()).await.unwrap();
        receiver_event(&mut rx, |e| matches!(e, ReceiverEvent::Deferred { .. })).await;
        sb.gate.close();
        let b = bob.clone();
        let id = ob.id().clone();
        let task = tokio::spawn(async move {
            b.complete_deferred(agent("alice"), id, ApplyDecision::Apply(effect()))
                .await
        });
        assert_no_reply(&task, &sb.gate).await;
        if crash {
            sb.gate.fail();
            let r = join(task).await;
            assert!(matches!(r, Err(NodeError::Stopped)), "{r:?}");
        } else {
            sb.gate.open();
            assert_eq!(join(task).await.unwrap(), Received::Applied);
        }
        let ledger = sb.load().unwrap().receiver.ledger;
        let e = ledger.values().next().expect("the deferral is durable");
        assert_eq!(
            e.outcome == abhyasa_core::custody::LedgerOutcome::Applied,
            !crash,
            "crash={crash}: {e:?}"
        );
    }
}

// C-ND-2: `external_outcome` answers `Applied` only after the ledger entry
// commits; a crash first is an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_nd_2_external_outcome_answers_after_the_ledger_commits() {
    for crash in [false, true] {
        let intent = ExternalIntent {
            idempotency_key: abhyasa_core::ObligationId::new("ob-1").unwrap(),
            action: "revoke-upstream".into(),
            data: json!({}),
        };
        let (_net, alice, _sa, bob, sb) =
            pair(options("alice"), bob_with(ApplyDecision::External(intent))).await;
        let mut rx = bob.subscribe();
        let ob = revoke(&alice, "ob-1", "bob");
        alice.offer(ob.clone()).await.unwrap();
        receiver_event(&mut rx, |e| matches!(e, ReceiverEvent::Execute { .. })).await;
        sb.gate.close();
        let b = bob.clone();
        let id = ob.id().clone();
        let task = tokio::spawn(async move {
            b.external_outcome(agent("alice"), id, ExternalOutcome::Applied(effect()))
                .await
        });
        assert_no_reply(&task, &sb.gate).await;
        if crash {
            sb.gate.fail();
            let r = join(task).await;
            assert!(matches!(r, Err(NodeError::Stopped)), "{r:?}");
        } else {
            sb.gate.open();
            assert_eq!(join(task).await.unwrap(), Received::Applied);
        }
        let durable = sb.load().unwrap().receiver;
        let applied = durable
            .ledger
            .values()
            .any(|e| e.outcome == abhyasa_core::custody::LedgerOutcome::Applied);
        assert_eq!(applied, !crash, "crash={crash}: {:?}", durable.ledger);
    }
}

// C-ND-2: `resolve` answers only after its `Record::Principal` commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_nd_2_resolve_answers_after_its_record_commits() {
    for crash in [false, true] {
        let mut a = options("alice");
        a.custodian.profiles.insert(
            Kind::new("anumati.consent").unwrap(),
            CustodyProfile {
                decline_policy: DeclinePolicy::Surface,
                ..a.custodian.default_profile
            },
        );
        let decline = ApplyDecision::Decline {
            reason: DeclineReason::Policy,
            detail: Some("not here".into()),
        };
        let (_net, alice, sa, _bob, _sb) = pair(a, bob_with(decline)).await;
        let ob = revoke(&alice, "ob-1", "bob");
        alice.offer(ob.clone()).await.unwrap();
        let out = tokio::time::timeout(Duration::from_secs(10), alice.outcome(ob.id()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(out.state, TerminalState::Declined);
        sa.gate.close();
        let n = alice.clone();
        let id = ob.id().clone();
        let task = tokio::spawn(async move { n.resolve(id, Resolution::Dismiss).await });
        assert_no_reply(&task, &sa.gate).await;
        if crash {
            sa.gate.fail();
            let r = join(task).await;
            assert!(matches!(r, Err(NodeError::Stopped)), "{r:?}");
        } else {
            sa.gate.open();
            assert_eq!(join(task).await.unwrap(), None);
        }
        let open_items = sa.load().unwrap().decisions().len();
        assert_eq!(open_items, usize::from(crash), "crash={crash}");
    }
}

// C-ND-2: a re-offer while the first offer's `CustodyOpened` is in flight
// gets the first offer's answer, when it commits; a crash first fails both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_nd_2_reoffer_in_flight_gets_the_first_answer_after_commit() {
    for crash in [false, true] {
        let net = MemNetwork::new(3);
        // A bare endpoint: `offer` takes only targets in the peer table.
        let _bob = net.join(agent("bob"), LinkConfig::default()).await.unwrap();
        let store = GatedStore::default();
        let node = open(&net, options("alice"), store.clone()).await;
        let ob = revoke(&node, "ob-1", "bob");
        store.gate.close();
        let (n1, o1) = (node.clone(), ob.clone());
        let first = tokio::spawn(async move { n1.offer(o1).await });
        store.gate.until_held().await;
        let (n2, o2) = (node.clone(), ob.clone());
        let again = tokio::spawn(async move { n2.offer(o2).await });
        assert_no_reply(&again, &store.gate).await;
        assert!(!first.is_finished());
        if crash {
            store.gate.fail();
            for t in [first, again] {
                let r = join(t).await;
                assert!(matches!(r, Err(NodeError::Stopped)), "{r:?}");
            }
            assert!(store.load().unwrap().custodian.pending.is_empty());
        } else {
            store.gate.open();
            let a = join(first).await.unwrap();
            let b = join(again).await.unwrap();
            assert!(matches!(a, Offered::Custody { .. }), "{a:?}");
            assert_eq!(a, b, "the re-offer gets the first offer's answer");
            assert_eq!(store.load().unwrap().custodian.pending.len(), 1);
        }
    }
}

// C-ND-2: `outcome()` and `status` report a terminal state only once its
// `CustodyClosed` has committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_nd_2_outcome_and_status_report_only_durable_terminal_states() {
    for crash in [false, true] {
        let decline = ApplyDecision::Decline {
            reason: DeclineReason::Policy,
            detail: None,
        };
        let (_net, alice, sa, _bob, sb) = pair(options("alice"), bob_with(decline)).await;
        let ob = revoke(&alice, "ob-1", "bob");
        // Bob's decline is held until alice's gate is closed, so the commit
        // alice holds below is the close of this obligation.
        sb.gate.close();
        alice.offer(ob.clone()).await.unwrap();
        sb.gate.until_held().await;
        sa.gate.close();
        sb.gate.open();
        sa.gate.until_held().await;
        let (n, id) = (alice.clone(), ob.id().clone());
        let status = tokio::spawn(async move { n.status(&id).await });
        let (n, id) = (alice.clone(), ob.id().clone());
        let outcome = tokio::spawn(async move { n.outcome(&id).await });
        assert_no_reply(&status, &sa.gate).await;
        assert!(
            !outcome.is_finished(),
            "outcome answered before the close commits"
        );
        if crash {
            sa.gate.fail();
            assert!(matches!(join(status).await, Err(NodeError::Stopped)));
            assert!(matches!(join(outcome).await, Err(NodeError::Stopped)));
            assert!(sa.load().unwrap().custodian.terminal.is_empty());
        } else {
            sa.gate.open();
            let v = join(status).await.unwrap();
            assert_eq!(
                v.custodian,
                Some(abhyasa::CustodianState::Declined),
                "{v:?}"
            );
            let o = join(outcome).await.unwrap();
            assert_eq!(o.state, TerminalState::Declined);
            assert_eq!(sa.load().unwrap().custodian.terminal.len(), 1);
        }
    }
}
