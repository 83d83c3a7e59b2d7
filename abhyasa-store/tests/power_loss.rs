//! C-ST-1 power loss on redb, on the log store (its own disk model,
//! [`LogCut`], further down) and on fjall (a FUSE file system of the
//! test's own, [`FjallCut`] and `power_loss/fuse.rs`): with writes not yet
//! synced dropped at the crash point, every commit reported durable
//! survives and nothing torn is read back.
//!
//! The kill test (`tests/kill.rs`) stops the process, but the kernel still
//! holds its page cache: every `write` reaches the disk. A power cut does
//! not: whatever was written since the last `fdatasync` may be lost, in
//! part, in any order, and a write may be torn at a sector boundary. This
//! test runs the store on [`PowerCut`], a redb storage backend that keeps
//! the synced image apart from the writes since the last sync. At a crash
//! point (the `n`-th I/O operation) every further operation fails, the
//! commit in flight reports an error, and the disk that "comes back" is the
//! synced image plus a seeded random subset of the unsynced writes, each
//! torn into independently kept 512-byte sectors.
//!
//! The workload is a real one: a custodian and a receiver (the shared test
//! world) run applied, declined, deferred, external-intent, superseded and
//! escalated obligations on SimStores, and each side's commits are recorded
//! (time and batches). Each side's log is replayed into a redb store on a
//! `PowerCut` disk once cleanly (a snapshot of the loaded state after each
//! commit), then once per crash point: the store reopened on the surviving
//! image must open, load, keep its indexes equal to its records, and equal
//! the snapshot after the last commit that returned `Ok` — or, if the
//! commit in flight had reached the disk whole, the one after it. Nothing
//! else: not a lost acknowledged commit, not a half of one.
//!
//! The default run takes a stride of crash points (every I/O operation of
//! the commits up to the first sync, then every `STRIDE`-th one);
//! `ABHYASA_POWER_LOSS_FULL=1` tries every operation, with more seeds.
//!
//! fjall has no storage hook: it does its file I/O through `std::fs`. Its
//! tests mount a FUSE file system in this process that keeps, per file,
//! the data as of its last `fsync`/`fdatasync` and, per directory, the
//! entries as of its last directory `fsync`; the disk that comes back keeps
//! those plus a random part of the rest, and the store reopens on a real
//! directory holding it. They need `/dev/fuse` and root (no libfuse): where
//! they cannot mount they say SKIPPED, unless `ABHYASA_REQUIRE_FUSE` is set
//! (`.ci/run` sets it where it can mount). `ABHYASA_FUSE_TRACE=1` prints
//! every operation the file system counts. They found two gaps in fjall
//! 3.1.13 that `FjallStore` now closes: a database whose creation a cut
//! interrupted no longer opened, and the folder naming each keyspace was
//! never synced.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use abhyasa_testkit::store_world as common;
#[path = "power_loss/fuse.rs"]
mod fuse;

use std::collections::BTreeMap;
use std::io;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use abhyasa_core::custody::Record;
use abhyasa_core::store::{Committed, CrashTiming, DurableState, SimStore, Store, StoreError};
use abhyasa_core::Timestamp;
use abhyasa_store::{
    read_image_at, FjallStore, LogDisk, LogOptions, LogStore, RedbStore, StoreOptions,
};
use common::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const SECTOR: usize = 512;
/// The log store's disk tears writes finer than a sector: its records are
/// mostly smaller than one, and a record torn inside (its header kept, a
/// piece of its payload not) must read as torn, never as a commit.
const LOG_SECTOR: usize = 64;
const STRIDE: u64 = 7;
/// Every one of this many operations before the first commit is a crash
/// point, whatever the store's [`Rig::OPEN_STRIDE`].
const OPEN_TAIL: u64 = 48;

// ------------------------------------------------------------ the disk

#[derive(Debug, Clone)]
enum Op {
    Write(u64, Vec<u8>),
    SetLen(u64),
}

#[derive(Debug, Default)]
struct Disk {
    /// What a power cut cannot take: the image as of the last sync.
    synced: Vec<u8>,
    /// What reads see: the synced image plus every write since.
    live: Vec<u8>,
    /// The operations since the last sync, in order.
    unsynced: Vec<Op>,
    /// I/O operations so far (writes, length changes, syncs).
    ops: u64,
    /// The power fails at this operation (1-based): it and every later
    /// operation return an error.
    cut_at: Option<u64>,
    cut: bool,
}

/// A redb storage backend that loses what was not synced (see the module
/// doc). Clones share one disk.
#[derive(Debug, Clone, Default)]
struct PowerCut(Arc<Mutex<Disk>>);

fn lost() -> io::Error {
    io::Error::other("power lost")
}

