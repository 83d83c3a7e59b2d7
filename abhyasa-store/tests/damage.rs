//! Damage to synced data, per store (C-SD-2, C-SD-4): a store holding
//! acknowledged custody (pending rows with their principal withholds,
//! escalated transfers with their fail-safes, receiver ledger entries with
//! their effects) is closed cleanly, then one fault is put into its files —
//! a flipped bit, a zeroed 512-byte or 4-KiB sector, a truncation, a
//! sector copied over another (a misdirected write), a missing file — and
//! reopened. Every fault must end in one of two ways: the store opens and
//! loads exactly the state it held, or opening or loading fails with a
//! typed error (the node refuses to start). Never a panic, never a load
//! that silently misses or invents a row.
//!
//! The positions are a seeded sample (the seed is printed; replay with
//! `ABHYASA_DAMAGE_SEED=N`); `ABHYASA_DAMAGE_SWEEP=1` flips a bit in every
//! 512-byte sector of every file and zeroes every sector instead.
#![allow(missing_docs, clippy::unwrap_used)]

use abhyasa_testkit::store_world as common;

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::Duration;

use abhyasa_core::custody::Record;
use abhyasa_core::custody::{Custodian, EffectValue, EffectWrite, LedgerOutcome, LedgerRecord};
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::store::{DurableState, StoreError};
use abhyasa_core::{GovernedKey, Sequence, Timestamp};
use common::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const PENDING: usize = 96;
const ESCALATED: usize = 16;
const LEDGER: usize = 48;
/// Obligations per commit: the store holds many small transactions.
const PER_COMMIT: usize = 4;

fn at(s: u64) -> Timestamp {
    EPOCH.saturating_add(Duration::from_secs(s))
}

fn drain(c: &mut Custodian) -> Vec<Record> {
    let mut out = Vec::new();
    while let Some(b) = c.poll_records() {
        c.handle_committed(b.token());
        out.extend(b.records);
    }
    out
}

fn applied_ledger(i: usize) -> Record {
    let ob = phala(&format!("in-{i:04}"), -0.1);
    Record::Ledger(Box::new(LedgerRecord {
        custodian: agent("upstream"),
        obligation_id: ob.id().clone(),
        digest: ob.digest(),
        kind: ob.kind().clone(),
        outcome: LedgerOutcome::Applied,
        reason: None,
        detail: None,
        effect: vec![EffectWrite {
            key: counter_key(ob.id()),
            value: EffectValue::Json(serde_json::json!(i)),
        }],
        key_sequence: Some((
            GovernedKey::new(format!("in-key-{i}")).unwrap(),
            Sequence(1),
        )),
        recorded_at: EPOCH,
        deadline_at: ob.deadline_at(),
        obligation: None,
    }))
}

/// The batches a node would have committed and acknowledged: revocations
/// under custody (each with its principal withhold), Phala correctives
/// escalated at their deadline (fail-safe applied), applied ledger entries.
fn acknowledged() -> Vec<Vec<Record>> {
    let mut c = Custodian::new(custodian_config(), PolarityRegistry::standard());
    let mut batches = Vec::new();
    let mut batch = Vec::new();
    let mut push = |batch: &mut Vec<Record>, recs: Vec<Record>, n: usize| {
        batch.extend(recs);
        if n % PER_COMMIT == PER_COMMIT - 1 {
            batches.push(std::mem::take(batch));
        }
    };
    for i in 0..ESCALATED {
        c.offer(EPOCH, phala(&format!("ph-{i:04}"), -0.2)).unwrap();
        let recs = drain(&mut c);
        push(&mut batch, recs, i);
    }
    c.handle_timeout(EPOCH.saturating_add(Duration::from_secs(DEADLINE_SECONDS as u64)));
    let closes = drain(&mut c);
    assert!(!closes.is_empty());
    batch.extend(closes);
    for i in 0..PENDING {
        let ob = revoke(&format!("rv-{i:04}"), &format!("scope-{i}"), 1);
        c.offer(EPOCH, ob).unwrap();
        let recs = drain(&mut c);
        push(&mut batch, recs, i);
    }
    for i in 0..LEDGER {
        push(&mut batch, vec![applied_ledger(i)], i);
    }
    if !batch.is_empty() {
        batches.push(batch);
    }
    batches
}

