//! # abhyasa-store
//!
//! Embedded durable stores for Abhyasa nodes: [`LogStore`] (the default: a
//! commit log with its keys in memory and its long values read from the
//! log, one write and one `fdatasync` per commit), [`FjallStore`] (an LSM
//! tree), [`RedbStore`] (a B-tree file) and [`SledStore`], all implementing the core's
//! [`Store`] trait with the same tables and the
//! same rules (the semantics are written once, over a minimal key-value
//! transaction, and both backends run the shared storage suite together
//! with the core's `SimStore`).
//!
//! Tables (sled trees / redb tables): `meta` (format version, log
//! counter), `custody_pending` (obligation, `safe(O)`, attempts, next
//! attempt; the deadline is the obligation's absolute one),
//! `custody_terminal`, `escalations`, `reconciliations`, `principal`
//! (authorizations with sequences, routing weights, open decisions),
//! `receiver_ledger` (id → digest, outcome, reason, effect),
//! `receiver_key_sequences`, `receiver_effects`, `intents`, `events`
//! (the append-only log), `quarantine` (rows moved aside by
//! [`Repair::quarantine`]) and `index` (format 2: the secondary indexes of
//! the paged reads `list`, `escalations`, `decisions` and `inbox`, written
//! in the same transaction as the records they derive from; a version-1
//! database is migrated on open).
//!
//! See `README.md` for the benchmark that chose the default.
#![forbid(unsafe_code)]

/// The read methods of [`Store`], for a backend whose reads all go
/// through one consistent view: `$view` builds it from `$self` (and may
/// use `?`). Every backend answers its reads with
/// the same engine functions over its own view; only the view differs.
macro_rules! reads_through_view {
    ($self:ident => $view:expr) => {
        fn load(&$self) -> Result<abhyasa_core::store::DurableState, StoreError> {
            $crate::engine::load(&$view)
        }

        fn inbox(
            &$self,
            now: abhyasa_core::Timestamp,
        ) -> Result<abhyasa_core::store::Inbox, StoreError> {
            $crate::reads::inbox(&$view, now)
        }

        fn list(
            &$self,
            state: Option<abhyasa_core::store::ListState>,
            after: Option<&abhyasa_core::ObligationId>,
            limit: usize,
        ) -> Result<
            abhyasa_core::store::Page<abhyasa_core::store::Listed, abhyasa_core::ObligationId>,
            StoreError,
        > {
            $crate::reads::list(&$view, state, after, limit)
        }

        fn escalations(
            &$self,
            after: Option<abhyasa_core::store::EventId>,
            limit: usize,
        ) -> Result<
            abhyasa_core::store::Page<
                abhyasa_core::store::EscalationEntry,
                abhyasa_core::store::EventId,
            >,
            StoreError,
        > {
            $crate::reads::escalations(&$view, after, limit)
        }

        fn decisions(
            &$self,
            after: Option<&abhyasa_core::ObligationId>,
            limit: usize,
        ) -> Result<
            abhyasa_core::store::Page<
                abhyasa_core::principal::DecisionItem,
                abhyasa_core::ObligationId,
            >,
            StoreError,
        > {
            $crate::reads::decisions(&$view, after, limit)
        }

        fn events(
            &$self,
            from: abhyasa_core::store::EventId,
            limit: usize,
        ) -> Result<Vec<abhyasa_core::store::StoredEvent>, StoreError> {
            $crate::engine::events(&$view, from, limit)
        }
    };
}

/// [`Repair`]'s two reads over a backend's view (see
/// `reads_through_view!`).
macro_rules! repair_reads_through_view {
    ($self:ident => $view:expr) => {
        fn check(&$self) -> Result<Vec<$crate::CorruptRow>, StoreError> {
            $crate::engine::check(&$view)
        }

        fn quarantined(&$self) -> Result<Vec<$crate::QuarantinedRow>, StoreError> {
            $crate::engine::quarantined(&$view)
        }
    };
}

mod codec;
mod engine;
mod fjall_journal;
mod fjall_store;
mod guard;
mod index;
pub mod kv;
mod log_record;
mod log_store;
mod reads;
mod redb_store;
mod sled_store;
mod witness;

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use abhyasa_core::store::{Store, StoreError};
use abhyasa_core::Timestamp;

pub use engine::{CorruptRow, QuarantinedRow, FORMAT_VERSION};
pub use fjall_store::FjallStore;
pub use log_store::{read_image_at, FsDisk, LogDisk, LogOptions, LogRepair, LogStore};
pub use redb_store::RedbStore;
pub use sled_store::SledStore;

