//! Store benchmark: sled, redb, the log store and fjall side by side.
//!
//! ```text
//! cargo run --release -p abhyasa-store --example store_bench            # 1,000,000 pending
//! cargo run --release -p abhyasa-store --example store_bench -- --quick # 100,000, fewer commits
//! cargo run --release -p abhyasa-store --example store_bench -- --pending 250000
//! cargo run --release -p abhyasa-store --example store_bench -- --only-throughput
//! cargo run --release -p abhyasa-store --example store_bench -- --store log --only-scale
//! cargo run --release -p abhyasa-store --example store_bench -- --cpu
//! cargo run --release -p abhyasa-store --example store_bench -- --retained 1000000
//! ```
//!
//! `--retained N` measures what finished obligations cost until compaction
//! drops them: N obligations opened, applied (the receiver's ledger entry
//! in the same store) and closed, the store reopened in a fresh child
//! process and its durable state loaded; prints the heap the open store
//! holds per retained obligation (its own: the loaded state dropped) and
//! what the loaded state itself takes.
//!
//! `--cpu` measures the log store's own CPU per obligation alone: the
//! same commits (batch 256) on a disk held in memory, so no write or
//! `fdatasync` is timed, only the engine, the encoding and the in-memory
//! tables (the part of a commit that grows with its size).
//!
//! Prints, per backend: committed obligations/s and CPU microseconds per
//! committed obligation at batch sizes 1, 16, 256 and 4096 (each
//! obligation is a `CustodyOpened`, the receiver's applied `Ledger` entry
//! and, one commit later, its `CustodyClosed`: one durable group commit
//! per batch); bytes of disk and of memory per pending
//! obligation; and the time to reopen the database and recover N pending
//! obligations into a running `Custodian` (measured in a fresh child
//! process, so its resident memory is the recovery's alone).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use abhyasa_core::custody::{
    Custodian, CustodianConfig, CustodyProfile, Receiver, ReceiverConfig, Record, StandardApplier,
};
use abhyasa_core::polarity::{PolarityRegistry, PHALA_KIND};
use abhyasa_core::store::Store;
use abhyasa_core::{AckStatus, AgentId, CustodyAck, Obligation, RetryBackoff, Timestamp};
use abhyasa_store::{read_image_at, LogDisk, LogOptions, LogStore, StoreKind, StoreOptions};
use serde_json::json;

/// Counts the bytes the program holds on the heap, so the recovery child
/// can tell what the restored custodian holds from what the allocator
/// keeps of what the load freed (the resident-set figure has both). It
/// forwards to the node binary's allocator (`abhyasa_alloc`, mimalloc), so
/// the resident memory per pending obligation is what `abhyasa node run`
/// would hold.
struct Counting;

/// The allocator `Counting` forwards to.
const INNER: abhyasa_alloc::Allocator = abhyasa_alloc::Allocator;

static HELD: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