/// Waits until no process holds sled's lock on the database in `path`
/// (its flusher lets go a moment after the store is dropped), so the files
/// are copied at rest.
fn wait_unlocked(kind: Kind, path: &Path) {
    if kind != Kind::Sled {
        return;
    }
    for _ in 0..500 {
        let f = std::fs::File::open(path.join("db")).unwrap();
        if f.try_lock().is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("sled at {} stays locked", path.display());
}

/// A closed store holding the acknowledged batches, and what it loads.
fn golden(kind: Kind) -> (tempfile::TempDir, PathBuf, DurableState) {
    let dir = tempfile::tempdir().unwrap();
    let path = disk_path(kind, dir.path());
    {
        let mut s = open_disk(kind, &path).unwrap();
        for (n, b) in acknowledged().iter().enumerate() {
            let _ = s.commit(at(n as u64), &[b]).unwrap();
        }
    }
    wait_unlocked(kind, &path);
    let state = {
        let s = reopen(kind, &path);
        s.load().unwrap()
    };
    wait_unlocked(kind, &path);
    assert_eq!(state.custodian.pending.len(), PENDING);
    assert_eq!(state.custodian.terminal.len(), ESCALATED);
    assert_eq!(state.receiver.ledger.len(), LEDGER);
    assert!(state.custodian.principal.len() >= PENDING);
    (dir, path, state)
}

/// Every regular file under `root`, relative, sorted.
fn files(root: &Path) -> Vec<PathBuf> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                walk(root, &p, out);
            } else {
                out.push(p.strip_prefix(root).unwrap().to_path_buf());
            }
        }
    }
    if root.is_file() {
        return vec![PathBuf::new()];
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

fn copy_tree(from: &Path, to: &Path) {
    if from.is_file() {
        std::fs::copy(from, to).unwrap();
        return;
    }
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}

/// One fault in one file.
#[derive(Clone, Debug)]
enum Fault {
    Flip {
        offset: u64,
        bit: u8,
    },
    Zero {
        offset: u64,
        len: u64,
    },
    Truncate {
        len: u64,
    },
    /// The sector at `from` written over the one at `to`.
    Misdirect {
        from: u64,
        to: u64,
    },
    Missing,
}

impl Fault {
    fn class(&self) -> &'static str {
        match self {
            Fault::Flip { .. } => "bit flip",
            Fault::Zero { len: 512, .. } => "zeroed 512 B",
            Fault::Zero { .. } => "zeroed 4 KiB",
            Fault::Truncate { .. } => "truncation",
            Fault::Misdirect { .. } => "misdirected sector",
            Fault::Missing => "missing file",
        }
    }

    fn apply(&self, file: &Path) {
        let mut b = std::fs::read(file).unwrap();
        match *self {
            Fault::Flip { offset, bit } => b[offset as usize] ^= 1 << bit,
            Fault::Zero { offset, len } => {
                let end = (offset + len).min(b.len() as u64) as usize;
                b[offset as usize..end].fill(0);
            }
            Fault::Truncate { len } => b.truncate(len as usize),
            Fault::Misdirect { from, to } => {
                let src = b[from as usize..from as usize + 512].to_vec();
                b[to as usize..to as usize + 512].copy_from_slice(&src);
            }
            Fault::Missing => {
                std::fs::remove_file(file).unwrap();
                return;
            }
        }
        std::fs::write(file, b).unwrap();
    }
}

