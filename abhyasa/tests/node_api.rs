//! The embedding API (issue 11 §6): `Node::builder` and its checks, typed
//! errors, typed status states, `offer` refusing targets that are not
//! peers, and cancellation: a dropped `offer` future never leaves a
//! half-accepted obligation (AB-1, C-ND-2).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use abhyasa::{CustodianState, Node, NodeError, NodeOptions};
use abhyasa_core::custody::{Offered, Record, TerminalState};
use abhyasa_core::principal::Resolution;
use abhyasa_core::store::{
    Committed, Compacted, DurableState, EventId, SimStore, Store, StoreError, StoredEvent,
};
use abhyasa_core::{AgentId, Obligation, ObligationId, RetryBackoff, Timestamp};
use abhyasa_transport::mem::MemNetwork;
use abhyasa_transport::{LinkConfig, Transport};
use serde_json::json;

fn agent(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
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

/// Slow retries, so the only commits are the ones a test causes.
fn slow(o: &mut NodeOptions) {
    o.custodian.default_profile.backoff = RetryBackoff {
        base: Duration::from_secs(2),
        cap: Duration::from_secs(4),
        jitter: 0.0,
    };
}

async fn join(net: &MemNetwork, name: &str) -> Transport {
    net.join(agent(name), LinkConfig::default()).await.unwrap()
}

async fn open(net: &MemNetwork, name: &str, store: impl Store + 'static) -> Node {
    Node::builder(agent(name))
        .configure(slow)
        .store(store)
        .transport(join(net, name).await)
        .open()
        .await
        .unwrap()
}

/// Makes one option incoherent.
type Breaker = Box<dyn Fn(&mut NodeOptions)>;

/// The field an `InvalidOptions` error names.
fn invalid_field(r: Result<Node, NodeError>) -> String {
    match r {
        Err(NodeError::InvalidOptions { field, reason }) => {
            assert!(!reason.is_empty(), "{field}: empty reason");
            field
        }
        other => panic!("expected InvalidOptions, got {other:?}"),
    }
}

// Options are checked when the node is built, each refusal typed and
// naming its field; nothing is opened (no endpoint keeps the agent busy).
#[tokio::test]
async fn builder_refuses_incoherent_options_naming_the_field() {
    let net = MemNetwork::new(1);
    let a = agent("alice");
    let no_store = Node::builder(a.clone())
        .transport(join(&net, "alice").await)
        .open()
        .await;
    assert_eq!(invalid_field(no_store), "store");
    let no_transport = Node::builder(a.clone()).store(SimStore::new()).open().await;
    assert_eq!(invalid_field(no_transport), "transport");

    let cases: Vec<(&str, Breaker)> = vec![
        (
            "receiver.agent",
            Box::new(|o| o.receiver.agent = agent("mallory")),
        ),
        ("max_batch_inputs", Box::new(|o| o.max_batch_inputs = 0)),
        (
            "custodian.max_pending",
            Box::new(|o| o.custodian.max_pending = 0),
        ),
        (
            "receiver.ledger_quota",
            Box::new(|o| o.receiver.ledger_quota = 0),
        ),
        (
            "receiver.max_deadline",
            Box::new(|o| o.receiver.max_deadline = Duration::ZERO),
        ),
        (
            "custodian.default_profile.backoff_base_seconds",
            Box::new(|o| o.custodian.default_profile.backoff.base = Duration::ZERO),
        ),
        (
            "custodian.profiles[oauth.token].jitter",
            Box::new(|o| {
                let mut p = o.custodian.default_profile;
                p.backoff.jitter = 2.0;
                o.custodian
                    .profiles
                    .insert(abhyasa_core::Kind::new("oauth.token").unwrap(), p);
            }),
        ),
    ];
    for (field, break_it) in cases {
        let net = MemNetwork::new(2);
        let r = Node::builder(a.clone())
            .configure(|o| break_it(o))
            .store(SimStore::new())
            .transport(join(&net, "alice").await)
            .open()
            .await;
        assert_eq!(invalid_field(r), field);
    }

    // Options or a transport for another agent.
    let net = MemNetwork::new(3);
    let r = Node::builder(a.clone())
        .options(NodeOptions::new(agent("bob")))
        .store(SimStore::new())
        .transport(join(&net, "alice").await)
        .open()
        .await;
    assert_eq!(invalid_field(r), "custodian.agent");
    let r = Node::builder(a.clone())
        .store(SimStore::new())
        .transport(join(&net, "bob").await)
        .open()
        .await;
    assert_eq!(invalid_field(r), "transport");
    // `Node::open`, the builder's back end, runs the same checks.
    let mut o = NodeOptions::new(a.clone());
    o.max_batch_inputs = 0;
    let r = Node::open(o, Box::new(SimStore::new()), join(&net, "alice").await).await;
    assert_eq!(invalid_field(r), "max_batch_inputs");

    // A coherent set opens and works.
    let net = MemNetwork::new(4);
    let _bob = open(&net, "bob", SimStore::new()).await;
    let alice = Node::builder(a)
        .configure(slow)
        .max_batch_inputs(16)
        .store(SimStore::new())
        .transport(join(&net, "alice").await)
        .open()
        .await
        .unwrap();
    let ob = revoke(&alice, "ok-1", "bob");
    assert!(matches!(
        alice.offer(ob.clone()).await.unwrap(),
        Offered::Custody { .. }
    ));
    let out = tokio::time::timeout(Duration::from_secs(10), alice.outcome(ob.id()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.state, TerminalState::Applied);
}

// `offer` to a target outside the transport's peer table is refused with
// `UnknownPeer`, and nothing is accepted: no custody, no principal write,
// nothing in the store. A peer that joins the network becomes a target.
#[tokio::test]
async fn offer_refuses_a_target_that_is_not_a_peer() {
    let net = MemNetwork::new(5);
    let store = GatedStore::default();
    let alice = open(&net, "alice", store.clone()).await;
    let _bob = open(&net, "bob", SimStore::new()).await;
    let ob = revoke(&alice, "to-zed", "zed");
    let e = alice.offer(ob.clone()).await.unwrap_err();
    assert!(
        matches!(&e, NodeError::UnknownPeer(p) if *p == agent("zed")),
        "{e:?}"
    );
    assert!(e.to_string().contains("zed"), "{e}");
    assert!(!alice.is_known_peer(&agent("zed")));
    assert!(alice.status(ob.id()).await.unwrap().is_unknown());
    let ds = store.load().unwrap();
    assert!(ds.custodian.pending.is_empty() && ds.custodian.principal.is_empty());
    assert_eq!(alice.metrics().await.unwrap().opened, 0);

    // Known peers are targets, connected or not.
    assert!(matches!(
        alice.offer(revoke(&alice, "to-bob", "bob")).await.unwrap(),
        Offered::Custody { .. }
    ));
    let _zed = join(&net, "zed").await;
    assert!(alice.is_known_peer(&agent("zed")));
    assert!(matches!(
        alice.offer(ob).await.unwrap(),
        Offered::Custody { .. }
    ));
}

// Unknown ids are typed errors carrying the id, not strings.
#[tokio::test]
async fn unknown_obligations_and_decision_items_are_typed() {
    let net = MemNetwork::new(6);
    let alice = open(&net, "alice", SimStore::new()).await;
    let id = ObligationId::new("never-offered").unwrap();
    match alice.outcome(&id).await {
        Err(NodeError::UnknownObligation(got)) => assert_eq!(got, id),
        other => panic!("{other:?}"),
    }
    match alice.resolve(id.clone(), Resolution::ApplySafe).await {
        Err(e @ NodeError::UnknownDecisionItem(_)) => {
            assert!(e.to_string().contains("never-offered"), "{e}");
            assert!(matches!(e, NodeError::UnknownDecisionItem(got) if got == id));
        }
        other => panic!("{other:?}"),
    }
}

// Status states are enums; serialised they are the strings the CLI has
// always printed (`abhyasa status --json`).
#[tokio::test]
async fn status_states_are_typed_and_keep_their_json_spelling() {
    for t in [
        TerminalState::Applied,
        TerminalState::Declined,
        TerminalState::Escalated,
        TerminalState::BestEffort,
    ] {
        let s = CustodianState::from(t);
        assert_eq!(
            serde_json::to_value(s).unwrap(),
            serde_json::to_value(t).unwrap()
        );
        assert_eq!(s.terminal(), Some(t));
    }
    assert_eq!(
        serde_json::to_value(CustodianState::Pending).unwrap(),
        json!("pending")
    );
    assert_eq!(CustodianState::Pending.terminal(), None);

    let net = MemNetwork::new(7);
    let bob = open(&net, "bob", SimStore::new()).await;
    let alice = open(&net, "alice", SimStore::new()).await;
    let ob = revoke(&alice, "st-1", "bob");
    alice.offer(ob.clone()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), alice.outcome(ob.id()))
        .await
        .unwrap()
        .unwrap();
    let a = alice.status(ob.id()).await.unwrap();
    assert_eq!(a.custodian, Some(CustodianState::Applied));
    assert_eq!(
        serde_json::to_value(&a).unwrap(),
        json!({"obligation_id": "st-1", "custodian": "applied", "attempts": 1,
               "deadline_at": null, "receiver": []})
    );
    let b = bob.status(ob.id()).await.unwrap();
    assert_eq!(b.custodian, None);
    assert_eq!(
        serde_json::to_value(&b).unwrap()["receiver"],
        json!([["alice", "applied"]])
    );
    // And back: what the CLI reads parses into the typed view.
    let back: abhyasa::StatusView =
        serde_json::from_value(serde_json::to_value(&b).unwrap()).unwrap();
    assert_eq!(back, b);

    // Pending, while bob is cut off.
    net.partition(&agent("alice"), &agent("bob"));
    let p = revoke(&alice, "st-2", "bob");
    alice.offer(p.clone()).await.unwrap();
    let v = serde_json::to_value(alice.status(p.id()).await.unwrap()).unwrap();
    assert_eq!(v["custodian"], "pending", "{v}");
    assert_eq!(v["attempts"], 1, "{v}");
}

// --- cancellation -------------------------------------------------------

#[derive(Default)]
struct GateState {
    closed: bool,
    waiting: usize,
    fail: bool,
}

/// The test's side of a store whose commits it can hold and fail.
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
    /// Fails the held commits, as a crash before they were durable would.
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
}

