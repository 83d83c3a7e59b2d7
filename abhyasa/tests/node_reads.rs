//! Reads don't block or scan (issue 11 §5, C-ND-5): `Node::open` loads on
//! the store thread while the runtime keeps running other tasks, and
//! `list`, `escalations`, `decisions` and `inbox` answer one indexed page
//! at a time.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use abhyasa::clock::Clock;
use abhyasa::{Node, NodeOptions};
use abhyasa_core::custody::{CustodyProfile, Record, TerminalState};
use abhyasa_core::store::{
    Committed, Compacted, DurableState, EventId, ListState, SimStore, Store, StoreError,
    StoredEvent,
};
use abhyasa_core::{AgentId, Obligation, ObligationId, RetryBackoff, Timestamp};
use abhyasa_transport::mem::MemNetwork;
use abhyasa_transport::LinkConfig;
use serde_json::json;

fn agent(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

/// A store whose `load` is slow: it returns only once another task on the
/// node's runtime has ticked 50 times (or fails after 5 s). Run on the
/// runtime's only worker, it would wait for a task that cannot run.
struct SlowLoad {
    inner: SimStore,
    ticks: Arc<AtomicU64>,
}

impl Store for SlowLoad {
    fn backend(&self) -> &'static str {
        "slow-load"
    }
    fn format_version(&self) -> u32 {
        self.inner.format_version()
    }
    fn commit(&mut self, now: Timestamp, batches: &[&[Record]]) -> Result<Committed, StoreError> {
        self.inner.commit(now, batches)
    }
    fn load(&self) -> Result<DurableState, StoreError> {
        let start = Instant::now();
        while self.ticks.load(Ordering::SeqCst) < 50 {
            if start.elapsed() > Duration::from_secs(5) {
                return Err(StoreError::Io {
                    op: "load",
                    source: std::io::Error::other(
                        "no other task ran while the store loaded: the runtime was blocked",
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.inner.load()
    }
    fn events(&self, from: EventId, limit: usize) -> Result<Vec<StoredEvent>, StoreError> {
        self.inner.events(from, limit)
    }
    fn compact(&mut self, now: Timestamp, retention: Duration) -> Result<Compacted, StoreError> {
        self.inner.compact(now, retention)
    }
}

// C-ND-5 / issue 11 §5: `Node::open` loads on the store thread. On a
// current-thread runtime another task keeps making progress while the
// (slow) load runs; loading inside the async fn would starve it and the
// load would fail.
#[tokio::test(flavor = "current_thread")]
async fn c_nd_5_open_loads_on_the_store_thread_while_the_runtime_runs() {
    let ticks = Arc::new(AtomicU64::new(0));
    let ticker = {
        let ticks = ticks.clone();
        tokio::spawn(async move {
            loop {
                ticks.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    let net = MemNetwork::new(3);
    let t = net
        .join(agent("alice"), LinkConfig::default())
        .await
        .unwrap();
    let store = SlowLoad {
        inner: SimStore::new(),
        ticks: ticks.clone(),
    };
    let node = Node::open(NodeOptions::new(agent("alice")), Box::new(store), t)
        .await
        .expect("the load finished while another task ran");
    assert!(ticks.load(Ordering::SeqCst) >= 50);
    assert_eq!(node.inbox().await.unwrap().pending, 0);
    ticker.abort();
    node.shutdown().await.unwrap();
}

/// Time the test moves by hand.
#[derive(Debug, Default)]
struct ManualClock(AtomicI64);

impl ManualClock {
    fn advance(&self, d: Duration) {
        self.0.fetch_add(d.as_micros() as i64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_unix_micros(self.0.load(Ordering::SeqCst))
    }
}

fn revoke_to(now: Timestamp, id: &str, target: &str) -> Obligation {
    Obligation::builder()
        .id(id)
        .kind("anumati.consent")
        .target(target)
        .payload(json!({"decision": "revoke", "scope": format!("scope.{id}")}))
        .deadline_seconds(1)
        .max_retries(abhyasa_core::min_retries_to_span(1, 0.05, 0.2) as i64 + 2)
        .created_at(now)
        .build()
        .unwrap()
}

// C-ND-5 / issue 11 §5: the node's reads page through the store's
// indexes: `list` by state with `limit`/`after`, `escalations` by log
// position, and `inbox` counters, all agreeing with the records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_nd_5_node_reads_are_paged() {
    let clock = Arc::new(ManualClock::default());
    clock.advance(Duration::from_secs(1_700_000_000));
    let net = MemNetwork::new(5);
    let mut o = NodeOptions::new(agent("alice"));
    o.custodian.default_profile = CustodyProfile {
        backoff: RetryBackoff {
            base: Duration::from_millis(50),
            cap: Duration::from_millis(200),
            jitter: 0.0,
        },
        ..CustodyProfile::default()
    };
    o.clock = clock.clone();
    let t = net
        .join(agent("alice"), LinkConfig::default())
        .await
        .unwrap();
    let alice = Node::open(o, Box::new(SimStore::new()), t).await.unwrap();
    // "carol" joins and leaves at once (a known peer, never reachable):
    // every obligation to her escalates at its deadline.
    let carol = net
        .join(agent("carol"), LinkConfig::default())
        .await
        .unwrap();
    carol.handle.shutdown().await;
    let mut ids = Vec::new();
    for i in 0..7 {
        let ob = revoke_to(clock.now(), &format!("ob-{i}"), "carol");
        ids.push(ob.id().clone());
        alice.offer(ob).await.unwrap();
    }
    let pending = alice.list(Some(ListState::Pending), None, 3).await.unwrap();
    assert_eq!(pending.items.len(), 3);
    assert_eq!(pending.next, Some(ids[2].clone()));
    assert_eq!(alice.inbox().await.unwrap().pending, 7);

    clock.advance(Duration::from_secs(2));
    for id in &ids {
        let o = tokio::time::timeout(Duration::from_secs(20), alice.outcome(id))
            .await
            .expect("the escalation")
            .unwrap();
        assert_eq!(o.state, TerminalState::Escalated);
    }
    let inbox = alice.inbox().await.unwrap();
    assert_eq!((inbox.pending, inbox.escalated), (0, 7), "{inbox:?}");

    // Pages of three: 3 + 3 + 1, each resuming after the last.
    let mut seen: Vec<ObligationId> = Vec::new();
    let mut after = None;
    loop {
        let page = alice
            .list(Some(ListState::Escalated), after.clone(), 3)
            .await
            .unwrap();
        assert!(page.items.len() <= 3);
        seen.extend(page.items.iter().map(|r| r.obligation_id.clone()));
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(seen, ids, "every escalated obligation once, in id order");
    assert!(alice
        .list(Some(ListState::Pending), None, 10)
        .await
        .unwrap()
        .items
        .is_empty());

    let first = alice.escalations(None, 4).await.unwrap();
    assert_eq!(first.items.len(), 4);
    let rest = alice.escalations(first.next, 4).await.unwrap();
    assert_eq!(rest.items.len(), 3);
    assert_eq!(rest.next, None);
    let mut escalated: Vec<ObligationId> = first
        .items
        .iter()
        .chain(&rest.items)
        .map(|e| e.escalation.obligation_id.clone())
        .collect();
    escalated.sort();
    assert_eq!(escalated, ids);
    assert!(alice.decisions(None, 10).await.unwrap().items.is_empty());
    alice.shutdown().await.unwrap();
}