/// The faults tried on a file of `len` bytes: a seeded sample (or, in a
/// sweep, every sector).
fn faults_for(
    file_len: u64,
    len: u64,
    multi_file: bool,
    rng: &mut ChaCha8Rng,
    sweep: bool,
) -> Vec<Fault> {
    let mut out = Vec::new();
    if len == 0 {
        if multi_file {
            out.push(Fault::Missing);
        }
        return out;
    }
    let sectors = len.div_ceil(512);
    let flip_at = |offset: u64, rng: &mut ChaCha8Rng, out: &mut Vec<Fault>| {
        out.push(Fault::Flip {
            offset: offset.min(len - 1),
            bit: rng.random_range(0..8),
        })
    };
    if sweep {
        for s in 0..sectors {
            let o = s * 512 + rng.random_range(0..512.min(len - s * 512));
            flip_at(o, rng, &mut out);
            out.push(Fault::Zero {
                offset: s * 512,
                len: 512,
            });
        }
    } else {
        // The header, the first page's end, a page boundary, the tail and
        // a few anywhere.
        let mut picks = vec![
            0,
            1 + rng.random_range(0..63.min(len)),
            len - 1,
            len.saturating_sub(9),
        ];
        if len > 4096 {
            picks.push(4096);
            picks.push(4096 + rng.random_range(0..64));
        }
        for _ in 0..4 + (len / 512 / 16).min(20) {
            picks.push(rng.random_range(0..len));
        }
        if file_len > len {
            // Past the written part (preallocated zeros).
            picks.push(rng.random_range(len..file_len));
        }
        picks.sort_unstable();
        picks.dedup();
        for o in picks {
            flip_at(o, rng, &mut out);
        }
        out.push(Fault::Zero {
            offset: rng.random_range(0..sectors) * 512,
            len: 512,
        });
        out.push(Fault::Zero {
            offset: (sectors - 1) * 512,
            len: 512,
        });
    }
    out.push(Fault::Zero {
        offset: rng.random_range(0..len.div_ceil(4096)) * 4096,
        len: 4096,
    });
    for cut in [len / 2, len - 1, 0] {
        out.push(Fault::Truncate { len: cut });
    }
    if sectors >= 2 && len >= 1024 {
        let whole = len / 512;
        let from = rng.random_range(0..whole);
        let mut to = rng.random_range(0..whole);
        if to == from {
            to = (from + 1) % whole;
        }
        out.push(Fault::Misdirect {
            from: from * 512,
            to: to * 512,
        });
    }
    if multi_file {
        out.push(Fault::Missing);
    }
    out
}

/// What a reopen of a damaged store did.
#[derive(Debug)]
enum Outcome {
    /// Opened and loaded exactly the state it held.
    Intact,
    /// Opening or loading failed with this typed error.
    Refused(String),
    /// Opened and loaded something else: rows missing, altered or invented.
    Silent(String),
    /// A panic escaped the store.
    Panicked(String),
    /// The process aborted (a panic while unwinding from a panic, inside
    /// the engine): the node does not start, but not with a typed error.
    Aborted(String),
}

impl Outcome {
    fn text(&self) -> String {
        match self {
            Outcome::Intact => "intact".into(),
            Outcome::Refused(e) => format!("refused: {e}"),
            Outcome::Silent(d) => format!("silently different: {d}"),
            Outcome::Panicked(p) => format!("panicked: {p}"),
            Outcome::Aborted(a) => format!("aborted: {a}"),
        }
    }
}