// `unsafe` because a global allocator is an unsafe trait; this bench
// needs one to count the heap a recovery holds.
// SAFETY: every call forwards to the node's allocator with the caller's
// own layout and pointer; the counter is the only addition.
#[allow(unsafe_code)]
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        HELD.fetch_add(layout.size(), std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the caller's layout, passed on unchanged.
        unsafe { INNER.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        HELD.fetch_sub(layout.size(), std::sync::atomic::Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { INNER.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        HELD.fetch_add(new, std::sync::atomic::Ordering::Relaxed);
        HELD.fetch_sub(layout.size(), std::sync::atomic::Ordering::Relaxed);
        // SAFETY: `ptr` came from this allocator with `layout`.
        unsafe { INNER.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn held_bytes() -> usize {
    HELD.load(std::sync::atomic::Ordering::Relaxed)
}

use abhyasa_testkit::proc_stat::cpu_secs;

const EPOCH: Timestamp = Timestamp::from_unix_seconds(1_780_000_000);

fn obligation(i: u64) -> Obligation {
    Obligation::builder()
        .id(format!("ob-{i:010}"))
        .kind(PHALA_KIND)
        .target("receiver")
        .payload(json!({"weight_delta": -0.25, "weight_key": format!("route-{}", i % 1000), "reason": "corrective"}))
        .deadline_seconds(600)
        .max_retries(64)
        .created_at(EPOCH)
        .build()
        .expect("valid obligation")
}

fn custodian() -> Custodian {
    let mut cfg = CustodianConfig::new(AgentId::new("custodian").expect("id"));
    cfg.max_pending = usize::MAX;
    cfg.default_profile = CustodyProfile {
        backoff: RetryBackoff::DEFAULT,
        ..CustodyProfile::default()
    };
    Custodian::new(cfg, PolarityRegistry::standard())
}

fn drain(c: &mut Custodian) -> Vec<Record> {
    let mut out = Vec::new();
    while let Some(b) = c.poll_records() {
        c.handle_committed(b.token());
        out.extend(b.records);
    }
    out
}

/// Per batch: the opens and the receiver's ledger entries of its
/// obligations, and their closes (committed one batch later).
struct Batch {
    opens_and_ledger: Vec<Record>,
    closes: Vec<Record>,
}

fn make_batches(first: u64, batch: usize, count: usize) -> Vec<Batch> {
    let mut c = custodian();
    let mut r = Receiver::new(
        ReceiverConfig::new(AgentId::new("receiver").expect("id")),
        PolarityRegistry::standard(),
    );
    let mut applier = StandardApplier::default();
    let from = AgentId::new("custodian").expect("id");
    let to = AgentId::new("receiver").expect("id");
    let mut out = Vec::with_capacity(count);
    for b in 0..count {
        let mut opens_and_ledger = Vec::with_capacity(batch * 2);
        let mut obs = Vec::with_capacity(batch);
        for i in 0..batch {
            let ob = obligation(first + (b * batch + i) as u64);
            c.offer(EPOCH, ob.clone()).expect("offer");
            obs.push(ob);
        }
        opens_and_ledger.extend(drain(&mut c));
        for ob in &obs {
            let _ = r.handle_obligation(EPOCH, &from, ob.clone(), &mut applier);
        }
        while let Some(rb) = r.poll_records() {
            r.handle_committed(rb.token());
            opens_and_ledger.extend(rb.records);
        }
        while r.poll_transmit().is_some() {}
        for ob in &obs {
            let ack = CustodyAck::new(
                ob.id().clone(),
                to.clone(),
                AckStatus::Applied,
                EPOCH,
                Some(ob.digest()),
            );
            c.handle_ack(EPOCH, &to, &ack);
        }
        let closes = drain(&mut c);
        while c.poll_transmit().is_some() {}
        while c.poll_event().is_some() {}
        out.push(Batch {
            opens_and_ledger,
            closes,
        });
    }
    out
}

fn db_path(kind: StoreKind, dir: &Path) -> PathBuf {
    match kind {
        StoreKind::Sled => dir.join("sled"),
        StoreKind::Redb => dir.join("node.redb"),
        StoreKind::Log => dir.join("log"),
        StoreKind::Fjall => dir.join("fjall"),
    }
}

fn disk_bytes(p: &Path) -> u64 {
    let Ok(md) = std::fs::metadata(p) else {
        return 0;
    };
    if md.is_file() {
        return md.len();
    }
    std::fs::read_dir(p)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| disk_bytes(&e.path()))
                .sum()
        })
        .unwrap_or(0)
}

/// This process's resident set, bytes, from `/proc/self/statm` (0 where
/// there is none).
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map_or(0, |pages| pages * 4096)
}

/// Commits the first `count` batches, one commit each: a batch's opens
/// and ledger entries with the previous batch's closes.
fn commit_all(store: &mut dyn Store, batches: &[Batch], count: usize) {
    for i in 0..count {
        let prev: &[Record] = if i == 0 { &[] } else { &batches[i - 1].closes };
        let _ = store
            .commit(EPOCH, &[&batches[i].opens_and_ledger, prev])
            .expect("commit");
    }
}

/// Committing `count` batches of `batch` obligations: obligations/s, and
/// the CPU time (this process, user + system) per obligation in
/// microseconds. The CPU figure is what the store costs a node whose
/// cores are busy (the throughput example's case) and is robust to other
/// load on the machine; wall time is not.
fn throughput(kind: StoreKind, batch: usize, count: usize) -> (f64, f64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = kind
        .open(db_path(kind, dir.path()), &StoreOptions::default())
        .expect("open");
    let batches = make_batches(0, batch, count + 1);
    let cpu = cpu_secs();
    let start = Instant::now();
    commit_all(store.as_mut(), &batches, count);
    let n = (count * batch) as f64;
    (
        n / start.elapsed().as_secs_f64(),
        (cpu_secs() - cpu) * 1e6 / n,
    )
}

/// A disk in memory: a write is a copy and a sync does nothing, so a
/// commit's time is the store's CPU alone.
#[derive(Debug, Default)]
struct MemDisk(HashMap<String, Vec<u8>>);

impl LogDisk for MemDisk {
    fn list(&self) -> io::Result<Vec<String>> {
        Ok(self.0.keys().cloned().collect())
    }
    fn read(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        Ok(self.0.get(name).cloned())
    }
    fn read_at(&self, name: &str, at: u64, buf: &mut [u8]) -> io::Result<()> {
        read_image_at(self.0.get(name).ok_or(io::ErrorKind::NotFound)?, at, buf)
    }
    fn write_at(&mut self, name: &str, at: u64, data: &[u8]) -> io::Result<()> {
        let f = self.0.entry(name.to_string()).or_default();
        let at = usize::try_from(at).map_err(io::Error::other)?;
        if f.len() < at + data.len() {
            f.resize(at + data.len(), 0);
        }
        f[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn sync(&mut self, _: &str) -> io::Result<()> {
        Ok(())
    }
    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        if let Some(f) = self.0.get_mut(name) {
            f.truncate(usize::try_from(len).unwrap_or(usize::MAX));
        }
        Ok(())
    }
    fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        let f = self.0.remove(from).ok_or(io::ErrorKind::NotFound)?;
        self.0.insert(to.to_string(), f);
        Ok(())
    }
    fn remove(&mut self, name: &str) -> io::Result<()> {
        self.0.remove(name);
        Ok(())
    }
    fn sync_dir(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The log store's CPU per obligation without I/O: `rounds` runs of
/// `count` batches of 256 on a [`MemDisk`]; the best run's wall time per
/// obligation (no I/O waits, so wall time is CPU time unless the machine
/// takes the core away; the best of several runs is the least disturbed).
fn cpu_only(rounds: usize, count: usize) {
    let batch = 256;
    let batches = make_batches(0, batch, count + 1);
    let n = (count * batch) as f64;
    let mut best = f64::INFINITY;
    for _ in 0..rounds {
        let mut store = LogStore::open_on(MemDisk::default(), LogOptions::default()).expect("open");
        let start = Instant::now();
        commit_all(&mut store, &batches, count);
        let us = start.elapsed().as_secs_f64() * 1e6 / n;
        println!("  round: {us:.2} us / obligation");
        best = best.min(us);
    }
    println!(
        "log store CPU, no I/O, batch {batch}, {count} commits: best {best:.2} us / obligation ({:.2} us / record)",
        best / 3.0
    );
}

struct Scale {
    write_secs: f64,
    disk_per_pending: f64,
    recover_secs: f64,
    load_secs: f64,
    recover_cpu: f64,
    rss_per_pending: f64,
    held_per_pending: f64,
    custodian_per_pending: f64,
}

fn scale(kind: StoreKind, pending: u64) -> Scale {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = db_path(kind, dir.path());
    // Written by a child that exits before the recovery starts, as a
    // node's process is gone before it restarts: the recovering process
    // then reuses the memory the writer gave back instead of touching
    // pages the machine has not handed out yet (on this VM that first
    // touch doubled the recovery's CPU time).
    let write = field(&child("--write-child", kind, &path, pending), "write_secs=");
    assert!(write.is_finite(), "the write child printed no write_secs");
    let write = Duration::from_secs_f64(write);
    let disk = disk_bytes(&path);
    if std::env::var_os("STORE_BENCH_KEEP").is_some() {
        // For profiling the recovery alone: `--recover-child KIND PATH N`.
        eprintln!("kept {}", path.display());
        let _ = dir.keep();
        return Scale {
            write_secs: write.as_secs_f64(),
            disk_per_pending: disk as f64 / pending as f64,
            recover_secs: f64::NAN,
            load_secs: f64::NAN,
            recover_cpu: f64::NAN,
            rss_per_pending: f64::NAN,
            held_per_pending: f64::NAN,
            custodian_per_pending: f64::NAN,
        };
    }
    let text = child("--recover-child", kind, &path, pending);
    let field = |name: &str| field(&text, name);
    Scale {
        write_secs: write.as_secs_f64(),
        disk_per_pending: disk as f64 / pending as f64,
        recover_secs: field("recover_secs="),
        load_secs: field("load_secs="),
        recover_cpu: field("recover_cpu="),
        rss_per_pending: field("rss_delta=") / pending as f64,
        held_per_pending: field("held=") / pending as f64,
        custodian_per_pending: field("held_custodian=") / pending as f64,
    }
}

/// The value of `name` (`key=`) in a child's `key=value` output; NaN when
/// it printed none.
fn field(text: &str, name: &str) -> f64 {
    text.split_whitespace()
        .find_map(|kv| kv.strip_prefix(name).and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// Runs this program as `mode KIND PATH PENDING` and returns what it
/// printed; a child that fails fails the bench.
fn child(mode: &str, kind: StoreKind, path: &Path, pending: u64) -> String {
    let out = Command::new(std::env::current_exe().expect("exe"))
        .args([
            mode,
            kind.as_str(),
            &path.display().to_string(),
            &pending.to_string(),
        ])
        .output()
        .expect("child");
    assert!(out.status.success(), "{mode} failed: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Writes `pending` obligations in batches of 4096 into a new store at
/// `path`; prints the time spent in commits.
fn write_child(kind: &str, path: &str, pending: u64) {
    let kind: StoreKind = kind.parse().expect("kind");
    let batch = 4096usize;
    let mut write = Duration::ZERO;
    let mut store = kind.open(path, &StoreOptions::default()).expect("open");
    let mut c = custodian();
    let mut done = 0u64;
    while done < pending {
        let n = batch.min((pending - done) as usize);
        for i in 0..n {
            c.offer(EPOCH, obligation(done + i as u64)).expect("offer");
        }
        let b = c.poll_records().expect("records");
        let t = Instant::now();
        let _ = store.commit(EPOCH, &[&b.records]).expect("commit");
        write += t.elapsed();
        c.handle_committed(b.token());
        while c.poll_transmit().is_some() {}
        while c.poll_event().is_some() {}
        done += n as u64;
    }
    println!("write_secs={}", write.as_secs_f64());
}

fn recover_child(kind: &str, path: &str, pending: u64) {
    let kind: StoreKind = kind.parse().expect("kind");
    let before = rss_bytes();
    let held_before = held_bytes();
    let cpu = cpu_secs();
    let t = Instant::now();
    let store = kind.open(path, &StoreOptions::default()).expect("open");
    let state = store.load().expect("load");
    let loaded = t.elapsed().as_secs_f64();
    let mut cfg = CustodianConfig::new(AgentId::new("custodian").expect("id"));
    cfg.max_pending = usize::MAX;
    let c = Custodian::restore_owned(cfg, PolarityRegistry::standard(), state.custodian);
    let secs = t.elapsed().as_secs_f64();
    let cpu = cpu_secs() - cpu;
    assert_eq!(c.pending_len() as u64, pending, "recovered pending count");
    drop(state.receiver);
    // As `abhyasa node run` does once its node is open: what the load
    // freed goes back to the system now rather than after the purge delay.
    abhyasa_alloc::collect();
    let after = rss_bytes();
    let held = held_bytes().saturating_sub(held_before);
    drop(store);
    let held_custodian = held_bytes().saturating_sub(held_before);
    println!(
        "recover_secs={secs} recover_cpu={cpu} load_secs={loaded} rss_delta={} held={held} held_custodian={held_custodian}",
        after.saturating_sub(before)
    );
    drop(c);
}

/// Writes `n` obligations opened, applied and closed into a new store at
/// `path`, 64 batches of 4096 at a time.
fn retain_write_child(kind: &str, path: &str, n: u64) {
    let kind: StoreKind = kind.parse().expect("kind");
    let mut store = kind.open(path, &StoreOptions::default()).expect("open");
    let batch = 4096usize;
    let mut done = 0u64;
    while done < n {
        let count = 64.min((n - done).div_ceil(batch as u64) as usize);
        let batches = make_batches(done, batch, count);
        commit_all(store.as_mut(), &batches, count);
        let last = &batches[count - 1].closes;
        let _ = store.commit(EPOCH, &[last]).expect("commit");
        done += (count * batch) as u64;
    }
    println!("written={done}");
}

/// Reopens the store at `path` and loads it: the heap the open store holds
/// (the loaded state dropped), the heap of the loaded state, and the time.
fn retain_recover_child(kind: &str, path: &str) {
    let kind: StoreKind = kind.parse().expect("kind");
    let held_before = held_bytes();
    let t = Instant::now();
    let store = kind.open(path, &StoreOptions::default()).expect("open");
    let state = store.load().expect("load");
    let secs = t.elapsed().as_secs_f64();
    let terminal = state.custodian.terminal.len();
    abhyasa_alloc::collect();
    let with_state = held_bytes().saturating_sub(held_before);
    drop(state);
    abhyasa_alloc::collect();
    let store_held = held_bytes().saturating_sub(held_before);
    println!(
        "terminal={terminal} store_held={store_held} state_held={} load_secs={secs}",
        with_state.saturating_sub(store_held)
    );
    drop(store);
}

fn retained(kinds: &[StoreKind], n: u64) {
    println!("{n} retained obligations (opened, applied, closed; both sides in one store):");
    for &kind in kinds {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = db_path(kind, dir.path());
        let written = field(&child("--retain-write-child", kind, &path, n), "written=");
        let text = child("--retain-recover-child", kind, &path, 0);
        let f = |name: &str| field(&text, name);
        println!(
            "{:>6}: {} terminal of {written}; store heap {:.0} B / obligation, loaded state {:.0} B / obligation, open + load {:.2} s, disk {:.0} B / obligation",
            kind.as_str(),
            f("terminal="),
            f("store_held=") / written,
            f("state_held=") / written,
            f("load_secs="),
            disk_bytes(&path) as f64 / written,
        );
    }
}

fn main() {
    abhyasa_alloc::tune();
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--retain-write-child") {
        retain_write_child(&args[2], &args[3], args[4].parse().expect("n"));
        return;
    }
    if args.get(1).map(String::as_str) == Some("--retain-recover-child") {
        retain_recover_child(&args[2], &args[3]);
        return;
    }
    if args.get(1).map(String::as_str) == Some("--write-child") {
        write_child(&args[2], &args[3], args[4].parse().expect("pending"));
        return;
    }
    if args.get(1).map(String::as_str) == Some("--recover-child") {
        recover_child(&args[2], &args[3], args[4].parse().expect("pending"));
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let pending: u64 = args
        .iter()
        .position(|a| a == "--pending")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().expect("--pending N"))
        .unwrap_or(if quick { 100_000 } else { 1_000_000 });
    let kinds: Vec<StoreKind> = match args.iter().position(|a| a == "--store") {
        Some(i) => vec![args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .expect("--store redb|sled|log|fjall")],
        None => vec![
            StoreKind::Sled,
            StoreKind::Redb,
            StoreKind::Log,
            StoreKind::Fjall,
        ],
    };
    if let Some(n) = args
        .iter()
        .position(|a| a == "--retained")
        .and_then(|i| args.get(i + 1))
    {
        retained(&kinds, n.parse().expect("--retained N"));
        return;
    }
    if args.iter().any(|a| a == "--cpu") {
        cpu_only(5, if quick { 100 } else { 400 });
        return;
    }
    let only_scale = args.iter().any(|a| a == "--only-scale");
    println!(
        "abhyasa-store bench ({} mode; {} cores)",
        if quick { "quick" } else { "full" },
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("one durable group commit per batch; an obligation = CustodyOpened + Ledger(applied) + CustodyClosed");
    println!();
    let head = |label: &str| {
        let mut line = format!("{label:>28}");
        for k in &kinds {
            line.push_str(&format!(" {:>14}", k.as_str()));
        }
        line
    };
    let cells = |label: String, xs: &[f64], digits: usize| {
        let mut line = format!("{label:>28}");
        for x in xs {
            line.push_str(&format!(" {x:>14.digits$}"));
        }
        line
    };
    println!("{}", head("committed obligations/s"));
    let mut cpu = Vec::new();
    for (batch, count) in [(1usize, 200usize), (16, 150), (256, 40), (4096, 8)] {
        if only_scale {
            break;
        }
        let count = if quick { (count / 4).max(3) } else { count };
        let r: Vec<(f64, f64)> = kinds.iter().map(|k| throughput(*k, batch, count)).collect();
        let rate: Vec<f64> = r.iter().map(|x| x.0).collect();
        println!("{}", cells(format!("batch {batch}"), &rate, 0));
        cpu.push((batch, r.iter().map(|x| x.1).collect::<Vec<f64>>()));
    }
    if !cpu.is_empty() {
        println!("{}", head("CPU us / obligation"));
        for (batch, us) in cpu {
            println!("{}", cells(format!("batch {batch}"), &us, 1));
        }
    }
    if args.iter().any(|a| a == "--only-throughput") {
        return;
    }
    println!();
    println!("{pending} pending obligations (opened in batches of 4096):");
    let s: Vec<Scale> = kinds.iter().map(|k| scale(*k, pending)).collect();
    println!("{}", head(""));
    let row = |label: &str, f: fn(&Scale) -> f64, digits: usize| {
        let xs: Vec<f64> = s.iter().map(f).collect();
        println!("{}", cells(label.to_string(), &xs, digits));
    };
    row("write time, s", |x| x.write_secs, 1);
    row("disk bytes / pending", |x| x.disk_per_pending, 0);
    row("memory bytes / pending", |x| x.rss_per_pending, 0);
    row("  heap held / pending", |x| x.held_per_pending, 0);
    row("  of it the custodian's", |x| x.custodian_per_pending, 0);
    row("reopen + recover, s", |x| x.recover_secs, 2);
    row("  of which open + load, s", |x| x.load_secs, 2);
    row("  CPU time of recovery, s", |x| x.recover_cpu, 2);
}
