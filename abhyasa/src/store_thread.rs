//! The store runs on its own thread: commits (with their fsync) never block
//! the driver, which keeps feeding the state machines while a batch is in
//! flight. Exactly one commit is in flight at a time, in order.

use std::sync::mpsc as std_mpsc;
use std::thread;
use std::time::Instant;

use abhyasa_core::custody::{CommitToken, Record};
use abhyasa_core::store::{DurableState, EventId, Inbox, Store, StoreError, StoredEvent};
use abhyasa_core::Timestamp;
use tokio::sync::{mpsc, oneshot};

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
    pub(crate) micros: u64,
    pub(crate) result: Result<(), StoreError>,
}

/// A read of the store.
#[derive(Debug)]
pub(crate) enum Query {
    Load(oneshot::Sender<Result<DurableState, StoreError>>),
    Inbox(Timestamp, oneshot::Sender<Result<Inbox, StoreError>>),
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

/// Starts the store thread. Commit results come back on the returned
/// receiver; the thread ends when the job sender is dropped.
pub(crate) fn spawn(
    mut store: Box<dyn Store>,
) -> std::io::Result<(
    std_mpsc::Sender<Job>,
    mpsc::UnboundedReceiver<CommitDone>,
    thread::JoinHandle<()>,
)> {
    let (tx, rx) = std_mpsc::channel::<Job>();
    let (done_tx, done_rx) = mpsc::unbounded_channel();
    let handle = thread::Builder::new()
        .name("abhyasa-store".into())
        .spawn(move || {
            while let Ok(job) = rx.recv() {
                match job {
                    Job::Stop => break,
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
                        let result = store.commit(c.now, &slices).map(|_| ());
                        let done = CommitDone {
                            custodian: c.custodian.as_ref().map(|(_, t)| *t),
                            receiver: c.receiver.as_ref().map(|(_, t)| *t),
                            records,
                            micros: u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX),
                            result,
                        };
                        if done_tx.send(done).is_err() {
                            break;
                        }
                    }
                    Job::Query(q) => match q {
                        Query::Load(r) => {
                            let _ = r.send(store.load());
                        }
                        Query::Inbox(now, r) => {
                            let _ = r.send(store.inbox(now));
                        }
                        Query::Events(from, limit, r) => {
                            let _ = r.send(store.events(from, limit));
                        }
                        Query::Compact(now, retention, r) => {
                            let _ = r.send(store.compact(now, retention));
                        }
                    },
                }
            }
        })?;
    Ok((tx, done_rx, handle))
}
