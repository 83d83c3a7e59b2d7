//! [`FjallStore`]: the store on fjall 3 (an LSM-tree), one database per
//! node, one keyspace per table.
//!
//! # Durability
//!
//! A commit runs the engine over a transaction of its own: reads see the
//! keyspaces with this commit's writes laid over them, and the writes are
//! kept in memory until the engine is done. They are then handed to fjall
//! as one write batch, which fjall appends to its journal as one entry
//! (checksummed; a torn entry is dropped whole on recovery, with every
//! keyspace it touches) and makes durable with `fdatasync`
//! (`PersistMode::SyncData`) before `commit` returns. fjall flushes
//! memtables and compacts tables on its own threads; a journal is deleted
//! only once every memtable it holds has been written out, so every
//! commit reported durable is either in a journal or in a table.
//!
//! Memory is bounded by fjall's memtables (what its journals hold, 64 MiB
//! here, see [`JOURNAL_BYTES`]), its block cache
//! ([`StoreOptions::cache_bytes`]) and a commit's own writes, not by the
//! data held: the store keeps no rows of its own between commits. A
//! restart replays at most that much journal.

use std::path::{Path, PathBuf};
use std::time::Duration;

use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode, Slice};

use abhyasa_core::custody::Record;
use abhyasa_core::store::{Committed, Compacted, Store, StoreError};
use abhyasa_core::Timestamp;

use crate::engine::{self, Table, Txn, View, Visit};
use crate::guard::guarded;
use crate::index;
use crate::{QuarantinedRow, Repair, StoreOptions};

const BACKEND: &str = "fjall";

/// Journal bytes fjall keeps before it flushes the memtables they hold
/// (fjall's floor; its default is 512 MiB): what is not yet in a table is
/// in a journal, so this also bounds the memtables' sum. A restart replays
/// them all: on 1,000,000 pending obligations, 512 MiB of journal took the
/// recovery to 3.8 s and 700 B per pending, 64 MiB to 2.6 s and 642 B
/// (`store_bench --store fjall --only-scale --pending 1000000`).
const JOURNAL_BYTES: u64 = 64 << 20;

fn backend(op: &'static str, e: fjall::Error) -> StoreError {
    match e {
        fjall::Error::Io(source) => StoreError::Io { op, source },
        other => StoreError::Backend {
            backend: BACKEND,
            op,
            source: Box::new(other),
        },
    }
}

/// The store on fjall. See the module docs for how a commit is made
/// durable.
pub struct FjallStore {
    db: Database,
    keyspaces: Vec<Keyspace>,
    path: PathBuf,
    format: u32,
}

impl std::fmt::Debug for FjallStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FjallStore")
            .field("path", &self.path)
            .field("format", &self.format)
            .finish_non_exhaustive()
    }
}

/// A commit's writes, by table: `None` deletes the key. Held as fjall's
/// own byte slices, so the batch takes them without another copy. A hash
/// map, not an ordered one: the batch needs each key once (its entries
/// share one sequence number) but in no order, and the engine's reads of
/// its own writes are point lookups; ordering them had cost ~3% of a
/// custody run's instructions in key comparisons.
type Overlay = Vec<abhyasa_core::Map<Slice, Option<Slice>>>;

/// A write transaction: the keyspaces as they are, with `writes` laid
/// over them. Nothing reaches fjall until [`FjallStore::transact`] hands
/// `writes` over as one batch.
struct FjallTxn<'a> {
    keyspaces: &'a [Keyspace],
    writes: Overlay,
}

impl Txn for FjallTxn<'_> {
    fn get(&mut self, t: Table, k: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if let Some(w) = self.writes[t.index()].get(k) {
            return Ok(w.as_ref().map(|v| v.to_vec()));
        }
        Ok(self.keyspaces[t.index()]
            .get(k)
            .map_err(|e| backend("read", e))?
            .map(|v| v.to_vec()))
    }

    fn put(&mut self, t: Table, k: &[u8], v: &[u8]) -> Result<(), StoreError> {
        self.writes[t.index()].insert(Slice::from(k), Some(Slice::from(v)));
        Ok(())
    }

    fn del(&mut self, t: Table, k: &[u8]) -> Result<(), StoreError> {
        self.writes[t.index()].insert(Slice::from(k), None);
        Ok(())
    }
}

/// Reads straight from the keyspaces. Consistent: the store is its own
/// only writer, and a commit takes `&mut self`, so no batch is applied
/// while a view (borrowing `&self`) reads.
struct FjallView<'a>(&'a [Keyspace]);

impl View for FjallView<'_> {
    fn get(&self, t: Table, k: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        guarded(BACKEND, "read", || {
            Ok(self.0[t.index()]
                .get(k)
                .map_err(|e| backend("read", e))?
                .map(|v| v.to_vec()))
        })
    }

    fn scan(&self, t: Table, from: &[u8], f: &mut Visit<'_>) -> Result<(), StoreError> {
        guarded(BACKEND, "scan", || {
            for item in self.0[t.index()].range(from..) {
                let (k, v) = item.into_inner().map_err(|e| backend("scan", e))?;
                if !f(&k, &v)? {
                    break;
                }
            }
            Ok(())
        })
    }
}

