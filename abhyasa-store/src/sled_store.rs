//! [`SledStore`]: the store on sled 0.34, one database per node, one tree
//! per table.
//!
//! # Durability
//!
//! sled 0.34.7's `Db::flush()` writes its I/O buffers with
//! `sync_file_range(WAIT_BEFORE | WRITE | WAIT_AFTER)` on Linux
//! (`pagecache/iobuf.rs`), which neither flushes the drive's cache nor the
//! file's metadata; a real `sync_all` only runs on its 500 ms background
//! timer and on drop. Values too large for a segment go to `blobs/` files
//! written without any sync (`pagecache/blob_io.rs`). So a commit here is:
//! one sled transaction across the trees (atomic on recovery), `flush()`,
//! then `fsync` of the data file through our own descriptor (fsync acts on
//! the inode, whichever descriptor asks), of any blob file created since
//! the last commit and of the blob directory. Only then does `commit`
//! return.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sled::transaction::{
    ConflictableTransactionError, TransactionError, UnabortableTransactionError,
};
use sled::Transactional;

use abhyasa_core::custody::Record;
use abhyasa_core::store::{Committed, Compacted, Store, StoreError};
use abhyasa_core::Timestamp;

use crate::engine::{self, Table, Txn, View, Visit};
use crate::guard::guarded;
use crate::index;
use crate::{QuarantinedRow, Repair, StoreOptions};

const BACKEND: &str = "sled";

fn backend(op: &'static str, e: sled::Error) -> StoreError {
    match e {
        sled::Error::Io(source) => StoreError::Io { op, source },
        other => StoreError::Backend {
            backend: BACKEND,
            op,
            source: Box::new(other),
        },
    }
}

fn io(op: &'static str) -> impl FnOnce(std::io::Error) -> StoreError {
    move |source| StoreError::Io { op, source }
}

/// The store on sled. See the module docs for how a commit is made
/// durable.
#[derive(Debug)]
pub struct SledStore {
    db: sled::Db,
    trees: Vec<sled::Tree>,
    path: PathBuf,
    data_file: File,
    synced_blobs: BTreeSet<std::ffi::OsString>,
    format: u32,
}

struct SledTxn<'a> {
    trees: &'a [sled::transaction::TransactionalTree],
    conflict: bool,
}

impl SledTxn<'_> {
    fn map(&mut self, e: UnabortableTransactionError) -> StoreError {
        match e {
            UnabortableTransactionError::Conflict => {
                // sled retries the whole closure; remember why it stopped.
                self.conflict = true;
                StoreError::Backend {
                    backend: BACKEND,
                    op: "transaction",
                    source: "transaction conflict".into(),
                }
            }
            UnabortableTransactionError::Storage(e) => backend("transaction", e),
        }
    }
}

impl Txn for SledTxn<'_> {
    fn get(&mut self, t: Table, k: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        match self.trees[t.index()].get(k) {
            Ok(v) => Ok(v.map(|v| v.to_vec())),
            Err(e) => Err(self.map(e)),
        }
    }

    fn put(&mut self, t: Table, k: &[u8], v: &[u8]) -> Result<(), StoreError> {
        match self.trees[t.index()].insert(k, v) {
            Ok(_) => Ok(()),
            Err(e) => Err(self.map(e)),
        }
    }

    fn del(&mut self, t: Table, k: &[u8]) -> Result<(), StoreError> {
        match self.trees[t.index()].remove(k) {
            Ok(_) => Ok(()),
            Err(e) => Err(self.map(e)),
        }
    }
}

struct SledView<'a>(&'a [sled::Tree]);

impl View for SledView<'_> {
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
                let (k, v) = item.map_err(|e| backend("scan", e))?;
                if !f(&k, &v)? {
                    break;
                }
            }
            Ok(())
        })
    }
}

/// How long [`SledStore::open_with`] waits for a lock sled itself still
/// holds.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// Opens sled at `path`. sled 0.34 releases a database's file lock only
/// when the last of its background threads lets go of it, a little after
/// the `Db` is dropped: a store closed and reopened in the same process
/// (a restart of an embedded node, the tests) can find its own lock still
/// held. Waits up to [`LOCK_WAIT`] for that lock, then reports it.
fn open_db(path: &Path, options: &StoreOptions) -> Result<sled::Db, StoreError> {
    let started = std::time::Instant::now();
    loop {
        let r = sled::Config::new()
            .path(path)
            .cache_capacity(options.cache_bytes)
            .open();
        match r {
            Err(sled::Error::Io(e))
                if e.to_string().contains("could not acquire lock")
                    && started.elapsed() < LOCK_WAIT =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            r => return r.map_err(|e| backend("open", e)),
        }
    }
}

