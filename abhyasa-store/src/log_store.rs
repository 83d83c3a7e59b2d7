//! [`LogStore`]: the store as an append-only log of commits with every
//! table held in memory, for the hot path of custody.
//!
//! The tables and rules are the same as the other embedded stores' (the
//! engine in `engine.rs` runs over this store's transaction exactly as it
//! runs over redb's); only the storage differs:
//!
//! - **One write and one `fdatasync` per commit.** A commit's write set
//!   (every put and delete, in the order the commit made them) is encoded
//!   as one log record (format 2, `log_record.rs`: a self-checking header,
//!   the payload and a mark, both checksums salted with the generation
//!   and the record's offset, so a record copied elsewhere, or written
//!   inside an obligation's payload, never checks) and written after the
//!   last commit of the current log file, which is synced before the commit
//!   returns. The commit writes the in-memory tables as it goes, keeping
//!   each replaced row; if it fails, or its record cannot be written and
//!   synced, the rows are put back before the commit returns, so a read
//!   (reads run after commits, on the same thread) never sees a commit
//!   that is not durable.
//! - **Logs are grown ahead of their commits.** A commit is written at
//!   its offset inside bytes the log already has: the log is grown with
//!   fill (bytes bound to the generation and offset, never zero),
//!   [`LogOptions::preallocate_bytes`] at a time, synced before any
//!   commit lands there; then the new length is witnessed in the log's
//!   header. A commit's `fdatasync` then has only data to write, not the
//!   file's new size as well. The store thread grows the log between
//!   commits when nothing waits (`Store::idle`: less than half a step
//!   left), so a commit waits for the fill only when commits come too fast
//!   for the thread ever to be idle, or one is larger than half a step.
//! - **Keys in memory, long values on disk.** Every table lives in a
//!   `BTreeMap` keyed by the row's key. A value shorter than 64 bytes
//!   (counters, index entries) is held there; a longer one (a pending
//!   obligation, a terminal summary, a ledger entry) is held as its place
//!   in the log record its commit writes (read from the record itself
//!   until the commit is durable, and taken back with the commit's other
//!   writes if it never is) — or in the snapshot, once a checkpoint has
//!   put one in force — and read with one `pread` when asked for.
//!   Whether a row exists is always answered from memory
//!   (`Txn::contains`), so the commit path reads the disk only for a long
//!   row whose bytes it needs (a retry's attempt count rewrites the
//!   pending row; a close only removes it). After a
//!   restart the tables are rebuilt with full B-tree nodes. Per pending
//!   obligation that is ~60 bytes beside the custodian's own state, not
//!   the ~470 of holding every row (the memory target).
//! - **Checkpoints.** When the logs since the snapshot in force have grown
//!   past its size (and at least [`LogOptions::checkpoint_bytes`]), the
//!   commit that crossed the line encodes the whole state as snapshot
//!   `g+1` and starts `log-{g+1}` (created, synced, directory synced);
//!   commits go there from then on. Each later commit writes and syncs the
//!   next chunk of the snapshot to `snap-{g+1}.tmp`
//!   ([`LogOptions::checkpoint_chunk_bytes`], at least twice its own
//!   record), so no commit waits for a whole snapshot to reach the disk.
//!   When it is whole it is renamed into place (directory synced, with a
//!   CRC over all of it), every value held in the older snapshot or logs
//!   moves to its place in the new snapshot, and those files are removed.
//!   Until then `snap-{g}`, `log-{g}` and `log-{g+1}` are the state.
//! - **Recovery** loads the newest snapshot and replays every log from its
//!   generation on, in order. Fill after a log's last record is room. A
//!   torn final write is dropped (made fill again, logged at warn) only
//!   when `log_record::tail` proves part of it never landed; any other
//!   bytes that do not check — a flipped bit, a zeroed or misdirected
//!   sector, a truncated or missing file, a gap between logs — refuse the
//!   open with [`StoreError::Damaged`] (file, offset, the obligations the
//!   damaged bytes name). Nothing else is ever cut off.
//!   [`LogStore::open_for_check`] reads without writing and lists every
//!   damaged place; [`LogStore::repair`] copies the files aside and keeps
//!   every record around each (C-SD-1..3).
//! - **A failed write or sync poisons the store.** After an I/O error in
//!   the commit path the file's state is unknown (a failed `fsync` may have
//!   dropped dirty pages), so every later commit fails until the store is
//!   reopened, which recovers from what is on disk.
//!
//! The files live behind [`LogDisk`], so the power-loss test runs the store
//! on a disk that drops whatever was not synced.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use abhyasa_core::custody::{PendingRecord, Record};
use abhyasa_core::store::{Committed, Compacted, Store, StoreError};
use abhyasa_core::Timestamp;

use crate::engine::{self, Table, Txn, View, Visit};
use crate::index;
use crate::log_record::{
    self, crc, fill, log_header, LogHeader, Tail, HEADER, HEADER_V1, LOG_HEADER,
};
use crate::{Damage, QuarantinedRow, Repair};

const BACKEND: &str = "log";

/// The snapshot file's first bytes.
const SNAP_MAGIC: &[u8; 8] = b"ABHYSNAP";
/// The snapshot layout version.
const SNAP_VERSION: u32 = 1;
/// A snapshot's header: magic, layout version, generation.
const SNAP_HEADER: usize = 8 + 4 + 8;
/// Marks the end of a snapshot's entries (no table has this index).
const SNAP_END: u8 = 0xFF;
/// Put and delete in a log record.
const OP_PUT: u8 = 1;
const OP_DEL: u8 = 2;

/// The files of a [`LogStore`]: a flat directory of named files, each read
/// whole and written at an offset. [`FsDisk`] is the real one; the
/// power-loss test supplies one that forgets what was not synced.
pub trait LogDisk: Send + fmt::Debug {
    /// The names of the files present.
    fn list(&self) -> io::Result<Vec<String>>;
    /// The whole content of `name`, or `None` if there is no such file.
    fn read(&self, name: &str) -> io::Result<Option<Vec<u8>>>;
    /// Fills `buf` from byte `at` of `name`: how the store reads a row it
    /// holds as a place in a file. The default reads the whole file
    /// ([`LogDisk::read`]); a real disk reads just the bytes.
    fn read_at(&self, name: &str, at: u64, buf: &mut [u8]) -> io::Result<()> {
        let b = self
            .read(name)?
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, name.to_string()))?;
        read_image_at(&b, at, buf)
    }
    /// Writes `data` at byte `at` of `name`, creating the file if it is
    /// missing; a write past the end extends it (a gap reads as zeros).
    fn write_at(&mut self, name: &str, at: u64, data: &[u8]) -> io::Result<()>;
    /// Makes `name`'s content durable (`fdatasync`).
    fn sync(&mut self, name: &str) -> io::Result<()>;
    /// Cuts `name` to `len` bytes.
    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()>;
    /// Renames `from` to `to`, replacing `to`.
    fn rename(&mut self, from: &str, to: &str) -> io::Result<()>;
    /// Removes `name` (absent is fine).
    fn remove(&mut self, name: &str) -> io::Result<()>;
    /// Makes the directory's entries (creations, renames, removals) durable.
    fn sync_dir(&mut self) -> io::Result<()>;
}

/// [`LogDisk::read_at`] for a disk that holds a file's bytes in memory
/// (`image`): fills `buf` from byte `at`, or fails with `UnexpectedEof` if
/// the file is shorter.
pub fn read_image_at(image: &[u8], at: u64, buf: &mut [u8]) -> io::Result<()> {
    let src = usize::try_from(at)
        .ok()
        .and_then(|at| image.get(at..at.checked_add(buf.len())?))
        .ok_or(io::ErrorKind::UnexpectedEof)?;
    buf.copy_from_slice(src);
    Ok(())
}

/// A [`LogDisk`] on a directory of the file system. It holds an exclusive
/// lock on `LOCK` in the directory while open, so two processes never
/// write one store.
#[derive(Debug)]
pub struct FsDisk {
    dir: PathBuf,
    /// Open handles, read and write; behind a lock so [`LogDisk::read_at`]
    /// (which takes `&self`) can open and keep one too.
    files: Mutex<HashMap<String, File>>,
    _lock: File,
}

const LOCK: &str = "LOCK";

impl FsDisk {
    /// Opens (creating it if missing) the directory `dir`. A directory it
    /// creates is made durable in its parent before this returns: the
    /// store's syncs cover what is inside it, not its own name, and a
    /// power cut could otherwise take every commit away with the name.
    pub fn open(dir: impl AsRef<Path>) -> io::Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        if !dir.is_dir() {
            std::fs::create_dir_all(&dir)?;
            let parent = match dir.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            File::open(parent)?.sync_all()?;
        }
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(LOCK))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!("{} is open in another process", dir.display()),
                ))
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
        Ok(Self {
            dir,
            files: Mutex::new(HashMap::new()),
            _lock: lock,
        })
    }

    fn files(&mut self) -> &mut HashMap<String, File> {
        self.files.get_mut().unwrap_or_else(|e| e.into_inner())
    }

    /// The handle of `name`, for writing: created if missing.
    fn file(&mut self, name: &str) -> io::Result<&mut File> {
        let files = self.files.get_mut().unwrap_or_else(|e| e.into_inner());
        handle(files, &self.dir, name, true)
    }
}

/// The open handle of `name` in `dir` (read and write), opened and kept
/// in `files` the first time; a missing file is created only if `create`.
fn handle<'f>(
    files: &'f mut HashMap<String, File>,
    dir: &Path,
    name: &str,
    create: bool,
) -> io::Result<&'f mut File> {
    if !files.contains_key(name) {
        let f = OpenOptions::new()
            .create(create)
            .truncate(false)
            .read(true)
            .write(true)
            .open(dir.join(name))?;
        files.insert(name.to_string(), f);
    }
    files
        .get_mut(name)
        .ok_or_else(|| io::Error::other("file handle missing after open"))
}

impl LogDisk for FsDisk {
    fn list(&self) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(&self.dir)? {
            let e = e?;
            if let Some(name) = e.file_name().to_str() {
                if name != LOCK {
                    out.push(name.to_string());
                }
            }
        }
        Ok(out)
    }

    fn read(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        match std::fs::read(self.dir.join(name)) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn read_at(&self, name: &str, at: u64, buf: &mut [u8]) -> io::Result<()> {
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        // Never created by a read: a missing file is an error, not a new one.
        read_exact_at(handle(&mut files, &self.dir, name, false)?, at, buf)
    }

    fn write_at(&mut self, name: &str, at: u64, data: &[u8]) -> io::Result<()> {
        write_all_at(self.file(name)?, at, data)
    }

    fn sync(&mut self, name: &str) -> io::Result<()> {
        self.file(name)?.sync_data()
    }

    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        self.file(name)?.set_len(len)
    }

    fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        self.files().remove(from);
        self.files().remove(to);
        std::fs::rename(self.dir.join(from), self.dir.join(to))
    }

    fn remove(&mut self, name: &str) -> io::Result<()> {
        self.files().remove(name);
        match std::fs::remove_file(self.dir.join(name)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn sync_dir(&mut self) -> io::Result<()> {
        File::open(&self.dir)?.sync_all()
    }
}

/// Writes all of `data` at offset `at` of `f`: one `pwrite` (no seek
/// first) on Unix.
#[cfg(unix)]
fn write_all_at(f: &File, at: u64, data: &[u8]) -> io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(f, data, at)
}

/// Fills `buf` from offset `at` of `f`: one `pread` on Unix.
#[cfg(unix)]
fn read_exact_at(f: &File, at: u64, buf: &mut [u8]) -> io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(f, buf, at)
}

/// Fills `buf` from offset `at` of `f`.
#[cfg(not(unix))]
fn read_exact_at(mut f: &File, at: u64, buf: &mut [u8]) -> io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    f.seek(SeekFrom::Start(at))?;
    f.read_exact(buf)
}

/// Writes all of `data` at offset `at` of `f`.
#[cfg(not(unix))]
fn write_all_at(mut f: &File, at: u64, data: &[u8]) -> io::Result<()> {
    use std::io::{Seek, SeekFrom, Write};
    f.seek(SeekFrom::Start(at))?;
    f.write_all(data)
}

/// Tuning of a [`LogStore`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogOptions {
    /// The log is checkpointed into a new snapshot once it holds more than
    /// this many bytes and more than the last snapshot did. Default 64 MiB.
    pub checkpoint_bytes: u64,
    /// Each commit during a checkpoint writes (and syncs) at least this
    /// much of the snapshot, and at least twice its own record, so the
    /// snapshot is in place before its log has grown to half its size.
    /// Default 1 MiB.
    pub checkpoint_chunk_bytes: usize,
    /// A log is grown this many bytes at a time, with fill, synced
    /// before any commit is written there: a commit then overwrites bytes
    /// the file already has, and its `fdatasync` writes only the data (a
    /// write that grows a file also has the file's size to write, a second
    /// synchronous write on ext4). 0 grows the log commit by commit.
    /// Default 512 KiB: the commit that grows the log waits for the fill
    /// to reach the disk, and 4 MiB at a time stalled the pipeline
    /// behind it long enough to cost more custody throughput than the
    /// shorter syncs gained.
    pub preallocate_bytes: u64,
}

impl Default for LogOptions {
    fn default() -> Self {
        Self {
            checkpoint_bytes: 64 * 1024 * 1024,
            checkpoint_chunk_bytes: 1 << 20,
            preallocate_bytes: 512 << 10,
        }
    }
}