fn apply(img: &mut Vec<u8>, op: &Op) {
    match op {
        Op::SetLen(n) => img.resize(usize::try_from(*n).unwrap(), 0),
        Op::Write(off, data) => {
            let off = usize::try_from(*off).unwrap();
            if img.len() < off + data.len() {
                img.resize(off + data.len(), 0);
            }
            img[off..off + data.len()].copy_from_slice(data);
        }
    }
}

impl PowerCut {
    fn on(image: Vec<u8>) -> Self {
        Self(Arc::new(Mutex::new(Disk {
            synced: image.clone(),
            live: image,
            ..Disk::default()
        })))
    }

    fn disk(&self) -> MutexGuard<'_, Disk> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts one operation; fails it (and every later one) from the
    /// crash point on.
    fn tick(&self) -> io::Result<MutexGuard<'_, Disk>> {
        let mut d = self.disk();
        let d2 = &mut *d;
        tick_at(&mut d2.ops, d2.cut_at, &mut d2.cut)?;
        Ok(d)
    }

    fn ops(&self) -> u64 {
        self.disk().ops
    }

    fn cut_at(&self, op: u64) {
        self.disk().cut_at = Some(op);
    }

    /// The disk after the power comes back (see [`survivor`]).
    fn after_power_loss(&self, rng: &mut ChaCha8Rng) -> Vec<u8> {
        let d = self.disk();
        survivor(&d.synced, &d.unsynced, SECTOR, rng)
    }
}

/// What a power cut leaves of one file: the synced image, then each
/// unsynced operation kept or lost at random (a write in pieces of
/// `sector` bytes, each kept or lost on its own).
fn survivor(synced: &[u8], unsynced: &[Op], sector: usize, rng: &mut ChaCha8Rng) -> Vec<u8> {
    let mut img = synced.to_vec();
    for op in unsynced {
        match op {
            Op::SetLen(_) => {
                if rng.random_bool(0.5) {
                    apply(&mut img, op);
                }
            }
            Op::Write(off, data) => {
                for (i, piece) in data.chunks(sector).enumerate() {
                    if rng.random_bool(0.5) {
                        let at = off + u64::try_from(i * sector).unwrap();
                        apply(&mut img, &Op::Write(at, piece.to_vec()));
                    }
                }
            }
        }
    }
    img
}

/// Counts one I/O operation of a disk; fails it (and every later one) from
/// the crash point on.
fn tick_at(ops: &mut u64, cut_at: Option<u64>, cut: &mut bool) -> io::Result<()> {
    *ops += 1;
    if cut_at.is_some_and(|at| *ops >= at) {
        *cut = true;
    }
    if *cut {
        return Err(lost());
    }
    Ok(())
}

impl redb::StorageBackend for PowerCut {
    fn len(&self) -> io::Result<u64> {
        let d = self.disk();
        if d.cut {
            return Err(lost());
        }
        Ok(u64::try_from(d.live.len()).unwrap())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let d = self.disk();
        if d.cut {
            return Err(lost());
        }
        let off = usize::try_from(offset).map_err(io::Error::other)?;
        let src = d
            .live
            .get(off..off + out.len())
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end"))?;
        out.copy_from_slice(src);
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut d = self.tick()?;
        let op = Op::SetLen(len);
        apply(&mut d.live, &op);
        d.unsynced.push(op);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut d = self.tick()?;
        d.synced = d.live.clone();
        d.unsynced.clear();
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut d = self.tick()?;
        let op = Op::Write(offset, data.to_vec());
        apply(&mut d.live, &op);
        d.unsynced.push(op);
        Ok(())
    }
}

// ------------------------------------------------- the stores on them

/// A store on a disk that can lose power: redb on [`PowerCut`], the log
/// store on [`LogCut`].
trait Rig: Sized {
    type S: Store;
    /// Cut at every I/O operation, with several seeds, even by default
    /// (a store with few operations per commit).
    const EVERY_OP: bool;
    /// Cut at every this many operations of the store's creation (before
    /// its last [`OPEN_TAIL`] operations) unless the run is full.
    const OPEN_STRIDE: u64 = 1;
    /// A new, empty disk.
    fn blank() -> Self;
    fn open(&self) -> Result<Self::S, StoreError>;
    fn ops(&self) -> u64;
    fn cut_at(&self, op: u64);
    /// The disk after the power comes back (`opened`: whether the store
    /// finished opening before the cut).
    fn back(&self, opened: bool, rng: &mut ChaCha8Rng) -> Self;
}

impl Rig for PowerCut {
    type S = RedbStore;
    const EVERY_OP: bool = false;
    fn blank() -> Self {
        PowerCut::default()
    }
    fn open(&self) -> Result<RedbStore, StoreError> {
        RedbStore::open_on(self.clone(), &options())
    }
    fn ops(&self) -> u64 {
        PowerCut::ops(self)
    }
    fn cut_at(&self, op: u64) {
        PowerCut::cut_at(self, op)
    }
    fn back(&self, opened: bool, rng: &mut ChaCha8Rng) -> Self {
        if opened {
            PowerCut::on(self.after_power_loss(rng))
        } else {
            // A cut while the database was being created:
            // `RedbStore::open_with` builds a new file under a temporary
            // name and renames it into place only once it is initialised
            // and synced, so the node finds no database and creates a fresh
            // one (nothing was acknowledged).
            PowerCut::default()
        }
    }
}