/// Entry points for the fuzz targets (`fuzz/`): not an interface.
#[doc(hidden)]
pub mod fuzzing {
    /// Decodes `data` as a log store's log (both versions, for a node's
    /// open and for a check) and as its snapshot. Never panics; `Err` names
    /// a broken rule (an error that is not a typed damage report, or a
    /// value placed outside the bytes).
    pub fn log_store_decode(data: &[u8]) -> Result<(), String> {
        crate::log_store::decode_all(data)
    }

    /// How many commits `data` replays as the newest log of generation 0,
    /// for a node's open: `Err` on any damage or a torn tail. What a seed
    /// of the `log_store_decode` corpus must pass to count as valid.
    pub fn log_store_commits(data: &[u8]) -> Result<usize, String> {
        crate::log_store::count_commits(data)
    }
}

/// Creates a new database at `path` (a file or a directory) under a
/// temporary name, `<path>.creating`: `build` initialises it there (tables,
/// format version: synced commits) and closes it, and only then is it
/// renamed into place and its directory synced. A power cut while a
/// database is first created would otherwise leave a torn one that no
/// longer opens (redb: "not a redb database"; fjall: files it refuses to
/// create twice) though it never held a record: the node could not start
/// again. A leftover temporary is such a cut (nothing in it was ever
/// acknowledged) and is removed first. C-ST-1.
fn create_then_rename(
    path: &Path,
    build: impl FnOnce(&Path) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let io = |op: &'static str| move |source| StoreError::Io { op, source };
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".creating");
    let tmp = path.with_file_name(name);
    let removed = match std::fs::symlink_metadata(&tmp) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(&tmp),
        Ok(_) => std::fs::remove_file(&tmp),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    removed.map_err(io("remove an interrupted creation"))?;
    build(&tmp)?;
    std::fs::rename(&tmp, path).map_err(io("rename the new database into place"))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("sync the database's directory"))
}

/// A damaged place in a store's files (C-SD-2): what
/// [`StoreError::Damaged`] names, and what [`Repair::damage`] lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    /// The file, relative to the store's directory.
    pub file: String,
    /// The byte of `file` where the damage starts.
    pub offset: u64,
    /// What is wrong there.
    pub detail: String,
    /// The obligations whose rows the damaged bytes held, as far as they
    /// can still be read.
    pub obligations: Vec<String>,
}

impl From<Damage> for StoreError {
    fn from(d: Damage) -> Self {
        StoreError::Damaged {
            file: d.file,
            offset: d.offset,
            detail: d.detail,
            obligations: d.obligations,
        }
    }
}

impl fmt::Display for Damage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at byte {}: {}", self.file, self.offset, self.detail)?;
        if !self.obligations.is_empty() {
            write!(f, "; obligations affected: {}", self.obligations.join(", "))?;
        }
        Ok(())
    }
}

/// What [`StoreKind::repair`] found and did.
#[derive(Clone, Debug, Default)]
pub struct RepairReport {
    /// Where the files it changed were copied first, verbatim (`None`: it
    /// changed no file).
    pub saved_to: Option<std::path::PathBuf>,
    /// Every damaged place it found.
    pub damage: Vec<Damage>,
    /// Rows that did not decode, moved into quarantine.
    pub quarantined: Vec<QuarantinedRow>,
    /// The obligations named by damaged bytes that the repaired store
    /// holds neither as pending nor as finished, and whose offer is gone
    /// with the damaged bytes: custody it could not recover.
    pub lost: Vec<String>,
    /// The obligations whose offer the repair salvaged from the damaged
    /// bytes but whose custody it cannot prove: handed to the node, which
    /// escalates each with cause `store_damaged` and applies its fail-safe
    /// at its next start (C-SD-4).
    pub escalated: Vec<String>,
}

/// Offline inspection and repair of an embedded store, for a node that
/// refuses to start because a row does not decode or a file is damaged
/// (`abhyasa store check`, `abhyasa store repair`, `abhyasa store
/// quarantine`, `abhyasa store quarantined`).
///
/// A store never writes a row it cannot read back
/// ([`StoreError::Unwritable`]), so a corrupt row means damage from outside
/// (disk, another program, a bug in an older build). [`Store::load`] then
/// fails with [`StoreError::Corrupt`] naming the first such row rather than
/// misread or skip it; these calls list every such row and move them
/// aside, verbatim, so the node can start on everything else.
pub trait Repair {
    /// Every entry of every data table that does not decode.
    fn check(&self) -> Result<Vec<CorruptRow>, StoreError>;
    /// Moves every entry [`Repair::check`] finds into the `quarantine`
    /// table (raw bytes kept, with the reason and `now`), atomically;
    /// returns what it moved. Every other row is untouched.
    fn quarantine(&mut self, now: Timestamp) -> Result<Vec<QuarantinedRow>, StoreError>;
    /// The entries moved aside so far.
    fn quarantined(&self) -> Result<Vec<QuarantinedRow>, StoreError>;
    /// Every damaged place in the store's files that the open for check
    /// read around (C-SD-2, C-SD-3). A store that refuses to open on
    /// damage instead of listing it returns none.
    fn damage(&self) -> Vec<Damage> {
        Vec::new()
    }
}