/// A value at least this long is held as its place in the log record or
/// snapshot that holds it rather than in memory: the tables
/// then cost a key and a place per large row (a pending obligation, a
/// terminal summary, a ledger entry), not the row (the memory
/// target). Shorter values — counters, index entries — stay in memory.
const HELD_ON_DISK_FROM: usize = 64;

/// The file a value was read from or written to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Src {
    Log(u64),
    Snap(u64),
}

impl Src {
    fn name(self) -> String {
        match self {
            Src::Log(g) => log_name(g),
            Src::Snap(g) => snap_name(g),
        }
    }

    /// Whether the checkpoint that puts snapshot `gen` in force removes
    /// this file.
    fn replaced_by(self, gen: u64) -> bool {
        match self {
            Src::Log(g) | Src::Snap(g) => g < gen,
        }
    }
}

/// A row's value: in memory, or where a log record or snapshot holds it
/// (`len` bytes from `at`). A place a commit makes in its own record is
/// read from the record until the record is synced, and taken back with
/// the commit if it never is ([`LogTxn`]); a file is removed only after
/// every place in it has moved to the snapshot that replaces it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Val {
    Mem(Box<[u8]>),
    At { src: Src, at: u64, len: u32 },
}

impl Val {
    /// Value `v`, which `src` holds (or its commit will write) at `at`: a
    /// place if it is long enough, else the bytes.
    fn read_from(src: Src, at: u64, v: &[u8]) -> Self {
        match u32::try_from(v.len()) {
            Ok(len) if v.len() >= HELD_ON_DISK_FROM => Val::At { src, at, len },
            _ => Val::Mem(v.into()),
        }
    }

    /// The bytes, read from the disk if they are held there.
    fn load<'v>(&'v self, disk: &dyn LogDisk) -> Result<std::borrow::Cow<'v, [u8]>, StoreError> {
        match self {
            Val::Mem(b) => Ok(std::borrow::Cow::Borrowed(b)),
            Val::At { src, at, len } => {
                let mut buf = vec![0u8; *len as usize];
                disk.read_at(&src.name(), *at, &mut buf)
                    .map_err(io_err("read a row from the log"))?;
                Ok(std::borrow::Cow::Owned(buf))
            }
        }
    }
}

type Rows = BTreeMap<Box<[u8]>, Val>;

/// A snapshot on its way to disk: the state as it was when `log-{gen}`
/// was started, encoded, and how much of it `snap-{gen}.tmp` holds.
struct Checkpoint {
    gen: u64,
    bytes: Vec<u8>,
    written: usize,
}

/// The store as a commit log with in-memory tables (see the module doc).
pub struct LogStore {
    disk: Box<dyn LogDisk>,
    tables: Vec<Rows>,
    path: PathBuf,
    format: u32,
    /// The log commits go to, `log-{gen}`.
    gen: u64,
    /// Bytes of commits in `log-{gen}`.
    log_bytes: u64,
    /// Bytes `log-{gen}` has on disk, synced and witnessed in its header:
    /// from `log_bytes` on, fill.
    /// Kept only while logs grow ahead ([`LogOptions::preallocate_bytes`]
    /// above 0); with 0 it stays what the open found and is never read.
    log_room: u64,
    /// The header slot of `log-{gen}` in force (the next header write
    /// goes to the other one).
    log_slot: usize,
    /// The length the header of `log-{gen}` witnesses (`log_room` once
    /// the next commit's sync has made the slot durable).
    witnessed: u64,
    /// Bytes in every log since the snapshot in force.
    logged_since_snap: u64,
    snap_bytes: u64,
    /// A checkpoint being written, a chunk per commit.
    checkpoint: Option<Checkpoint>,
    options: LogOptions,
    /// Why commits are refused, after a failed write or sync.
    poisoned: Option<String>,
    /// The last commit's record buffer, kept for the next one: a group
    /// commit's record runs to hundreds of KiB, and growing a fresh one
    /// each time costs reallocations, copies and page faults.
    spare: Vec<u8>,
    /// The last commit's undo list, emptied, kept for the next one as
    /// `spare` is (one entry per write of a group commit).
    spare_undo: Vec<Undo>,
    /// How the store was opened: [`Mode::Check`] never writes.
    mode: Mode,
    /// Whether starting the next log marks `log-{gen}` as followed: not
    /// in a version-1 log (its first bytes are records) nor in a repair
    /// (the files it replaces are damaged).
    mark_followed: bool,
    /// What [`LogStore::open_for_check`] found damaged.
    damage: Vec<Damage>,
    /// The pending rows still whole inside the damaged commits.
    salvaged: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Largest record buffer kept between commits; a rare larger commit's
/// buffer is freed rather than held for good.
const SPARE_MAX: usize = 4 << 20;

impl fmt::Debug for LogStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogStore")
            .field("path", &self.path)
            .field("gen", &self.gen)
            .field("log_bytes", &self.log_bytes)
            .field("snap_bytes", &self.snap_bytes)
            .field("checkpointing", &self.checkpoint.as_ref().map(|c| c.gen))
            .field("poisoned", &self.poisoned)
            .finish_non_exhaustive()
    }
}

fn io_err(op: &'static str) -> impl FnOnce(io::Error) -> StoreError {
    move |source| StoreError::Io { op, source }
}

fn corrupt(file: &str, at: usize, detail: impl Into<String>) -> StoreError {
    Damage {
        file: file.to_string(),
        offset: at as u64,
        detail: detail.into(),
        obligations: Vec::new(),
    }
    .into()
}

fn log_name(gen: u64) -> String {
    format!("log-{gen}")
}

fn snap_name(gen: u64) -> String {
    format!("snap-{gen}")
}

fn put_len(out: &mut Vec<u8>, n: usize) -> Result<(), StoreError> {
    let n = u32::try_from(n).map_err(|_| StoreError::Unwritable {
        table: "log",
        key: String::new(),
        detail: format!("an entry of {n} bytes is larger than a log entry can hold"),
    })?;
    out.extend_from_slice(&n.to_le_bytes());
    Ok(())
}

/// A cursor over bytes that never reads past their end.
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let s = self.b.get(self.at..end)?;
        self.at = end;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|s| s[0])
    }
    fn u32(&mut self) -> Option<u32> {
        let s = self.take(4)?;
        Some(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self) -> Option<u64> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Some(u64::from_le_bytes(a))
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.u32()?).ok()?;
        self.take(n)
    }
    fn done(&self) -> bool {
        self.at == self.b.len()
    }
}

fn table_of(i: u8) -> Option<Table> {
    Table::ALL.get(usize::from(i)).copied()
}

/// One write of a commit: a put (`Some`: where in the payload the value
/// starts, and the value) or a delete (`None`).
type Write1<'a> = Option<(usize, &'a [u8])>;

/// A commit's writes, as decoded from its log record.
type Ops<'a> = Vec<(Table, &'a [u8], Write1<'a>)>;

/// Decodes a log record's payload into its writes.
fn decode_ops(payload: &[u8]) -> Option<Ops<'_>> {
    let mut c = Cursor { b: payload, at: 0 };
    let mut out = Vec::new();
    while !c.done() {
        let op = c.u8()?;
        let t = table_of(c.u8()?)?;
        let k = c.bytes()?;
        let v = match op {
            OP_PUT => {
                let v = c.bytes()?;
                Some((c.at - v.len(), v))
            }
            OP_DEL => None,
            _ => return None,
        };
        out.push((t, k, v));
    }
    Some(out)
}

/// The table named `name`.
fn table_named(name: &str) -> Result<Table, StoreError> {
    Table::ALL
        .into_iter()
        .find(|t| t.name() == name)
        .ok_or_else(|| StoreError::Unwritable {
            table: "log",
            key: name.to_string(),
            detail: "no such table".into(),
        })
}

/// A table for every [`Table`], all empty.
fn empty_tables() -> Vec<Rows> {
    Table::ALL.iter().map(|_| Rows::new()).collect()
}

/// The byte a table is named by in records and snapshots.
fn table_byte(t: Table) -> Result<u8, StoreError> {
    u8::try_from(t.index()).map_err(|_| StoreError::Unwritable {
        table: "log",
        key: String::new(),
        detail: "table index does not fit a byte".into(),
    })
}

/// Appends one write of a commit to a record's payload: a put (`Some`)
/// or a delete (`None`), as [`decode_ops`] reads it. Returns where in
/// `out` the key now is, and where its value starts.
fn push_op(
    out: &mut Vec<u8>,
    t: Table,
    k: &[u8],
    v: Option<&[u8]>,
) -> Result<(std::ops::Range<usize>, usize), StoreError> {
    let t = table_byte(t)?;
    out.push(if v.is_some() { OP_PUT } else { OP_DEL });
    out.push(t);
    put_len(out, k.len())?;
    let at = out.len();
    out.extend_from_slice(k);
    if let Some(v) = v {
        put_len(out, v.len())?;
        out.extend_from_slice(v);
    }
    Ok((at..at + k.len(), out.len() - v.map_or(0, <[u8]>::len)))
}

/// Seals `rec` as the record at offset `at` of log `gen`
/// ([`log_record::seal`]).
fn seal(rec: &mut Vec<u8>, gen: u64, at: u64) -> Result<(), StoreError> {
    log_record::seal(rec, gen, at).map_err(|len| StoreError::Unwritable {
        table: "log",
        key: String::new(),
        detail: format!("a commit of {len} bytes is larger than a log record may be"),
    })
}

/// Removes every snapshot and log of a generation before `gen`.
fn remove_before(disk: &mut dyn LogDisk, l: &Listing, gen: u64) -> Result<(), StoreError> {
    for g in l.snaps.iter().filter(|&&g| g < gen) {
        disk.remove(&snap_name(*g))
            .map_err(io_err("remove an old snapshot"))?;
    }
    for g in l.logs.iter().filter(|&&g| g < gen) {
        disk.remove(&log_name(*g))
            .map_err(io_err("remove an old log"))?;
    }
    Ok(())
}

fn apply(tables: &mut [Rows], t: Table, k: &[u8], v: Option<Val>) {
    let rows = &mut tables[t.index()];
    match v {
        Some(v) => {
            rows.insert(k.into(), v);
        }
        None => {
            rows.remove(k);
        }
    }
}

/// The whole state as snapshot `gen`, every value read in full (a value
/// held on disk is read from where it is).
fn encode_snapshot(gen: u64, tables: &[Rows], disk: &dyn LogDisk) -> Result<Vec<u8>, StoreError> {
    let mut out = Vec::new();
    out.extend_from_slice(SNAP_MAGIC);
    out.extend_from_slice(&SNAP_VERSION.to_le_bytes());
    out.extend_from_slice(&gen.to_le_bytes());
    let mut count = 0u64;
    for t in Table::ALL {
        let ti = table_byte(t)?;
        for (k, v) in &tables[t.index()] {
            out.push(ti);
            put_len(&mut out, k.len())?;
            out.extend_from_slice(k);
            let v = v.load(disk)?;
            put_len(&mut out, v.len())?;
            out.extend_from_slice(&v);
            count += 1;
        }
    }
    out.push(SNAP_END);
    out.extend_from_slice(&count.to_le_bytes());
    let sum = crc(&[&out]);
    out.extend_from_slice(&sum.to_le_bytes());
    Ok(out)
}

fn decode_snapshot(name: &str, gen: u64, b: &[u8]) -> Result<Vec<Rows>, StoreError> {
    let bad = |at: usize, d: &str| corrupt(name, at, format!("snapshot {d}"));
    let Some(body_len) = b.len().checked_sub(4) else {
        return Err(bad(0, "is shorter than its trailer"));
    };
    let (body, sum) = b.split_at(body_len);
    if crc(&[body]) != u32::from_le_bytes([sum[0], sum[1], sum[2], sum[3]]) {
        return Err(bad(body_len, "checksum does not match"));
    }
    let mut c = Cursor { b: body, at: 0 };
    if c.take(8) != Some(SNAP_MAGIC.as_slice()) {
        return Err(bad(0, "has no snapshot header"));
    }
    match c.u32() {
        Some(SNAP_VERSION) => {}
        Some(v) => return Err(bad(8, &format!("layout version {v} is not {SNAP_VERSION}"))),
        None => return Err(bad(8, "is truncated")),
    }
    if c.u64() != Some(gen) {
        return Err(bad(12, "names another generation than its file"));
    }
    let mut tables = empty_tables();
    let mut count = 0u64;
    loop {
        let at = c.at;
        let ti = c.u8().ok_or_else(|| bad(at, "is truncated"))?;
        if ti == SNAP_END {
            break;
        }
        let t = table_of(ti).ok_or_else(|| bad(at, &format!("names table {ti}")))?;
        let k = c.bytes().ok_or_else(|| bad(at, "entry is truncated"))?;
        let v = c.bytes().ok_or_else(|| bad(at, "entry is truncated"))?;
        let v = Val::read_from(Src::Snap(gen), (c.at - v.len()) as u64, v);
        tables[t.index()].insert(k.into(), v);
        count += 1;
    }
    if c.u64() != Some(count) || !c.done() {
        return Err(bad(c.at, "entry count does not match"));
    }
    Ok(tables)
}

/// What can still be read of damaged snapshot `gen` (`b`), for a check or
/// a repair: every entry from its start up to the first that does not
/// parse, whatever its checksum says.
fn salvage_snapshot(gen: u64, b: &[u8]) -> Vec<Rows> {
    let mut tables = empty_tables();
    let mut c = Cursor { b, at: SNAP_HEADER };
    while let Some((ti, k, at, v)) = snap_entry(&mut c) {
        let Some(t) = table_of(ti) else { break };
        tables[t.index()].insert(k.into(), Val::read_from(Src::Snap(gen), at as u64, v));
    }
    tables
}