// ------------------------------------------------ the log store's disk

/// One file of a [`LogCut`] disk.
#[derive(Debug, Clone, Default)]
struct FileImg {
    synced: Vec<u8>,
    live: Vec<u8>,
    unsynced: Vec<Op>,
}

#[derive(Debug, Clone)]
enum DirOp {
    Link(String, u64),
    Unlink(String),
}

#[derive(Debug, Default)]
struct Dir {
    /// Files by inode.
    files: BTreeMap<u64, FileImg>,
    /// The directory as of the last directory sync, and as reads see it.
    synced: BTreeMap<String, u64>,
    live: BTreeMap<String, u64>,
    /// Entry changes since the last directory sync, in order.
    unsynced: Vec<DirOp>,
    next_ino: u64,
    ops: u64,
    cut_at: Option<u64>,
    cut: bool,
}

/// A [`LogDisk`] that loses what was not synced: file data written since
/// the file's last `sync` (kept or lost in 64-byte pieces, at random), and
/// directory entries (creations, renames, removals) since the last
/// `sync_dir` (a random prefix of them survives, as a journal replays).
/// A file that loses its name is gone. Clones share one disk.
#[derive(Debug, Clone, Default)]
struct LogCut(Arc<Mutex<Dir>>);

impl LogCut {
    fn dir(&self) -> MutexGuard<'_, Dir> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn tick(&self) -> io::Result<MutexGuard<'_, Dir>> {
        let mut d = self.dir();
        let d2 = &mut *d;
        tick_at(&mut d2.ops, d2.cut_at, &mut d2.cut)?;
        Ok(d)
    }

    fn ino(d: &Dir, name: &str) -> io::Result<u64> {
        d.live
            .get(name)
            .copied()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, name.to_string()))
    }

    fn after_power_loss(&self, rng: &mut ChaCha8Rng) -> LogCut {
        let d = self.dir();
        let mut names = d.synced.clone();
        let keep = rng.random_range(0..=d.unsynced.len());
        for op in &d.unsynced[..keep] {
            match op {
                DirOp::Link(n, ino) => {
                    names.insert(n.clone(), *ino);
                }
                DirOp::Unlink(n) => {
                    names.remove(n);
                }
            }
        }
        let mut files = BTreeMap::new();
        for ino in names.values() {
            let f = &d.files[ino];
            let img = survivor(&f.synced, &f.unsynced, LOG_SECTOR, rng);
            files.insert(
                *ino,
                FileImg {
                    synced: img.clone(),
                    live: img,
                    unsynced: Vec::new(),
                },
            );
        }
        LogCut(Arc::new(Mutex::new(Dir {
            files,
            synced: names.clone(),
            live: names,
            next_ino: d.next_ino,
            ..Dir::default()
        })))
    }
}

impl LogDisk for LogCut {
    fn list(&self) -> io::Result<Vec<String>> {
        let d = self.dir();
        if d.cut {
            return Err(lost());
        }
        Ok(d.live.keys().cloned().collect())
    }

    fn read(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        let d = self.dir();
        if d.cut {
            return Err(lost());
        }
        Ok(d.live.get(name).map(|ino| d.files[ino].live.clone()))
    }

    fn read_at(&self, name: &str, at: u64, buf: &mut [u8]) -> io::Result<()> {
        let d = self.dir();
        if d.cut {
            return Err(lost());
        }
        let ino = d.live.get(name).ok_or(io::ErrorKind::NotFound)?;
        read_image_at(&d.files[ino].live, at, buf)
    }

    fn write_at(&mut self, name: &str, at: u64, data: &[u8]) -> io::Result<()> {
        let mut d = self.tick()?;
        let ino = match d.live.get(name) {
            Some(&ino) => ino,
            None => {
                let ino = d.next_ino;
                d.next_ino += 1;
                d.files.insert(ino, FileImg::default());
                d.live.insert(name.to_string(), ino);
                d.unsynced.push(DirOp::Link(name.to_string(), ino));
                ino
            }
        };
        let f = d.files.get_mut(&ino).unwrap();
        let op = Op::Write(at, data.to_vec());
        apply(&mut f.live, &op);
        f.unsynced.push(op);
        Ok(())
    }

