//! Ownership of a partition: a lease on the database clock, an epoch that
//! grows with every takeover, and the fencing check every commit makes in
//! its own transaction (C-FL-1).
//!
//! Why not session advisory locks: the holder of one is never told it lost
//! it (a dropped and re-established connection, a server restart), so a
//! paused owner could resume and write. Here a write lands only in a
//! transaction that first locked the `abhyasa_owners` row and found its own
//! epoch there; a takeover must lock the same row, so the two are ordered
//! by the database and a stale owner's commit is refused.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use abhyasa_core::store::StoreError;
use postgres::{Client, GenericClient, Transaction};

use crate::{connect, pg_err};

/// Takes the partition for `holder` if it is free or its lease has
/// lapsed. Returns the new epoch, or who holds it: a live lease under
/// `holder`'s own name is refused too ([`StoreError::HolderInUse`]), since
/// a copied configuration cannot be told from a restart (C-PA-4); a clean
/// stop ends its lease at once, a crashed owner's lapses.
pub(crate) fn try_take(
    client: &mut Client,
    partition: &str,
    holder: &str,
    lease: Duration,
) -> Result<Result<i64, StoreError>, StoreError> {
    let mut tx = client.transaction().map_err(pg_err("begin takeover"))?;
    // A paused owner may hold the row lock mid-commit; its session is ended
    // by idle_in_transaction_session_timeout. Do not queue behind it forever.
    tx.batch_execute("SET LOCAL lock_timeout = '2s'")
        .map_err(pg_err("takeover"))?;
    let row = tx
        .query_opt(
            "INSERT INTO abhyasa_owners (partition, holder, epoch, lease_until)
             VALUES ($1, $2, 1, now() + $3::float8 * interval '1 millisecond')
             ON CONFLICT (partition) DO UPDATE
               SET holder = EXCLUDED.holder,
                   epoch = abhyasa_owners.epoch + 1,
                   lease_until = EXCLUDED.lease_until,
                   taken_at = now()
               WHERE abhyasa_owners.lease_until <= now()
             RETURNING epoch",
            &[&partition, &holder, &millis(lease)],
        )
        .map_err(pg_err("take ownership"))?;
    let out = match row {
        Some(r) => Ok(r.get::<_, i64>(0)),
        None => {
            let r = tx
                .query_one(
                    "SELECT holder,
                            greatest(0, ceil(extract(epoch FROM lease_until - now()) * 1000))::bigint
                     FROM abhyasa_owners WHERE partition = $1",
                    &[&partition],
                )
                .map_err(pg_err("read owner"))?;
            let (owner, remaining_ms) = (
                r.get::<_, String>(0),
                u64::try_from(r.get::<_, i64>(1)).unwrap_or(0),
            );
            if owner == holder {
                Err(StoreError::HolderInUse {
                    holder: owner,
                    remaining_ms,
                })
            } else {
                Err(StoreError::Owned {
                    holder: owner,
                    remaining_ms,
                })
            }
        }
    };
    tx.commit().map_err(pg_err("commit takeover"))?;
    Ok(out)
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The fencing check, first statement of every write transaction: locks
/// the owner row (a takeover now waits for this transaction), renews the
/// lease, and fails with [`StoreError::Fenced`] if the epoch moved on.
pub(crate) fn fence(
    tx: &mut Transaction<'_>,
    partition: &str,
    epoch: i64,
    lease: Duration,
) -> Result<(), StoreError> {
    if renew(tx, partition, epoch, lease)? {
        return Ok(());
    }
    Err(fenced(tx, partition, epoch))
}

/// Extends the lease of `epoch`; false if `epoch` no longer owns it.
pub(crate) fn renew(
    c: &mut impl GenericClient,
    partition: &str,
    epoch: i64,
    lease: Duration,
) -> Result<bool, StoreError> {
    let n = c
        .execute(
            "UPDATE abhyasa_owners
             SET lease_until = greatest(lease_until, now() + $3::float8 * interval '1 millisecond')
             WHERE partition = $1 AND epoch = $2",
            &[&partition, &epoch, &millis(lease)],
        )
        .map_err(pg_err("check ownership"))?;
    Ok(n == 1)
}

/// The [`StoreError::Fenced`] naming who owns `partition` now.
pub(crate) fn fenced(c: &mut impl GenericClient, partition: &str, ours: i64) -> StoreError {
    let (holder, current) = match c.query_opt(
        "SELECT holder, epoch FROM abhyasa_owners WHERE partition = $1",
        &[&partition],
    ) {
        Ok(Some(r)) => (r.get::<_, String>(0), r.get::<_, i64>(1)),
        _ => ("nobody".to_string(), 0),
    };
    StoreError::Fenced {
        ours: u64::try_from(ours).unwrap_or(0),
        current: u64::try_from(current).unwrap_or(0),
        holder,
    }
}

/// Ends the lease of `epoch` now, so a standby takes over at once after a
/// clean stop (a crashed owner's lease simply lapses).
pub(crate) fn release(client: &mut Client, partition: &str, epoch: i64) {
    // Best effort: if it fails the lease lapses on its own.
    let _ = client.execute(
        "UPDATE abhyasa_owners SET lease_until = now() WHERE partition = $1 AND epoch = $2",
        &[&partition, &epoch],
    );
}

/// The renewal thread: keeps the lease alive while the node idles (commits
/// renew it too). It never decides anything: if the epoch moved on it only
/// raises `lost`; the next commit is refused by its own fencing check.
pub(crate) struct Renewer {
    stop: Option<mpsc::Sender<()>>,
    handle: Option<thread::JoinHandle<()>>,
    /// Set once a renewal found another epoch in force.
    pub(crate) lost: Arc<AtomicBool>,
    /// When the lease was last extended (by this thread or a commit): on
    /// this machine's monotonic clock, to tell how long the lease may have
    /// been lapsing while the database was out of reach.
    pub(crate) renewed_at: Arc<Mutex<Instant>>,
}

impl Renewer {
    /// Notes that the lease was extended now (a commit's fencing check
    /// extends it too).
    pub(crate) fn renewed(&self) {
        *self.renewed_at.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    /// How long since the lease was last extended.
    pub(crate) fn since_renewal(&self) -> Duration {
        self.renewed_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
    }
}

impl Renewer {
    pub(crate) fn spawn(
        url: String,
        partition: String,
        epoch: i64,
        lease: Duration,
        every: Duration,
    ) -> Result<Self, StoreError> {
        let mut client = Some(connect(&url, lease)?);
        let (stop, rx) = mpsc::channel::<()>();
        let lost = Arc::new(AtomicBool::new(false));
        let flag = lost.clone();
        let renewed_at = Arc::new(Mutex::new(Instant::now()));
        let stamp = renewed_at.clone();
        let handle = thread::Builder::new()
            .name("abhyasa-pg-lease".into())
            .spawn(move || loop {
                match rx.recv_timeout(every) {
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    // Stopped, or the store is gone.
                    _ => return,
                }
                if client.as_ref().is_none_or(|c| c.is_closed()) {
                    // Reconnect on the next tick at the latest; meanwhile
                    // the lease may lapse, which fencing makes safe.
                    client = connect(&url, lease).ok();
                }
                let Some(c) = client.as_mut() else { continue };
                match renew(c, &partition, epoch, lease) {
                    Ok(true) => *stamp.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now(),
                    Ok(false) => {
                        flag.store(true, Ordering::SeqCst);
                        return;
                    }
                    Err(_) => client = None,
                }
            })
            .map_err(|source| StoreError::Io {
                op: "spawn lease renewal thread",
                source,
            })?;
        Ok(Self {
            stop: Some(stop),
            handle: Some(handle),
            lost,
            renewed_at,
        })
    }
}

impl Drop for Renewer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
