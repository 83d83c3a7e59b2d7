//! The log store under random damage to synced data (C-SD-1..3), and its
//! decoders under arbitrary bytes (C-SD-5): the property tests beside the
//! fault-by-fault unit tests in `log_store.rs`.
//!
//! A store acknowledges `N` commits, each opening one obligation; one
//! fault is then injected anywhere in its files (a flipped bit, a zeroed
//! or copied 512-byte sector, a truncation). Whatever it hits, the open
//! either reads every commit back exactly or refuses with
//! `StoreError::Damaged`; a check changes no byte; every commit is read
//! back, or named, or was itself hit by the fault; after a repair the
//! store opens with exactly what the check read.
#![allow(missing_docs, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

use abhyasa_core::store::StoreError;
use abhyasa_core::Timestamp;
use abhyasa_store::{LogOptions, LogStore, Repair};
use proptest::prelude::*;

const N: usize = 30;

fn id(i: usize) -> String {
    format!("obl-{i:02}")
}

fn value(i: usize) -> Vec<u8> {
    vec![u8::try_from(i).unwrap(); 100]
}

fn options() -> LogOptions {
    LogOptions {
        checkpoint_bytes: 1 << 30,
        checkpoint_chunk_bytes: 1 << 20,
        preallocate_bytes: 8192,
    }
}

/// A store's files, and each commit's obligation with its record's bytes
/// in `log-0`.
type Template = (
    BTreeMap<String, Vec<u8>>,
    Vec<(String, std::ops::Range<usize>)>,
);

/// The files of a store that acknowledged `N` commits, built once.
fn template() -> &'static Template {
    static T: OnceLock<Template> = OnceLock::new();
    T.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let mut s = LogStore::open_with(dir.path(), options()).unwrap();
        for i in 0..N {
            s.plant_raw("custody_pending", id(i).as_bytes(), Some(&value(i)))
                .unwrap();
        }
        drop(s);
        let files = files(dir.path());
        // The records, as the format documents them: a 64-byte header,
        // then `len | pcrc | hcrc | payload | mark` each.
        let log = &files["log-0"];
        let mut at = 64;
        let mut recs = Vec::new();
        while let Some(h) = log.get(at..at + 4) {
            let len = u32::from_le_bytes(h.try_into().unwrap()) as usize;
            let end = at + 12 + len + 4;
            let payload = &log[at + 12..at + 12 + len];
            if let Some(i) = (0..N).find(|&i| payload.windows(6).any(|w| w == id(i).as_bytes())) {
                recs.push((id(i), at..end));
            }
            at = end;
            if recs.len() == N {
                break;
            }
        }
        assert_eq!(recs.len(), N);
        (files, recs)
    })
}

fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| {
            (
                e.file_name().into_string().unwrap(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

#[derive(Clone, Debug)]
enum Fault {
    Flip { at: usize, bit: u8 },
    Zero { sector: usize },
    Copy { from: usize, to: usize },
    Truncate { len: usize },
}

fn fault() -> impl Strategy<Value = Fault> {
    let len = template().0["log-0"].len();
    prop_oneof![
        (0..len, 0u8..8).prop_map(|(at, bit)| Fault::Flip { at, bit }),
        (0..len / 512).prop_map(|sector| Fault::Zero { sector }),
        (0..len / 512, 0..len - 512).prop_map(|(from, to)| Fault::Copy { from, to }),
        (0..len).prop_map(|len| Fault::Truncate { len }),
    ]
}

/// Injects `f` into `log`; the bytes it hit.
fn inject(f: &Fault, log: &mut Vec<u8>) -> std::ops::Range<usize> {
    match *f {
        Fault::Flip { at, bit } => {
            log[at] ^= 1 << bit;
            at..at + 1
        }
        Fault::Zero { sector } => {
            log[sector * 512..(sector + 1) * 512].fill(0);
            sector * 512..(sector + 1) * 512
        }
        Fault::Copy { from, to } => {
            let copy = log[from * 512..(from + 1) * 512].to_vec();
            let hit = to..to + 512;
            if log[hit.clone()] == copy[..] {
                return 0..0;
            }
            log[hit.clone()].copy_from_slice(&copy);
            hit
        }
        Fault::Truncate { len } => {
            let hit = len..log.len();
            log.truncate(len);
            hit
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    // C-SD-1, C-SD-2, C-SD-3 over random faults.
    #[test]
    fn no_acknowledged_commit_is_silently_lost(f in fault()) {
        let (clean, recs) = template();
        let dir = tempfile::tempdir().unwrap();
        let mut log = clean["log-0"].clone();
        let hit = inject(&f, &mut log);
        for (name, b) in clean {
            std::fs::write(dir.path().join(name), if name == "log-0" { &log } else { b }).unwrap();
        }
        let before = files(dir.path());
        match LogStore::open_with(dir.path(), options()) {
            Ok(s) => {
                // Only a fault that hit no acknowledged byte opens: every
                // commit reads back exactly.
                for (i, (o, _)) in recs.iter().enumerate() {
                    let got = s.read_raw("custody_pending", o.as_bytes()).unwrap();
                    prop_assert_eq!(got, Some(value(i)), "{:?}: {}", f, o);
                }
                drop(s);
                let check = LogStore::open_for_check(dir.path()).unwrap();
                prop_assert!(check.damage().is_empty(), "{:?}", check.damage());
                return Ok(());
            }
            Err(StoreError::Damaged { file, .. }) => prop_assert_eq!(file, "log-0"),
            Err(e) => prop_assert!(false, "{f:?}: {e}"),
        }
        prop_assert_eq!(&files(dir.path()), &before, "the refused open wrote");
        let check = LogStore::open_for_check(dir.path()).unwrap();
        prop_assert_eq!(&files(dir.path()), &before, "the check wrote");
        let damage = check.damage();
        prop_assert!(!damage.is_empty());
        drop(check);
        let r = LogStore::repair(dir.path(), Timestamp::from_unix_seconds(1_700_000_000)).unwrap();
        prop_assert_eq!(&r.damage, &damage);
        let aside = r.saved_to.clone().unwrap();
        let mut data = before.clone();
        data.retain(|n, _| n.starts_with("log-") || n.starts_with("snap-"));
        prop_assert_eq!(&files(&aside), &data, "the copy aside is not verbatim");
        let s = LogStore::open_with(dir.path(), options()).unwrap();
        for (i, (o, rec)) in recs.iter().enumerate() {
            let got = s.read_raw("custody_pending", o.as_bytes()).unwrap();
            let kept = got.is_some();
            if let Some(v) = got {
                prop_assert_eq!(v, value(i), "{:?}: {} read back other bytes", f, o);
            }
            let named = damage.iter().any(|d| d.obligations.contains(o));
            prop_assert!(
                kept || named || (rec.start < hit.end && hit.start < rec.end),
                "{:?}: {} ({:?}) silently absent; damage {:?}", f, o, rec, damage
            );
            prop_assert!(kept || r.lost.contains(o) || !named, "{} named but not reported lost", o);
        }
    }

    // C-SD-5: the decoders never panic and report damage typed.
    #[test]
    fn the_decoders_take_any_bytes(b in proptest::collection::vec(any::<u8>(), 0..2048)) {
        prop_assert_eq!(abhyasa_store::fuzzing::log_store_decode(&b), Ok(()));
    }

    // C-SD-5: the same from a real log with a few bytes changed.
    #[test]
    fn the_decoders_take_any_damaged_log(
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
        cut in any::<usize>(),
    ) {
        let mut b = template().0["log-0"].clone();
        for (at, v) in edits {
            let n = b.len();
            b[at % n] = v;
        }
        b.truncate(cut % (b.len() + 1));
        prop_assert_eq!(abhyasa_store::fuzzing::log_store_decode(&b), Ok(()));
    }
}