    fn sync(&mut self, name: &str) -> io::Result<()> {
        let mut d = self.tick()?;
        let ino = Self::ino(&d, name)?;
        let f = d.files.get_mut(&ino).unwrap();
        f.synced = f.live.clone();
        f.unsynced.clear();
        Ok(())
    }

    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        let mut d = self.tick()?;
        let ino = Self::ino(&d, name)?;
        let f = d.files.get_mut(&ino).unwrap();
        let op = Op::SetLen(len);
        apply(&mut f.live, &op);
        f.unsynced.push(op);
        Ok(())
    }

    fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        let mut d = self.tick()?;
        let ino = Self::ino(&d, from)?;
        d.live.remove(from);
        d.live.insert(to.to_string(), ino);
        // A rename is atomic in the journal: its two halves land together.
        d.unsynced.push(DirOp::Link(to.to_string(), ino));
        let at = d.unsynced.len() - 1;
        d.unsynced.insert(at, DirOp::Unlink(from.to_string()));
        Ok(())
    }

    fn remove(&mut self, name: &str) -> io::Result<()> {
        let mut d = self.tick()?;
        if d.live.remove(name).is_some() {
            d.unsynced.push(DirOp::Unlink(name.to_string()));
        }
        Ok(())
    }

    fn sync_dir(&mut self) -> io::Result<()> {
        let mut d = self.tick()?;
        d.synced = d.live.clone();
        d.unsynced.clear();
        Ok(())
    }
}

/// Checkpoints every few commits, so the cuts fall inside them too.
fn log_options() -> LogOptions {
    LogOptions {
        checkpoint_bytes: 2 * 1024,
        // A snapshot takes several commits to write.
        checkpoint_chunk_bytes: 256,
        // Logs grow by zeros every few commits, so the cuts fall inside
        // that too (and in commits written over zeros).
        preallocate_bytes: 512,
    }
}

impl Rig for LogCut {
    type S = LogStore;
    const EVERY_OP: bool = true;
    fn blank() -> Self {
        LogCut::default()
    }
    fn open(&self) -> Result<LogStore, StoreError> {
        LogStore::open_on(self.clone(), log_options())
    }
    fn ops(&self) -> u64 {
        self.dir().ops
    }
    fn cut_at(&self, op: u64) {
        self.dir().cut_at = Some(op);
    }
    fn back(&self, _opened: bool, rng: &mut ChaCha8Rng) -> Self {
        self.after_power_loss(rng)
    }
}

// ------------------------------------------ fjall and the log on a FUSE disk

/// fjall does its own file I/O through `std::fs`, with no storage hook,
/// and the log store's [`abhyasa_store::FsDisk`] is the one a node runs on: each runs on
/// [`fuse::PowerMount`], a FUSE file system in this process that keeps the
/// synced image apart (files by `fsync`/`fdatasync`, directory entries by
/// a directory `fsync`). The disk that comes back is written to a real
/// directory, where the store reopens.
enum FuseCut<S> {
    Mounted(fuse::PowerMount, PhantomData<S>),
    Back(tempfile::TempDir),
}

/// A store that opens on a directory of the real file system.
trait OnDir: Store + Sized {
    fn open_dir(path: &std::path::Path) -> Result<Self, StoreError>;
}

impl OnDir for FjallStore {
    fn open_dir(path: &std::path::Path) -> Result<Self, StoreError> {
        FjallStore::open_with(path, &options())
    }
}

impl OnDir for LogStore {
    fn open_dir(path: &std::path::Path) -> Result<Self, StoreError> {
        LogStore::open_with(path, log_options())
    }
}

impl<S> FuseCut<S> {
    fn root(&self) -> &std::path::Path {
        match self {
            FuseCut::Mounted(m, _) => m.path(),
            FuseCut::Back(d) => d.path(),
        }
    }
}

impl<S: OnDir> Rig for FuseCut<S> {
    type S = S;
    const EVERY_OP: bool = false;
    const OPEN_STRIDE: u64 = 11;
    fn blank() -> Self {
        FuseCut::Mounted(
            fuse::PowerMount::new().expect("mount the FUSE disk"),
            PhantomData,
        )
    }
    fn open(&self) -> Result<S, StoreError> {
        S::open_dir(&self.root().join("db"))
    }
    fn ops(&self) -> u64 {
        match self {
            FuseCut::Mounted(m, _) => m.ops(),
            FuseCut::Back(_) => 0,
        }
    }
    fn cut_at(&self, op: u64) {
        if let FuseCut::Mounted(m, _) = self {
            m.cut_at(op);
        }
    }
    fn back(&self, _opened: bool, rng: &mut ChaCha8Rng) -> Self {
        match self {
            FuseCut::Mounted(m, _) => {
                FuseCut::Back(m.after_power_loss(rng).expect("write the surviving image"))
            }
            FuseCut::Back(_) => unreachable!("the power is cut on the mounted disk only"),
        }
    }
}

