//! Compaction: one input that drops what is past retention from the
//! custodian, the receiver and the store together (C-ND-5).
//!
//! The node runs it on a schedule ([`CompactionPolicy::interval`]); an
//! embedder may also call [`crate::Node::compact`]. Each run takes one `now`
//! from the node's clock and applies the rule every store backend applies
//! ([`abhyasa_core::store::past_retention`]: a record is dropped once
//! `deadline_at + retention < now`) to the custodian's terminal summaries,
//! the receiver's decided ledger entries, and then, through the store
//! thread, to the stored records. The store job is queued behind the commit
//! in flight, so the store compacts what the machines had when they did; a
//! record committed after that with an already-expired deadline is caught by
//! the next run.
//!
//! Dropping a receiver ledger entry never enables a second application: a
//! redelivery of it is past its deadline and is declined `expired`.

use std::time::Duration;

use abhyasa_core::agent::Agent;
use abhyasa_core::store::{Compacted, StoreError};
use abhyasa_core::Timestamp;
use tokio::sync::oneshot;

use crate::store_thread::{Job, Query, StoreJobs};

/// When and how much the node compacts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompactionPolicy {
    /// Terminal records, decided ledger entries and log events are kept
    /// this long past their deadline (default 7 days).
    pub retention: Duration,
    /// How often the node compacts (default 1 hour). `Duration::ZERO`
    /// turns the schedule off; [`crate::Node::compact`] still works.
    pub interval: Duration,
}

impl CompactionPolicy {
    /// The default retention: 7 days.
    pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
    /// The default interval: 1 hour.
    pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(3600);

    /// A policy keeping `retention` and compacting every `interval`.
    pub fn new(retention: Duration, interval: Duration) -> Self {
        Self {
            retention,
            interval,
        }
    }
}

impl Default for CompactionPolicy {
    fn default() -> Self {
        Self::new(Self::DEFAULT_RETENTION, Self::DEFAULT_INTERVAL)
    }
}

/// What one compaction dropped, in memory and in the store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompactionReport {
    /// The `now` the run used.
    pub at: Option<Timestamp>,
    /// Terminal summaries the custodian dropped.
    pub custodian_terminal: usize,
    /// Decided ledger entries the receiver dropped.
    pub receiver_ledger: usize,
    /// What the store dropped.
    pub store: Compacted,
}

/// The machines' half of a run, answered by the driver; the store's half
/// arrives on `store` once the store thread has run it.
#[derive(Debug)]
pub(crate) struct Started {
    pub(crate) report: CompactionReport,
    pub(crate) store: oneshot::Receiver<Result<Compacted, StoreError>>,
}

/// The driver's hook: compacts the agent's custodian and receiver at `now` and queues the same
/// compaction on the store.
pub(crate) fn start(
    now: Timestamp,
    retention: Duration,
    agent: &mut Agent,
    store: &StoreJobs,
) -> Started {
    // `past_retention(d, now, r)` is `d + r < now`, i.e. `d < now - r`: the
    // machines keep what has `deadline_at >= before`.
    let before = now.saturating_sub(retention);
    let report = CompactionReport {
        at: Some(now),
        custodian_terminal: agent.custodian_mut().compact(before),
        receiver_ledger: agent.receiver_mut().compact(before),
        store: Compacted::default(),
    };
    let (tx, rx) = oneshot::channel();
    // If the store has stopped, `tx` is dropped and the caller sees it.
    let _ = store.send(Job::Query(Query::Compact(now, retention, tx)));
    Started { report, store: rx }
}

/// Waits for the store's half of a started run.
pub(crate) async fn finish(started: Started) -> Result<CompactionReport, crate::NodeError> {
    let store = started
        .store
        .await
        .map_err(|_| crate::NodeError::Stopped)??;
    Ok(CompactionReport {
        store,
        ..started.report
    })
}
