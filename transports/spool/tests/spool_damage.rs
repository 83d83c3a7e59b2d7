//! Damage to a synced spool file (C-SD-2, C-SD-4 at the relay): frames are
//! receipted and the spool closed, then one fault is put into the file —
//! a flipped bit, a zeroed 512-byte or 4-KiB sector, a truncation, a
//! sector copied over another — and the spool reopened. The relay must
//! not panic, must never hand out a frame that differs from the one it
//! receipted, and every receipted frame must be handed out intact, listed
//! as damaged (`Spool::damaged`, counted) or the open must fail with a
//! typed error. A frame is not custody: its origin keeps custody and
//! retries; the property is that the relay says what it dropped.
//!
//! Seeded (`ABHYASA_DAMAGE_SEED`); `ABHYASA_DAMAGE_SWEEP=1` damages every
//! sector.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::Duration;

use abhyasa_core::wire::{Envelope, FrameKey, Message, Sealed};
use abhyasa_core::{AgentId, Obligation, Timestamp};
use abhyasa_identity::generate_identity;
use abhyasa_spool::{Sealer, Spool, SpoolLimits};
use serde_json::json;

const T: Timestamp = Timestamp::from_unix_seconds(1_780_000_000);
const FRAMES: usize = 40;

fn agent(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

fn frame(s: &Sealer, i: usize) -> Sealed {
    let ob = Obligation::builder()
        .id(format!("ob-{i:03}"))
        .kind("anumati.consent")
        .target("edge")
        .payload(
            json!({"decision": "revoke", "scope": format!("scope-{i}"), "pad": "x".repeat(200)}),
        )
        .deadline_seconds(3600)
        .max_retries(64)
        .created_at(T)
        .build()
        .unwrap();
    let inner = Envelope::new(s.local().clone(), Message::Obligation(ob.clone()));
    s.seal(&agent("edge"), &inner, ob.deadline_at()).unwrap()
}

fn limits() -> SpoolLimits {
    let mut l = SpoolLimits::default();
    l.max_hold = Duration::from_secs(7200);
    l
}

/// Tiny deterministic generator (the sample of positions).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n.max(1)
    }
}

#[derive(Debug, Clone)]
enum Fault {
    Flip(u64, u8),
    Zero(u64, u64),
    Truncate(u64),
    Misdirect(u64, u64),
}

impl Fault {
    fn class(&self) -> &'static str {
        match self {
            Fault::Flip(..) => "bit flip",
            Fault::Zero(_, 512) => "zeroed 512 B",
            Fault::Zero(..) => "zeroed 4 KiB",
            Fault::Truncate(_) => "truncation",
            Fault::Misdirect(..) => "misdirected sector",
        }
    }

    fn apply(&self, path: &Path) {
        let mut b = std::fs::read(path).unwrap();
        match *self {
            Fault::Flip(o, bit) => b[o as usize] ^= 1 << bit,
            Fault::Zero(o, n) => {
                let end = ((o + n) as usize).min(b.len());
                b[o as usize..end].fill(0);
            }
            Fault::Truncate(n) => b.truncate(n as usize),
            Fault::Misdirect(from, to) => {
                let s = b[from as usize..from as usize + 512].to_vec();
                b[to as usize..to as usize + 512].copy_from_slice(&s);
            }
        }
        std::fs::write(path, b).unwrap();
    }
}

fn faults(len: u64, rng: &mut Rng, sweep: bool) -> Vec<Fault> {
    let sectors = len / 512;
    let mut out = Vec::new();
    if sweep {
        for s in 0..sectors {
            out.push(Fault::Flip(s * 512 + rng.below(512), rng.below(8) as u8));
            out.push(Fault::Zero(s * 512, 512));
        }
    } else {
        for o in [0, 1 + rng.below(63), 4096, len - 1] {
            out.push(Fault::Flip(o.min(len - 1), rng.below(8) as u8));
        }
        for _ in 0..12 {
            out.push(Fault::Flip(rng.below(len), rng.below(8) as u8));
        }
        for _ in 0..4 {
            out.push(Fault::Zero(rng.below(sectors) * 512, 512));
        }
    }
    for _ in 0..3 {
        out.push(Fault::Zero(rng.below(len / 4096) * 4096, 4096));
    }
    for cut in [len / 2, len - 1, 4096] {
        out.push(Fault::Truncate(cut));
    }
    for _ in 0..4 {
        let from = rng.below(sectors);
        let to = (from + 1 + rng.below(sectors - 1)) % sectors;
        out.push(Fault::Misdirect(from * 512, to * 512));
    }
    out
}

enum Outcome {
    Intact,
    Reported(usize),
    Refused(String),
    Wrong(String),
}

/// Opens the damaged spool and checks what it hands out against what was
/// receipted.
fn reopen(path: &Path, sent: &BTreeMap<FrameKey, Vec<u8>>) -> Outcome {
    let run = catch_unwind(AssertUnwindSafe(|| {
        let spool = match Spool::open(path, limits()) {
            Ok(s) => s,
            Err(e) => return Outcome::Refused(e.to_string()),
        };
        let (frames, _) =
            match spool.pending_for(T, &agent("edge"), 10_000, u64::MAX, &HashSet::new()) {
                Ok(f) => f,
                Err(e) => return Outcome::Refused(e.to_string()),
            };
        let mut seen = HashSet::new();
        for f in &frames {
            match sent.get(&f.key()) {
                Some(inner) if *inner == f.inner => {
                    seen.insert(f.key());
                }
                _ => {
                    return Outcome::Wrong(format!(
                        "handed out a frame never receipted: {}",
                        f.key()
                    ))
                }
            }
        }
        let reported = spool.damaged().len();
        let missing = sent.len() - seen.len();
        if missing > reported {
            return Outcome::Wrong(format!(
                "{missing} receipted frames missing, {reported} reported damaged"
            ));
        }
        if reported > 0 {
            assert_eq!(
                spool.damaged_total(),
                reported as u64,
                "damaged frames counted"
            );
            Outcome::Reported(reported)
        } else {
            Outcome::Intact
        }
    }));
    run.unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Outcome::Wrong(format!("panicked: {msg}"))
    })
}