/// Whether the fjall power-loss tests can run here: they need to mount a
/// FUSE file system. Where they cannot, they say so and pass, unless
/// `ABHYASA_REQUIRE_FUSE` is set (`.ci/run` sets it wherever `/dev/fuse`
/// exists and it runs as root): then they fail.
fn fuse_ready() -> bool {
    match fuse::available() {
        Ok(()) => true,
        Err(why) if std::env::var_os("ABHYASA_REQUIRE_FUSE").is_some() => {
            panic!("ABHYASA_REQUIRE_FUSE is set but {why}")
        }
        Err(why) => {
            eprintln!("SKIPPED: the fjall power-loss test needs FUSE: {why}");
            false
        }
    }
}

// ------------------------------------------------------------ the workload

/// One commit as the node made it.
type Logged = (Timestamp, Vec<Vec<Record>>);

/// A SimStore that records every commit it is asked for.
struct Recorder {
    inner: SimBackend,
    log: Arc<Mutex<Vec<Logged>>>,
}

impl Backend for Recorder {
    fn kind(&self) -> Kind {
        Kind::Sim
    }
    fn store(&mut self) -> &mut dyn Store {
        self.inner.store()
    }
    fn commit(&mut self, now: Timestamp, batches: &[&[Record]]) -> Result<Committed, StoreError> {
        let out = self.inner.commit(now, batches);
        if out.is_ok() {
            let copy = batches.iter().map(|b| b.to_vec()).collect();
            self.log
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((now, copy));
        }
        out
    }
    fn arm(&mut self, k: u64, timing: CrashTiming) {
        self.inner.arm(k, timing);
    }
    fn restart(&mut self) {
        self.inner.restart();
    }
    fn commits(&self) -> u64 {
        self.inner.commits()
    }
}

/// Both sides' commit logs from a run with every terminal path.
fn workload() -> (Vec<Logged>, Vec<Logged>) {
    let clog = Arc::new(Mutex::new(Vec::new()));
    let rlog = Arc::new(Mutex::new(Vec::new()));
    let rec = |log: &Arc<Mutex<Vec<Logged>>>| -> Box<dyn Backend> {
        Box::new(Recorder {
            inner: SimBackend(SimStore::new()),
            log: Arc::clone(log),
        })
    };
    let mut w = World::with_backends(rec(&clog), rec(&rlog));
    let run = Duration::from_secs(600);
    w.applier.decisions.insert(oid("dc"), Decision::Decline);
    w.applier.decisions.insert(oid("ex"), Decision::External);
    w.applier
        .decisions
        .insert(oid("df"), Decision::DeferThenApply);
    for i in 0..6 {
        w.offer(phala(&format!("ap-{i}"), -0.1));
    }
    w.offer(phala("dc", -0.3));
    w.offer(phala("ex", -0.3));
    w.offer(phala("df", -0.3));
    let at = w.now.saturating_add(Duration::from_secs(5));
    w.complete_at(at, oid("df"));
    w.offer(revoke("new", "email", 5));
    w.run(run);
    w.offer(revoke("old", "email", 3));
    w.run(run);
    w.partitioned = true;
    w.offer(phala("es", -0.3));
    w.run(run);
    let take = |l: Arc<Mutex<Vec<Logged>>>| std::mem::take(&mut *l.lock().unwrap());
    (take(clog), take(rlog))
}

// ------------------------------------------------------------ the check

/// The loaded state in an order-independent form (the snapshots hold
/// hash maps), so two loads of the same records compare equal.
fn fingerprint(st: &DurableState) -> String {
    fn sorted<K: std::fmt::Debug, V: std::fmt::Debug>(
        m: &std::collections::HashMap<K, V>,
    ) -> BTreeMap<String, String> {
        m.iter()
            .map(|(k, v)| (format!("{k:?}"), format!("{v:?}")))
            .collect()
    }
    let c = &st.custodian;
    let r = &st.receiver;
    format!(
        "pending {:?}\nterminal {:?}\nprincipal {:?}\nescalations {:?}\n\
         reconciliations {:?}\nledger {:?}\nkeys {:?}\neffects {:?}\nintents {:?}\nnext {:?}",
        sorted(&c.pending),
        sorted(&c.terminal),
        c.principal,
        c.escalations,
        c.reconciliations,
        sorted(&r.ledger),
        sorted(&r.key_sequences),
        r.effects,
        sorted(&r.intents),
        st.next_event,
    )
}

fn options() -> StoreOptions {
    StoreOptions {
        cache_bytes: 4 * 1024 * 1024,
    }
}

/// One commit, then the store thread's housekeeping as when no job waits
/// (`Store::idle`: the log store grows its log ahead there), so the cuts
/// fall inside that too. A failed `idle` leaves the commit acknowledged;
/// it poisons the store, so the next commit fails.
fn commit(store: &mut dyn Store, entry: &Logged) -> Result<Committed, StoreError> {
    let batches: Vec<&[Record]> = entry.1.iter().map(Vec::as_slice).collect();
    let c = store.commit(entry.0, &batches)?;
    let _ = store.idle();
    Ok(c)
}

