//! Issue 10 regressions: payload numbers that used to break their own
//! round trip (and, once pending, stop the whole store from opening) now
//! survive every store; a store refuses to write a row it could not read
//! back; a corrupt row is named, listed and quarantined without losing the
//! rows around it.
#![allow(missing_docs, clippy::unwrap_used)]

use abhyasa_testkit::store_world as common;
mod sled_reopen;

use abhyasa_core::custody::{Custodian, Record};
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::store::{Store, StoreError};
use abhyasa_core::{Obligation, SafeEffect};
use abhyasa_store::{Repair, StoreOptions};
use common::*;
use serde_json::{json, Value};
use sled_reopen::reopen_sled;

/// The payloads of issue 10 §1: Phala deltas that failed their digest,
/// floats serde_json used to misread, and integral doubles >= 2^53 whose
/// canonical form is an integer beyond the safe range.
fn issue_payloads() -> Vec<Value> {
    let mut v: Vec<Value> = [
        -0.9625043415580151,
        -0.9301445764253811,
        -0.42289705138250133,
        -0.019825152507417898,
    ]
    .iter()
    .map(|d| json!({"weight_delta": d, "weight_key": "w"}))
    .collect();
    for x in [
        9007199254740991.0,
        123456789012345680000.0,
        1e16,
        9007199254740992.0,
        -1e16,
    ] {
        v.push(json!({"weight_delta": -0.5, "weight_key": "w", "ttl": x}));
    }
    v
}

fn obligations() -> Vec<Obligation> {
    issue_payloads()
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            Obligation::builder()
                .id(format!("num-{i}"))
                .kind("phala.belief_update")
                .target("receiver")
                .payload(p)
                .deadline_seconds(DEADLINE_SECONDS)
                .max_retries(MAX_RETRIES)
                .created_at(EPOCH)
                .build()
                .unwrap()
        })
        .collect()
}

fn opened(obs: &[Obligation]) -> Vec<Record> {
    let mut c = Custodian::new(custodian_config(), PolarityRegistry::standard());
    let mut out = Vec::new();
    for ob in obs {
        c.offer(EPOCH, ob.clone()).unwrap();
    }
    while let Some(b) = c.poll_records() {
        c.handle_committed(b.token());
        out.extend(b.records);
    }
    out
}

// C-T-5: the issue's numbers, pending in every store, survive a restart
// with the same digest and payload; before the fix a redb or sled reopen
// failed with `Corrupt` for the whole store.
#[test]
fn c_t_5_issue_numbers_survive_every_store() {
    let obs = obligations();
    let records = opened(&obs);
    for kind in ALL {
        let mut b = backend(kind);
        let _durable = b.commit(EPOCH, &[&records]).unwrap();
        b.restart();
        let state = b.load();
        assert_eq!(state.custodian.pending.len(), obs.len(), "{kind:?}");
        for ob in &obs {
            let p = &state.custodian.pending[ob.id()];
            assert_eq!(p.obligation.digest(), ob.digest(), "{kind:?} {}", ob.id());
            assert_eq!(p.obligation, *ob, "{kind:?}");
            assert_eq!(
                p.obligation.payload().canonical_json(),
                ob.payload().canonical_json()
            );
        }
    }
}

// A store never commits a row it cannot read back: a pending record whose
// fail-safe magnitude is NaN encodes, but does not read back equal, so the
// whole commit is refused with `Unwritable` and nothing is written.
#[test]
fn a_row_that_would_not_read_back_is_refused_whole() {
    let obs = obligations();
    let mut records = opened(&obs[..2]);
    let Record::CustodyOpened { pending, .. } = &mut records[1] else {
        panic!("expected an open, got {:?}", records[1]);
    };
    pending.safe.effect = SafeEffect::DownWeight {
        magnitude: f64::NAN,
    };
    for kind in DISK {
        let mut b = backend(kind);
        let e = b.commit(EPOCH, &[&records]).unwrap_err();
        assert!(
            matches!(&e, StoreError::Unwritable { table: "custody_pending", key, .. } if key == "num-1"),
            "{kind:?}: {e}"
        );
        b.restart();
        assert!(b.load().custodian.pending.is_empty(), "{kind:?}");
    }
}

fn inject(kind: Kind, path: &std::path::Path, table: &str, key: &[u8], value: &[u8]) {
    match kind {
        Kind::Redb => {
            let db = redb::Database::open(path).unwrap();
            let def: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new(table);
            let w = db.begin_write().unwrap();
            w.open_table(def).unwrap().insert(key, value).unwrap();
            w.commit().unwrap();
        }
        Kind::Sled => {
            let db = reopen_sled(path);
            db.open_tree(table).unwrap().insert(key, value).unwrap();
            db.flush().unwrap();
        }
        Kind::Log => log_inject(path, table, key, Some(value)),
        Kind::Fjall => fjall_inject(path, table, key, Some(value)),
        Kind::Sim => unreachable!(),
    }
}

fn open_repair(kind: Kind, path: &std::path::Path) -> Box<dyn Repair> {
    kind.store_kind()
        .open_for_repair(path, &StoreOptions::default())
        .unwrap()
}

// A corrupt row fails `load` naming its table and key (never silently);
// `check` lists it, `quarantine` moves it aside verbatim and every other
// row survives; `quarantined` lists what was moved.
#[test]
fn a_corrupt_row_is_named_then_quarantined_without_losing_the_rest() {
    let obs = obligations();
    let records = opened(&obs);
    for kind in DISK {
        let dir = tempfile::tempdir().unwrap();
        let path = disk_path(kind, dir.path());
        {
            let mut s = open_disk(kind, &path).unwrap();
            let _durable = s.commit(EPOCH, &[&records]).unwrap();
        }
        let garbage = b"\xff\xfenot a pending row";
        inject(kind, &path, "custody_pending", b"broken-1", garbage);
        let s = open_disk(kind, &path).unwrap();
        match s.load() {
            Err(StoreError::Corrupt { table, key, .. }) => {
                assert_eq!(
                    (table, key.as_str()),
                    ("custody_pending", "broken-1"),
                    "{kind:?}"
                )
            }
            other => panic!("{kind:?}: expected Corrupt, got {other:?}"),
        }
        drop(s);
        let mut r = open_repair(kind, &path);
        let bad = r.check().unwrap();
        assert_eq!(bad.len(), 1, "{kind:?}: {bad:?}");
        assert_eq!(
            (bad[0].table, bad[0].key.as_str()),
            ("custody_pending", "broken-1")
        );
        let moved = r.quarantine(EPOCH).unwrap();
        assert_eq!(moved.len(), 1);
        assert_eq!(moved[0].raw_value, garbage.to_vec());
        assert!(r.check().unwrap().is_empty(), "{kind:?}");
        assert_eq!(r.quarantined().unwrap(), moved);
        drop(r);
        let s = open_disk(kind, &path).unwrap();
        let state = s.load().unwrap();
        assert_eq!(
            state.custodian.pending.len(),
            obs.len(),
            "{kind:?}: rows lost"
        );
        for ob in &obs {
            assert_eq!(state.custodian.pending[ob.id()].obligation, *ob);
        }
    }
}