/// The files of one directory listing, sorted out.
#[derive(Default)]
struct Listing {
    snaps: Vec<u64>,
    logs: Vec<u64>,
    stray: Vec<String>,
}

fn parse_gen(name: &str, prefix: &str) -> Option<u64> {
    let rest = name.strip_prefix(prefix)?;
    if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    rest.parse().ok()
}

fn listing(names: Vec<String>) -> Listing {
    let mut l = Listing::default();
    for n in names {
        if let Some(g) = parse_gen(&n, "snap-") {
            l.snaps.push(g);
        } else if let Some(g) = parse_gen(&n, "log-") {
            l.logs.push(g);
        } else if n.ends_with(".tmp") {
            l.stray.push(n);
        }
        // Anything else is not ours; leave it.
    }
    l
}

/// A write transaction. Its writes go straight to the in-memory tables,
/// each encoded into the commit's record as it is made and remembered in
/// `undo` with the row it replaced; [`LogStore::transact`] puts the rows
/// back if the transaction fails or its record cannot be made durable.
/// (Only the store's own thread, inside `transact`, sees the tables
/// between a write and its sync.)
///
/// A long value is put as its place in the log from the start: where the
/// record will be written (`gen`, `base`) is known before it is. Until
/// the record is durable such a place is read from `rec` itself, and if
/// it never becomes durable the rows are put back, so no read after the
/// transaction sees a place the log does not hold.
struct LogTxn<'a> {
    tables: &'a mut [Rows],
    /// Where rows held on disk are read from.
    disk: &'a dyn LogDisk,
    /// The commit's record: a header's room, then the writes as made.
    rec: &'a mut Vec<u8>,
    /// The log the record goes to, and the byte it will start at.
    gen: u64,
    base: u64,
    undo: Vec<Undo>,
}

/// How to take back one write: the row `key` (a range of the record, where
/// the write encoded it) held before it, or `None` if it had none.
struct Undo {
    t: Table,
    key: std::ops::Range<usize>,
    old: Option<Val>,
}

impl Txn for LogTxn<'_> {
    fn get(&mut self, t: Table, k: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(v) = self.tables[t.index()].get(k) else {
            return Ok(None);
        };
        if let Val::At { src, at, len } = *v {
            if src == Src::Log(self.gen) && at >= self.base {
                // Written by this transaction: in the record, not the log.
                let from = usize::try_from(at - self.base).unwrap_or(usize::MAX);
                let bytes = from
                    .checked_add(len as usize)
                    .and_then(|end| self.rec.get(from..end))
                    .ok_or_else(|| StoreError::Unwritable {
                        table: t.name(),
                        key: String::from_utf8_lossy(k).into_owned(),
                        detail: "a place this commit made is outside its record".into(),
                    })?;
                return Ok(Some(bytes.to_vec()));
            }
        }
        v.load(self.disk).map(|b| Some(b.into_owned()))
    }

    fn contains(&mut self, t: Table, k: &[u8]) -> Result<bool, StoreError> {
        // The key's entry is enough: no read of a value held on disk.
        Ok(self.tables[t.index()].contains_key(k))
    }

    fn put(&mut self, t: Table, k: &[u8], v: &[u8]) -> Result<(), StoreError> {
        let (key, at) = push_op(self.rec, t, k, Some(v))?;
        let val = Val::read_from(Src::Log(self.gen), self.base + at as u64, v);
        let old = self.tables[t.index()].insert(k.into(), val);
        self.undo.push(Undo { t, key, old });
        Ok(())
    }

    fn del(&mut self, t: Table, k: &[u8]) -> Result<(), StoreError> {
        self.del_found(t, k).map(|_| ())
    }

    fn del_found(&mut self, t: Table, k: &[u8]) -> Result<bool, StoreError> {
        // Deleting an absent row changes nothing: nothing to log or undo.
        let Some(old) = self.tables[t.index()].remove(k) else {
            return Ok(false);
        };
        let key = match push_op(self.rec, t, k, None) {
            Ok((key, _)) => key,
            Err(e) => {
                // Not logged, so not to be undone: the row stays.
                self.tables[t.index()].insert(k.into(), old);
                return Err(e);
            }
        };
        self.undo.push(Undo {
            t,
            key,
            old: Some(old),
        });
        Ok(true)
    }
}

/// Takes back a failed transaction's writes, newest first, so `tables`
/// are as they were before it.
fn roll_back(tables: &mut [Rows], rec: &[u8], undo: Vec<Undo>) {
    for u in undo.into_iter().rev() {
        let rows = &mut tables[u.t.index()];
        let k = &rec[u.key];
        match u.old {
            Some(v) => {
                rows.insert(k.into(), v);
            }
            None => {
                rows.remove(k);
            }
        }
    }
}

/// The next entry of a snapshot's body at `c`: its table byte, key, and
/// where its value starts, with the value; `None` at the end marker (or
/// at bytes that do not parse: the snapshot was checked when written).
fn snap_entry<'a>(c: &mut Cursor<'a>) -> Option<(u8, &'a [u8], usize, &'a [u8])> {
    let t = c.u8()?;
    if t == SNAP_END {
        return None;
    }
    let k = c.bytes()?;
    let v = c.bytes()?;
    Some((t, k, c.at - v.len(), v))
}

/// After snapshot `gen` (`snap`: its bytes) is in force, before the files
/// it replaces are removed: every value held in one of them moves to its
/// place in the snapshot. Such a value has not been written since the
/// snapshot was encoded (a write since then went to `log-{gen}`), so the
/// snapshot holds it under its key; both are in the same order (table,
/// then key), so one pass over each finds them all. Were one missing, its
/// bytes are read into memory while their file is still there.
fn repoint(
    tables: &mut [Rows],
    snap: &[u8],
    gen: u64,
    disk: &dyn LogDisk,
) -> Result<(), StoreError> {
    let mut c = Cursor {
        b: snap,
        at: SNAP_HEADER,
    };
    let mut entry = snap_entry(&mut c);
    for t in Table::ALL {
        let tb = table_byte(t)?;
        for (k, v) in tables[t.index()].iter_mut() {
            let Val::At { src, len, .. } = *v else {
                continue;
            };
            if !src.replaced_by(gen) {
                continue;
            }
            while let Some((et, ek, _, _)) = entry {
                if (et, ek) < (tb, &k[..]) {
                    entry = snap_entry(&mut c);
                } else {
                    break;
                }
            }
            match entry {
                Some((et, ek, at, ev)) if et == tb && ek == &k[..] && ev.len() == len as usize => {
                    *v = Val::At {
                        src: Src::Snap(gen),
                        at: at as u64,
                        len,
                    };
                }
                _ => {
                    debug_assert!(
                        false,
                        "a value held in a replaced file is not in the snapshot"
                    );
                    let bytes = v.load(disk)?.into_owned();
                    *v = Val::Mem(bytes.into());
                }
            }
        }
    }
    Ok(())
}

struct LogView<'a> {
    tables: &'a [Rows],
    disk: &'a dyn LogDisk,
}

impl View for LogView<'_> {
    fn get(&self, t: Table, k: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.tables[t.index()]
            .get(k)
            .map(|v| v.load(self.disk).map(std::borrow::Cow::into_owned))
            .transpose()
    }

    fn scan(&self, t: Table, from: &[u8], f: &mut Visit<'_>) -> Result<(), StoreError> {
        let rows = &self.tables[t.index()];
        for (k, v) in rows.range::<[u8], _>((Bound::Included(from), Bound::Unbounded)) {
            if !f(k, &v.load(self.disk)?)? {
                break;
            }
        }
        Ok(())
    }
}