/// A clean replay: the fingerprint before any commit and after each, and
/// the I/O operation count at which each commit started and ended.
struct Clean {
    snaps: Vec<String>,
    bounds: Vec<(u64, u64)>,
}

fn clean_replay<R: Rig>(log: &[Logged]) -> Clean {
    let disk = R::blank();
    let mut store = disk.open().unwrap();
    let mut snaps = vec![fingerprint(&store.load().unwrap())];
    let mut bounds = Vec::new();
    for entry in log {
        let start = disk.ops();
        let _durable = commit(&mut store, entry).unwrap();
        bounds.push((start, disk.ops()));
        snaps.push(fingerprint(&store.load().unwrap()));
    }
    Clean { snaps, bounds }
}

/// One crash at I/O operation `at`: replays until the power fails, brings
/// the disk back with a seeded loss of unsynced writes, and checks it.
/// Returns whether the crash fell inside a commit.
fn crash_at<R: Rig>(side: &str, log: &[Logged], clean: &Clean, at: u64, seed: u64) -> bool {
    let disk = R::blank();
    disk.cut_at(at);
    let label = format!("{side}: power cut at I/O op {at}, seed {seed}");
    // The store may not even finish opening before the cut.
    let mut acked = 0usize;
    let mut opened = false;
    if let Ok(mut store) = disk.open() {
        opened = true;
        for entry in log {
            if commit(&mut store, entry).is_err() {
                break;
            }
            acked += 1;
        }
        // The process dies with the power: whatever redb does on drop
        // meets a dead disk.
        drop(store);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ at.rotate_left(17));
    let back = disk.back(opened, &mut rng);
    let store = back
        .open()
        .unwrap_or_else(|e| panic!("{label}: the store does not open after the cut: {e}"));
    let st = store
        .load()
        .unwrap_or_else(|e| panic!("{label}: the store does not load after the cut: {e}"));
    let got = fingerprint(&st);
    let durable = &clean.snaps[acked];
    let in_flight = clean.snaps.get(acked + 1);
    assert!(
        got == *durable || Some(&got) == in_flight,
        "{label}: after {acked} acknowledged commits the store reads back neither \
         their state nor that plus the commit in flight\n--- got\n{got}\n--- durable\n{durable}"
    );
    assert_indexes_match(&store, EPOCH, &label);
    acked < log.len()
}

fn crash_points<R: Rig>(clean: &Clean, full: bool) -> Vec<u64> {
    let last = clean.bounds.last().map_or(0, |b| b.1);
    // Every operation of the first commits (opening the file, the format
    // records, the first obligations), then a stride through the rest,
    // plus the last operation of every commit (its header write or sync).
    // A store whose creation takes hundreds of operations (fjall: a folder
    // and files per keyspace) is cut at a stride through its creation and
    // at every one of the last `OPEN_TAIL` operations before the first
    // commit (the rename into place, the reopen, its recovery).
    let first = clean.bounds.get(2).map_or(last, |b| b.1);
    let opened = clean.bounds.first().map_or(last, |b| b.0);
    let in_open = |op: u64| {
        R::OPEN_STRIDE == 1 || op + OPEN_TAIL > opened || op.is_multiple_of(R::OPEN_STRIDE)
    };
    let mut pts: Vec<u64> = (1..=last + 1)
        .filter(|&op| full || (op <= first && (op > opened || in_open(op))) || op % STRIDE == 0)
        .collect();
    pts.extend(clean.bounds.iter().flat_map(|&(s, e)| [s + 1, e]));
    pts.sort_unstable();
    pts.dedup();
    pts
}

fn enumerate<R: Rig>(side: &str, log: &[Logged]) {
    assert!(
        log.len() >= 10,
        "{side}: the workload made {} commits",
        log.len()
    );
    let full = R::EVERY_OP || std::env::var_os("ABHYASA_POWER_LOSS_FULL").is_some();
    let clean = clean_replay::<R>(log);
    let seeds: &[u64] = if full { &[1, 2, 3, 4] } else { &[1] };
    let mut inside = 0;
    let pts = crash_points::<R>(&clean, full);
    for &at in &pts {
        for &seed in seeds {
            if crash_at::<R>(side, log, &clean, at, seed) {
                inside += 1;
            }
        }
    }
    eprintln!(
        "{side}: {} commits, {} I/O ops, {} crash points × {} seeds ({inside} inside a commit)",
        log.len(),
        clean.bounds.last().map_or(0, |b| b.1),
        pts.len(),
        seeds.len()
    );
    assert!(inside > 0, "{side}: no crash point fell inside a commit");
}

