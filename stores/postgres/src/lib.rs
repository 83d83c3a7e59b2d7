//! # abhyasa-pg
//!
//! [`PgStore`]: the custody [`Store`] on PostgreSQL, for agents that must
//! survive the loss of their machine and for fleets that share one
//! operated database.
//!
//! * **Same rules as the embedded stores.** The custody semantics
//!   (idempotent offers, terminal marks, the ledger committed with its
//!   effect, the read-back check, the event log, compaction) are the code
//!   of `abhyasa_store::kv`, run over a SQL transaction instead of a redb
//!   one; one [`Store::commit`] is one SQL transaction holding every record
//!   of the group commit, durable before it returns (`synchronous_commit`
//!   on; a server with `fsync` off is refused).
//! * **A partition per agent.** Every row is keyed by `(partition, tbl,
//!   key)`; every statement names its partition, so reads are scoped and
//!   served by the primary-key index (`migrations/0001_init.sql`).
//! * **Leased ownership, fenced by epoch** (C-FL-1). Opening takes the
//!   partition's `abhyasa_owners` row (epoch + 1) when it is free or its
//!   lease lapsed on the database clock, else fails with
//!   [`StoreError::Owned`] (or [`StoreError::HolderInUse`] when the live
//!   lease is under this node's own holder name: never taken over, C-PA-4)
//!   or waits ([`Takeover`]). A thread renews the
//!   lease; every commit locks the owner row and re-checks its epoch inside
//!   its own transaction, so after a takeover a stale owner's commit fails
//!   with [`StoreError::Fenced`] and writes nothing.
//! * **In doubt is a crash.** A connection lost around `COMMIT` leaves the
//!   outcome unknown: the commit fails, the store refuses every later call,
//!   and the node stops; a restart loads what is durable (crash semantics),
//!   never guessing.
#![forbid(unsafe_code)]

mod migrate;
mod owner;
mod rows;

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::Duration;

use abhyasa_core::custody::Record;
use abhyasa_core::store::{
    Committed, Compacted, DurableState, EventId, Store, StoreError, StoredEvent,
};
use abhyasa_core::{AgentId, Timestamp};
use abhyasa_store::kv;
use postgres::{Client, IsolationLevel, NoTls};

pub use migrate::SCHEMA_VERSION;

use owner::Renewer;
use rows::{PgTxn, PgView};

const BACKEND: &str = "postgres";

/// The environment variable that names the database when the config does
/// not (`postgres://user@host:port/db`).
pub const URL_ENV: &str = "ABHYASA_PG_URL";

/// What [`PgStore::open`] does while another live holder owns the partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Takeover {
    /// Fail at once with [`StoreError::Owned`] (or
    /// [`StoreError::HolderInUse`]).
    Fail,
    /// Stand by: poll every `poll` until the lease lapses, then take over.
    Wait {
        /// How often to try.
        poll: Duration,
    },
}

/// Options of [`PgStore::open`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PgOptions {
    /// This node's name in `abhyasa_owners` (default: host, pid and start
    /// time, unique per process). Reopening under the same name while its
    /// lease lives is refused ([`StoreError::HolderInUse`]): a name copied
    /// between two configs never takes a live partition; a restart after a
    /// crash waits the lease out under [`Takeover::Wait`].
    pub holder: String,
    /// Lease length on the database clock; a standby takes over this long
    /// after the owner's last renewal.
    pub lease: Duration,
    /// Renewal period (`None`: commits only, for tests that let a lease
    /// lapse). Keep it well under `lease`.
    pub renew_every: Option<Duration>,
    /// What to do while another live holder owns the partition.
    pub takeover: Takeover,
    /// The partition to hold (`None`: the agent id). Lets several
    /// deployments (or test runs) that reuse agent names share one
    /// database without seeing each other's rows.
    pub partition: Option<String>,
}

impl Default for PgOptions {
    fn default() -> Self {
        let lease = Duration::from_secs(10);
        Self {
            holder: default_holder(),
            lease,
            renew_every: Some(lease / 3),
            takeover: Takeover::Fail,
            partition: None,
        }
    }
}

impl PgOptions {
    /// Options with a lease of `lease`, renewed every third of it.
    pub fn with_lease(lease: Duration) -> Self {
        Self {
            lease,
            renew_every: Some(lease / 3),
            ..Self::default()
        }
    }
}

fn default_holder() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".to_string());
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0);
    format!("{host}:{}:{started}", std::process::id())
}