impl LogStore {
    /// Opens (or creates) the store in the directory `dir` with default
    /// options.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(dir, LogOptions::default())
    }

    /// Opens (or creates) the store in the directory `dir`.
    pub fn open_with(dir: impl AsRef<Path>, options: LogOptions) -> Result<Self, StoreError> {
        let path = dir.as_ref().to_path_buf();
        let disk = FsDisk::open(&path).map_err(io_err("open the store directory"))?;
        let mut s = Self::recover(Box::new(disk), options)?;
        s.path = path;
        Ok(s)
    }

    /// Opens (or creates) the store on a caller-supplied [`LogDisk`]: the
    /// same recovery, format checks and migrations as
    /// [`LogStore::open_with`]. [`LogStore::path`] is empty for it.
    pub fn open_on(disk: impl LogDisk + 'static, options: LogOptions) -> Result<Self, StoreError> {
        Self::recover(Box::new(disk), options)
    }

    /// Writes `value` (or deletes, `None`) at `key` of the table named
    /// `table`, durably, as one commit and bypassing every rule of the
    /// engine: for tests that plant rows the store would never write.
    #[doc(hidden)]
    pub fn plant_raw(
        &mut self,
        table: &str,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), StoreError> {
        let t = table_named(table)?;
        self.transact(|txn| match value {
            Some(v) => txn.put(t, key, v),
            None => txn.del(t, key),
        })
    }

    /// The bytes at `key` of the table named `table`, as stored: for
    /// tests that read back rows planted with [`LogStore::plant_raw`].
    #[doc(hidden)]
    pub fn read_raw(&self, table: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let t = table_named(table)?;
        self.view().get(t, key)
    }

    /// The store's directory (empty for [`LogStore::open_on`]).
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn recover(disk: Box<dyn LogDisk>, options: LogOptions) -> Result<Self, StoreError> {
        Self::recover_in(disk, options, Mode::Open).map(|(s, _)| s)
    }

    /// Opens the store in `dir` to read it only (`abhyasa store check`):
    /// nothing is written, cut off, removed or migrated, whatever it finds
    /// (C-SD-3). Damage does not refuse the open: every place is listed
    /// ([`Repair::damage`]) and every record around it read, so the tables
    /// hold what a repair would keep.
    pub fn open_for_check(dir: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = dir.as_ref().to_path_buf();
        if !path.is_dir() {
            return Err(StoreError::Io {
                op: "open the store directory",
                source: io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{} is not a directory", path.display()),
                ),
            });
        }
        let disk = FsDisk::open(&path).map_err(io_err("open the store directory"))?;
        let (mut s, damage) = Self::recover_in(Box::new(disk), LogOptions::default(), Mode::Check)?;
        s.path = path;
        s.damage = damage;
        Ok(s)
    }

    /// [`LogStore::open_for_check`] on a caller-supplied [`LogDisk`].
    pub fn open_for_check_on(disk: impl LogDisk + 'static) -> Result<Self, StoreError> {
        let (mut s, damage) = Self::recover_in(Box::new(disk), LogOptions::default(), Mode::Check)?;
        s.damage = damage;
        Ok(s)
    }

    /// Repairs the store in `dir` (`abhyasa store repair`; C-SD-3): reads
    /// it as [`LogStore::open_for_check`] does, and if any file is damaged
    /// copies every snapshot and log, verbatim, into
    /// `dir/damaged-<now>/`, then writes what was read (every record
    /// before and after each damaged place) as a new snapshot and log and
    /// removes the old files. Returns what it found and the obligations
    /// named by damaged bytes that are neither pending nor finished after
    /// it: custody it could not recover.
    pub fn repair(dir: impl AsRef<Path>, now: Timestamp) -> Result<LogRepair, StoreError> {
        let dir = dir.as_ref();
        let stamp = now.to_rfc3339().replace([':', '.'], "-");
        let mut aside = dir.join(format!("damaged-{stamp}"));
        let mut n = 1;
        while aside.exists() {
            n += 1;
            aside = dir.join(format!("damaged-{stamp}-{n}"));
        }
        Self::open_for_check(dir)?.repair_with(now, || {
            copy_aside(dir, &aside)?;
            Ok(aside)
        })
    }

    /// [`LogStore::repair`] on a store opened for check: `aside` copies
    /// the files away first (only if there is damage) and says where.
    fn repair_with(
        mut self,
        now: Timestamp,
        aside: impl FnOnce() -> io::Result<PathBuf>,
    ) -> Result<LogRepair, StoreError> {
        let damage = std::mem::take(&mut self.damage);
        if damage.is_empty() {
            return Ok(LogRepair::default());
        }
        let saved_to = aside().map_err(io_err("copy the damaged files aside"))?;
        self.rewrite()?;
        // C-SD-4: an obligation whose offer is still whole in the damaged
        // bytes is handed to the core to escalate `store_damaged` with
        // its fail-safe; one whose offer is gone is listed as lost.
        let lost = self.lost(&damage);
        let salvaged: Vec<PendingRecord> = lost
            .iter()
            .filter_map(|id| {
                self.salvaged
                    .iter()
                    .rev()
                    .filter(|(k, _)| k.as_slice() == id.as_bytes())
                    .find_map(|(k, v)| engine::salvage_pending(k, v))
            })
            .collect();
        let escalated = self.transact(|t| {
            engine::mark_receiver_damaged(t, now)?;
            engine::hand_over_damaged(t, now, salvaged)
        })?;
        let lost = lost
            .into_iter()
            .filter(|id| !escalated.contains(id))
            .collect();
        Ok(LogRepair {
            saved_to: Some(saved_to),
            damage,
            lost,
            escalated,
        })
    }

    /// The obligations the damaged places name that the store holds
    /// neither as pending nor as finished.
    fn lost(&self, damage: &[Damage]) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for id in damage.iter().flat_map(|d| &d.obligations) {
            let held = [Table::Pending, Table::Terminal]
                .iter()
                .any(|t| self.tables[t.index()].contains_key(id.as_bytes()));
            if !held && !out.contains(id) {
                out.push(id.clone());
            }
        }
        out
    }

    /// Writes the tables as a new snapshot and log (the next generation)
    /// and removes every older file: a repair's salvage made durable.
    fn rewrite(&mut self) -> Result<(), StoreError> {
        self.mode = Mode::Open;
        self.mark_followed = false;
        self.start_checkpoint()?;
        self.finish_checkpoint()?;
        // What the damaged records wrote to the indexes, the counters and
        // the format row is rebuilt from the records that remain; the next
        // event id stays past every event kept.
        let plan = index::plan_rebuild(&self.view())?;
        let past = self.tables[Table::Events.index()]
            .keys()
            .next_back()
            .and_then(|k| <[u8; 8]>::try_from(&k[..]).ok())
            .map(|k| u64::from_be_bytes(k) + 1);
        self.transact(|t| {
            if let Some(past) = past {
                engine::raise_next_event(t, past)?;
            }
            engine::finish_rebuild(t, &plan)
        })?;
        self.format = engine::FORMAT_VERSION;
        Ok(())
    }

    fn recover_in(
        mut disk: Box<dyn LogDisk>,
        options: LogOptions,
        mode: Mode,
    ) -> Result<(Self, Vec<Damage>), StoreError> {
        let mut found = Found {
            mode,
            damage: Vec::new(),
            salvaged: Vec::new(),
        };
        let l = listing(disk.list().map_err(io_err("list the store directory"))?);
        if mode == Mode::Open {
            for n in &l.stray {
                // An interrupted checkpoint: its snapshot was never renamed
                // into place, so nothing depends on it.
                disk.remove(n)
                    .map_err(io_err("remove an interrupted checkpoint"))?;
            }
        }
        // The snapshot in force and every log from its generation on, in
        // order: a checkpoint starts `log-{g+1}` first and writes
        // `snap-{g+1}` while commits go to it, so until that snapshot is in
        // place, `snap-{g}` with `log-{g}` and `log-{g+1}` is the state.
        let snap = l.snaps.iter().copied().max().unwrap_or(0);
        let mut logs: Vec<u64> = l.logs.iter().copied().filter(|&g| g >= snap).collect();
        logs.sort_unstable();
        let mut want = snap;
        for g in &logs {
            if *g != want {
                found.damage(Damage {
                    file: log_name(want),
                    offset: 0,
                    detail: format!(
                        "missing: log {g} follows snapshot {snap} and log {want} is not there"
                    ),
                    obligations: Vec::new(),
                })?;
            }
            want = g + 1;
        }
        if logs.is_empty() && !l.snaps.is_empty() {
            // A checkpoint starts its log before it writes its snapshot.
            found.damage(Damage {
                file: log_name(snap),
                offset: 0,
                detail: format!("missing: snapshot {snap} is in force and its log is not there"),
                obligations: Vec::new(),
            })?;
        }
        let (mut tables, snap_bytes) = if l.snaps.is_empty() {
            (empty_tables(), 0)
        } else {
            let name = snap_name(snap);
            let b = disk
                .read(&name)
                .map_err(io_err("read the snapshot"))?
                .ok_or_else(|| corrupt(&name, 0, "snapshot vanished while opening"))?;
            match decode_snapshot(&name, snap, &b) {
                Ok(t) => (t, b.len() as u64),
                Err(StoreError::Damaged {
                    file,
                    offset,
                    detail,
                    ..
                }) => {
                    found.damage(Damage {
                        file,
                        offset,
                        detail,
                        obligations: Vec::new(),
                    })?;
                    (salvage_snapshot(snap, &b), b.len() as u64)
                }
                Err(e) => return Err(e),
            }
        };
        let gen = logs.last().copied().unwrap_or(snap);
        let mut logged_since_snap = 0u64;
        let mut log_bytes = LOG_HEADER as u64;
        let mut log_room = LOG_HEADER as u64;
        let mut log_slot = 0;
        let mut migrate = false;
        for &g in &logs {
            let name = log_name(g);
            let b = disk
                .read(&name)
                .map_err(io_err("read the log"))?
                .ok_or_else(|| corrupt(&name, 0, "log vanished while opening"))?;
            let newest = g == gen;
            let v2 = log_record::is_v2(&b) || !is_v1(&b);
            let (end, torn, room, slot) = if v2 {
                replay_v2(&name, g, &b, newest, &mut tables, &mut found)?
            } else {
                // A version-1 log: read, never appended to (C-SD-1: it
                // cannot prove a tear, so anything after its last whole
                // record is damage); the open writes its state anew.
                migrate |= newest;
                let end = replay_v1(&name, g, &b, &mut tables, &mut found)?;
                (end, None, b.len() as u64, 0)
            };
            if v2 && mode == Mode::Open && log_header(&b).is_none() {
                // Its creation was cut (see `replay_v2`): created again.
                new_log(disk.as_mut(), g)?;
            }
            if let (Some(from), Mode::Open) = (torn, mode) {
                // C-SD-1: a torn final write, proven; its bytes become
                // room again (never a shorter file: the header witnesses
                // the synced length).
                let mut f = vec![0u8; b.len() - from];
                fill(g, from as u64, &mut f);
                disk.write_at(&name, from as u64, &f)
                    .and_then(|()| disk.sync(&name))
                    .map_err(io_err("drop a torn final write"))?;
                tracing::warn!(
                    file = %name,
                    offset = from,
                    bytes = b.len() - from,
                    "dropped a torn final write (never acknowledged: part of it never reached the disk)"
                );
            }
            logged_since_snap += end as u64;
            log_bytes = end as u64;
            log_room = room;
            log_slot = slot;
        }
        if logs.is_empty() && mode == Mode::Open {
            new_log(disk.as_mut(), gen)?;
        }
        if mode == Mode::Open {
            remove_before(disk.as_mut(), &l, snap)?;
        }
        // Rebuilt from their rows in order, the tables' B-trees have full
        // nodes: built a row at a time, a node that keeps filling at its
        // end splits in about half, and a million pending rows held ~40
        // bytes more each (the memory target).
        for rows in &mut tables {
            *rows = std::mem::take(rows).into_iter().collect();
        }
        let mut s = Self {
            disk,
            tables,
            path: PathBuf::new(),
            format: 0,
            gen,
            log_bytes,
            log_room,
            log_slot,
            witnessed: log_room,
            logged_since_snap,
            snap_bytes,
            checkpoint: None,
            options,
            poisoned: None,
            spare: Vec::new(),
            spare_undo: Vec::new(),
            mode,
            mark_followed: !migrate,
            damage: Vec::new(),
            salvaged: Vec::new(),
        };
        if mode == Mode::Check {
            // A format row the damage took is listed by the check, not fatal.
            s.format = engine::setup(&s.view()).map_or(0, |(f, _)| f);
            s.salvaged = std::mem::take(&mut found.salvaged);
            return Ok((s, found.damage));
        }
        if logs.len() > 2 || migrate {
            // Checkpoints were interrupted twice in a row: write one whole
            // now, so a node that restarts more often than a checkpoint
            // takes never piles up logs. After one interrupted checkpoint
            // (two logs) the first commit starts another (the logs since
            // the snapshot still outgrow it), written a chunk a commit as
            // any: encoding and syncing a whole snapshot here took ~1.3 s
            // of a million pending rows' recovery. A newest log
            // of version 1 is never appended to: its state is written as
            // a snapshot and a version-2 log.
            s.start_checkpoint()?;
            s.finish_checkpoint()?;
        }
        let (format, setup) = engine::setup(&s.view())?;
        if let Some(w) = setup {
            s.transact(|t| w.write(t))?;
        }
        s.format = format;
        Ok((s, found.damage))
    }

    fn view(&self) -> LogView<'_> {
        LogView {
            tables: &self.tables,
            disk: self.disk.as_ref(),
        }
    }

    /// Runs `f` over a transaction; if it succeeds, writes its write set
    /// as one log record and syncs it. The writes are in the tables from
    /// the moment `f` makes them; if `f` fails, or the record cannot be
    /// written and synced, they are taken back before this returns, so
    /// no read (all come after it) sees a commit that is not durable.
    fn transact<T>(
        &mut self,
        f: impl FnOnce(&mut LogTxn<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if self.mode == Mode::Check {
            return Err(StoreError::Io {
                op: "commit",
                source: io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "the store was opened to be checked: it is read, never written",
                ),
            });
        }
        if let Some(why) = &self.poisoned {
            return Err(StoreError::Io {
                op: "commit",
                source: io::Error::other(format!(
                    "the store refuses commits until it is reopened: {why}"
                )),
            });
        }
        let mut rec = std::mem::take(&mut self.spare);
        rec.clear();
        rec.resize(HEADER, 0);
        let out = self.transact_in(&mut rec, f);
        if rec.capacity() <= SPARE_MAX {
            self.spare = rec;
        }
        out
    }

    /// [`LogStore::transact`] with its record buffer, `rec` (`HEADER`
    /// zero bytes on entry).
    fn transact_in<T>(
        &mut self,
        rec: &mut Vec<u8>,
        f: impl FnOnce(&mut LogTxn<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let undo = std::mem::take(&mut self.spare_undo);
        let mut txn = LogTxn {
            tables: &mut self.tables,
            disk: self.disk.as_ref(),
            rec,
            undo,
            gen: self.gen,
            base: self.log_bytes,
        };
        let out = f(&mut txn);
        let mut undo = txn.undo;
        // The record, sealed, unless the transaction wrote nothing.
        let sealed = out.and_then(|out| {
            if rec.len() == HEADER {
                return Ok((out, false));
            }
            seal(rec, self.gen, self.log_bytes)?;
            Ok((out, true))
        });
        let out = match sealed {
            Ok((out, true)) => out,
            Ok((out, false)) => return Ok(out),
            Err(e) => {
                roll_back(&mut self.tables, rec, undo);
                return Err(e);
            }
        };
        let name = log_name(self.gen);
        if let Err(e) = self
            .make_room(&name, rec.len() as u64)
            .and_then(|()| self.disk.write_at(&name, self.log_bytes, rec))
            .and_then(|()| self.witness_room(&name))
            .and_then(|()| self.disk.sync(&name))
        {
            roll_back(&mut self.tables, rec, undo);
            self.poisoned = Some(format!("writing the log failed: {e}"));
            return Err(StoreError::Io {
                op: "append to the log",
                source: e,
            });
        }
        undo.clear();
        if undo.capacity() <= SPARE_MAX / std::mem::size_of::<Undo>() {
            self.spare_undo = undo;
        }
        self.log_bytes += rec.len() as u64;
        self.logged_since_snap += rec.len() as u64;
        // The commit is durable already: a failed checkpoint step does not
        // undo it, but the files' state is then unknown (see `poisoned`).
        if let Err(e) = self.checkpoint_step(rec.len()) {
            self.poisoned = Some(format!("a checkpoint failed: {e}"));
        }
        Ok(out)
    }

    /// Grows the current log, `name`, with synced fill (by
    /// [`LogOptions::preallocate_bytes`] at a time) until a record of
    /// `len` bytes fits in what it already has; then witnesses the new
    /// length in the log's header ([`LogStore::write_header`]).
    fn make_room(&mut self, name: &str, len: u64) -> io::Result<()> {
        let step = self.options.preallocate_bytes;
        let end = self.log_bytes + len;
        if step == 0 || end <= self.log_room {
            return Ok(());
        }
        let room = end.div_ceil(step).saturating_mul(step);
        let mut at = self.log_room.max(self.log_bytes);
        let mut buf = vec![0u8; 64 * 1024];
        while at < room {
            let n = (room - at).min(buf.len() as u64) as usize;
            fill(self.gen, at, &mut buf[..n]);
            self.disk.write_at(name, at, &buf[..n])?;
            at += n as u64;
        }
        self.disk.sync(name)?;
        self.log_room = room;
        Ok(())
    }

    /// After the log has grown: writes the header slot not in force,
    /// witnessing the new (already synced) length, for the commit's own
    /// `fdatasync` to make durable — no sync of its own. Whether it lands
    /// or not, the slot in force says what is true.
    fn witness_room(&mut self, name: &str) -> io::Result<()> {
        if self.log_room <= self.witnessed {
            return Ok(());
        }
        let slot = (self.log_slot + 1) % 2;
        let h = LogHeader {
            gen: self.gen,
            room: self.log_room,
            followed: false,
        };
        self.disk
            .write_at(name, LogHeader::slot_offset(slot), &h.encode())?;
        self.log_slot = slot;
        self.witnessed = self.log_room;
        Ok(())
    }

    /// Writes `log-{gen}`'s header, witnessing `room` synced bytes (and
    /// `followed`: a later log was started), to the slot not in force,
    /// synced. The bytes it witnesses are synced first, so the slot in
    /// force always says what is true; a write torn here leaves the other.
    fn write_header(&mut self, room: u64, followed: bool) -> io::Result<()> {
        let name = log_name(self.gen);
        let slot = (self.log_slot + 1) % 2;
        let h = LogHeader {
            gen: self.gen,
            room,
            followed,
        };
        self.disk
            .write_at(&name, LogHeader::slot_offset(slot), &h.encode())?;
        self.disk.sync(&name)?;
        self.log_slot = slot;
        self.witnessed = self.witnessed.max(room);
        Ok(())
    }

    /// Writes the rest of the checkpoint under way at once.
    fn finish_checkpoint(&mut self) -> Result<(), StoreError> {
        while let Some(cp) = &self.checkpoint {
            let rest = cp.bytes.len() - cp.written;
            self.checkpoint_step(rest)?;
        }
        Ok(())
    }

    /// After a commit: starts a checkpoint once the logs since the snapshot
    /// outgrow it, or writes the next chunk of the one under way.
    fn checkpoint_step(&mut self, record: usize) -> Result<(), StoreError> {
        if self.checkpoint.is_none() {
            if self.logged_since_snap > self.options.checkpoint_bytes.max(self.snap_bytes) {
                self.start_checkpoint()?;
            }
            return Ok(());
        }
        let Some(cp) = self.checkpoint.as_mut() else {
            return Ok(());
        };
        let tmp = format!("{}.tmp", snap_name(cp.gen));
        let end = cp
            .bytes
            .len()
            .min(cp.written + self.options.checkpoint_chunk_bytes.max(2 * record).max(1));
        let d = &mut self.disk;
        d.write_at(&tmp, cp.written as u64, &cp.bytes[cp.written..end])
            .and_then(|()| d.sync(&tmp))
            .map_err(io_err("write a snapshot"))?;
        cp.written = end;
        if end < cp.bytes.len() {
            return Ok(());
        }
        // Whole and synced: put it in force, move the values held in the
        // files it replaces to it, then drop those files.
        let gen = cp.gen;
        let snap = snap_name(gen);
        d.rename(&tmp, &snap)
            .and_then(|()| d.sync_dir())
            .map_err(io_err("put a snapshot in place"))?;
        let Some(cp) = self.checkpoint.take() else {
            return Ok(());
        };
        self.snap_bytes = cp.bytes.len() as u64;
        self.logged_since_snap = self.log_bytes;
        repoint(&mut self.tables, &cp.bytes, gen, self.disk.as_ref())?;
        let d = &mut self.disk;
        let old = listing(d.list().map_err(io_err("list the store directory"))?);
        remove_before(d.as_mut(), &old, gen)
    }

    /// Encodes the state as snapshot `gen + 1` and starts `log-{gen+1}`:
    /// later commits go there while the snapshot is written.
    fn start_checkpoint(&mut self) -> Result<(), StoreError> {
        let next = self.gen + 1;
        let bytes = encode_snapshot(next, &self.tables, self.disk.as_ref())?;
        let tmp = format!("{}.tmp", snap_name(next));
        self.disk.remove(&tmp).map_err(io_err("start a log"))?;
        new_log(self.disk.as_mut(), next)?;
        // Only once the next log exists: a newest log that says it was
        // followed has lost its successor (C-SD-2).
        if self.mark_followed {
            let room = self.log_room.max(self.log_bytes);
            self.write_header(room, true)
                .map_err(io_err("start a log"))?;
        }
        self.mark_followed = true;
        self.gen = next;
        self.log_bytes = LOG_HEADER as u64;
        self.log_room = LOG_HEADER as u64;
        self.witnessed = LOG_HEADER as u64;
        self.log_slot = 0;
        self.checkpoint = Some(Checkpoint {
            gen: next,
            bytes,
            written: 0,
        });
        Ok(())
    }
}