/// C-ST-1 on the custodian's commits (offers, attempts, acks, escalation
/// with its fail-safe, principal writes).
#[test]
fn c_st_1_power_loss_custodian_commits_survive() {
    let (clog, _) = workload();
    enumerate::<PowerCut>("custodian", &clog);
}

/// C-ST-1 on the receiver's commits (ledger, effects, intents, deferrals).
#[test]
fn c_st_1_power_loss_receiver_commits_survive() {
    let (_, rlog) = workload();
    enumerate::<PowerCut>("receiver", &rlog);
}

/// C-ST-1 on the log store, custodian side: cuts inside commits, inside
/// checkpoints (snapshot written, renamed, log started, old files
/// removed) and inside recovery's own writes.
#[test]
fn c_st_1_power_loss_log_store_custodian_commits_survive() {
    let (clog, _) = workload();
    enumerate::<LogCut>("log custodian", &clog);
}

/// C-ST-1 on the log store, receiver side.
#[test]
fn c_st_1_power_loss_log_store_receiver_commits_survive() {
    let (_, rlog) = workload();
    enumerate::<LogCut>("log receiver", &rlog);
}

/// C-ST-1 on fjall, custodian side: cuts inside its creation, its
/// keyspaces' creation and every journal write and sync of the commits.
#[test]
fn c_st_1_power_loss_fjall_custodian_commits_survive() {
    if fuse_ready() {
        let (clog, _) = workload();
        enumerate::<FuseCut<FjallStore>>("fjall custodian", &clog);
    }
}

/// C-ST-1 on fjall, receiver side.
#[test]
fn c_st_1_power_loss_fjall_receiver_commits_survive() {
    if fuse_ready() {
        let (_, rlog) = workload();
        enumerate::<FuseCut<FjallStore>>("fjall receiver", &rlog);
    }
}

/// C-ST-1 on the log store on the file system, as a node runs it
/// ([`abhyasa_store::FsDisk`]): cuts inside the creation of its directory and files, its
/// commits and checkpoints, through the real system calls.
#[test]
fn c_st_1_power_loss_log_store_on_a_file_system_custodian_commits_survive() {
    if fuse_ready() {
        let (clog, _) = workload();
        enumerate::<FuseCut<LogStore>>("log (fs) custodian", &clog);
    }
}

/// The same, receiver side.
#[test]
fn c_st_1_power_loss_log_store_on_a_file_system_receiver_commits_survive() {
    if fuse_ready() {
        let (_, rlog) = workload();
        enumerate::<FuseCut<LogStore>>("log (fs) receiver", &rlog);
    }
}

/// The backend itself: a cut loses exactly the unsynced writes when the
/// dice say so, and never a synced one (so the test above can fail).
#[test]
fn power_cut_drops_unsynced_writes_only() {
    use redb::StorageBackend;
    let d = PowerCut::default();
    d.write(0, &[1; 1024]).unwrap();
    d.sync_data().unwrap();
    d.write(0, &[2; 1024]).unwrap();
    d.cut_at(d.ops() + 1);
    assert!(
        d.write(1024, &[3; 8]).is_err(),
        "the cut fails later writes"
    );
    let mut kept_new = false;
    let mut kept_old = false;
    for seed in 0..32 {
        let img = d.after_power_loss(&mut ChaCha8Rng::seed_from_u64(seed));
        assert_eq!(img.len(), 1024, "the failed write never reached the disk");
        for sector in img.chunks(SECTOR) {
            assert!(sector.iter().all(|&b| b == sector[0]), "a sector is atomic");
            kept_new |= sector[0] == 2;
            kept_old |= sector[0] == 1;
        }
    }
    assert!(
        kept_new && kept_old,
        "unsynced sectors are sometimes kept, sometimes lost"
    );
}

/// C-ST-1 at creation: a new database is built under a temporary name and
/// renamed into place once initialised, so a cut during creation leaves
/// only that temporary — which the next open replaces — never a torn
/// database that no longer opens. `torn` plants what a cut mid-creation
/// leaves at the temporary name.
fn a_cut_during_creation_leaves_no_torn_database<S: Store>(
    name: &str,
    open: impl Fn(&std::path::Path) -> Result<S, StoreError>,
    torn: impl Fn(&std::path::Path),
) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    let leftover = dir.path().join(format!("{name}.creating"));
    torn(&leftover);
    let mut store = open(&path).unwrap();
    assert!(!leftover.exists(), "the interrupted creation is replaced");
    let (clog, _) = workload();
    for entry in clog.iter().take(5) {
        let _durable = commit(&mut store, entry).unwrap();
    }
    let before = fingerprint(&store.load().unwrap());
    drop(store);
    // Opening an existing database never goes through the temporary.
    torn(&leftover);
    let store = open(&path).unwrap();
    assert_eq!(fingerprint(&store.load().unwrap()), before);
    assert!(leftover.exists(), "an existing database is opened in place");
}