/// What differs between two loads, as lines naming each row.
fn diff(want: &DurableState, got: &DurableState) -> Vec<String> {
    let mut out = Vec::new();
    let (wc, gc) = (&want.custodian, &got.custodian);
    for (id, p) in &wc.pending {
        match gc.pending.get(id) {
            None => out.push(format!("pending {id} missing")),
            Some(g) if g != p => out.push(format!("pending {id} altered")),
            _ => {}
        }
    }
    for id in gc.pending.keys().filter(|id| !wc.pending.contains_key(*id)) {
        out.push(format!("pending {id} invented"));
    }
    for (id, t) in &wc.terminal {
        if gc.terminal.get(id) != Some(t) {
            out.push(format!("terminal {id} missing or altered"));
        }
    }
    if gc.terminal.len() != wc.terminal.len() {
        out.push(format!(
            "terminal: {} rows, not {}",
            gc.terminal.len(),
            wc.terminal.len()
        ));
    }
    let fmt = |v: &[abhyasa_core::principal::PrincipalWrite]| {
        let mut s: Vec<String> = v.iter().map(|w| format!("{w:?}")).collect();
        s.sort();
        s
    };
    let (wp, gp) = (fmt(&wc.principal), fmt(&gc.principal));
    for w in wp.iter().filter(|w| !gp.contains(w)) {
        out.push(format!("principal row missing or altered: {w:.80}"));
    }
    if wp.len() != gp.len() {
        out.push(format!("principal: {} rows, not {}", gp.len(), wp.len()));
    }
    if wc.escalations != gc.escalations {
        out.push("escalations differ".into());
    }
    let (wr, gr) = (&want.receiver, &got.receiver);
    for (k, l) in &wr.ledger {
        if gr.ledger.get(k) != Some(l) {
            out.push(format!("ledger {}/{} missing or altered", k.0, k.1));
        }
    }
    if gr.ledger.len() != wr.ledger.len() {
        out.push(format!(
            "ledger: {} rows, not {}",
            gr.ledger.len(),
            wr.ledger.len()
        ));
    }
    if wr.effects != gr.effects {
        out.push("receiver effects differ".into());
    }
    if wr.key_sequences != gr.key_sequences {
        out.push("receiver key sequences differ".into());
    }
    out
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic".into())
}

/// Reopens the damaged store in a child process (this test binary, the
/// `damage_child` test): fjall can panic in a destructor while unwinding
/// from a panic on a damaged file, which aborts the whole process.
fn reopen_in_child(kind: Kind, path: &Path, reference: &Path) -> Outcome {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "damage_child", "--nocapture", "--test-threads=1"])
        .env("ABHYASA_DAMAGE_CHILD", kind.name())
        .env("ABHYASA_DAMAGE_PATH", path)
        .env("ABHYASA_DAMAGE_REFERENCE", reference)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let Some(line) = stdout
        .lines()
        .find_map(|l| l.split_once("DAMAGE-OUTCOME ").map(|(_, rest)| rest))
    else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr
            .lines()
            .rfind(|l| l.contains("panicked") || l.contains("abort"))
            .unwrap_or("");
        if std::env::var("ABHYASA_DAMAGE_VERBOSE").is_ok() {
            eprintln!("child: {}\n{stdout}\n{stderr}", out.status);
        }
        return Outcome::Aborted(format!("{} ({last})", out.status));
    };
    let (tag, text) = line.split_once(' ').unwrap_or((line, ""));
    match tag {
        "intact" => Outcome::Intact,
        "refused" => Outcome::Refused(text.to_string()),
        "silent" => Outcome::Silent(text.to_string()),
        _ => Outcome::Panicked(text.to_string()),
    }
}

/// The child side of [`reopen_in_child`]: loads the reference store, then
/// the damaged one, and prints the outcome.
#[test]
fn damage_child() {
    let Ok(kind) = std::env::var("ABHYASA_DAMAGE_CHILD") else {
        return;
    };
    let kind = Kind::from_name(&kind);
    let path = PathBuf::from(std::env::var("ABHYASA_DAMAGE_PATH").unwrap());
    let reference = PathBuf::from(std::env::var("ABHYASA_DAMAGE_REFERENCE").unwrap());
    let want = open_disk(kind, &reference).unwrap().load().unwrap();
    let line = match reopen_damaged(kind, &path, &want) {
        Outcome::Intact => "intact".to_string(),
        Outcome::Refused(e) => format!("refused {e}"),
        Outcome::Silent(d) => format!("silent {d}"),
        Outcome::Panicked(p) | Outcome::Aborted(p) => format!("panicked {p}"),
    };
    println!("DAMAGE-OUTCOME {}", line.replace('\n', " "));
}