/// Maps a client error to a [`StoreError`] naming what the store was doing.
pub(crate) fn pg_err(op: &'static str) -> impl Fn(postgres::Error) -> StoreError {
    move |e| StoreError::Backend {
        backend: BACKEND,
        op,
        source: Box::new(e),
    }
}

fn refused(op: &'static str, detail: String) -> StoreError {
    StoreError::Backend {
        backend: BACKEND,
        op,
        source: detail.into(),
    }
}

/// Connects and sets what durability and liveness need on the session.
pub(crate) fn connect(url: &str, lease: Duration) -> Result<Client, StoreError> {
    let mut config: postgres::Config = url.parse().map_err(pg_err("parse postgres_url"))?;
    config
        .connect_timeout(Duration::from_secs(10))
        .keepalives_idle(Duration::from_secs(5))
        .application_name("abhyasa");
    let mut client = config.connect(NoTls).map_err(pg_err("connect"))?;
    // synchronous_commit on: COMMIT returns only once the WAL is flushed.
    // idle_in_transaction_session_timeout: a paused owner holding the owner
    // row mid-commit loses its session (and the lock) within one lease.
    let idle = lease.as_millis().max(1000);
    client
        .batch_execute(&format!(
            "SET synchronous_commit = on; SET idle_in_transaction_session_timeout = {idle}"
        ))
        .map_err(pg_err("configure session"))?;
    let fsync: String = client
        .query_one("SELECT current_setting('fsync')", &[])
        .map_err(pg_err("read fsync setting"))?
        .get(0);
    if fsync != "on" {
        return Err(refused(
            "open",
            "the server runs with fsync = off: commits would not be durable".into(),
        ));
    }
    Ok(client)
}

/// The custody store on PostgreSQL (see the crate docs).
pub struct PgStore {
    client: Mutex<Conn>,
    partition: String,
    holder: String,
    epoch: i64,
    lease: Duration,
    format: u32,
    /// Why the store refuses every call (an in-doubt commit, a lost
    /// connection, fencing): the node must stop and restart from `load`.
    broken: Option<String>,
    /// Set after a [`StoreError::Fenced`]: later commits repeat it.
    fenced: Option<(i64, String)>,
    renewer: Option<Renewer>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("partition", &self.partition)
            .field("holder", &self.holder)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Opens the partition of `agent` (or [`PgOptions::partition`]) in the
    /// database at `url`: migrates the schema, takes ownership (see [`Takeover`]), checks the format
    /// version and starts the lease renewal. Fails with
    /// [`StoreError::Owned`] while another live holder owns it (under
    /// [`Takeover::Fail`]) and [`StoreError::NewerFormat`] for a database
    /// written by a newer build.
    pub fn open(url: &str, agent: &AgentId, options: &PgOptions) -> Result<Self, StoreError> {
        let partition = options
            .partition
            .clone()
            .unwrap_or_else(|| agent.as_str().to_string());
        let mut client = connect(url, options.lease)?;
        migrate::migrate(&mut client)?;
        let epoch = loop {
            match owner::try_take(&mut client, &partition, &options.holder, options.lease)? {
                Ok(epoch) => break epoch,
                Err(owned) => match options.takeover {
                    Takeover::Fail => return Err(owned),
                    Takeover::Wait { poll } => {
                        let left = match &owned {
                            StoreError::Owned { remaining_ms, .. }
                            | StoreError::HolderInUse { remaining_ms, .. } => {
                                Duration::from_millis(*remaining_ms)
                            }
                            _ => poll,
                        };
                        std::thread::sleep(left.clamp(Duration::from_millis(1), poll));
                    }
                },
            }
        };
        let mut store = Self {
            client: Mutex::new(Conn(Some(client))),
            partition,
            holder: options.holder.clone(),
            epoch,
            lease: options.lease,
            format: 0,
            broken: None,
            fenced: None,
            renewer: None,
        };
        store.format = match store.read(|v| kv::check_format(v))? {
            Some(v) if v < abhyasa_store::FORMAT_VERSION => {
                // An older partition: its indexes, counters and row
                // witnesses derived from its rows, in one transaction.
                let plan = store.read(|v| kv::plan_migration(v))?;
                store.write(|t| kv::migrate(t, &plan))?;
                abhyasa_store::FORMAT_VERSION
            }
            Some(v) => v,
            // Every open writes the format version right after it takes
            // the partition, so a partition taken before (epoch > 1) with
            // no rows lost them behind the store's back (a TRUNCATE, a
            // restore of the wrong dump): refused, never a new empty store.
            None if epoch > 1 => {
                return Err(StoreError::Corrupt {
                    table: "meta",
                    key: "format_version".into(),
                    detail: format!(
                        "partition {} was taken {} times before but holds no rows: its rows \
                         were deleted outside the store (restore them; if the partition never \
                         held custody, delete its abhyasa_owners row)",
                        store.partition,
                        epoch - 1
                    ),
                });
            }
            None => {
                store.write(|t| kv::init_format(t))?;
                abhyasa_store::FORMAT_VERSION
            }
        };
        if let Some(every) = options.renew_every {
            store.renewer = Some(Renewer::spawn(
                url.to_string(),
                store.partition.clone(),
                epoch,
                options.lease,
                every,
            )?);
        }
        Ok(store)
    }