/// How a store is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// For a node: damage refuses the open; a proven torn final write is
    /// dropped; an interrupted checkpoint or an old format is taken care of.
    Open,
    /// For `store check` and `store repair`: nothing is written; every
    /// damaged place is listed and every record around it read.
    Check,
}

/// The damage a recovery found so far.
struct Found {
    mode: Mode,
    damage: Vec<Damage>,
    /// Pending rows (key, value) still whole inside damaged commits, for
    /// a repair to hand over (C-SD-4); kept only by a check.
    salvaged: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Found {
    /// Keeps the pending rows a damaged commit's bytes `b` still hold
    /// (checked by their own CRC when a repair decodes them).
    fn salvage(&mut self, b: &[u8]) {
        if self.mode == Mode::Check {
            self.salvaged.extend(
                log_record::pending_rows(b)
                    .into_iter()
                    .map(|(k, v)| (k.to_vec(), v.to_vec())),
            );
        }
    }

    /// Refuses the open ([`Mode::Open`]) or lists `d` and goes on.
    fn damage(&mut self, d: Damage) -> Result<(), StoreError> {
        match self.mode {
            Mode::Open => Err(d.into()),
            Mode::Check => {
                self.damage.push(d);
                Ok(())
            }
        }
    }
}

/// Whether `b` starts with a version-1 record (a version-1 log).
fn is_v1(b: &[u8]) -> bool {
    log_record::record_at_v1(b, 0, 0).is_some() || b.iter().all(|&x| x == 0)
}

/// Creates log `gen`, empty but for its header, synced with its directory.
fn new_log(disk: &mut dyn LogDisk, gen: u64) -> Result<(), StoreError> {
    let name = log_name(gen);
    let h = LogHeader {
        gen,
        room: LOG_HEADER as u64,
        followed: false,
    }
    .encode();
    disk.write_at(&name, 0, &[h, h].concat())
        .and_then(|()| disk.sync(&name))
        .and_then(|()| disk.sync_dir())
        .map_err(io_err("create the log"))
}

/// Applies the writes of one record (its payload at `at` of log `gen`,
/// its header `header` bytes long) to `tables`.
fn apply_record(tables: &mut [Rows], gen: u64, at: usize, header: usize, ops: Ops<'_>) {
    for (t, k, v) in ops {
        let v = v.map(|(i, v)| Val::read_from(Src::Log(gen), (at + header + i) as u64, v));
        apply(tables, t, k, v);
    }
}

/// The obligations the damaged bytes `b[from..to]` (a record's payload,
/// as far as it can be told) name.
fn named(b: &[u8], from: usize, to: usize) -> Vec<String> {
    b.get(from..to.min(b.len()))
        .map(log_record::obligations_named)
        .unwrap_or_default()
}

/// Replays version-2 log `gen` (`b`) into `tables` (see `log_record.rs`
/// for the rule). Returns the end of its last whole record, the start of
/// a proven torn final write if there is one, the witnessed room and the
/// header slot in force.
fn replay_v2(
    name: &str,
    gen: u64,
    b: &[u8],
    newest: bool,
    tables: &mut [Rows],
    found: &mut Found,
) -> Result<(usize, Option<usize>, u64, usize), StoreError> {
    let damage = |offset: usize, detail: String, obligations: Vec<String>| Damage {
        file: name.to_string(),
        offset: offset as u64,
        detail,
        obligations,
    };
    let (h, slot) = match log_header(b) {
        Some(h) => h,
        None if newest && b.len() <= LOG_HEADER => {
            // A log whose creation was cut before its first sync: nothing
            // was ever committed to it (the open writes its header anew).
            (
                LogHeader {
                    gen,
                    room: 0,
                    followed: false,
                },
                0,
            )
        }
        None => {
            found.damage(damage(
                0,
                "neither copy of the log's header checks".into(),
                vec![],
            ))?;
            (
                LogHeader {
                    gen,
                    room: 0,
                    followed: false,
                },
                0,
            )
        }
    };
    if h.gen != gen {
        found.damage(damage(
            0,
            format!("the header names log {} (a file copied or renamed)", h.gen),
            vec![],
        ))?;
    }
    if (b.len() as u64) < h.room {
        found.damage(damage(
            b.len(),
            format!(
                "truncated: {} bytes, but {} were synced; every commit past byte {} is lost",
                b.len(),
                h.room,
                b.len()
            ),
            vec![],
        ))?;
    }
    if newest && h.followed {
        found.damage(Damage {
            file: log_name(gen + 1),
            offset: 0,
            detail: format!("missing: {name} says log {} was started after it", gen + 1),
            obligations: Vec::new(),
        })?;
    }
    let mut at = LOG_HEADER;
    loop {
        if let Some((payload, end)) = log_record::record_at(b, gen, at) {
            match decode_ops(payload) {
                Some(ops) => {
                    apply_record(tables, gen, at, HEADER, ops);
                    at = end;
                    continue;
                }
                None => {
                    found.damage(damage(
                        at,
                        "a commit checks but its writes do not decode".into(),
                        log_record::obligations_named(payload),
                    ))?;
                    found.salvage(payload);
                    at = end;
                    continue;
                }
            }
        }
        if log_record::first_not_room(b, gen, h.room, at).is_none() {
            return Ok((at, None, h.room, slot));
        }
        let extent = log_record::header_len(b, gen, at).map(|len| at + HEADER + len);
        let next = log_record::next_record(b, gen, at);
        let (detail, end) = match next {
            Some(y) => (
                format!(
                    "the commit here does not check, but a whole one follows at {y} \
                     (a crash tears only the last commit)"
                ),
                y,
            ),
            None => match log_record::tail(b, gen, h.room, at, newest) {
                Tail::Room => return Ok((at, None, h.room, slot)),
                Tail::Torn => return Ok((at, Some(at), h.room, slot)),
                Tail::Damaged(detail) => (detail, log_record::end_of_written(b, gen, h.room, at)),
            },
        };
        // A damaged header or mark around an intact payload: the repair
        // keeps its writes (the check reads them; the open still refuses).
        let ends = [extent.map_or(0, |e| e + log_record::MARK), end];
        let intact =
            log_record::intact_payload(b, gen, at, &ends).and_then(|p| Some((p, decode_ops(p)?)));
        let detail = match &intact {
            Some(_) => format!("{detail}; its payload is intact, and a repair keeps it"),
            None => detail,
        };
        found.damage(damage(
            at,
            detail,
            named(b, at + HEADER, extent.unwrap_or(end).min(end)),
        ))?;
        if let Some(d) = b.get(at + HEADER..extent.unwrap_or(end).min(end).min(b.len())) {
            found.salvage(d);
        }
        if let Some((_, ops)) = intact {
            apply_record(tables, gen, at, HEADER, ops);
        }
        match next {
            Some(y) => at = y,
            None => return Ok((at, None, h.room, slot)),
        }
    }
}

/// Replays version-1 log `gen` (`b`: `len | crc | payload` records, then
/// zeros) into `tables`; returns the end of its last whole record. It
/// cannot tell a torn write from damage, so anything after its last whole
/// record but zeros is damage.
fn replay_v1(
    name: &str,
    gen: u64,
    b: &[u8],
    tables: &mut [Rows],
    found: &mut Found,
) -> Result<usize, StoreError> {
    let mut at = 0;
    let mut end = 0;
    while at < b.len() {
        if let Some(ops) =
            log_record::record_at_v1(b, gen, at).and_then(|(p, e)| Some((decode_ops(p)?, e)))
        {
            apply_record(tables, gen, at, HEADER_V1, ops.0);
            at = ops.1;
            end = at;
            continue;
        }
        if b[at..].iter().all(|&x| x == 0) {
            break;
        }
        found.damage(Damage {
            file: name.to_string(),
            offset: at as u64,
            detail: "a version-1 log has bytes after its last whole commit: a torn write or \
                     damage, which that format cannot tell apart"
                .into(),
            obligations: named(b, at + HEADER_V1, b.len()),
        })?;
        match (at + 1..b.len()).find(|&y| log_record::record_at_v1(b, gen, y).is_some()) {
            Some(y) => at = y,
            None => break,
        }
    }
    Ok(end)
}

/// Copies every snapshot and log in `dir` verbatim into `aside` (created),
/// synced.
fn copy_aside(dir: &Path, aside: &Path) -> io::Result<()> {
    std::fs::create_dir_all(aside)?;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name();
        let Some(n) = name.to_str() else { continue };
        if e.file_type()?.is_file() && (n.starts_with("log-") || n.starts_with("snap-")) {
            let to = aside.join(n);
            std::fs::copy(e.path(), &to)?;
            File::open(&to)?.sync_all()?;
        }
    }
    File::open(aside)?.sync_all()?;
    File::open(dir)?.sync_all()
}

/// [`crate::fuzzing::log_store_commits`]: `data` replayed as the newest
/// log of generation 0 in a node's open.
pub(crate) fn count_commits(data: &[u8]) -> Result<usize, String> {
    let mut found = Found {
        mode: Mode::Open,
        damage: Vec::new(),
        salvaged: Vec::new(),
    };
    let mut t = empty_tables();
    let (end, torn, ..) =
        replay_v2("log-0", 0, data, true, &mut t, &mut found).map_err(|e| e.to_string())?;
    if torn.is_some() {
        return Err(format!("a torn write at {end}"));
    }
    let mut n = 0;
    let mut at = LOG_HEADER;
    while let Some((_, next)) = log_record::record_at(data, 0, at) {
        n += 1;
        at = next;
    }
    Ok(n)
}

/// Decodes `data` as every file the log store reads back: a log of
/// either version (the newest and an older one; for a node's open and for
/// a check) and a snapshot (strictly and salvaged). Every error must be
/// [`StoreError::Damaged`], and every value read must lie inside `data`;
/// `Err` says which rule broke. The fuzz target and its proptest run it.
pub(crate) fn decode_all(data: &[u8]) -> Result<(), String> {
    let inside = |tables: &[Rows], gen: u64| -> Result<(), String> {
        for rows in tables {
            for v in rows.values() {
                if let Val::At { at, len, .. } = v {
                    if at
                        .checked_add(u64::from(*len))
                        .is_none_or(|e| e > data.len() as u64)
                    {
                        return Err(format!("log {gen}: a value's place {at}+{len} is outside"));
                    }
                }
            }
        }
        Ok(())
    };
    let typed = |r: Result<(), StoreError>| match r {
        Ok(()) | Err(StoreError::Damaged { .. }) => Ok(()),
        Err(e) => Err(format!("an error that is not Damaged: {e}")),
    };
    for gen in [0, 1] {
        for newest in [true, false] {
            for mode in [Mode::Open, Mode::Check] {
                let mut found = Found {
                    mode,
                    damage: Vec::new(),
                    salvaged: Vec::new(),
                };
                let mut t = empty_tables();
                let end = replay_v2("log", gen, data, newest, &mut t, &mut found);
                if let Ok((end, torn, ..)) = &end {
                    if *end > data.len().max(LOG_HEADER) || torn.is_some_and(|x| x != *end) {
                        return Err(format!("log {gen}: end {end} torn {torn:?}"));
                    }
                }
                typed(end.map(|_| ()))?;
                inside(&t, gen)?;
                let mut t = empty_tables();
                typed(replay_v1("log", gen, data, &mut t, &mut found).map(|_| ()))?;
                inside(&t, gen)?;
            }
        }
        match decode_snapshot("snap", gen, data) {
            Ok(t) => inside(&t, gen)?,
            Err(e) => typed(Err(e))?,
        }
        inside(&salvage_snapshot(gen, data), gen)?;
    }
    Ok(())
}