/// Tuning shared by the backends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreOptions {
    /// Page cache size in bytes (sled's and redb's own default is 1 GiB;
    /// ours is 64 MiB, so a node's memory is bounded by its pending set).
    pub cache_bytes: u64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            cache_bytes: 64 * 1024 * 1024,
        }
    }
}

/// Which backend a node uses (`store = "redb" | "sled" | "log" | "fjall"`
/// in its config).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum StoreKind {
    /// [`RedbStore`] (a file): a B-tree database.
    Redb,
    /// [`SledStore`].
    Sled,
    /// [`LogStore`] (a directory): the default, chosen by measurement
    /// (`benches/README.md`): the fastest store that passes the suite,
    /// crash enumeration, kill and power-loss tests and meets the memory
    /// and recovery bounds.
    #[default]
    Log,
    /// [`FjallStore`] (a directory): an LSM-tree.
    Fjall,
}

impl StoreKind {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreKind::Redb => "redb",
            StoreKind::Sled => "sled",
            StoreKind::Log => "log",
            StoreKind::Fjall => "fjall",
        }
    }

    /// Opens a store of this kind at `path` (a file for redb, a directory
    /// for sled, log and fjall).
    pub fn open(
        self,
        path: impl AsRef<Path>,
        options: &StoreOptions,
    ) -> Result<Box<dyn Store>, StoreError> {
        Ok(match self {
            StoreKind::Redb => Box::new(RedbStore::open_with(path, options)?),
            StoreKind::Sled => Box::new(SledStore::open_with(path, options)?),
            StoreKind::Log => Box::new(LogStore::open(path)?),
            StoreKind::Fjall => Box::new(FjallStore::open_with(path, options)?),
        })
    }
}

impl StoreKind {
    /// Opens a store of this kind for [`Repair`] (no node may hold it).
    pub fn open_for_repair(
        self,
        path: impl AsRef<Path>,
        options: &StoreOptions,
    ) -> Result<Box<dyn Repair>, StoreError> {
        Ok(match self {
            StoreKind::Redb => Box::new(RedbStore::open_with(path, options)?),
            StoreKind::Sled => Box::new(SledStore::open_with(path, options)?),
            StoreKind::Log => Box::new(LogStore::open(path)?),
            StoreKind::Fjall => Box::new(FjallStore::open_with(path, options)?),
        })
    }
}

impl StoreKind {
    /// Opens a store of this kind to be checked (no node may hold it): the
    /// log store reads only, changes no byte and lists damage instead of
    /// refusing it (C-SD-3); the others open as for [`Repair`].
    pub fn open_for_check(
        self,
        path: impl AsRef<Path>,
        options: &StoreOptions,
    ) -> Result<Box<dyn Repair>, StoreError> {
        match self {
            StoreKind::Log => Ok(Box::new(LogStore::open_for_check(path)?)),
            other => other.open_for_repair(path, options),
        }
    }

    /// Repairs a store of this kind (no node may hold it): the log store
    /// salvages around damaged files ([`LogStore::repair`]); then every
    /// row that does not decode is quarantined ([`Repair::quarantine`]).
    pub fn repair(
        self,
        path: impl AsRef<Path>,
        options: &StoreOptions,
        now: Timestamp,
    ) -> Result<RepairReport, StoreError> {
        let mut report = RepairReport::default();
        if self == StoreKind::Log {
            let r = LogStore::repair(path.as_ref(), now)?;
            report.saved_to = r.saved_to;
            report.damage = r.damage;
            report.lost = r.lost;
            report.escalated = r.escalated;
        }
        let mut store = self.open_for_repair(path, options)?;
        report.quarantined = store.quarantine(now)?;
        // A pending row that does not decode is custody whose offer is
        // unreadable (its CRC fails): named as lost, never dropped unsaid.
        for q in &report.quarantined {
            if q.table == "custody_pending" && !report.lost.contains(&q.key) {
                report.lost.push(q.key.clone());
            }
        }
        Ok(report)
    }
}

impl fmt::Display for StoreKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown `store = "..."` value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown store {0:?}: expected \"redb\", \"sled\", \"log\" or \"fjall\"")]
pub struct UnknownStoreKind(pub String);

impl FromStr for StoreKind {
    type Err = UnknownStoreKind;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "redb" => Ok(StoreKind::Redb),
            "sled" => Ok(StoreKind::Sled),
            "log" => Ok(StoreKind::Log),
            "fjall" => Ok(StoreKind::Fjall),
            other => Err(UnknownStoreKind(other.to_string())),
        }
    }
}