impl FjallStore {
    /// Opens (or creates) the database in directory `path` with default
    /// options.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(path, &StoreOptions::default())
    }

    /// Opens (or creates) the database in directory `path`, replaying its
    /// journal. Fails with [`StoreError::NewerFormat`] if it was written by
    /// a newer format.
    pub fn open_with(path: impl AsRef<Path>, options: &StoreOptions) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        if !path.exists() {
            // fjall creates a database in several steps (directories, lock,
            // journal, version marker, one keyspace per table), and refuses
            // to finish one a power cut interrupted ("File exists"): build
            // it whole under a temporary name first. C-ST-1.
            crate::create_then_rename(&path, |tmp| {
                Self::open_existing(tmp.to_path_buf(), options, false).map(drop)
            })?;
        }
        // fjall truncates a journal at damage it cannot decode and drops
        // what follows: damage is refused before fjall sees it.
        crate::fjall_journal::check(&path)?;
        Self::open_existing(path, options, true)
    }

    /// `existed`: the directory was there before this open, so it must
    /// hold a format version (`engine::setup_existing`).
    fn open_existing(
        path: PathBuf,
        options: &StoreOptions,
        existed: bool,
    ) -> Result<Self, StoreError> {
        guarded(BACKEND, "open", || {
            Self::open_guarded(path, options, existed)
        })
    }

    fn open_guarded(
        path: PathBuf,
        options: &StoreOptions,
        existed: bool,
    ) -> Result<Self, StoreError> {
        let existing = existed.then(|| path.clone());
        let db = Database::builder(&path)
            .cache_size(options.cache_bytes)
            .max_journaling_size(JOURNAL_BYTES)
            .open()
            .map_err(|e| backend("open", e))?;
        let keyspaces = Table::ALL
            .iter()
            .map(|t| {
                db.keyspace(t.name(), KeyspaceCreateOptions::default)
                    .map_err(|e| backend("open keyspace", e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        // A new keyspace is named in fjall's meta keyspace, through the
        // journal: sync it, so that nothing below starts on state a crash
        // could take back. fjall syncs each new keyspace's own folder but
        // not the `keyspaces` folder that names it (3.1.13): a power cut
        // could drop the folder, and fjall would then recreate the
        // keyspace empty, under every commit later made to it. Sync that
        // folder too (found by the FUSE power-loss test). C-ST-1.
        db.persist(PersistMode::SyncAll)
            .map_err(|e| backend("persist", e))?;
        std::fs::File::open(path.join("keyspaces"))
            .and_then(|d| d.sync_all())
            .map_err(|source| StoreError::Io {
                op: "sync fjall's keyspaces folder",
                source,
            })?;
        let mut s = Self {
            db,
            keyspaces,
            path,
            format: 0,
        };
        let (format, setup) =
            engine::setup_existing(&FjallView(&s.keyspaces), existing.as_deref())?;
        if let Some(w) = setup {
            s.transact(w.op(), |t| w.write(t))?;
        }
        s.format = format;
        Ok(s)
    }

    /// The database directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes the database occupies on disk (journals and tables).
    pub fn size_on_disk(&self) -> Result<u64, StoreError> {
        self.db.disk_space().map_err(|e| backend("size", e))
    }

    /// Runs `f` over a transaction and, if it succeeds, writes its writes
    /// as one batch, durable (`fdatasync`) before this returns. If `f`
    /// fails, nothing was written.
    fn transact<T>(
        &mut self,
        op: &'static str,
        f: impl FnOnce(&mut FjallTxn<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        guarded(BACKEND, op, || {
            let mut t = FjallTxn {
                keyspaces: &self.keyspaces,
                writes: Table::ALL.iter().map(|_| Default::default()).collect(),
            };
            let out = f(&mut t)?;
            let writes = t.writes;
            // An empty batch commits nothing: fjall neither writes nor syncs it.
            let mut batch = self.db.batch().durability(Some(PersistMode::SyncData));
            for (ks, rows) in self.keyspaces.iter().zip(writes) {
                for (k, v) in rows {
                    match v {
                        Some(v) => batch.insert(ks, k, v),
                        None => batch.remove(ks, k),
                    }
                }
            }
            batch.commit().map_err(|e| backend(op, e))?;
            Ok(out)
        })
    }
}

impl Store for FjallStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn format_version(&self) -> u32 {
        self.format
    }

    fn commit(&mut self, now: Timestamp, batches: &[&[Record]]) -> Result<Committed, StoreError> {
        self.transact("commit", |t| engine::commit(t, now, batches))
    }

    reads_through_view!(self => FjallView(&self.keyspaces));

    fn compact(&mut self, now: Timestamp, retention: Duration) -> Result<Compacted, StoreError> {
        let (dels, out) = engine::plan_compaction(&FjallView(&self.keyspaces), now, retention)?;
        if !dels.is_empty() {
            self.transact("compact", |t| engine::delete(t, &dels))?;
        }
        Ok(out)
    }
}

impl Repair for FjallStore {
    repair_reads_through_view!(self => FjallView(&self.keyspaces));

    fn quarantine(&mut self, now: Timestamp) -> Result<Vec<QuarantinedRow>, StoreError> {
        let bad = engine::check(&FjallView(&self.keyspaces))?;
        if bad.is_empty() {
            return Ok(Vec::new());
        }
        let moved = self.transact("quarantine", |t| engine::quarantine(t, now, &bad))?;
        let plan = index::plan_rebuild(&FjallView(&self.keyspaces))?;
        self.transact("reindex", |t| engine::finish_rebuild(t, &plan))?;
        Ok(moved)
    }
}