/// What [`LogStore::repair`] found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogRepair {
    /// Where the files were copied before any was changed (`None`: no
    /// damage, nothing changed).
    pub saved_to: Option<PathBuf>,
    /// Every damaged place.
    pub damage: Vec<Damage>,
    /// The obligations named by damaged bytes that the repaired store
    /// holds neither as pending nor as finished, and whose offer the
    /// damaged bytes no longer hold whole.
    pub lost: Vec<String>,
    /// The obligations whose offer was salvaged from the damaged bytes and
    /// handed over as custody the store cannot prove: the node escalates
    /// each `store_damaged` with its fail-safe at its next start (C-SD-4).
    pub escalated: Vec<String>,
}

impl Store for LogStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn format_version(&self) -> u32 {
        self.format
    }

    fn commit(&mut self, now: Timestamp, batches: &[&[Record]]) -> Result<Committed, StoreError> {
        self.transact(|t| engine::commit(t, now, batches))
    }

    reads_through_view!(self => self.view());

    fn compact(&mut self, now: Timestamp, retention: Duration) -> Result<Compacted, StoreError> {
        let (dels, out) = engine::plan_compaction(&self.view(), now, retention)?;
        if !dels.is_empty() {
            self.transact(|t| engine::delete(t, &dels))?;
        }
        Ok(out)
    }

    /// Grows the log ahead of the commits while nothing waits: when less
    /// than half a step ([`LogOptions::preallocate_bytes`]) of synced
    /// fill is left, one more step. Under light load the commit that would have
    /// crossed the end then finds the room there and does not wait for
    /// the fill to be written and synced (0.6–4 ms on the development
    /// machine, strace); under saturation the thread is
    /// rarely idle and commits grow the log as before. Reads are
    /// unchanged (the fill is past every commit). A failed write or
    /// sync poisons the store as one in a commit does.
    fn idle(&mut self) -> Result<(), StoreError> {
        let step = self.options.preallocate_bytes;
        let half = step / 2;
        if step == 0 || self.poisoned.is_some() || self.log_room >= self.log_bytes + half {
            return Ok(());
        }
        let name = log_name(self.gen);
        self.make_room(&name, half).map_err(|e| {
            self.poisoned = Some(format!("growing the log failed: {e}"));
            StoreError::Io {
                op: "grow the log",
                source: e,
            }
        })
    }
}

impl Repair for LogStore {
    repair_reads_through_view!(self => self.view());

    fn damage(&self) -> Vec<Damage> {
        self.damage.clone()
    }

