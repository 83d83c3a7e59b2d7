//! The store runs on its own thread: commits (with their fsync) never block
//! the driver, which keeps feeding the state machines while a batch is in
//! flight. Exactly one commit is in flight at a time, in order.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Instant;

use abhyasa_core::custody::{CommitToken, Record};
use abhyasa_core::principal::DecisionItem;
use abhyasa_core::store::{
    DurableState, EscalationEntry, EventId, Inbox, ListState, Listed, LogEvent, Page, Store,
    StoreError, StoredEvent,
};
use abhyasa_core::{ObligationId, Timestamp};
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::api::NodeEvent;

/// Where the store thread announces what each commit appended to the event
/// log (the lag-safe subscription, [`crate::Subscription`]).
#[derive(Clone, Debug)]
pub(crate) struct LogSink {
    /// The node's event channel.
    pub(crate) events: broadcast::Sender<NodeEvent>,
    /// One past the last event id committed: where a new subscriber starts.
    pub(crate) published: Arc<AtomicU64>,
}

impl LogSink {
    /// After commit `c` of `records` at `now` is durable: moves the
    /// published end, then (only if anyone listens) broadcasts each log
    /// event with its id, before the driver releases anything the commit
    /// unblocked.
    fn committed(&self, now: Timestamp, records: &[&[Record]], c: &abhyasa_core::store::Committed) {
        self.published.store(c.end_event.0, Ordering::SeqCst);
        if self.events.receiver_count() == 0 {
            return;
        }
        let all = records.iter().flat_map(|b| b.iter());
        for (i, r) in (c.first_event.0..c.end_event.0).zip(all) {
            let _ = self.events.send(NodeEvent::Logged(StoredEvent {
                id: EventId(i),
                at: now,
                event: LogEvent::of(r),
            }));
        }
    }
}

/// A batch in flight: the records of both machines and their tokens.
#[derive(Debug)]
pub(crate) struct CommitJob {
    pub(crate) now: Timestamp,
    pub(crate) custodian: Option<(Vec<Record>, CommitToken)>,
    pub(crate) receiver: Option<(Vec<Record>, CommitToken)>,
}

/// A finished commit.
#[derive(Debug)]
pub(crate) struct CommitDone {
    pub(crate) custodian: Option<CommitToken>,
    pub(crate) receiver: Option<CommitToken>,
    pub(crate) records: usize,
    /// The job, handed back: its records are dropped by the driver that
    /// made them, not here. Their ids are the driver's, and a drop here
    /// is an atomic write to a cache line the driver is using, and a free
    /// into another thread's heap.
    pub(crate) spent: Option<CommitJob>,
    pub(crate) micros: u64,
    pub(crate) result: Result<(), StoreError>,
}

/// A read of the store.
#[derive(Debug)]
pub(crate) enum Query {
    Load(oneshot::Sender<Result<DurableState, StoreError>>),
    Inbox(Timestamp, oneshot::Sender<Result<Inbox, StoreError>>),
    List(
        Option<ListState>,
        Option<ObligationId>,
        usize,
        oneshot::Sender<Result<Page<Listed, ObligationId>, StoreError>>,
    ),
    Escalations(
        Option<EventId>,
        usize,
        oneshot::Sender<Result<Page<EscalationEntry, EventId>, StoreError>>,
    ),
    Decisions(
        Option<ObligationId>,
        usize,
        oneshot::Sender<Result<Page<DecisionItem, ObligationId>, StoreError>>,
    ),
    Events(
        EventId,
        usize,
        oneshot::Sender<Result<Vec<StoredEvent>, StoreError>>,
    ),
    Compact(
        Timestamp,
        std::time::Duration,
        oneshot::Sender<Result<abhyasa_core::store::Compacted, StoreError>>,
    ),
}

#[derive(Debug)]
pub(crate) enum Job {
    Commit(CommitJob),
    Query(Query),
    /// Close the store and end the thread (node handles may still hold
    /// senders; their later queries fail with `Stopped`).
    Stop,
}

/// Where store jobs go: the store thread, or the store itself, run in
/// the caller (see [`spawn_inline`]). Cheap to clone.
#[derive(Clone)]
pub(crate) enum StoreJobs {
    /// The store thread.
    Thread(std_mpsc::Sender<Job>),
    /// The store, run by whoever sends a job.
    Inline(Arc<Mutex<Inline>>),
}

impl std::fmt::Debug for StoreJobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreJobs::Thread(_) => f.write_str("StoreJobs::Thread"),
            StoreJobs::Inline(_) => f.write_str("StoreJobs::Inline"),
        }
    }
}

/// The inline store and where its commit results go.
pub(crate) struct Inline {
    store: Option<Box<dyn Store>>,
    done: mpsc::UnboundedSender<CommitDone>,
    log: LogSink,
}

/// The store has stopped.
#[derive(Debug)]
pub(crate) struct Stopped;