fn reopen_damaged(kind: Kind, path: &Path, want: &DurableState) -> Outcome {
    let run = catch_unwind(AssertUnwindSafe(|| -> Result<Vec<String>, StoreError> {
        let s = open_disk(kind, path)?;
        let got = s.load()?;
        Ok(diff(want, &got))
    }));
    wait_unlocked_if_present(kind, path);
    match run {
        Err(p) => Outcome::Panicked(panic_text(p)),
        Ok(Err(e)) => Outcome::Refused(e.to_string()),
        Ok(Ok(d)) if d.is_empty() => Outcome::Intact,
        Ok(Ok(d)) => Outcome::Silent(format!(
            "{} differences: {}",
            d.len(),
            d[..d.len().min(4)].join("; ")
        )),
    }
}

fn wait_unlocked_if_present(kind: Kind, path: &Path) {
    if kind == Kind::Sled && path.join("db").exists() {
        wait_unlocked(kind, path);
    }
}

fn seed() -> u64 {
    std::env::var("ABHYASA_DAMAGE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(42)
}

/// Runs every fault over a copy of the golden store of `kind`; returns the
/// failures (silent loss or panic) after printing the per-class tally.
fn damage_suite(kind: Kind) -> Vec<String> {
    let sweep = std::env::var("ABHYASA_DAMAGE_SWEEP").is_ok_and(|v| v == "1");
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (gdir, gpath, want) = golden(kind);
    let multi_file = gpath.is_dir();
    let reference = gdir.path().join("reference");
    copy_tree(&gpath, &reference);
    let mut tally: BTreeMap<&'static str, [usize; 9]> = BTreeMap::new();
    let mut bad = Vec::new();
    let mut cases = 0;
    let all = files(&gpath);
    let mut picked: Vec<PathBuf> = Vec::new();
    let mut small = Vec::new();
    for rel in &all {
        let len = std::fs::metadata(gpath.join(rel)).map_or(0, |m| m.len());
        if sweep || all.len() <= 10 || len >= 4096 || rel.extension().is_some_and(|x| x == "jnl") {
            picked.push(rel.clone());
        } else {
            small.push(rel.clone());
        }
    }
    // fjall keeps a few small files per keyspace: a seeded handful of
    // them (all in a sweep).
    for _ in 0..6.min(small.len()) {
        let i = rng.random_range(0..small.len());
        picked.push(small.swap_remove(i));
    }
    for rel in picked {
        let at = |root: &Path| {
            if rel.as_os_str().is_empty() {
                root.to_path_buf()
            } else {
                root.join(&rel)
            }
        };
        let bytes = std::fs::read(at(&gpath)).unwrap();
        let file_len = bytes.len() as u64;
        // The written part: faults go there (a 64 MiB preallocated fjall
        // journal is mostly zeros).
        let len = bytes
            .iter()
            .rposition(|&b| b != 0)
            .map_or(0, |p| p as u64 + 1);
        let len = if len == 0 { file_len } else { len };
        for fault in faults_for(file_len, len, multi_file, &mut rng, sweep) {
            cases += 1;
            let work = tempfile::tempdir_in(gdir.path()).unwrap();
            let path = disk_path(kind, work.path());
            copy_tree(&gpath, &path);
            fault.apply(&at(&path));
            let outcome = if kind == Kind::Fjall {
                reopen_in_child(kind, &path, &reference)
            } else {
                reopen_damaged(kind, &path, &want)
            };
            let journal_tail = kind == Kind::Fjall
                && rel.extension().is_some_and(|x| x == "jnl")
                && matches!(fault, Fault::Truncate { .. } | Fault::Zero { .. });
            let slot = match &outcome {
                // Known and documented (README, "What damage does"): fjall
                // cannot tell its journal's lost tail from a torn write.
                Outcome::Silent(_) if journal_tail => 8,
                Outcome::Intact => 0,
                Outcome::Refused(e) if e.contains("panicked") => 4,
                Outcome::Refused(e) if e.contains("(row witness)") => 3,
                Outcome::Refused(e) if e.starts_with("corrupt ") => 2,
                Outcome::Refused(_) => 1,
                Outcome::Aborted(_) => 5,
                Outcome::Silent(_) => 6,
                Outcome::Panicked(_) => 7,
            };
            tally.entry(fault.class()).or_default()[slot] += 1;
            if std::env::var("ABHYASA_DAMAGE_VERBOSE").is_ok() {
                eprintln!("{kind:?} {} {fault:?}: {outcome:?}", rel.display());
            }
            if slot == 6 || slot == 7 {
                bad.push(format!(
                    "{kind:?} {} {fault:?} (seed {seed}): {}",
                    rel.display(),
                    outcome.text()
                ));
            }
        }
    }
    eprintln!(
        "{kind:?}: {cases} faults over {} files (seed {seed}{})",
        files(&gpath).len(),
        if sweep { ", sweep" } else { "" }
    );
    eprintln!(
        "  fault class          intact | refused: engine  row witness caught-panic aborted \
         | tail-lost silent panic"
    );
    for (class, [i, e, r, w, c, a, s, p, t]) in &tally {
        eprintln!(
            "  {class:<20} {i:>6} | {e:>15} {r:>4} {w:>7} {c:>12} {a:>7} | {t:>9} {s:>6} {p:>5}"
        );
    }
    bad
}

fn assert_no_silent_loss(kind: Kind) {
    let bad = damage_suite(kind);
    assert!(
        bad.is_empty(),
        "{} faults lost or altered acknowledged state silently or panicked \
         (replay with ABHYASA_DAMAGE_SEED):\n{}",
        bad.len(),
        bad.join("\n")
    );
}

// C-SD-2, C-SD-4
#[test]
fn redb_damage_is_refused_never_silent_c_sd_2() {
    assert_no_silent_loss(Kind::Redb);
}

// C-SD-2, C-SD-4
#[test]
fn fjall_damage_is_refused_never_silent_c_sd_2() {
    assert_no_silent_loss(Kind::Fjall);
}

// C-SD-2, C-SD-4
#[test]
fn sled_damage_is_refused_never_silent_c_sd_2() {
    assert_no_silent_loss(Kind::Sled);
}

// C-SD-4: a pending row deleted behind the store's back (the engine's
// checks cannot see a row that is simply gone) fails the load by its
// witness; `Repair::check` names the obligation from the event log;
// `quarantine` records the loss and the store opens on the rest.
#[test]
fn a_vanished_pending_row_is_named_and_its_loss_recorded_c_sd_4() {
    let (_dir, path, want) = golden(Kind::Redb);
    {
        let db = redb::Database::open(&path).unwrap();
        let def: redb::TableDefinition<&[u8], &[u8]> =
            redb::TableDefinition::new("custody_pending");
        let w = db.begin_write().unwrap();
        let _ = w.open_table(def).unwrap().remove(&b"rv-0042"[..]).unwrap();
        w.commit().unwrap();
    }
    let opts = abhyasa_store::StoreOptions::default();
    match open_disk(Kind::Redb, &path).unwrap().load() {
        Err(StoreError::Corrupt { table, key, detail }) => {
            assert_eq!((table, key.as_str()), ("custody_pending", "(row witness)"));
            assert!(detail.contains("1 rows are missing"), "{detail}");
        }
        other => panic!("a vanished pending row loaded: {:?}", other.map(|_| ())),
    }
    let mut repair = abhyasa_store::StoreKind::Redb
        .open_for_repair(&path, &opts)
        .unwrap();
    let bad = repair.check().unwrap();
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(bad[0].detail.contains("rv-0042"), "{:?}", bad[0]);
    let moved = repair.quarantine(EPOCH).unwrap();
    assert_eq!(moved.len(), 1);
    assert!(repair.check().unwrap().is_empty());
    drop(repair);
    let got = open_disk(Kind::Redb, &path).unwrap().load().unwrap();
    assert_eq!(
        got.custodian.pending.len(),
        want.custodian.pending.len() - 1
    );
    assert!(!got
        .custodian
        .pending
        .keys()
        .any(|k| k.as_str() == "rv-0042"));
}