#[test]
fn c_st_1_a_cut_during_creation_leaves_no_torn_database() {
    a_cut_during_creation_leaves_no_torn_database(
        "node.redb",
        |p| RedbStore::open_with(p, &options()),
        |tmp| std::fs::write(tmp, b"torn: not a redb header").unwrap(),
    );
}

/// The same for fjall, whose database is a directory: what a cut in
/// `Database::create_new` leaves (lock, journal, no version marker) made
/// the next open fail with "File exists" before creation went through a
/// temporary name. Here without FUSE; the power-loss tests above cut at
/// every step of the real creation.
#[test]
fn c_st_1_a_cut_during_fjall_creation_leaves_no_torn_database() {
    a_cut_during_creation_leaves_no_torn_database(
        "fjall",
        |p| FjallStore::open_with(p, &options()),
        |tmp| {
            std::fs::create_dir_all(tmp.join("keyspaces")).unwrap();
            std::fs::write(tmp.join("lock"), b"").unwrap();
            std::fs::write(tmp.join("0.jnl"), [0u8; 64]).unwrap();
        },
    );
}

/// The FUSE disk itself: a cut keeps every synced byte and name, and
/// sometimes keeps, sometimes loses, what was not synced (so the fjall
/// tests above can fail).
#[test]
fn fuse_disk_drops_unsynced_writes_and_names_only() {
    use std::fs::File;
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    if !fuse_ready() {
        return;
    }
    let m = fuse::PowerMount::new().unwrap();
    let dir = m.path().to_path_buf();
    let mut a = File::create(dir.join("a")).unwrap();
    a.write_all(&[1; 1024]).unwrap();
    a.sync_data().unwrap();
    File::open(&dir).unwrap().sync_all().unwrap();
    // Unsynced: an overwrite of `a`, and the name of `b` (its data synced).
    a.write_all_at(&[2; 1024], 0).unwrap();
    std::fs::write(dir.join("b"), b"named, not synced").unwrap();
    File::open(dir.join("b")).unwrap().sync_all().unwrap();
    m.cut_at(m.ops() + 1);
    assert!(
        a.write_all_at(&[3; 8], 1024).is_err(),
        "the cut fails later writes"
    );
    let (mut kept_new, mut kept_old, mut b_kept, mut b_lost) = (false, false, false, false);
    for seed in 0..32 {
        let back = m
            .after_power_loss(&mut ChaCha8Rng::seed_from_u64(seed))
            .unwrap();
        let img = std::fs::read(back.path().join("a")).unwrap();
        assert_eq!(img.len(), 1024, "the failed write never reached the disk");
        for sector in img.chunks(SECTOR) {
            assert!(sector.iter().all(|&b| b == sector[0]), "a sector is atomic");
            kept_new |= sector[0] == 2;
            kept_old |= sector[0] == 1;
        }
        match std::fs::read(back.path().join("b")) {
            Ok(data) => {
                assert_eq!(data, b"named, not synced");
                b_kept = true;
            }
            Err(_) => b_lost = true,
        }
    }
    assert!(
        kept_new && kept_old,
        "unsynced sectors are sometimes kept, sometimes lost"
    );
    assert!(
        b_kept && b_lost,
        "an unsynced name is sometimes kept, sometimes lost"
    );
    drop(a);
}

/// The log store's checkpoints on a real directory: with a snapshot every
/// few commits, each written over several commits, reopening after any
/// commit reads back exactly what was committed, and the directory holds
/// no more than the snapshot in force, the logs after it and the snapshot
/// being written.
#[test]
fn log_store_checkpoints_on_a_real_directory_reopen_to_the_same_state() {
    let (clog, rlog) = workload();
    for (side, log) in [("custodian", clog), ("receiver", rlog)] {
        let clean = clean_replay::<LogCut>(&log);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut store = LogStore::open_with(&path, log_options()).unwrap();
        for (i, entry) in log.iter().enumerate() {
            let _durable = commit(&mut store, entry).unwrap();
            drop(store);
            store = LogStore::open_with(&path, log_options()).unwrap();
            let got = fingerprint(&store.load().unwrap());
            assert_eq!(got, clean.snaps[i + 1], "{side}: reopened after commit {i}");
            let files: Vec<String> = std::fs::read_dir(&path)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| n != "LOCK")
                .collect();
            assert!(files.len() <= 4, "{side}: after commit {i}: {files:?}");
        }
        let snaps = std::fs::read_dir(&path)
            .unwrap()
            .filter(|e| {
                let n = e.as_ref().unwrap().file_name();
                let n = n.to_string_lossy();
                n.starts_with("snap-") && !n.ends_with(".tmp")
            })
            .count();
        assert_eq!(snaps, 1, "{side}: a snapshot is in force");
        assert_indexes_match(&store, EPOCH, side);
    }
}