impl StoreJobs {
    /// Hands `job` to the store. Inline, a commit runs now and its result
    /// is queued like the thread's, so the driver releases what depends on
    /// it only on a later turn of its loop, as with the thread.
    pub(crate) fn send(&self, job: Job) -> Result<(), Stopped> {
        match self {
            StoreJobs::Thread(tx) => tx.send(job).map_err(|_| Stopped),
            StoreJobs::Inline(inline) => {
                let mut g = inline.lock().unwrap_or_else(|e| e.into_inner());
                let Inline { store, done, log } = &mut *g;
                let Some(s) = store.as_mut() else {
                    return Err(Stopped);
                };
                if !run_job(s.as_mut(), job, done, log) {
                    *store = None;
                }
                Ok(())
            }
        }
    }
}

/// Runs one job; false when the store should stop.
fn run_job(
    store: &mut dyn Store,
    job: Job,
    done_tx: &mpsc::UnboundedSender<CommitDone>,
    log: &LogSink,
) -> bool {
    match job {
        Job::Stop => false,
        Job::Commit(c) => {
            let start = Instant::now();
            let mut slices: Vec<&[Record]> = Vec::with_capacity(2);
            let mut records = 0;
            if let Some((r, _)) = &c.custodian {
                records += r.len();
                slices.push(r);
            }
            if let Some((r, _)) = &c.receiver {
                records += r.len();
                slices.push(r);
            }
            let result = store.commit(c.now, &slices).map(|committed| {
                log.committed(c.now, &slices, &committed);
            });
            let micros = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
            drop(slices);
            let done = CommitDone {
                custodian: c.custodian.as_ref().map(|(_, t)| *t),
                receiver: c.receiver.as_ref().map(|(_, t)| *t),
                records,
                spent: Some(c),
                micros,
                result,
            };
            done_tx.send(done).is_ok()
        }
        Job::Query(q) => {
            match q {
                Query::Load(r) => {
                    let _ = r.send(store.load());
                }
                Query::Inbox(now, r) => {
                    let _ = r.send(store.inbox(now));
                }
                Query::List(state, after, limit, r) => {
                    let _ = r.send(store.list(state, after.as_ref(), limit));
                }
                Query::Escalations(after, limit, r) => {
                    let _ = r.send(store.escalations(after, limit));
                }
                Query::Decisions(after, limit, r) => {
                    let _ = r.send(store.decisions(after.as_ref(), limit));
                }
                Query::Events(from, limit, r) => {
                    let _ = r.send(store.events(from, limit));
                }
                Query::Compact(now, retention, r) => {
                    let _ = r.send(store.compact(now, retention));
                }
            }
            true
        }
    }
}

/// How often an idle store thread asks [`Store::health`].
const HEALTH_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// Starts the store thread. Commit results come back on the returned
/// receiver; the thread ends when the job sender is dropped.
pub(crate) fn spawn(
    mut store: Box<dyn Store>,
    log: LogSink,
) -> std::io::Result<(
    StoreJobs,
    mpsc::UnboundedReceiver<CommitDone>,
    Option<thread::JoinHandle<()>>,
)> {
    let (tx, rx) = std_mpsc::channel::<Job>();
    let (done_tx, done_rx) = mpsc::unbounded_channel();
    let handle = thread::Builder::new()
        .name("abhyasa-store".into())
        .spawn(move || {
            // A store error outside a commit stops the node as a failed
            // commit would: reported as one, with no tokens.
            let fail = |e| {
                let _ = done_tx.send(CommitDone {
                    custodian: None,
                    receiver: None,
                    records: 0,
                    spent: None,
                    micros: 0,
                    result: Err(e),
                });
            };
            loop {
                let next = match rx.try_recv() {
                    Ok(job) => Ok(job),
                    Err(std_mpsc::TryRecvError::Disconnected) => break,
                    Err(std_mpsc::TryRecvError::Empty) => {
                        // Nothing waits: the store's housekeeping (the log
                        // store grows its log ahead), then wait.
                        if let Err(e) = store.idle() {
                            fail(e);
                            break;
                        }
                        rx.recv_timeout(HEALTH_EVERY)
                    }
                };
                match next {
                    Ok(job) => {
                        if !run_job(store.as_mut(), job, &done_tx, &log) {
                            break;
                        }
                    }
                    Err(std_mpsc::RecvTimeoutError::Timeout) => {
                        // Idle: a store that can no longer be written (its
                        // lease was taken over) stops the node now, as a
                        // failed commit would, rather than at the next offer.
                        if let Err(e) = store.health() {
                            fail(e);
                            break;
                        }
                    }
                    Err(std_mpsc::RecvTimeoutError::Disconnected) => break,
                }
            }
        })?;
    Ok((StoreJobs::Thread(tx), done_rx, Some(handle)))
}

/// No thread: every job runs in the caller, on the driver's task for
/// commits. For simulations whose time and scheduling must stay on one
/// deterministic executor (turmoil); a commit then blocks the driver for
/// its duration, so use it with an in-memory store.
pub(crate) fn spawn_inline(
    store: Box<dyn Store>,
    log: LogSink,
) -> (StoreJobs, mpsc::UnboundedReceiver<CommitDone>) {
    let (done_tx, done_rx) = mpsc::unbounded_channel();
    let inline = Inline {
        store: Some(store),
        done: done_tx,
        log,
    };
    (StoreJobs::Inline(Arc::new(Mutex::new(inline))), done_rx)
}
