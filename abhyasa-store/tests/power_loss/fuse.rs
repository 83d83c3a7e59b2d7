//! A FUSE file system that loses what was not synced, for stores whose
//! engine does its own file I/O through `std::fs` (fjall): the power-loss
//! test mounts it, runs the store on it and, at the crash point, takes
//! from it the disk that "comes back".
//!
//! The file system lives in this process's memory. FUSE sends every
//! `write`, `ftruncate`, `fsync`/`fdatasync`, `mkdir`, `create`, `unlink`,
//! `rmdir` and `rename` to it as it happens (no write-back cache is
//! asked for), so it sees each operation in order and keeps, apart from
//! what reads see, the image a power cut cannot take:
//!
//! - a file's data as of its last `fsync`/`fdatasync`; what was written
//!   since survives in 512-byte sectors (aligned to the file), each kept or
//!   lost at random, and a length change since is kept or lost at random;
//! - a directory's entries as of its last `fsync`; the entry changes since
//!   (creations, removals, renames) survive as a random prefix, as a
//!   file-system journal replays them, a rename whole or not at all. A file
//!   or directory that loses its name is gone, with all beneath it.
//!
//! At the crash point (the `n`-th of those operations) that operation and
//! every later one, reads included, fail with `EIO`.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request, TimeOrNow,
    WriteFlags,
};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

const PAGE: u64 = 4096;
const SECTOR: u64 = 512;
/// Attributes and entries are not cached by the kernel: every lookup asks.
const TTL: Duration = Duration::ZERO;

// ------------------------------------------------------------ file data

/// A file's bytes, in pages, holes read as zeros (fjall preallocates its
/// journals to 64 MiB with `set_len`).
#[derive(Debug, Clone, Default)]
struct Sparse {
    len: u64,
    pages: BTreeMap<u64, Vec<u8>>,
}

impl Sparse {
    fn write(&mut self, off: u64, data: &[u8]) {
        let mut pos = off;
        let mut rest = data;
        while !rest.is_empty() {
            let within = usize::try_from(pos % PAGE).unwrap();
            let n = rest.len().min(PAGE as usize - within);
            let page = self
                .pages
                .entry(pos / PAGE)
                .or_insert_with(|| vec![0; PAGE as usize]);
            page[within..within + n].copy_from_slice(&rest[..n]);
            pos += n as u64;
            rest = &rest[n..];
        }
        self.len = self.len.max(off + data.len() as u64);
    }

    fn set_len(&mut self, len: u64) {
        if len < self.len {
            drop(self.pages.split_off(&len.div_ceil(PAGE)));
            if let Some(page) = self.pages.get_mut(&(len / PAGE)) {
                page[usize::try_from(len % PAGE).unwrap()..].fill(0);
            }
        }
        self.len = len;
    }

    fn read(&self, off: u64, size: usize) -> Vec<u8> {
        let end = self.len.min(off.saturating_add(size as u64));
        if off >= end {
            return Vec::new();
        }
        let mut out = vec![0; usize::try_from(end - off).unwrap()];
        for (&n, page) in self.pages.range(off / PAGE..=(end - 1) / PAGE) {
            let start = n * PAGE;
            let (from, to) = (off.max(start), end.min(start + PAGE));
            let dst = usize::try_from(from - off).unwrap()..usize::try_from(to - off).unwrap();
            let src = usize::try_from(from - start).unwrap()..usize::try_from(to - start).unwrap();
            out[dst].copy_from_slice(&page[src]);
        }
        out
    }
}

#[derive(Debug, Clone)]
enum DataOp {
    Write(u64, Vec<u8>),
    SetLen(u64),
}

#[derive(Debug, Default)]
struct FileNode {
    live: Sparse,
    synced: Sparse,
    unsynced: Vec<DataOp>,
}

impl FileNode {
    fn apply(img: &mut Sparse, op: &DataOp) {
        match op {
            DataOp::Write(off, data) => img.write(*off, data),
            DataOp::SetLen(n) => img.set_len(*n),
        }
    }