    fn quarantine(&mut self, now: Timestamp) -> Result<Vec<QuarantinedRow>, StoreError> {
        let bad = engine::check(&self.view())?;
        if bad.is_empty() {
            return Ok(Vec::new());
        }
        let moved = self.transact(|t| engine::quarantine(t, now, &bad))?;
        let plan = index::plan_rebuild(&self.view())?;
        self.transact(|t| engine::finish_rebuild(t, &plan))?;
        Ok(moved)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    type Op<'a> = (Table, &'a [u8], Option<&'a [u8]>);

    /// Every table with every value read in full, wherever it is held.
    /// Each table's rows with their values in full.
    type Full = Vec<BTreeMap<Box<[u8]>, Box<[u8]>>>;

    fn materialize(tables: &[Rows], disk: &dyn LogDisk) -> Full {
        tables
            .iter()
            .map(|rows| {
                rows.iter()
                    .map(|(k, v)| (k.clone(), v.load(disk).unwrap().into_owned().into()))
                    .collect()
            })
            .collect()
    }

    fn rows_of(s: &LogStore) -> Full {
        materialize(&s.tables, s.disk.as_ref())
    }

    fn rec(gen: u64, at: usize, ops: &[Op<'_>]) -> Vec<u8> {
        let mut out = vec![0u8; HEADER];
        for (t, k, v) in ops {
            push_op(&mut out, *t, k, *v).unwrap();
        }
        seal(&mut out, gen, at as u64).unwrap();
        out
    }

    /// Log `gen` as a store writes it: its header, `recs`, then `room`
    /// bytes of fill.
    fn log_image(gen: u64, recs: &[&[u8]], room: usize) -> Vec<u8> {
        let mut b = [h2(gen, 0), h2(gen, 0)].concat();
        for r in recs {
            b.extend_from_slice(r);
        }
        let at = b.len();
        b.resize(at + room, 0);
        fill(gen, at as u64, &mut b[at..]);
        let room = b.len() as u64;
        b[..32].copy_from_slice(&h2(gen, room));
        b
    }

    fn h2(gen: u64, room: u64) -> [u8; 32] {
        LogHeader {
            gen,
            room,
            followed: false,
        }
        .encode()
    }

    /// Replays `b` as the newest log `gen` for a node's open: the end of
    /// its last record and a proven tear's start, or the refusal.
    fn replay(gen: u64, b: &[u8], t: &mut [Rows]) -> Result<(usize, Option<usize>), StoreError> {
        replay_as(gen, b, true, t)
    }

    /// [`replay`] as the newest log or an older one.
    fn replay_as(
        gen: u64,
        b: &[u8],
        newest: bool,
        t: &mut [Rows],
    ) -> Result<(usize, Option<usize>), StoreError> {
        let mut found = Found {
            mode: Mode::Open,
            damage: Vec::new(),
            salvaged: Vec::new(),
        };
        replay_v2("log", gen, b, newest, t, &mut found).map(|(end, torn, ..)| (end, torn))
    }

    // C-SD-1: a record bound to its generation and offset, with a mark
    // that tells written bytes from fill.
    #[test]
    fn records_check_only_where_they_were_written() {
        let a = rec(0, LOG_HEADER, &[(Table::Meta, b"a", Some(b"1"))]);
        let b = rec(
            0,
            LOG_HEADER + a.len(),
            &[(Table::Meta, b"b", Some(b"2")), (Table::Meta, b"a", None)],
        );
        let log = log_image(0, &[&a, &b], 256);
        let mut t = empty_tables();
        assert_eq!(
            replay(0, &log, &mut t).unwrap(),
            (LOG_HEADER + a.len() + b.len(), None)
        );
        assert_eq!(t[Table::Meta.index()].len(), 1);
        // The same records in another generation or at another offset
        // do not check.
        assert!(log_record::record_at(&log, 1, LOG_HEADER).is_none());
        let moved = log_image(0, &[&b, &a], 256);
        assert!(log_record::record_at(&moved, 0, LOG_HEADER).is_none());
        // Each byte of a whole record, flipped, fails its check.
        for i in 0..a.len() {
            let mut bad = log.clone();
            bad[LOG_HEADER + i] ^= 1;
            assert!(log_record::record_at(&bad, 0, LOG_HEADER).is_none(), "{i}");
        }
    }

    /// Files in memory, shared by clones (so a store can be reopened on
    /// what an earlier one wrote), with writes or syncs made to fail.
    #[derive(Debug, Clone, Default)]
    struct MemDisk(std::sync::Arc<std::sync::Mutex<MemFiles>>);

    #[derive(Debug, Default)]
    struct MemFiles {
        files: BTreeMap<String, Vec<u8>>,
        fail_append: bool,
        fail_sync: bool,
        /// Each file's length at its last sync.
        synced_len: BTreeMap<String, usize>,
        /// Syncs that found a file's length changed since its last one.
        growing_syncs: usize,
    }

    impl MemDisk {
        fn files(&self) -> std::sync::MutexGuard<'_, MemFiles> {
            self.0.lock().unwrap()
        }
        fn bytes(&self) -> usize {
            self.files().files.values().map(Vec::len).sum()
        }
    }

    impl LogDisk for MemDisk {
        fn list(&self) -> io::Result<Vec<String>> {
            Ok(self.files().files.keys().cloned().collect())
        }
        fn read(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
            Ok(self.files().files.get(name).cloned())
        }
        fn read_at(&self, name: &str, at: u64, buf: &mut [u8]) -> io::Result<()> {
            let f = self.files();
            read_image_at(f.files.get(name).ok_or(io::ErrorKind::NotFound)?, at, buf)
        }
        fn write_at(&mut self, name: &str, at: u64, data: &[u8]) -> io::Result<()> {
            let mut f = self.files();
            if f.fail_append {
                return Err(io::Error::other("write refused"));
            }
            let b = f.files.entry(name.into()).or_default();
            let at = usize::try_from(at).unwrap();
            if b.len() < at + data.len() {
                b.resize(at + data.len(), 0);
            }
            b[at..at + data.len()].copy_from_slice(data);
            Ok(())
        }
        fn sync(&mut self, name: &str) -> io::Result<()> {
            let mut f = self.files();
            if f.fail_sync {
                return Err(io::Error::other("sync refused"));
            }
            let len = f.files.get(name).map_or(0, Vec::len);
            if f.synced_len.insert(name.into(), len) != Some(len) {
                f.growing_syncs += 1;
            }
            Ok(())
        }
        fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
            if let Some(b) = self.files().files.get_mut(name) {
                b.truncate(usize::try_from(len).unwrap());
            }
            Ok(())
        }
        fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
            let mut f = self.files();
            let b = f.files.remove(from).ok_or(io::ErrorKind::NotFound)?;
            f.files.insert(to.into(), b);
            Ok(())
        }
        fn remove(&mut self, name: &str) -> io::Result<()> {
            self.files().files.remove(name);
            Ok(())
        }
        fn sync_dir(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// A transaction that writes one key several times, deletes a row it
    /// wrote and one that was never there, and replaces a committed row.
    fn churn(t: &mut LogTxn<'_>) -> Result<(), StoreError> {
        t.put(Table::Meta, b"x.a", b"2")?;
        t.put(Table::Meta, b"x.a", b"3")?;
        t.put(Table::Meta, b"x.c", b"gone")?;
        t.del(Table::Meta, b"x.c")?;
        t.del(Table::Meta, b"x.never")?;
        t.del(Table::Meta, b"x.b")?;
        t.put(Table::Pending, b"x.d", b"4")?;
        assert_eq!(
            t.get(Table::Meta, b"x.a")?.as_deref(),
            Some(b"3".as_slice())
        );
        assert_eq!(t.get(Table::Meta, b"x.c")?, None);
        Ok(())
    }

    fn seeded(disk: &MemDisk) -> LogStore {
        let mut s = LogStore::open_on(disk.clone(), LogOptions::default()).unwrap();
        s.transact(|t| {
            t.put(Table::Meta, b"x.a", b"1")?;
            t.put(Table::Meta, b"x.b", b"1")
        })
        .unwrap();
        s
    }

    #[test]
    fn a_failed_transaction_or_write_leaves_the_tables_as_they_were() {
        let disk = MemDisk::default();
        let mut s = seeded(&disk);
        let before = rows_of(&s);
        let written = disk.bytes();

        // The transaction itself fails after its writes.
        let err = s
            .transact(|t| {
                churn(t)?;
                Err::<(), _>(StoreError::Unwritable {
                    table: "meta",
                    key: String::new(),
                    detail: "refused by the test".into(),
                })
            })
            .unwrap_err();
        assert!(matches!(err, StoreError::Unwritable { .. }), "{err}");
        assert_eq!(rows_of(&s), before);
        assert_eq!(disk.bytes(), written);

        // Its record cannot be written: taken back, and the store poisoned.
        disk.files().fail_append = true;
        assert!(s.transact(churn).is_err());
        assert_eq!(rows_of(&s), before);
        disk.files().fail_append = false;
        assert!(s.transact(churn).is_err(), "a poisoned store commits");
        assert_eq!(rows_of(&s), before);

        // Written but not synced: taken back too.
        let mut s = LogStore::open_on(disk.clone(), LogOptions::default()).unwrap();
        assert_eq!(rows_of(&s), before);
        disk.files().fail_sync = true;
        assert!(s.transact(churn).is_err());
        assert_eq!(rows_of(&s), before);
    }

    #[test]
    fn a_commit_replays_to_the_tables_it_left() {
        let disk = MemDisk::default();
        let mut s = seeded(&disk);
        let written = disk.bytes();
        // Deleting a row that is not there writes nothing.
        s.transact(|t| t.del(Table::Meta, b"x.never")).unwrap();
        assert_eq!(disk.bytes(), written);

        s.transact(churn).unwrap();
        let rows = &s.tables[Table::Meta.index()];
        assert_eq!(
            rows.get(b"x.a".as_slice()),
            Some(&Val::Mem(b"3".as_slice().into()))
        );
        assert!(!rows.contains_key(b"x.b".as_slice()));
        assert!(!rows.contains_key(b"x.c".as_slice()));
        let reopened = LogStore::open_on(disk.clone(), LogOptions::default()).unwrap();
        assert_eq!(rows_of(&reopened), rows_of(&s));
    }

    fn log_len(disk: &MemDisk, s: &LogStore) -> usize {
        disk.files().files[&log_name(s.gen)].len()
    }

    fn put_meta(s: &mut LogStore, k: &[u8], len: usize) {
        s.transact(|t| t.put(Table::Meta, k, &vec![7; len]))
            .unwrap();
    }

    /// A store on a fresh disk whose log grows `step` bytes at a time.
    fn growing_by(step: u64) -> (MemDisk, LogOptions, LogStore) {
        let options = LogOptions {
            preallocate_bytes: step,
            ..LogOptions::default()
        };
        let disk = MemDisk::default();
        let s = LogStore::open_on(disk.clone(), options.clone()).unwrap();
        (disk, options, s)
    }

    #[test]
    fn idle_grows_the_log_ahead_so_commits_need_not() {
        const STEP: u64 = 4096;
        let (disk, options, mut s) = growing_by(STEP);
        // With half a step of fill or more ahead, idle writes nothing.
        assert!(s.log_room >= s.log_bytes + STEP / 2);
        let (bytes, grown) = (disk.bytes(), disk.files().growing_syncs);
        s.idle().unwrap();
        assert_eq!((disk.bytes(), disk.files().growing_syncs), (bytes, grown));

        // Less than half a step left: idle grows the log by a step, synced.
        let fill = |s: &LogStore| usize::try_from(s.log_room - s.log_bytes - STEP / 4).unwrap();
        let n = fill(&s);
        put_meta(&mut s, b"a", n);
        assert!(s.log_room < s.log_bytes + STEP / 2);
        let old_end = s.log_room;
        s.idle().unwrap();
        assert_eq!(disk.files().growing_syncs, grown + 1);
        assert_eq!(s.log_room, old_end + STEP);
        assert_eq!(log_len(&disk, &s) as u64, s.log_room);
        // A commit past the old end finds the room: it grows nothing.
        put_meta(&mut s, b"b", STEP as usize / 2);
        assert!(s.log_bytes > old_end);
        assert_eq!(disk.files().growing_syncs, grown + 1);

        // Reopened: the same rows; the fill is room.
        let tables = rows_of(&s);
        drop(s);
        let mut s = LogStore::open_on(disk.clone(), options.clone()).unwrap();
        assert_eq!(rows_of(&s), tables);

        // A growth that fails poisons the store, as a commit's does.
        s.idle().unwrap();
        let n = fill(&s);
        put_meta(&mut s, b"c", n);
        assert!(s.log_room < s.log_bytes + STEP / 2);
        disk.files().fail_sync = true;
        assert!(matches!(s.idle(), Err(StoreError::Io { .. })));
        disk.files().fail_sync = false;
        assert!(s.transact(|t| t.put(Table::Meta, b"d", b"1")).is_err());
        let s = LogStore::open_on(disk.clone(), options).unwrap();
        assert_eq!(rows_of(&s).len(), tables.len());
        assert!(rows_of(&s)[Table::Meta.index()].contains_key(b"c".as_slice()));
    }

    #[test]
    fn commits_overwrite_fill_the_log_already_has() {
        const STEP: u64 = 4096;
        let (disk, options, mut s) = growing_by(STEP);
        let grown = disk.files().growing_syncs;
        assert_eq!(log_len(&disk, &s), STEP as usize);
        // Commits that fit in the fill leave the file's length alone:
        // none of their syncs has a new length to write.
        for i in 0..20u8 {
            put_meta(&mut s, &[b'k', i], 40);
        }
        assert!(s.log_bytes < STEP / 2, "{}", s.log_bytes);
        assert_eq!(disk.files().growing_syncs, grown);
        assert_eq!(log_len(&disk, &s), STEP as usize);
        // One that does not fit grows the log by whole steps, once.
        put_meta(&mut s, b"big", 5000);
        assert_eq!(disk.files().growing_syncs, grown + 1);
        let room = usize::try_from(s.log_bytes.div_ceil(STEP) * STEP).unwrap();
        assert!(room > STEP as usize);
        assert_eq!(log_len(&disk, &s), room);

        // Reopened: the fill is room, not a torn commit.
        let tables = rows_of(&s);
        let log_bytes = s.log_bytes;
        drop(s);
        let mut s = LogStore::open_on(disk.clone(), options.clone()).unwrap();
        assert_eq!(rows_of(&s), tables);
        assert_eq!(s.log_bytes, log_bytes);
        assert_eq!(log_len(&disk, &s), room);
        let grown = disk.files().growing_syncs;
        put_meta(&mut s, b"after", 40);
        assert_eq!(disk.files().growing_syncs, grown);

        // A torn commit in the fill is dropped (C-SD-1): its bytes are
        // fill again, the file keeps its length, and commits go on there.
        let tables = rows_of(&s);
        let end = usize::try_from(s.log_bytes).unwrap();
        let name = log_name(s.gen);
        let gen = s.gen;
        drop(s);
        let torn = rec(gen, end, &[(Table::Meta, b"torn", Some(&[1; 300]))]);
        disk.files().files.get_mut(&name).unwrap()[end..end + 200].copy_from_slice(&torn[..200]);
        let mut s = LogStore::open_on(disk.clone(), options.clone()).unwrap();
        assert_eq!(rows_of(&s), tables);
        assert_eq!(log_len(&disk, &s), room);
        assert!(log_record::first_not_room(&disk.files().files[&name], gen, 0, end).is_none());
        put_meta(&mut s, b"again", 40);
        assert_eq!(log_len(&disk, &s) % STEP as usize, 0);

        // Without preallocation every commit grows the file.
        let disk = MemDisk::default();
        let options = LogOptions {
            preallocate_bytes: 0,
            ..LogOptions::default()
        };
        let mut s = LogStore::open_on(disk.clone(), options).unwrap();
        let grown = disk.files().growing_syncs;
        for i in 0..5u8 {
            put_meta(&mut s, &[b'k', i], 40);
        }
        assert_eq!(disk.files().growing_syncs, grown + 5);
        assert_eq!(log_len(&disk, &s), usize::try_from(s.log_bytes).unwrap());
    }

    /// A store on a fresh disk, committed to until a checkpoint has
    /// started: `log-0` (its last commit followed by fill) and `log-1`
    /// are then both the state.
    fn mid_checkpoint(options: &LogOptions) -> (MemDisk, LogStore) {
        let disk = MemDisk::default();
        let mut s = LogStore::open_on(disk.clone(), options.clone()).unwrap();
        let mut i = 0u8;
        while s.gen == 0 {
            put_meta(&mut s, &[b'k', i], 100);
            i += 1;
        }
        assert!(s.checkpoint.is_some());
        let f = disk.files();
        let log0 = &f.files[&log_name(0)];
        let (end, _) = replay_as(0, log0, false, &mut empty_tables()).unwrap();
        assert!(end < log0.len() && log_record::first_not_room(log0, 0, 0, end).is_none());
        drop(f);
        (disk, s)
    }

    // Reopened after one interrupted checkpoint, the store opens on its
    // snapshot and both logs without writing a snapshot; its first commit
    // starts a checkpoint. Interrupted again (three logs), it writes one
    // whole as it opens: logs never pile up.
    #[test]
    fn an_interrupted_checkpoint_is_taken_again_by_the_next_commit() {
        let options = LogOptions {
            checkpoint_bytes: 256,
            checkpoint_chunk_bytes: 1,
            preallocate_bytes: 4096,
        };
        let names = |disk: &MemDisk| {
            let mut v: Vec<String> = disk.files().files.keys().cloned().collect();
            v.sort();
            v
        };
        let (disk, s) = mid_checkpoint(&options);
        let tables = rows_of(&s);
        drop(s);
        let mut s = LogStore::open_on(disk.clone(), options.clone()).unwrap();
        assert_eq!(rows_of(&s), tables);
        assert!(s.checkpoint.is_none());
        assert_eq!(s.gen, 1);
        assert_eq!(names(&disk), [log_name(0), log_name(1)]);

        put_meta(&mut s, b"after", 100);
        assert!(s.checkpoint.is_some(), "the first commit starts one");
        assert_eq!(s.gen, 2);
        let tables = rows_of(&s);
        drop(s);
        let s = LogStore::open_on(disk.clone(), options.clone()).unwrap();
        assert_eq!(rows_of(&s), tables);
        assert!(s.checkpoint.is_none());
        assert_eq!(names(&disk), [log_name(3), snap_name(3)]);
    }

    #[test]
    fn an_older_log_ending_in_fill_opens_and_one_ending_in_bytes_is_refused() {
        let options = LogOptions {
            checkpoint_bytes: 256,
            checkpoint_chunk_bytes: 1,
            preallocate_bytes: 4096,
        };
        let (disk, s) = mid_checkpoint(&options);
        let tables = rows_of(&s);
        drop(s);
        let s = LogStore::open_on(disk.clone(), options.clone()).unwrap();
        assert_eq!(rows_of(&s), tables);
        drop(s);

        // The same with a stray byte after log-0's last commit.
        let (disk, s) = mid_checkpoint(&options);
        drop(s);
        let mut f = disk.files();
        let log0 = f.files.get_mut(&log_name(0)).unwrap();
        let (end, _) = replay_as(0, log0, false, &mut empty_tables()).unwrap();
        log0[end + 100] ^= 0x10;
        drop(f);
        let err = LogStore::open_on(disk.clone(), options).unwrap_err();
        assert!(
            matches!(&err, StoreError::Damaged { file, offset, .. } if file == "log-0" && *offset == end as u64),
            "{err}"
        );
    }

    #[test]
    fn long_values_are_held_on_disk_and_follow_each_checkpoint() {
        let options = LogOptions {
            checkpoint_bytes: 2048,
            checkpoint_chunk_bytes: 512,
            preallocate_bytes: 4096,
        };
        let disk = MemDisk::default();
        let mut s = LogStore::open_on(disk.clone(), options.clone()).unwrap();
        let long = |i: u8| vec![i; HELD_ON_DISK_FROM + usize::from(i)];
        let pending = |s: &LogStore, k: &[u8]| s.tables[Table::Pending.index()].get(k).cloned();

        // Committed, a long value is its place in the log; a short one and
        // a long one the same commit then replaced are in memory.
        s.transact(|t| {
            t.put(Table::Pending, b"p0", &long(0))?;
            // Read back before the record is written: from the record.
            t.put(Table::Terminal, b"t5", &long(5))?;
            assert_eq!(t.get(Table::Terminal, b"t5")?, Some(long(5)));
            t.put(Table::Pending, b"p1", &long(1))?;
            t.put(Table::Pending, b"p1", b"short")?;
            t.put(Table::Meta, b"m", b"1")
        })
        .unwrap();
        // A transaction that fails leaves no place in a record never written.
        let before = rows_of(&s);
        let err = s.transact(|t| {
            t.put(Table::Pending, b"p0", &long(7))?;
            t.put(Table::Pending, b"p9", &long(9))?;
            Err::<(), _>(StoreError::Unwritable {
                table: "custody_pending",
                key: String::new(),
                detail: "refused by the test".into(),
            })
        });
        assert!(err.is_err());
        assert_eq!(rows_of(&s), before);
        let Some(Val::At { src, at, len }) = pending(&s, b"p0") else {
            panic!("a committed long value is held in memory");
        };
        assert_eq!(src, Src::Log(0));
        let log0 = disk.files().files[&log_name(0)].clone();
        assert_eq!(&log0[at as usize..][..len as usize], &long(0)[..]);
        assert_eq!(
            pending(&s, b"p1"),
            Some(Val::Mem(b"short".as_slice().into()))
        );
        assert!(matches!(
            s.tables[Table::Meta.index()].get(b"m".as_slice()),
            Some(Val::Mem(_))
        ));

        // Commits until checkpoints have replaced log 0 and log 1: every
        // value reads back, from files that are still there.
        let mut i = 2u8;
        while s.gen < 3 || s.checkpoint.is_some() {
            s.transact(|t| t.put(Table::Pending, &[b'q', i], &long(i)))
                .unwrap();
            i += 1;
        }
        let names: Vec<String> = disk.files().files.keys().cloned().collect();
        assert!(
            !names.contains(&log_name(0)) && !names.contains(&log_name(1)),
            "{names:?}"
        );
        assert!(names.contains(&snap_name(3)), "{names:?}");
        assert!(matches!(
            pending(&s, b"p0"),
            Some(Val::At {
                src: Src::Snap(3),
                ..
            })
        ));
        let check = |s: &LogStore| {
            let v = s.view();
            assert_eq!(v.get(Table::Pending, b"p0").unwrap(), Some(long(0)));
            assert_eq!(
                v.get(Table::Pending, b"p1").unwrap(),
                Some(b"short".to_vec())
            );
            for j in 2..i {
                assert_eq!(v.get(Table::Pending, &[b'q', j]).unwrap(), Some(long(j)));
            }
            for rows in &s.tables {
                for val in rows.values() {
                    if let Val::At { src, .. } = val {
                        assert!(names.contains(&src.name()), "{src:?} is gone");
                    }
                }
            }
        };
        check(&s);
        // Reopened: the same rows, held as places in the same files.
        let before = rows_of(&s);
        drop(s);
        let s = LogStore::open_on(disk.clone(), options).unwrap();
        assert_eq!(rows_of(&s), before);
        check(&s);
    }

    #[test]
    fn an_image_reads_inside_its_bytes_only() {
        let mut buf = [0u8; 2];
        read_image_at(b"abc", 1, &mut buf).unwrap();
        assert_eq!(&buf, b"bc");
        for at in [2, 3, u64::MAX] {
            let e = read_image_at(b"abc", at, &mut buf).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "at {at}");
        }
    }

