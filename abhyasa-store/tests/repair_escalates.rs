//! C-SD-4 on the log store: after a repair, custody the node can no longer
//! prove is never silently absent. Offers committed one per commit; one
//! commit is damaged after its pending row (the row is still whole, its
//! own CRC checks), another inside its pending row. The repair hands the
//! first back as custody it cannot prove — the next start escalates it
//! `store_damaged` with its fail-safe, through a committed close — and
//! lists the second as lost; every other offer is still pending.
#![allow(missing_docs, clippy::unwrap_used)]

use abhyasa_testkit::store_world as common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use abhyasa_core::custody::{Custodian, TerminalState};
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::store::Store;
use abhyasa_core::{EscalationCause, EscalationTrigger, GuardOutcome};
use abhyasa_store::{LogStore, StoreKind, StoreOptions};
use common::*;

const OFFERS: usize = 12;

fn id(i: usize) -> String {
    format!("ob-{i:02}")
}

fn log_file(dir: &Path) -> PathBuf {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("log-"))
        })
        .collect();
    logs.sort();
    logs.pop().expect("a log")
}

fn find(b: &[u8], what: &[u8], from: usize) -> usize {
    from + b[from..]
        .windows(what.len())
        .position(|w| w == what)
        .expect("bytes present")
}

#[test]
fn c_sd_4_a_repair_hands_unprovable_custody_to_a_store_damaged_escalation() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store.log");
    let mut c = Custodian::new(custodian_config(), PolarityRegistry::standard());
    {
        let mut s = LogStore::open(&dir).unwrap();
        for i in 0..OFFERS {
            c.offer(EPOCH, phala(&id(i), -0.3)).unwrap();
            let b = c.poll_records().unwrap();
            let _ = s.commit(EPOCH, &[&b.records]).unwrap();
            c.handle_committed(b.token());
        }
    }
    let file = log_file(&dir);
    let mut b = std::fs::read(&file).unwrap();
    // Commit 5: a bit flipped near its end (its events), past its pending
    // row. Commit 8: a bit flipped inside its pending row.
    let whole = find(&b, id(5).as_bytes(), 0);
    let next = find(&b, id(6).as_bytes(), whole);
    b[next - 40] ^= 0x10;
    let broken = find(&b, id(8).as_bytes(), 0);
    b[broken + 40] ^= 0x01;
    std::fs::write(&file, &b).unwrap();

    assert!(LogStore::open(&dir).is_err(), "damage refuses the open");
    let r = StoreKind::Log
        .repair(&dir, &StoreOptions::default(), EPOCH)
        .unwrap();
    assert_eq!(r.escalated, vec![id(5)], "{r:?}");
    assert_eq!(r.lost, vec![id(8)], "{r:?}");

    // The next start: the core escalates what the repair handed over.
    let now = EPOCH.saturating_add(Duration::from_secs(5));
    let mut s = LogStore::open(&dir).unwrap();
    let state = s.load().unwrap();
    assert!(state.custodian.damaged.contains(&oid(&id(5))));
    // Receiver rows may be gone with the damaged commits: the receiver
    // declines what it does not hold that was created before the repair.
    assert_eq!(state.receiver.damaged_before, Some(EPOCH));
    let mut c2 = Custodian::restore_owned(
        custodian_config(),
        PolarityRegistry::standard(),
        state.custodian,
    );
    let before = c2.principal().clone();
    c2.handle_timeout(now);
    let b = c2.poll_records().unwrap();
    let _ = s.commit(now, &[&b.records]).unwrap();
    c2.handle_committed(b.token());
    assert_eq!(c2.stats().escalated, 1);
    drop(s);

    // What the store holds after a second restart.
    let s = LogStore::open(&dir).unwrap();
    let state = s.load().unwrap();
    let t = &state.custodian.terminal[&oid(&id(5))];
    assert_eq!(t.state, TerminalState::Escalated);
    let e = state
        .custodian
        .escalations
        .iter()
        .find(|e| e.obligation_id == oid(&id(5)))
        .expect("a stored escalation")
        .clone();
    assert_eq!(e.cause, EscalationCause::StoreDamaged);
    assert_eq!(e.trigger, EscalationTrigger::StoreRepair);
    assert_eq!(e.guard, GuardOutcome::Applied);
    let c3 = Custodian::restore_owned(
        custodian_config(),
        PolarityRegistry::standard(),
        state.custodian,
    );
    let key = &e.safe_action.key;
    assert!(
        (before.weight(key) - c3.principal().weight(key) - 0.3).abs() < 1e-9,
        "the fail-safe is applied once: {} -> {}",
        before.weight(key),
        c3.principal().weight(key)
    );
    for i in (0..OFFERS).filter(|&i| i != 5 && i != 8) {
        assert!(c3.is_pending(&oid(&id(i))), "{} still pending", id(i));
    }
    assert!(c3.terminal(&oid(&id(8))).is_none() && !c3.is_pending(&oid(&id(8))));
    // A later event says so too.
    let events = s.events(abhyasa_core::store::EventId(0), 1000).unwrap();
    assert!(
        events
            .iter()
            .any(|e| format!("{:?}", e.event).contains("CustodyClosed")),
        "the close is in the event log"
    );
}

// C-SD-2: a redb database is a single file; a missing one is refused (its
// `.created` marker says it existed), never opened as a new, empty store.
#[test]
fn c_sd_2_a_missing_redb_file_is_refused_not_made_new() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("store.redb");
    {
        let mut s = abhyasa_store::RedbStore::open(&path).unwrap();
        let mut c = Custodian::new(custodian_config(), PolarityRegistry::standard());
        c.offer(EPOCH, phala("ob-1", -0.3)).unwrap();
        let b = c.poll_records().unwrap();
        let _ = s.commit(EPOCH, &[&b.records]).unwrap();
    }
    std::fs::remove_file(&path).unwrap();
    let err = abhyasa_store::RedbStore::open(&path).expect_err("refused");
    assert!(
        matches!(err, abhyasa_core::store::StoreError::Damaged { .. }),
        "{err}"
    );
    assert!(!path.exists(), "no new database was made");
    // Where none ever was, a store is created.
    let fresh = tmp.path().join("other.redb");
    assert!(abhyasa_store::RedbStore::open(&fresh).is_ok());
}