    fn push(&mut self, op: DataOp) {
        Self::apply(&mut self.live, &op);
        self.unsynced.push(op);
    }

    /// The synced image, then each unsynced operation kept or lost at
    /// random: a write sector by sector.
    fn survivor(&self, rng: &mut ChaCha8Rng) -> Sparse {
        let mut img = self.synced.clone();
        for op in &self.unsynced {
            match op {
                DataOp::SetLen(_) => {
                    if rng.random_bool(0.5) {
                        Self::apply(&mut img, op);
                    }
                }
                DataOp::Write(off, data) => {
                    let end = off + data.len() as u64;
                    let mut at = *off;
                    while at < end {
                        let next = ((at / SECTOR + 1) * SECTOR).min(end);
                        if rng.random_bool(0.5) {
                            let piece = usize::try_from(at - off).unwrap()
                                ..usize::try_from(next - off).unwrap();
                            img.write(at, &data[piece]);
                        }
                        at = next;
                    }
                }
            }
        }
        img
    }
}

// ------------------------------------------------------------ directories

#[derive(Debug, Clone)]
enum DirOp {
    Link(OsString, u64),
    Unlink(OsString),
    /// A rename inside one directory: both halves land together.
    Rename(OsString, OsString, u64),
}

#[derive(Debug, Default)]
struct DirNode {
    live: BTreeMap<OsString, u64>,
    synced: BTreeMap<OsString, u64>,
    unsynced: Vec<DirOp>,
}

impl DirNode {
    fn apply(names: &mut BTreeMap<OsString, u64>, op: &DirOp) {
        match op {
            DirOp::Link(n, ino) => {
                names.insert(n.clone(), *ino);
            }
            DirOp::Unlink(n) => {
                names.remove(n);
            }
            DirOp::Rename(from, to, ino) => {
                names.remove(from);
                names.insert(to.clone(), *ino);
            }
        }
    }

    fn push(&mut self, op: DirOp) {
        Self::apply(&mut self.live, &op);
        self.unsynced.push(op);
    }

    fn survivor(&self, rng: &mut ChaCha8Rng) -> BTreeMap<OsString, u64> {
        let mut names = self.synced.clone();
        let keep = rng.random_range(0..=self.unsynced.len());
        for op in &self.unsynced[..keep] {
            Self::apply(&mut names, op);
        }
        names
    }
}

#[derive(Debug)]
enum Node {
    File(FileNode),
    Dir(DirNode),
}

#[derive(Debug)]
struct State {
    nodes: HashMap<u64, Node>,
    next_ino: u64,
    /// Mutating operations so far.
    ops: u64,
    cut_at: Option<u64>,
    cut: bool,
    uid: u32,
    gid: u32,
}

fn eio() -> Errno {
    Errno::EIO
}

impl State {
    fn new(uid: u32, gid: u32) -> Self {
        let mut nodes = HashMap::new();
        nodes.insert(INodeNo::ROOT.0, Node::Dir(DirNode::default()));
        Self {
            nodes,
            next_ino: INodeNo::ROOT.0 + 1,
            ops: 0,
            cut_at: None,
            cut: false,
            uid,
            gid,
        }
    }

    /// Counts one mutating operation; fails it (and every later one) from
    /// the crash point on.
    fn tick(&mut self, what: std::fmt::Arguments<'_>) -> Result<(), Errno> {
        self.ops += 1;
        if std::env::var_os("ABHYASA_FUSE_TRACE").is_some() {
            eprintln!("fuse op {}: {what}", self.ops);
        }
        if self.cut_at.is_some_and(|at| self.ops >= at) {
            self.cut = true;
        }
        self.alive()
    }

    fn alive(&self) -> Result<(), Errno> {
        if self.cut {
            Err(eio())
        } else {
            Ok(())
        }
    }