// C-SD-2, C-SD-4: a damaged spool is reported, never delivered, never a panic.
#[test]
fn damaged_spool_is_reported_never_delivered_c_sd_2() {
    let seed = std::env::var("ABHYASA_DAMAGE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(42u64);
    let sweep = std::env::var("ABHYASA_DAMAGE_SWEEP").is_ok_and(|v| v == "1");
    let dir = tempfile::tempdir().unwrap();
    let golden = dir.path().join("spool.redb");
    let alice = {
        let id = agent("alice");
        Sealer::new(id.clone(), generate_identity(&id).unwrap(), 1 << 20)
    };
    let mut sent = BTreeMap::new();
    {
        let mut spool = Spool::open(&golden, limits()).unwrap();
        for chunk in (0..FRAMES).collect::<Vec<_>>().chunks(4) {
            let frames: Vec<Sealed> = chunk.iter().map(|&i| frame(&alice, i)).collect();
            for f in &frames {
                sent.insert(f.key(), f.inner.clone());
            }
            let r = spool.offer(T, &agent("alice"), frames, |_| true).unwrap();
            assert!(r.refused.is_empty());
        }
    }
    let len = std::fs::metadata(&golden).unwrap().len();
    let mut rng = Rng(seed);
    let mut tally: BTreeMap<&str, [usize; 4]> = BTreeMap::new();
    let mut bad = Vec::new();
    let verbose = std::env::var("ABHYASA_DAMAGE_VERBOSE").is_ok();
    for fault in faults(len, &mut rng, sweep) {
        let path = dir.path().join("damaged.redb");
        std::fs::copy(&golden, &path).unwrap();
        fault.apply(&path);
        let out = reopen(&path, &sent);
        let slot = match &out {
            Outcome::Intact => 0,
            Outcome::Reported(n) => {
                if verbose {
                    eprintln!("{fault:?}: {n} frames reported damaged");
                }
                1
            }
            Outcome::Refused(e) => {
                if verbose {
                    eprintln!("{fault:?}: refused: {e}");
                }
                2
            }
            Outcome::Wrong(w) => {
                bad.push(format!("{fault:?} (seed {seed}): {w}"));
                3
            }
        };
        tally.entry(fault.class()).or_default()[slot] += 1;
        std::fs::remove_file(&path).unwrap();
    }
    eprintln!(
        "spool, {len} bytes, seed {seed}{}",
        if sweep { ", sweep" } else { "" }
    );
    eprintln!("  fault class          intact reported refused wrong");
    for (class, [i, r, f, w]) in &tally {
        eprintln!("  {class:<20} {i:>6} {r:>8} {f:>7} {w:>5}");
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

// C-SD-4: an entry whose bytes changed is moved aside at open, counted and
// named; the other frames are served; the next open finds it still aside;
// the origin's retry of the same frame is held again.
#[test]
fn a_damaged_entry_is_moved_aside_and_named_c_sd_4() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spool.redb");
    let alice = {
        let id = agent("alice");
        Sealer::new(id.clone(), generate_identity(&id).unwrap(), 1 << 20)
    };
    let frames: Vec<Sealed> = (0..3).map(|i| frame(&alice, i)).collect();
    let victim = frames[1].key();
    {
        let mut spool = Spool::open(&path, limits()).unwrap();
        spool.offer(T, &agent("alice"), frames, |_| true).unwrap();
    }
    // Flip one bit inside the second frame's payload text, where only the
    // entry's checksum can tell.
    let mut b = std::fs::read(&path).unwrap();
    let needle = b"scope-1";
    let at = b
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("the frame's payload is in the file");
    b[at + 6] ^= 0x02; // "scope-1" -> "scope-3"
    std::fs::write(&path, &b).unwrap();
    let spool = Spool::open(&path, limits()).unwrap();
    assert_eq!(spool.damaged().len(), 1);
    let d = &spool.damaged()[0];
    assert!(d.detail.contains("checksum"), "{d:?}");
    let (origin, destination, key) = d.as_read.clone().expect("envelope still reads");
    assert_eq!(
        (origin.as_str(), destination.as_str(), key),
        ("alice", "edge", victim)
    );
    assert_eq!(spool.len(), 2);
    assert!(!spool.contains(&victim));
    assert_eq!(spool.damaged_total(), 1);
    drop(spool);
    let mut spool = Spool::open(&path, limits()).unwrap();
    assert!(spool.damaged().is_empty(), "moved aside once");
    assert_eq!(spool.damaged_total(), 1);
    assert_eq!(spool.len(), 2);
    // The drop is not silent for custody: the relay never acks, so the
    // origin still holds the obligation and retries it until its deadline
    // (then escalates). The retry is spooled again, not taken for a copy
    // of the frame moved aside.
    spool
        .offer(T, &agent("alice"), vec![frame(&alice, 1)], |_| true)
        .unwrap();
    assert!(spool.contains(&victim), "the origin's retry is held again");
    assert_eq!(spool.len(), 3);
}