    #[test]
    fn snapshots_round_trip_and_refuse_damage() {
        let mut t = empty_tables();
        let long = vec![9u8; HELD_ON_DISK_FROM];
        t[Table::Pending.index()].insert(b"k".as_slice().into(), Val::Mem(b"v".as_slice().into()));
        t[Table::Terminal.index()].insert(b"l".as_slice().into(), Val::Mem(long.clone().into()));
        t[Table::Index.index()].insert(b"".as_slice().into(), Val::Mem(b"".as_slice().into()));
        let b = encode_snapshot(3, &t, &MemDisk::default()).unwrap();
        let back = decode_snapshot("snap-3", 3, &b).unwrap();
        // The long value is held as its place in the snapshot.
        let Some(Val::At { src, at, len }) = back[Table::Terminal.index()].get(b"l".as_slice())
        else {
            panic!("a long value read from a snapshot is held in memory");
        };
        assert_eq!(*src, Src::Snap(3));
        assert_eq!(&b[*at as usize..][..*len as usize], &long[..]);
        let disk = MemDisk::default();
        disk.files().files.insert(snap_name(3), b.clone());
        assert_eq!(materialize(&back, &disk), materialize(&t, &disk));
        assert!(decode_snapshot("snap-4", 4, &b).is_err());
        for i in 0..b.len() {
            let mut bad = b.clone();
            bad[i] ^= 1;
            assert!(decode_snapshot("snap-3", 3, &bad).is_err(), "byte {i}");
        }
        for cut in 0..b.len() {
            assert!(
                decode_snapshot("snap-3", 3, &b[..cut]).is_err(),
                "cut {cut}"
            );
        }
    }

    /// C-SD-1..3 on the log store, fault by fault.
    mod damage {
        use super::*;

        const N: usize = 30;

        fn options() -> LogOptions {
            LogOptions {
                checkpoint_bytes: 1 << 30,
                checkpoint_chunk_bytes: 1 << 20,
                preallocate_bytes: 8192,
            }
        }

        fn id(i: usize) -> String {
            format!("obl-{i:02}")
        }

        fn value(i: usize) -> Vec<u8> {
            vec![u8::try_from(i).unwrap(); 100]
        }

        /// A store that acknowledged `N` commits, each opening one
        /// obligation (a pending row held on disk): the disk, and each
        /// commit's obligation with its record's bytes in `log-0`.
        fn acked() -> (MemDisk, Vec<(String, std::ops::Range<usize>)>) {
            let disk = MemDisk::default();
            let mut s = LogStore::open_on(disk.clone(), options()).unwrap();
            let mut recs = Vec::new();
            for i in 0..N {
                let from = usize::try_from(s.log_bytes).unwrap();
                s.transact(|t| t.put(Table::Pending, id(i).as_bytes(), &value(i)))
                    .unwrap();
                recs.push((id(i), from..usize::try_from(s.log_bytes).unwrap()));
            }
            assert_eq!(s.gen, 0);
            (disk, recs)
        }

        fn image(disk: &MemDisk) -> BTreeMap<String, Vec<u8>> {
            disk.files().files.clone()
        }

        fn log0(disk: &MemDisk) -> std::sync::MutexGuard<'_, MemFiles> {
            disk.files()
        }

        /// The property after a fault that destroyed the bytes `hit` of
        /// `log-0`: the open refuses, naming the file and an offset at or
        /// before the first commit it cannot read (C-SD-2); a check
        /// changes no byte and lists it (C-SD-3); every acknowledged
        /// commit is read back whole, or named, or was itself hit; a
        /// repair keeps exactly what the check read, names the rest, and
        /// the store opens after it.
        fn refused_and_accounted(
            disk: &MemDisk,
            recs: &[(String, std::ops::Range<usize>)],
            hit: std::ops::Range<usize>,
            what: &str,
        ) -> Vec<String> {
            let before = image(disk);
            let err = LogStore::open_on(disk.clone(), options())
                .err()
                .unwrap_or_else(|| panic!("{what}: the store opened"));
            let StoreError::Damaged { file, offset, .. } = &err else {
                panic!("{what}: {err}");
            };
            assert_eq!(file, "log-0", "{what}: {err}");
            let first_hit = recs
                .iter()
                .find(|(_, r)| r.end > hit.start)
                .map_or(usize::MAX, |(_, r)| r.start);
            assert!(
                *offset as usize <= first_hit.max(hit.start),
                "{what}: {err}"
            );
            assert_eq!(image(disk), before, "{what}: the refused open wrote");

            let c = LogStore::open_for_check_on(disk.clone()).unwrap();
            assert_eq!(image(disk), before, "{what}: the check wrote");
            let damage = c.damage();
            assert!(!damage.is_empty(), "{what}");
            let mut kept = Vec::new();
            let mut named = Vec::new();
            for (i, (o, r)) in recs.iter().enumerate() {
                let got = c.view().get(Table::Pending, o.as_bytes()).unwrap();
                if let Some(v) = got {
                    assert_eq!(v, value(i), "{what}: {o} read back other bytes");
                    kept.push(o.clone());
                } else if damage.iter().any(|d| d.obligations.contains(o)) {
                    named.push(o.clone());
                } else {
                    assert!(
                        r.start < hit.end && hit.start < r.end,
                        "{what}: {o} ({r:?}) is silently absent; damage {damage:?}"
                    );
                }
            }
            let r = c
                .repair_with(Timestamp::EPOCH, || Ok(PathBuf::from("aside")))
                .unwrap();
            assert_eq!(r.damage, damage);
            for o in &named {
                assert!(r.lost.contains(o), "{what}: {o} not reported lost");
            }
            let s = LogStore::open_on(disk.clone(), options()).unwrap();
            let now: Vec<String> = s.tables[Table::Pending.index()]
                .keys()
                .map(|k| String::from_utf8(k.to_vec()).unwrap())
                .collect();
            assert_eq!(now, kept, "{what}: the repair kept other rows");
            kept
        }

        fn mutate(disk: &MemDisk, f: impl FnOnce(&mut Vec<u8>)) {
            f(log0(disk).files.get_mut("log-0").unwrap());
        }

        // C-SD-2, C-SD-3: a flipped bit in each field of a commit in the
        // middle of the log and of the last one.
        #[test]
        fn a_flipped_bit_anywhere_refuses_the_open_and_repair_salvages_around_it() {
            type At = fn(&std::ops::Range<usize>) -> usize;
            let fields: [(&str, At); 5] = [
                ("length", |r| r.start + 1),
                ("payload checksum", |r| r.start + 5),
                ("header checksum", |r| r.start + 10),
                ("payload", |r| r.start + HEADER + 30),
                ("mark", |r| r.end - 2),
            ];
            for k in [0, N / 2, N - 1] {
                for (name, at) in fields {
                    for bit in [0x01, 0x80] {
                        let (disk, recs) = acked();
                        let x = at(&recs[k].1);
                        mutate(&disk, |b| b[x] ^= bit);
                        let what = format!("bit {bit:#x} of the {name} of commit {k}");
                        let kept = refused_and_accounted(&disk, &recs, x..x + 1, &what);
                        // Around an intact payload the repair keeps the
                        // commit; a damaged payload's obligation is named.
                        assert_eq!(kept.contains(&recs[k].0), name != "payload", "{what}");
                    }
                }
            }
        }

        // C-SD-2: a zeroed 512-byte sector, mid-file and at the tail; a
        // sector copied from elsewhere in the file over them.
        #[test]
        fn a_zeroed_or_misdirected_sector_refuses_the_open() {
            for k in [3, N / 2, N - 1] {
                let (disk, recs) = acked();
                let s0 = recs[k].1.start / 512 * 512;
                mutate(&disk, |b| b[s0..s0 + 512].fill(0));
                refused_and_accounted(&disk, &recs, s0..s0 + 512, &format!("zeroed at {k}"));

                let (disk, recs) = acked();
                let s0 = recs[k].1.start / 512 * 512 + 100;
                mutate(&disk, |b| {
                    let from = if s0 > 2048 { 1024 } else { 3072 };
                    let copy = b[from..from + 512].to_vec();
                    b[s0..s0 + 512].copy_from_slice(&copy);
                });
                refused_and_accounted(&disk, &recs, s0..s0 + 512, &format!("copied at {k}"));
            }
            // The last commit wholly zeroed, room after it: zeros are
            // never room below the witnessed length.
            let (disk, recs) = acked();
            let gone = recs[N - 1].1.start..recs[N - 1].1.end + 64;
            mutate(&disk, |b| b[gone.clone()].fill(0));
            refused_and_accounted(&disk, &recs, gone, "the last commit zeroed");
            // A sector of room copied over the last commit: fill, but
            // another offset's, so not a tear.
            let (disk, recs) = acked();
            let last = recs[N - 1].1.clone();
            mutate(&disk, |b| {
                let copy = b[6000..6000 + last.len()].to_vec();
                b[last.clone()].copy_from_slice(&copy);
            });
            refused_and_accounted(
                &disk,
                &recs,
                last.clone(),
                "room copied over the last commit",
            );
        }

        // C-SD-2: truncation at and between commit boundaries, and at the
        // end of the last commit (the room the header witnesses is gone).
        #[test]
        fn a_truncated_log_refuses_the_open() {
            let (_, recs) = acked();
            let mut cuts = vec![LOG_HEADER, recs[N - 1].1.end, recs[N - 1].1.end + 1];
            for k in [1, N / 2, N - 1] {
                cuts.extend([recs[k].1.start, recs[k].1.start + 7, recs[k].1.end - 1]);
            }
            for cut in cuts {
                let (disk, recs) = acked();
                let len = log0(&disk).files["log-0"].len();
                mutate(&disk, |b| b.truncate(cut));
                refused_and_accounted(&disk, &recs, cut..len, &format!("cut at {cut}"));
            }
        }

        // C-SD-1: a write torn at any byte of the last record, or with
        // any piece of it never written, is dropped; every acknowledged
        // commit stays, and the store goes on.
        #[test]
        fn a_torn_final_write_is_dropped_at_every_byte_and_nothing_else() {
            let (disk, recs) = acked();
            let at = recs[N - 1].1.end;
            let torn = rec(
                0,
                at,
                &[(Table::Pending, b"never-acked", Some(&[7u8; 300]))],
            );
            let clean = image(&disk);
            let mut shapes: Vec<(String, Vec<u8>)> = Vec::new();
            let base = clean["log-0"].clone();
            for cut in 1..torn.len() {
                let mut b = base.clone();
                b[at..at + cut].copy_from_slice(&torn[..cut]);
                shapes.push((format!("cut after byte {cut}"), b));
            }
            for piece in (0..torn.len()).step_by(64) {
                let mut b = base.clone();
                b[at..at + torn.len()].copy_from_slice(&torn);
                let end = (piece + 64).min(torn.len());
                fill(0, (at + piece) as u64, &mut b[at + piece..at + end]);
                shapes.push((format!("piece {piece} lost"), b));
            }
            for (what, b) in shapes {
                *disk.files() = MemFiles::default();
                disk.files().files = clean.clone();
                disk.files().files.insert("log-0".into(), b);
                let mut s = LogStore::open_on(disk.clone(), options())
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                for (i, (o, _)) in recs.iter().enumerate() {
                    let v = s.view().get(Table::Pending, o.as_bytes()).unwrap();
                    assert_eq!(v, Some(value(i)), "{what}: {o}");
                }
                assert!(
                    !s.tables[Table::Pending.index()].contains_key(b"never-acked".as_slice()),
                    "{what}"
                );
                assert_eq!(image(&disk)["log-0"], base, "{what}: not made room again");
                s.transact(|t| t.put(Table::Pending, b"after", &value(1)))
                    .unwrap();
                drop(s);
                let s = LogStore::open_on(disk.clone(), options()).unwrap();
                assert_eq!(s.tables[Table::Pending.index()].len(), N + 1, "{what}");
            }
            // Whole, it is a commit.
            let mut b = base.clone();
            b[at..at + torn.len()].copy_from_slice(&torn);
            disk.files().files.insert("log-0".into(), b);
            let s = LogStore::open_on(disk.clone(), options()).unwrap();
            assert!(s.tables[Table::Pending.index()].contains_key(b"never-acked".as_slice()));
        }

        // C-SD-2: a missing newest log, a missing snapshot in force, a
        // missing log between.
        #[test]
        fn a_missing_file_refuses_the_open() {
            let options = LogOptions {
                checkpoint_bytes: 256,
                checkpoint_chunk_bytes: 64,
                preallocate_bytes: 4096,
            };
            let disk = MemDisk::default();
            let mut s = LogStore::open_on(disk.clone(), options.clone()).unwrap();
            let mut i = 0;
            while s.gen < 3 {
                s.transact(|t| t.put(Table::Pending, id(i).as_bytes(), &value(i)))
                    .unwrap();
                i += 1;
            }
            let newest = log_name(s.gen);
            drop(s);
            let names: Vec<String> = disk.files().files.keys().cloned().collect();
            for gone in names {
                let mut files = image(&disk);
                files.remove(&gone);
                let d = MemDisk::default();
                d.files().files = files;
                match LogStore::open_on(d.clone(), options.clone()) {
                    Err(StoreError::Damaged { file, .. }) => {
                        assert!(
                            file.starts_with("log-") || file.starts_with("snap-"),
                            "{file}"
                        );
                    }
                    Err(e) => panic!("{gone} missing: {e}"),
                    Ok(_) if gone.starts_with("log-") && gone != newest => {
                        // An older log the snapshot in force replaced.
                    }
                    Ok(_) => panic!("{gone} missing: the store opened"),
                }
            }
        }
    }
}