    /// The partition (agent id) this store holds.
    pub fn partition(&self) -> &str {
        &self.partition
    }

    /// This node's holder name.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// The owner epoch this store writes under.
    pub fn epoch(&self) -> u64 {
        u64::try_from(self.epoch).unwrap_or(0)
    }

    /// The server process id of this store's session (`pg_stat_activity.pid`),
    /// for operators tracing a node's connection.
    pub fn backend_pid(&self) -> Result<i32, StoreError> {
        self.check_usable()?;
        let mut c = self.lock();
        let row = c
            .query_one("SELECT pg_backend_pid()", &[])
            .map_err(pg_err("read backend pid"))?;
        Ok(row.get(0))
    }

    /// True once the renewal thread found that another node took the
    /// partition over; the next commit fails with [`StoreError::Fenced`].
    pub fn lost_ownership(&self) -> bool {
        self.fenced.is_some()
            || self
                .renewer
                .as_ref()
                .is_some_and(|r| r.lost.load(Ordering::SeqCst))
    }

    fn check_usable(&self) -> Result<(), StoreError> {
        if let Some((current, holder)) = &self.fenced {
            return Err(StoreError::Fenced {
                ours: self.epoch(),
                current: u64::try_from(*current).unwrap_or(0),
                holder: holder.clone(),
            });
        }
        match &self.broken {
            Some(why) => Err(refused("use", why.clone())),
            None => Ok(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Conn> {
        // A panic while holding the client leaves nothing half-written on
        // our side (the server rolls back an unfinished transaction).
        self.client.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` over one consistent read-only snapshot of the partition.
    fn read<T>(
        &self,
        f: impl FnOnce(&PgView<'_, '_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.check_usable()?;
        let mut client = self.lock();
        let mut tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .map_err(pg_err("begin read"))?;
        let out = {
            let view = PgView {
                tx: RefCell::new(&mut tx),
                partition: &self.partition,
            };
            f(&view)?
        };
        tx.commit().map_err(pg_err("end read"))?;
        Ok(out)
    }

    /// Runs `f` in one fenced write transaction and commits it durably;
    /// nothing is written unless `f` and the fencing check succeed.
    fn write<T>(
        &mut self,
        f: impl FnOnce(&mut PgTxn<'_, '_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.write_with(Vec::new(), f)
    }

    fn write_with<T>(
        &mut self,
        prefetch: Vec<(kv::KvTable, Vec<u8>)>,
        f: impl FnOnce(&mut PgTxn<'_, '_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.check_usable()?;
        let (partition, epoch, lease) = (self.partition.clone(), self.epoch, self.lease);
        let mut client = self.client.lock().unwrap_or_else(|e| e.into_inner());
        let result: Result<T, WriteError> = (|| {
            let mut tx = client.transaction().map_err(pg_err("begin"))?;
            // C-FL-1: the fencing check comes first and holds the owner row
            // until COMMIT, so no takeover can slip in between.
            owner::fence(&mut tx, &partition, epoch, lease)?;
            let out = {
                let mut txn = PgTxn::new(&mut tx, &partition, epoch);
                txn.prefetch(prefetch)?;
                let out = f(&mut txn)?;
                txn.flush()?;
                out
            };
            tx.commit()
                .map_err(|e| WriteError::Committing(pg_err("commit")(e)))?;
            Ok(out)
        })();
        let closed = client.is_closed();
        drop(client);
        if result.is_ok() {
            // The fencing check extended the lease.
            if let Some(r) = &self.renewer {
                r.renewed();
            }
        }
        result.map_err(|e| self.fail(e, closed))
    }

    /// Records why a write failed and what that leaves of the store.
    fn fail(&mut self, e: WriteError, closed: bool) -> StoreError {
        match e {
            WriteError::Refused(StoreError::Fenced {
                current, holder, ..
            }) => {
                self.fenced = Some((i64::try_from(current).unwrap_or(0), holder.clone()));
                StoreError::Fenced {
                    ours: self.epoch(),
                    current,
                    holder,
                }
            }
            WriteError::Committing(e) if closed => {
                self.broken = Some(format!(
                    "a commit is in doubt (the connection was lost during COMMIT: {e}); \
                     restart the node and load what is durable"
                ));
                refused("commit", self.broken.clone().unwrap_or_default())
            }
            WriteError::Refused(e) | WriteError::Committing(e) => {
                if closed {
                    self.broken = Some(format!(
                        "the database connection was lost ({e}); restart the node"
                    ));
                }
                e
            }
        }
    }
}

/// Why a write transaction failed: before `COMMIT` (nothing was written)
/// or at it (the outcome may be unknown).
enum WriteError {
    Refused(StoreError),
    Committing(StoreError),
}

impl From<StoreError> for WriteError {
    fn from(e: StoreError) -> Self {
        WriteError::Refused(e)
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        drop(self.renewer.take());
        let release = self.broken.is_none() && self.fenced.is_none();
        let (partition, epoch) = (&self.partition, self.epoch);
        let conn = self.client.get_mut().unwrap_or_else(|e| e.into_inner());
        let Some(mut client) = conn.0.take() else {
            return;
        };
        // The synchronous client runs a runtime of its own, which panics
        // inside another: a node that stops on an error drops its store
        // from async code. So the release and the client's own close run
        // on a thread of their own; the lease is still ended at once.
        std::thread::scope(|s| {
            let _ = s
                .spawn(move || {
                    if release {
                        owner::release(&mut client, partition, epoch);
                    }
                    drop(client);
                })
                .join();
        });
    }
}

/// The store's connection: always present while the store is alive; taken
/// only by its `Drop`, which closes it off any async runtime.
struct Conn(Option<Client>);

impl std::ops::Deref for Conn {
    type Target = Client;
    fn deref(&self) -> &Client {
        self.0
            .as_ref()
            .expect("the connection is taken only when the store drops")
    }
}

impl std::ops::DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut Client {
        self.0
            .as_mut()
            .expect("the connection is taken only when the store drops")
    }
}

impl Store for PgStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn format_version(&self) -> u32 {
        self.format
    }

    fn commit(&mut self, now: Timestamp, batches: &[&[Record]]) -> Result<Committed, StoreError> {
        let set = kv::read_set(batches);
        self.write_with(set, |t| kv::commit(t, now, batches))
    }

    fn load(&self) -> Result<DurableState, StoreError> {
        self.read(|v| kv::load(v))
    }

    fn events(&self, from: EventId, limit: usize) -> Result<Vec<StoredEvent>, StoreError> {
        self.read(|v| kv::events(v, from, limit))
    }

    /// Refuses once the partition is no longer surely ours: the renewal
    /// thread saw another epoch in force ([`StoreError::Fenced`]), or the
    /// lease went a whole term without being extended (the database was
    /// out of reach, so a standby may have taken over). Either way the node
    /// stops now, even with nothing to commit (C-FL-1).
    fn health(&self) -> Result<(), StoreError> {
        self.check_usable()?;
        let Some(r) = &self.renewer else {
            return Ok(());
        };
        if r.lost.load(Ordering::SeqCst) {
            let mut client = self.lock();
            return Err(owner::fenced(&mut **client, &self.partition, self.epoch));
        }
        let since = r.since_renewal();
        if since > self.lease {
            // A whole term without renewal (this process was paused, or the
            // database out of reach): ask the database itself.
            let mut client = self.lock();
            match owner::renew(&mut **client, &self.partition, self.epoch, self.lease) {
                Ok(true) => {
                    drop(client);
                    r.renewed();
                    return Ok(());
                }
                Ok(false) => return Err(owner::fenced(&mut **client, &self.partition, self.epoch)),
                Err(_) => {}
            }
            return Err(refused(
                "renew lease",
                format!(
                    "the lease ({} ms) was not extended for {} ms (is the database \
                     reachable?); a standby may own the partition now",
                    self.lease.as_millis(),
                    since.as_millis()
                ),
            ));
        }
        Ok(())
    }

    fn compact(&mut self, now: Timestamp, retention: Duration) -> Result<Compacted, StoreError> {
        // The owner is the partition's single writer (fenced), so nothing
        // changes between the plan and the deletions.
        let (dels, out) = self.read(|v| kv::plan_compaction(v, now, retention))?;
        if !dels.is_empty() {
            self.write(|t| kv::delete(t, &dels))?;
        }
        Ok(out)
    }
}