/// A `SimStore` that outlives its node (a restart reopens the same
/// records), behind a [`Gate`].
#[derive(Clone, Default)]
struct GatedStore {
    inner: Arc<Mutex<SimStore>>,
    gate: Gate,
}

impl GatedStore {
    /// The same records behind a fresh, open gate: the store after a restart.
    fn reopened(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            gate: Gate::default(),
        }
    }
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

/// Polls `fut` `n` times without a real waker, giving the node's tasks a
/// turn after each poll; it must not complete while its commit is held.
async fn poll_n<F: Future>(mut fut: Pin<&mut F>, n: usize) {
    let mut cx = Context::from_waker(Waker::noop());
    for i in 0..n {
        assert!(
            matches!(fut.as_mut().poll(&mut cx), Poll::Pending),
            "offer answered at poll {i} while its commit was held"
        );
        for _ in 0..5 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether the custodian store holds `id` under custody.
fn durable(store: &GatedStore, id: &ObligationId) -> bool {
    store.load().unwrap().custodian.pending.contains_key(id)
}

// C-ND-2, AB-1: dropping an `offer` future after N polls, N = 0.., with
// its commit held: the obligation is then either fully accepted — durable,
// shown pending by `status`, still pending after a restart — or absent
// everywhere. `status`
// never shows it before the store holds it. When the held commit fails
// instead (a crash before it was durable), it is absent after the restart
// and no answer ever claimed it. Both ends (absent, accepted) must occur.
#[tokio::test]
async fn dropping_an_offer_future_never_leaves_a_half_accepted_obligation() {
    let (mut absent, mut accepted) = (0, 0);
    for crash in [false, true] {
        for n in 0..4 {
            let net = MemNetwork::new(10 + n as u64);
            // bob is a bare endpoint: known, reachable, never acks, so
            // custody stays open and `pending` is the accepted state.
            let _bob = join(&net, "bob").await;
            let store = GatedStore::default();
            let alice = open(&net, "alice", store.clone()).await;
            let ob = revoke(&alice, &format!("drop-{n}-{crash}"), "bob");
            let id = ob.id().clone();
            store.gate.close();
            {
                let fut = alice.offer(ob.clone());
                let mut fut = std::pin::pin!(fut);
                poll_n(fut.as_mut(), n).await;
            } // dropped here, after n polls
            tokio::time::sleep(Duration::from_millis(50)).await;
            let held = store.gate.waiting() > 0;
            // Ask while the commit (if any) is held: the answer must not
            // run ahead of the store.
            let a2 = alice.clone();
            let id2 = id.clone();
            let status = tokio::spawn(async move { a2.status(&id2).await });
            tokio::time::sleep(Duration::from_millis(100)).await;
            if status.is_finished() {
                let v = status.await.unwrap().unwrap();
                assert!(
                    v.custodian.is_none() || durable(&store, &id),
                    "n={n}: status showed {:?} before the store held it",
                    v.custodian
                );
                assert!(!held, "n={n}: status answered while a commit was held");
                assert!(v.is_unknown(), "n={n}: {v:?}");
                absent += 1;
                alice.shutdown().await.unwrap();
            } else if crash {
                assert!(held, "n={n}: status waits for a commit that is not held");
                store.gate.fail();
                // The node stops on the failed commit: the held status
                // answer is an error, never a view of the lost offer.
                let r = tokio::time::timeout(Duration::from_secs(10), status)
                    .await
                    .unwrap()
                    .unwrap();
                assert!(matches!(r, Err(NodeError::Stopped)), "n={n}: {r:?}");
                assert!(!durable(&store, &id), "n={n}: failed commit is durable");
                absent += 1;
            } else {
                store.gate.open();
                let v = tokio::time::timeout(Duration::from_secs(10), status)
                    .await
                    .unwrap()
                    .unwrap()
                    .unwrap();
                assert_eq!(v.custodian, Some(CustodianState::Pending), "n={n}");
                assert!(durable(&store, &id), "n={n}: shown pending, not durable");
                accepted += 1;
                alice.shutdown().await.unwrap();
            }
            drop(alice);
            // After a restart on the same records, the node agrees with
            // what was (or was not) shown.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let store2 = store.reopened();
            let alice = open(&net, "alice", store2.clone()).await;
            let v = alice.status(&id).await.unwrap();
            let present = durable(&store2, &id);
            assert_eq!(
                v.custodian,
                present.then_some(CustodianState::Pending),
                "n={n} crash={crash}: after restart"
            );
            // Offering again is the way to learn the answer: accepted
            // once, whichever way the dropped future went.
            let again = alice.offer(ob).await.unwrap();
            if present {
                assert_eq!(again, Offered::AlreadyPending, "n={n}");
            } else {
                assert!(matches!(again, Offered::Custody { .. }), "n={n}: {again:?}");
            }
            alice.shutdown().await.unwrap();
        }
    }
    assert!(
        absent > 0 && accepted > 0,
        "absent {absent}, accepted {accepted}"
    );
}

// --- README ---------------------------------------------------------------

/// The body of the first fenced block opening with `fence` after `heading`.
fn block_after(text: &str, heading: &str, fence: &str) -> String {
    let from = text.find(heading).expect("heading");
    let rest = &text[from..];
    let start = rest.find(fence).expect("opening fence") + fence.len();
    let body = &rest[start..];
    let end = body.find("\n```").expect("closing fence");
    body[..end].trim_matches('\n').to_string()
}

// The README's embedding example is the crate-level doctest of `abhyasa`
// (which compiles and runs it), so the README cannot drift from the API.
#[test]
fn readme_embedding_example_is_the_compiled_crate_doctest() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{dir}/../README.md")).unwrap();
    let lib = std::fs::read_to_string(format!("{dir}/src/lib.rs")).unwrap();
    let doc: String = lib
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    let in_readme = block_after(
        &readme,
        "## Quickstart: agent frameworks",
        "```rust,ignore\n",
    );
    let in_lib = block_after(&doc, "## Embedding a node", "```rust\n");
    assert!(in_lib.contains("Node::builder"), "{in_lib}");
    assert_eq!(
        in_readme, in_lib,
        "README's embedding block differs from abhyasa's doctest"
    );
}

// An applied transfer's outcome and status keep its attempt count after
// the transfer ended — asked long after its event, and after a restart on
// the same records — because the terminal summary the store keeps holds
// it (issue 14 answers applied outcomes from that summary, not from a
// per-obligation cache).
#[tokio::test]
async fn an_applied_outcome_keeps_its_attempts_after_the_event_and_a_restart() {
    fn fast(o: &mut NodeOptions) {
        o.custodian.default_profile.backoff = RetryBackoff {
            base: Duration::from_millis(30),
            cap: Duration::from_millis(60),
            jitter: 0.0,
        };
    }
    let net = MemNetwork::new(8);
    let _bob = open(&net, "bob", SimStore::new()).await;
    let store = GatedStore::default();
    let start = |store: GatedStore| {
        let net = net.clone();
        async move {
            Node::builder(agent("alice"))
                .configure(fast)
                .store(store)
                .transport(join(&net, "alice").await)
                .open()
                .await
                .unwrap()
        }
    };
    let alice = start(store.clone()).await;
    // Cut off until a retry has been sent: applied on attempt 2 or later.
    net.partition(&agent("alice"), &agent("bob"));
    let ob = Obligation::builder()
        .id("at-1")
        .kind("anumati.consent")
        .target("bob")
        .payload(json!({"decision": "revoke", "scope": "scope.at-1"}))
        .deadline_seconds(10)
        .max_retries(abhyasa_core::min_retries_to_span(10, 0.03, 0.06) as i64 + 1)
        .created_at(alice.now())
        .build()
        .unwrap();
    alice.offer(ob.clone()).await.unwrap();
    while alice.status(ob.id()).await.unwrap().attempts < Some(2) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    net.heal(&agent("alice"), &agent("bob"));
    let out = tokio::time::timeout(Duration::from_secs(10), alice.outcome(ob.id()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.state, TerminalState::Applied);
    let n = out
        .attempts
        .expect("an applied outcome counts its attempts");
    assert!(n >= 2, "{out:?}");
    // Asked again, after the event: the same answer.
    assert_eq!(alice.outcome(ob.id()).await.unwrap(), out);
    assert_eq!(alice.status(ob.id()).await.unwrap().attempts, Some(n));

    alice.shutdown().await.unwrap();
    drop(alice);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let alice = start(store.reopened()).await;
    assert_eq!(alice.outcome(ob.id()).await.unwrap(), out, "after restart");
    let v = alice.status(ob.id()).await.unwrap();
    assert_eq!(
        (v.custodian, v.attempts),
        (Some(CustodianState::Applied), Some(n))
    );
    alice.shutdown().await.unwrap();
}