    fn attr(&self, ino: u64) -> Result<FileAttr, Errno> {
        let node = self.nodes.get(&ino).ok_or(Errno::ENOENT)?;
        let (kind, size, perm, nlink) = match node {
            Node::File(f) => (FileType::RegularFile, f.live.len, 0o644, 1),
            Node::Dir(_) => (FileType::Directory, 0, 0o755, 2),
        };
        Ok(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: PAGE as u32,
            flags: 0,
        })
    }

    fn dir(&mut self, ino: u64) -> Result<&mut DirNode, Errno> {
        match self.nodes.get_mut(&ino) {
            Some(Node::Dir(d)) => Ok(d),
            Some(Node::File(_)) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    /// `fsync` (`dir` false) or `fsyncdir` (`dir` true) of `ino`: what it
    /// holds now becomes what survives a cut. The node's kind is checked
    /// before the operation counts.
    fn sync(&mut self, ino: u64, dir: bool) -> Result<(), Errno> {
        let op = if dir {
            self.dir(ino)?;
            "fsyncdir"
        } else {
            self.file(ino)?;
            "fsync"
        };
        self.tick(format_args!("{op} {ino}"))?;
        match self.nodes.get_mut(&ino) {
            Some(Node::File(f)) => {
                f.synced = f.live.clone();
                f.unsynced.clear();
            }
            Some(Node::Dir(d)) => {
                d.synced = d.live.clone();
                d.unsynced.clear();
            }
            None => return Err(Errno::ENOENT),
        }
        Ok(())
    }

    fn file(&mut self, ino: u64) -> Result<&mut FileNode, Errno> {
        match self.nodes.get_mut(&ino) {
            Some(Node::File(f)) => Ok(f),
            Some(Node::Dir(_)) => Err(Errno::EISDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn lookup(&mut self, parent: u64, name: &OsStr) -> Result<u64, Errno> {
        self.dir(parent)?
            .live
            .get(name)
            .copied()
            .ok_or(Errno::ENOENT)
    }

    /// A new node named `name` in `parent`.
    fn make(&mut self, parent: u64, name: &OsStr, node: Node) -> Result<FileAttr, Errno> {
        if self.dir(parent)?.live.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        self.tick(format_args!("make {parent}/{name:?}"))?;
        let ino = self.next_ino;
        self.next_ino += 1;
        self.nodes.insert(ino, node);
        self.dir(parent)?
            .push(DirOp::Link(name.to_os_string(), ino));
        self.attr(ino)
    }

    fn remove(&mut self, parent: u64, name: &OsStr, want_dir: bool) -> Result<(), Errno> {
        let ino = self.lookup(parent, name)?;
        match (self.nodes.get(&ino), want_dir) {
            (Some(Node::Dir(d)), true) if !d.live.is_empty() => return Err(Errno::ENOTEMPTY),
            (Some(Node::Dir(_)), false) => return Err(Errno::EISDIR),
            (Some(Node::File(_)), true) => return Err(Errno::ENOTDIR),
            _ => {}
        }
        self.tick(format_args!("remove {parent}/{name:?}"))?;
        self.dir(parent)?.push(DirOp::Unlink(name.to_os_string()));
        Ok(())
    }

    fn rename(
        &mut self,
        parent: u64,
        name: &OsStr,
        to_parent: u64,
        to: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            return Err(Errno::EINVAL);
        }
        let ino = self.lookup(parent, name)?;
        if let Ok(old) = self.lookup(to_parent, to) {
            if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                return Err(Errno::EEXIST);
            }
            if let Some(Node::Dir(d)) = self.nodes.get(&old) {
                if !d.live.is_empty() {
                    return Err(Errno::ENOTEMPTY);
                }
            }
        }
        self.tick(format_args!(
            "rename {parent}/{name:?} -> {to_parent}/{to:?}"
        ))?;
        if parent == to_parent {
            self.dir(parent)?
                .push(DirOp::Rename(name.to_os_string(), to.to_os_string(), ino));
        } else {
            self.dir(parent)?.push(DirOp::Unlink(name.to_os_string()));
            self.dir(to_parent)?
                .push(DirOp::Link(to.to_os_string(), ino));
        }
        Ok(())
    }

    /// Writes what a power cut leaves under directory `ino` into `dir` on
    /// a real file system.
    fn restore(&self, ino: u64, dir: &Path, rng: &mut ChaCha8Rng) -> io::Result<()> {
        let Some(Node::Dir(d)) = self.nodes.get(&ino) else {
            return Ok(());
        };
        for (name, child) in d.survivor(rng) {
            let path = dir.join(&name);
            match &self.nodes[&child] {
                Node::Dir(_) => {
                    std::fs::create_dir(&path)?;
                    self.restore(child, &path, rng)?;
                }
                Node::File(f) => {
                    let img = f.survivor(rng);
                    let file = std::fs::File::create(&path)?;
                    file.set_len(img.len)?;
                    for (n, page) in &img.pages {
                        let start = n * PAGE;
                        let end = img.len.min(start + PAGE);
                        if start < end {
                            let used = usize::try_from(end - start).unwrap();
                            file.write_all_at(&page[..used], start)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

// ------------------------------------------------------------ the FUSE side

#[derive(Debug, Clone)]
struct PowerFs(Arc<Mutex<State>>);

impl PowerFs {
    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

macro_rules! answer {
    ($reply:expr, $res:expr, |$v:ident| $ok:expr) => {
        match $res {
            Ok($v) => $ok,
            Err(e) => $reply.error(e),
        }
    };
}

impl Filesystem for PowerFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut s = self.state();
        let res = s
            .alive()
            .and_then(|()| s.lookup(parent.0, name))
            .and_then(|ino| s.attr(ino));
        answer!(reply, res, |a| reply.entry(&TTL, &a, Generation(0)));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let s = self.state();
        let res = s.alive().and_then(|()| s.attr(ino.0));
        answer!(reply, res, |a| reply.attr(&TTL, &a));
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut s = self.state();
        let res = s.alive().and_then(|()| {
            if let Some(len) = size {
                s.file(ino.0)?;
                s.tick(format_args!("set_len {} {len}", ino.0))?;
                s.file(ino.0)?.push(DataOp::SetLen(len));
            }
            s.attr(ino.0)
        });
        answer!(reply, res, |a| reply.attr(&TTL, &a));
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let mut s = self.state();
        let res = s
            .alive()
            .and_then(|()| s.make(parent.0, name, Node::Dir(DirNode::default())));
        answer!(reply, res, |a| reply.entry(&TTL, &a, Generation(0)));
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let mut s = self.state();
        let res = s
            .alive()
            .and_then(|()| s.make(parent.0, name, Node::File(FileNode::default())));
        answer!(reply, res, |a| reply.created(
            &TTL,
            &a,
            Generation(0),
            FileHandle(0),
            FopenFlags::empty()
        ));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut s = self.state();
        let res = s.alive().and_then(|()| s.remove(parent.0, name, false));
        answer!(reply, res, |_v| reply.ok());
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut s = self.state();
        let res = s.alive().and_then(|()| s.remove(parent.0, name, true));
        answer!(reply, res, |_v| reply.ok());
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut s = self.state();
        let res = s
            .alive()
            .and_then(|()| s.rename(parent.0, name, newparent.0, newname, flags));
        answer!(reply, res, |_v| reply.ok());
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let s = self.state();
        let res = s.alive().and_then(|()| s.attr(ino.0));
        answer!(reply, res, |_a| reply
            .opened(FileHandle(0), FopenFlags::empty()));
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut s = self.state();
        let res = s
            .alive()
            .and_then(|()| Ok(s.file(ino.0)?.live.read(offset, size as usize)));
        answer!(reply, res, |data| reply.data(&data));
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut s = self.state();
        let res = s.alive().and_then(|()| {
            s.file(ino.0)?;
            s.tick(format_args!(
                "write {} at {offset} len {}",
                ino.0,
                data.len()
            ))?;
            s.file(ino.0)?.push(DataOp::Write(offset, data.to_vec()));
            Ok(u32::try_from(data.len()).unwrap())
        });
        answer!(reply, res, |n| reply.written(n));
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut s = self.state();
        let res = s.alive().and_then(|()| s.sync(ino.0, false));
        answer!(reply, res, |_v| reply.ok());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut s = self.state();
        let res = s.alive().and_then(|()| {
            let names: Vec<(OsString, u64)> = s
                .dir(ino.0)?
                .live
                .iter()
                .map(|(n, i)| (n.clone(), *i))
                .collect();
            let mut all = vec![
                (OsString::from("."), ino.0, FileType::Directory),
                (OsString::from(".."), INodeNo::ROOT.0, FileType::Directory),
            ];
            for (name, child) in names {
                let kind = match s.nodes.get(&child) {
                    Some(Node::Dir(_)) => FileType::Directory,
                    _ => FileType::RegularFile,
                };
                all.push((name, child, kind));
            }
            Ok(all)
        });
        match res {
            Ok(all) => {
                let skip = usize::try_from(offset).unwrap_or(usize::MAX);
                for (i, (name, child, kind)) in all.into_iter().enumerate().skip(skip) {
                    if reply.add(INodeNo(child), i as u64 + 1, kind, &name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut s = self.state();
        let res = s.alive().and_then(|()| s.sync(ino.0, true));
        answer!(reply, res, |_v| reply.ok());
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }
}

// ------------------------------------------------------------ the mount

/// A mounted [`PowerFs`] on a fresh temporary directory. Dropping it
/// unmounts.
pub(crate) struct PowerMount {
    fs: PowerFs,
    // Dropped first: unmounted before the directory goes.
    session: Option<BackgroundSession>,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for PowerMount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PowerMount")
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

impl PowerMount {
    /// Mounts an empty file system.
    pub(crate) fn new() -> io::Result<Self> {
        let dir = tempfile::tempdir()?;
        let meta = std::fs::metadata(dir.path())?;
        let fs = PowerFs(Arc::new(Mutex::new(State::new(meta.uid(), meta.gid()))));
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::FSName("abhyasa-power-cut".into()),
            MountOption::RW,
        ];
        let session = fuser::spawn_mount2(fs.clone(), dir.path(), &config)?;
        Ok(Self {
            fs,
            session: Some(session),
            dir,
        })
    }

    /// Where it is mounted.
    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Mutating operations so far.
    pub(crate) fn ops(&self) -> u64 {
        self.fs.state().ops
    }

    /// The power fails at this mutating operation (1-based).
    pub(crate) fn cut_at(&self, op: u64) {
        self.fs.state().cut_at = Some(op);
    }

    /// Writes the disk after the power comes back into a new temporary
    /// directory on the real file system.
    pub(crate) fn after_power_loss(&self, rng: &mut ChaCha8Rng) -> io::Result<tempfile::TempDir> {
        let out = tempfile::tempdir()?;
        self.fs.state().restore(INodeNo::ROOT.0, out.path(), rng)?;
        Ok(out)
    }
}

impl Drop for PowerMount {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            if let Err(e) = session.umount_and_join() {
                eprintln!("unmounting {}: {e}", self.dir.path().display());
            }
        }
    }
}

/// Whether this machine can mount a FUSE file system here (root, or
/// `fusermount`, and `/dev/fuse`): `Err` says why not.
pub(crate) fn available() -> Result<(), String> {
    let m = PowerMount::new().map_err(|e| format!("cannot mount a FUSE file system: {e}"))?;
    let probe: PathBuf = m.path().join("probe");
    std::fs::write(&probe, b"probe")
        .and_then(|()| std::fs::read(&probe))
        .map_err(|e| format!("the FUSE mount does not answer: {e}"))
        .and_then(|got| {
            if got == b"probe" {
                Ok(())
            } else {
                Err("the FUSE mount reads back other bytes".into())
            }
        })
}