impl SledStore {
    /// Opens (or creates) the database in directory `path` with default
    /// options.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(path, &StoreOptions::default())
    }

    /// Opens (or creates) the database in directory `path`. Fails with
    /// [`StoreError::NewerFormat`] if it was written by a newer format.
    pub fn open_with(path: impl AsRef<Path>, options: &StoreOptions) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        guarded(BACKEND, "open", || Self::open_guarded(path, options))
    }

    fn open_guarded(path: PathBuf, options: &StoreOptions) -> Result<Self, StoreError> {
        // A directory that holds files already is a database that must
        // hold a format version (`engine::setup_existing`): sled would make
        // a new, empty one in place of a missing data file.
        let existing = std::fs::read_dir(&path)
            .is_ok_and(|mut d| d.next().is_some())
            .then(|| path.clone());
        let db = open_db(&path, options)?;
        let trees = Table::ALL
            .iter()
            .map(|t| db.open_tree(t.name()).map_err(|e| backend("open tree", e)))
            .collect::<Result<Vec<_>, _>>()?;
        let data_file = File::options()
            .read(true)
            .write(true)
            .open(path.join("db"))
            .map_err(io("open data file for fsync"))?;
        let mut s = Self {
            db,
            trees,
            path,
            data_file,
            synced_blobs: BTreeSet::new(),
            format: 0,
        };
        s.synced_blobs = s.blob_names()?;
        let (format, setup) = engine::setup_existing(&SledView(&s.trees), existing.as_deref())?;
        if let Some(w) = setup {
            s.transact(w.op(), |t| w.write(t))?;
            s.sync()?;
        }
        s.format = format;
        Ok(s)
    }

    /// The database directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes the database occupies on disk.
    pub fn size_on_disk(&self) -> Result<u64, StoreError> {
        self.db.size_on_disk().map_err(|e| backend("size", e))
    }

    fn blob_names(&self) -> Result<BTreeSet<std::ffi::OsString>, StoreError> {
        let dir = self.path.join("blobs");
        let mut out = BTreeSet::new();
        match std::fs::read_dir(&dir) {
            Ok(rd) => {
                for e in rd {
                    out.insert(e.map_err(io("list blobs"))?.file_name());
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(StoreError::Io {
                    op: "list blobs",
                    source: e,
                })
            }
        }
        Ok(out)
    }

    /// Makes everything sled has written durable (see the module docs).
    fn sync(&mut self) -> Result<(), StoreError> {
        self.db.flush().map_err(|e| backend("flush", e))?;
        self.data_file.sync_all().map_err(io("fsync data file"))?;
        let now = self.blob_names()?;
        let dir = self.path.join("blobs");
        let mut new_blob = false;
        for name in now.difference(&self.synced_blobs) {
            new_blob = true;
            match File::open(dir.join(name)) {
                Ok(f) => f.sync_all().map_err(io("fsync blob"))?,
                // Garbage-collected since it was listed.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(StoreError::Io {
                        op: "open blob",
                        source: e,
                    })
                }
            }
        }
        if new_blob {
            File::open(&dir)
                .and_then(|d| d.sync_all())
                .map_err(io("fsync blob directory"))?;
        }
        self.synced_blobs = now;
        Ok(())
    }

    fn transact<T>(
        &self,
        op: &'static str,
        f: impl Fn(&mut SledTxn<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let r = guarded(BACKEND, op, || {
            Ok(self.trees.as_slice().transaction(|trees| {
                let mut t = SledTxn {
                    trees: trees.as_slice(),
                    conflict: false,
                };
                match f(&mut t) {
                    Ok(v) => Ok(v),
                    Err(_) if t.conflict => Err(ConflictableTransactionError::Conflict),
                    Err(e) => Err(ConflictableTransactionError::Abort(e)),
                }
            }))
        })?;
        match r {
            Ok(v) => Ok(v),
            Err(TransactionError::Abort(e)) => Err(e),
            Err(TransactionError::Storage(e)) => Err(backend(op, e)),
        }
    }
}

impl Store for SledStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn format_version(&self) -> u32 {
        self.format
    }

    fn commit(&mut self, now: Timestamp, batches: &[&[Record]]) -> Result<Committed, StoreError> {
        let c = self.transact("commit", |t| engine::commit(t, now, batches))?;
        self.sync()?;
        Ok(c)
    }

    reads_through_view!(self => SledView(&self.trees));

    fn compact(&mut self, now: Timestamp, retention: Duration) -> Result<Compacted, StoreError> {
        let (dels, out) = engine::plan_compaction(&SledView(&self.trees), now, retention)?;
        if !dels.is_empty() {
            self.transact("compact", |t| engine::delete(t, &dels))?;
            self.sync()?;
        }
        Ok(out)
    }
}

impl Repair for SledStore {
    repair_reads_through_view!(self => SledView(&self.trees));

    fn quarantine(&mut self, now: Timestamp) -> Result<Vec<QuarantinedRow>, StoreError> {
        let bad = engine::check(&SledView(&self.trees))?;
        if bad.is_empty() {
            return Ok(Vec::new());
        }
        let moved = self.transact("quarantine", |t| engine::quarantine(t, now, &bad))?;
        self.sync()?;
        let plan = index::plan_rebuild(&SledView(&self.trees))?;
        self.transact("reindex", |t| engine::finish_rebuild(t, &plan))?;
        self.sync()?;
        Ok(moved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A lock sled still holds for a moment (its own background threads
    // let go of it after the `Db` is dropped) is waited for; a lock held
    // for good is reported, not waited on forever.
    #[test]
    fn open_waits_for_a_lock_released_late_and_reports_one_held() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s");
        drop(SledStore::open(&path).expect("creates"));
        let holder = sled::open(&path).expect("the lock is free");
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(holder);
        });
        let s = SledStore::open(&path).expect("opens once the lock is released");
        release.join().expect("releaser");
        drop(s);

        let holder = sled::open(&path).expect("the lock is free");
        let started = std::time::Instant::now();
        match SledStore::open(&path) {
            Err(StoreError::Io { op: "open", source }) => {
                assert!(source.to_string().contains("lock"), "{source}");
            }
            other => panic!("opened a database another handle holds: {other:?}"),
        }
        assert!(started.elapsed() >= LOCK_WAIT, "gave up early");
        drop(holder);
    }
}
