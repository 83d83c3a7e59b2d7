//! [`RedbStore`]: the store on redb, one database file per node, one table
//! per tree of the sled store. A redb write transaction spans tables and
//! its commit is durable (fsync'd, `Durability::Immediate`) by default.

use std::path::{Path, PathBuf};
use std::time::Duration;

use redb::{ReadableDatabase, ReadableTable, TableDefinition};

use abhyasa_core::custody::Record;
use abhyasa_core::store::{Committed, Compacted, Store, StoreError};
use abhyasa_core::Timestamp;

use crate::engine::{self, Table, Txn, View, Visit};
use crate::guard::guarded;
use crate::index;
use crate::{QuarantinedRow, Repair, StoreOptions};

const BACKEND: &str = "redb";

type Def = TableDefinition<'static, &'static [u8], &'static [u8]>;

fn def(t: Table) -> Def {
    TableDefinition::new(t.name())
}

fn backend(op: &'static str, e: impl Into<redb::Error>) -> StoreError {
    match e.into() {
        redb::Error::Io(source) => StoreError::Io { op, source },
        other => StoreError::Backend {
            backend: BACKEND,
            op,
            source: Box::new(other),
        },
    }
}

fn builder(options: &StoreOptions) -> redb::Builder {
    let cache = usize::try_from(options.cache_bytes).unwrap_or(usize::MAX);
    let mut b = redb::Builder::new();
    b.set_cache_size(cache);
    b
}

/// The store on redb.
#[derive(Debug)]
pub struct RedbStore {
    db: redb::Database,
    path: PathBuf,
    format: u32,
}

struct RedbTxn<'t> {
    wtx: &'t redb::WriteTransaction,
    tables: Vec<Option<redb::Table<'t, &'static [u8], &'static [u8]>>>,
}

impl<'t> RedbTxn<'t> {
    fn new(wtx: &'t redb::WriteTransaction) -> Self {
        Self {
            wtx,
            tables: Table::ALL.iter().map(|_| None).collect(),
        }
    }

    /// Opens tables lazily: most commits touch three or four of them.
    fn table(
        &mut self,
        t: Table,
    ) -> Result<&mut redb::Table<'t, &'static [u8], &'static [u8]>, StoreError> {
        let slot = &mut self.tables[t.index()];
        if slot.is_none() {
            *slot = Some(
                self.wtx
                    .open_table(def(t))
                    .map_err(|e| backend("open table", e))?,
            );
        }
        slot.as_mut().ok_or_else(|| StoreError::Backend {
            backend: BACKEND,
            op: "open table",
            source: "table slot empty after open".into(),
        })
    }
}

impl Txn for RedbTxn<'_> {
    fn get(&mut self, t: Table, k: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .table(t)?
            .get(k)
            .map_err(|e| backend("read", e))?
            .map(|v| v.value().to_vec()))
    }

    fn put(&mut self, t: Table, k: &[u8], v: &[u8]) -> Result<(), StoreError> {
        self.table(t)?
            .insert(k, v)
            .map_err(|e| backend("write", e))?;
        Ok(())
    }

    fn del(&mut self, t: Table, k: &[u8]) -> Result<(), StoreError> {
        self.table(t)?.remove(k).map_err(|e| backend("delete", e))?;
        Ok(())
    }
}

struct RedbView(redb::ReadTransaction);

impl View for RedbView {
    fn get(&self, t: Table, k: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        guarded(BACKEND, "read", || {
            let table = self
                .0
                .open_table(def(t))
                .map_err(|e| backend("open table", e))?;
            Ok(table
                .get(k)
                .map_err(|e| backend("read", e))?
                .map(|v| v.value().to_vec()))
        })
    }

    fn scan(&self, t: Table, from: &[u8], f: &mut Visit<'_>) -> Result<(), StoreError> {
        guarded(BACKEND, "scan", || {
            let table = self
                .0
                .open_table(def(t))
                .map_err(|e| backend("open table", e))?;
            for item in table.range(from..).map_err(|e| backend("scan", e))? {
                let (k, v) = item.map_err(|e| backend("scan", e))?;
                if !f(k.value(), v.value())? {
                    break;
                }
            }
            Ok(())
        })
    }
}

impl RedbStore {
    /// Opens (or creates) the database file `path` with default options.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(path, &StoreOptions::default())
    }

    /// Opens (or creates) the database file `path`. Fails with
    /// [`StoreError::NewerFormat`] if it was written by a newer format.
    pub fn open_with(path: impl AsRef<Path>, options: &StoreOptions) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        let marker = created_marker(&path);
        if !path.exists() {
            // A single file cannot tell that it was removed: its sibling
            // marker, written once the database exists, does (C-SD-2).
            if marker.exists() {
                return Err(StoreError::Damaged {
                    file: path
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    offset: 0,
                    detail: format!(
                        "missing: {} says the database was created here; restore the file \
                         (a new store is created only where none ever was)",
                        marker.display()
                    ),
                    obligations: Vec::new(),
                });
            }
            Self::create_new(&path, options)?;
        }
        if !marker.exists() && std::fs::metadata(&path).is_ok_and(|m| m.len() > 0) {
            write_marker(&marker)?;
        }
        // A database is created whole under another name and renamed into
        // place (`create_new`), so an empty file here is one that lost its
        // contents: refused before redb would make it a new database.
        if std::fs::metadata(&path).is_ok_and(|m| m.is_file() && m.len() == 0) {
            return Err(StoreError::Corrupt {
                table: "meta",
                key: "format_version".into(),
                detail: format!(
                    "the database file {} is empty: its contents were lost (restore it; a \
                     new store is created only where none exists)",
                    path.display()
                ),
            });
        }
        guarded(BACKEND, "open", || {
            let db = builder(options)
                .create(&path)
                .map_err(|e| backend("open", e))?;
            Self::finish_open(db, path, true)
        })
    }

    /// Creates a new database through [`crate::create_then_rename`]: a
    /// power cut mid-creation leaves no torn `path`. C-ST-1.
    fn create_new(path: &Path, options: &StoreOptions) -> Result<(), StoreError> {
        crate::create_then_rename(path, |tmp| {
            let db = builder(options)
                .create(tmp)
                .map_err(|e| backend("create", e))?;
            Self::finish_open(db, tmp.to_path_buf(), false).map(drop)
        })
    }

    /// Opens (or creates) a store on a caller-supplied redb storage
    /// backend instead of a file: the same tables, format checks and
    /// migrations as [`RedbStore::open_with`]. Durability is the backend's
    /// `sync_data`: a commit returns only after redb has called it. The
    /// power-loss test (C-ST-1, `tests/power_loss.rs`) runs the store on a
    /// backend that loses every write not yet synced. [`RedbStore::path`]
    /// is empty for such a store.
    pub fn open_on(
        storage: impl redb::StorageBackend,
        options: &StoreOptions,
    ) -> Result<Self, StoreError> {
        let db = builder(options)
            .create_with_backend(storage)
            .map_err(|e| backend("open", e))?;
        Self::finish_open(db, PathBuf::new(), false)
    }

    /// `existed`: the file was there before this open, so it must hold a
    /// format version (`engine::setup_existing`).
    fn finish_open(db: redb::Database, path: PathBuf, existed: bool) -> Result<Self, StoreError> {
        let existing = existed.then(|| path.clone());
        let mut s = Self {
            db,
            path,
            format: 0,
        };
        // Every table exists from the start, so reads never meet a missing one.
        s.transact(|t| {
            for table in Table::ALL {
                t.table(table)?;
            }
            Ok(())
        })?;
        let (format, setup) = engine::setup_existing(&s.view()?, existing.as_deref())?;
        if let Some(w) = setup {
            s.transact(|t| w.write(t))?;
        }
        s.format = format;
        Ok(s)
    }

    /// The database file (empty for a store opened with
    /// [`RedbStore::open_on`]).
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn view(&self) -> Result<RedbView, StoreError> {
        Ok(RedbView(
            self.db.begin_read().map_err(|e| backend("begin read", e))?,
        ))
    }

    fn transact<T>(
        &mut self,
        f: impl FnOnce(&mut RedbTxn<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        guarded(BACKEND, "commit", || {
            let mut wtx = self
                .db
                .begin_write()
                .map_err(|e| backend("begin write", e))?;
            // Two-phase commit: the commit slot is synced before the byte
            // that makes it current, so a current slot whose checksums fail
            // is damage, never a torn write. With one phase redb's recovery
            // cannot tell the two apart and rolls the last acknowledged
            // commit back on a flipped bit (C-SD-1); with two it refuses.
            wtx.set_two_phase_commit(true);
            let out = {
                let mut t = RedbTxn::new(&wtx);
                f(&mut t)
            };
            match out {
                Ok(v) => {
                    // Durability::Immediate (the default): synced before it returns.
                    wtx.commit().map_err(|e| backend("commit", e))?;
                    Ok(v)
                }
                Err(e) => {
                    // The caller needs the reason the commit was refused; the
                    // transaction is discarded whether or not abort succeeds.
                    let _ = wtx.abort();
                    Err(e)
                }
            }
        })
    }
}

impl Store for RedbStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn format_version(&self) -> u32 {
        self.format
    }

    fn commit(&mut self, now: Timestamp, batches: &[&[Record]]) -> Result<Committed, StoreError> {
        self.transact(|t| engine::commit(t, now, batches))
    }

    reads_through_view!(self => self.view()?);

    fn compact(&mut self, now: Timestamp, retention: Duration) -> Result<Compacted, StoreError> {
        let (dels, out) = engine::plan_compaction(&self.view()?, now, retention)?;
        if !dels.is_empty() {
            self.transact(|t| engine::delete(t, &dels))?;
        }
        Ok(out)
    }
}

impl Repair for RedbStore {
    repair_reads_through_view!(self => self.view()?);

    fn quarantine(&mut self, now: Timestamp) -> Result<Vec<QuarantinedRow>, StoreError> {
        let bad = engine::check(&self.view()?)?;
        if bad.is_empty() {
            return Ok(Vec::new());
        }
        let moved = self.transact(|t| engine::quarantine(t, now, &bad))?;
        let plan = index::plan_rebuild(&self.view()?)?;
        self.transact(|t| engine::finish_rebuild(t, &plan))?;
        Ok(moved)
    }
}

/// `<file>.created`, beside a redb database: present once the database
/// was created, so a missing database file is refused, never made anew.
fn created_marker(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".created");
    path.with_file_name(name)
}

/// Writes the marker and syncs it and its directory.
fn write_marker(marker: &Path) -> Result<(), StoreError> {
    let io = |op: &'static str| move |source| StoreError::Io { op, source };
    std::fs::File::create(marker)
        .and_then(|f| f.sync_all())
        .map_err(io("write the database's created marker"))?;
    let dir = match marker.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("sync the database's directory"))
}
