//! Paged, indexed reads (issue 11 §5, C-ND-5): `list` by state,
//! `escalations`, `decisions` and the inbox counters answer from indexes
//! kept in the records' own transaction, page by page, on every backend;
//! they equal what the records say after restarts, compaction and the
//! migration of a version-1 database.
#![allow(missing_docs, clippy::unwrap_used)]

use abhyasa_testkit::store_world as common;
mod sled_reopen;

use std::time::Duration;

use abhyasa_core::custody::{AckBinding, Custodian, CustodyProfile, Record};
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::store::{ListState, Store, DEFAULT_RETENTION};
use abhyasa_core::{AckStatus, CustodyAck, DeclinePolicy, DeclineReason, Obligation, Timestamp};
use common::*;
use sled_reopen::reopen_sled;

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

fn ack(ob: &Obligation, status: AckStatus, t: Timestamp) -> CustodyAck {
    let mut a = CustodyAck::new(
        ob.id().clone(),
        agent("receiver"),
        status,
        t,
        Some(ob.digest()),
    );
    if status == AckStatus::Declined {
        a.reason = Some(DeclineReason::Policy);
    }
    a
}

/// 30 obligations: 6 applied, 6 declined (surfaced: open decisions), 6
/// deferred, 6 left pending, 6 best-effort; then the still-pending ones
/// (deferred and silent) escalate at their deadline when `escalate`.
fn populate(b: &mut Box<dyn Backend>, escalate: bool) -> Vec<Obligation> {
    let mut cfg = custodian_config();
    cfg.ack_binding = AckBinding::RequireDigest;
    cfg.default_profile = CustodyProfile {
        backoff: backoff(),
        decline_policy: DeclinePolicy::Surface,
    };
    let mut c = Custodian::new(cfg, PolarityRegistry::standard());
    let mut obs = Vec::new();
    for i in 0..30 {
        // Reinforcing Phala updates travel best-effort (AC-1).
        let delta = if i % 5 == 4 { 0.2 } else { -0.1 };
        let ob = phala(&format!("ob-{i:02}"), delta);
        c.offer(EPOCH, ob.clone()).unwrap();
        obs.push(ob);
    }
    let from = agent("receiver");
    for (i, ob) in obs.iter().enumerate() {
        let status = match i % 5 {
            0 => AckStatus::Applied,
            1 => AckStatus::Declined,
            2 => AckStatus::Deferred,
            _ => continue,
        };
        c.handle_ack(at(1), &from, &ack(ob, status, at(1)));
    }
    let _ = b.commit(at(1), &[&drain(&mut c)]).unwrap();
    if escalate {
        c.handle_timeout(obs[0].deadline_at());
        let _ = b.commit(obs[0].deadline_at(), &[&drain(&mut c)]).unwrap();
    }
    obs
}

fn restart(b: &mut Box<dyn Backend>) {
    if b.kind() != Kind::Sim {
        b.restart();
    }
}

// C-ND-5 / issue 11 §5: every paged read equals the fold of the records on
// SimStore, sled and redb, before and after escalation, restart and
// compaction; a page holds at most `limit` items and its cursor resumes
// exactly after its last one.
#[test]
fn paged_reads_match_the_records_on_every_backend_c_nd_5() {
    for kind in ALL {
        let mut b = backend(kind);
        let obs = populate(&mut b, false);
        let label = format!("{kind:?}");
        restart(&mut b);
        assert_indexes_match(b.store(), at(2), &label);
        // Past the deadline the deferred transfers count as overdue.
        let late = obs[0].deadline_at();
        assert_indexes_match(b.store(), late, &label);
        assert_eq!(
            b.store().inbox(late).unwrap().deferred_overdue,
            6,
            "{label}"
        );

        let inbox = b.store().inbox(at(2)).unwrap();
        assert_eq!(
            (inbox.pending, inbox.decision_required, inbox.escalated),
            (12, 6, 0),
            "{label}"
        );
        // One page of three pending, then the next page from its cursor.
        let p1 = b.store().list(Some(ListState::Pending), None, 3).unwrap();
        let ids: Vec<&str> = p1.items.iter().map(|r| r.obligation_id.as_str()).collect();
        assert_eq!(ids, ["ob-02", "ob-03", "ob-07"], "{label}");
        assert_eq!(
            p1.next.as_ref().map(|c| c.as_str()),
            Some("ob-07"),
            "{label}"
        );
        let p2 = b
            .store()
            .list(Some(ListState::Pending), p1.next.as_ref(), 3)
            .unwrap();
        let ids: Vec<&str> = p2.items.iter().map(|r| r.obligation_id.as_str()).collect();
        assert_eq!(ids, ["ob-08", "ob-12", "ob-13"], "{label}");
        let applied = b.store().list(Some(ListState::Applied), None, 100).unwrap();
        assert_eq!(applied.items.len(), 6, "{label}");
        assert_eq!(applied.next, None, "{label}: the last page has no cursor");

        // Escalate what is left; the escalations page in commit order.
        let mut b2 = backend(kind);
        let _ = populate(&mut b2, true);
        restart(&mut b2);
        let late = obs[0].deadline_at();
        assert_indexes_match(b2.store(), late, &label);
        let inbox = b2.store().inbox(late).unwrap();
        assert_eq!((inbox.pending, inbox.escalated), (0, 12), "{label}");
        let page = b2.store().escalations(None, 5).unwrap();
        assert_eq!(page.items.len(), 5, "{label}");
        assert_eq!(page.next, Some(page.items[4].position), "{label}");

        // Compaction past retention drops the terminal summaries and their
        // escalations from the indexes as from the records.
        let past = late
            .saturating_add(DEFAULT_RETENTION)
            .saturating_add(Duration::from_secs(1));
        let _ = b2.store().compact(past, DEFAULT_RETENTION).unwrap();
        restart(&mut b2);
        assert_indexes_match(b2.store(), past, &label);
        let inbox = b2.store().inbox(past).unwrap();
        assert_eq!(inbox.escalated, 0, "{label}");
        assert!(
            b2.store().list(None, None, 10).unwrap().items.is_empty(),
            "{label}"
        );
    }
}

// A page limit of 0 or beyond MAX_PAGE is clamped: a caller can never make
// a store materialise an unbounded answer (C-ND-5).
#[test]
fn page_limits_are_clamped_c_nd_5() {
    for kind in ALL {
        let mut b = backend(kind);
        let _ = populate(&mut b, false);
        let one = b.store().list(None, None, 0).unwrap();
        assert_eq!(one.items.len(), 1, "{kind:?}");
        let all = b.store().list(None, None, usize::MAX).unwrap();
        assert_eq!(all.items.len(), 30, "{kind:?}");
    }
}

/// Turns a format-2 database back into what format 1 wrote: no index
/// rows, no counters, version 1.
fn downgrade_to_v1(kind: Kind, path: &std::path::Path) {
    const COUNTERS: [&str; 5] = [
        "count.pending",
        "count.decisions",
        "count.escalated",
        "count.late_applied",
        "count.outcome_unknown",
    ];
    let v1 = 1u32.to_be_bytes();
    match kind {
        Kind::Sled => {
            let db = reopen_sled(path);
            db.drop_tree("index").unwrap();
            let meta = db.open_tree("meta").unwrap();
            for c in COUNTERS {
                meta.remove(c).unwrap();
            }
            meta.insert("format_version", &v1).unwrap();
            db.flush().unwrap();
        }
        _ => {
            let db = redb::Database::create(path).unwrap();
            let tx = db.begin_write().unwrap();
            {
                let index: redb::TableDefinition<&[u8], &[u8]> =
                    redb::TableDefinition::new("index");
                tx.delete_table(index).unwrap();
                let def: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("meta");
                let mut t = tx.open_table(def).unwrap();
                for c in COUNTERS {
                    t.remove(c.as_bytes()).unwrap();
                }
                t.insert(&b"format_version"[..], &v1[..]).unwrap();
            }
            tx.commit().unwrap();
        }
    }
}

// An old (format 1) database is migrated on open: its indexes and counters
// are derived from its records, and it reports format 2.
#[test]
fn version_1_database_is_migrated_on_open_c_nd_5() {
    for kind in LEGACY {
        let dir = tempfile::tempdir().unwrap();
        let path = disk_path(kind, dir.path());
        {
            let mut b: Box<dyn Backend> = Box::new(PathBackend::open(kind, &path));
            let _ = populate(&mut b, false);
        }
        downgrade_to_v1(kind, &path);
        let s = open_disk(kind, &path).unwrap();
        assert_eq!(
            s.format_version(),
            abhyasa_store::FORMAT_VERSION,
            "{kind:?}"
        );
        assert_eq!(s.inbox(at(2)).unwrap().pending, 12, "{kind:?}");
        assert_indexes_match(s.as_ref(), at(2), &format!("{kind:?} migrated"));
    }
}

/// A disk store at a given path, for tests that edit the file in between.
struct PathBackend {
    kind: Kind,
    store: Box<dyn Store>,
}

impl PathBackend {
    fn open(kind: Kind, path: &std::path::Path) -> Self {
        Self {
            kind,
            store: open_disk(kind, path).unwrap(),
        }
    }
}

impl Backend for PathBackend {
    fn kind(&self) -> Kind {
        self.kind
    }
    fn store(&mut self) -> &mut dyn Store {
        self.store.as_mut()
    }
    fn commit(
        &mut self,
        now: Timestamp,
        batches: &[&[Record]],
    ) -> Result<abhyasa_core::store::Committed, abhyasa_core::store::StoreError> {
        self.store.commit(now, batches)
    }
    fn arm(&mut self, _k: u64, _timing: abhyasa_core::store::CrashTiming) {
        unreachable!("no crash points here")
    }
    fn restart(&mut self) {}
    fn commits(&self) -> u64 {
        0
    }
}

/// Overwrites row `key` of `table` with bytes that do not decode.
fn damage(kind: Kind, path: &std::path::Path, table: &str, key: &str) {
    let garbage = [0xff, 0xff, 0x01];
    match kind {
        Kind::Log => log_inject(path, table, key.as_bytes(), Some(&garbage)),
        Kind::Fjall => fjall_inject(path, table, key.as_bytes(), Some(&garbage)),
        Kind::Sled => {
            let db = reopen_sled(path);
            db.open_tree(table)
                .unwrap()
                .insert(key, &garbage[..])
                .unwrap();
            db.flush().unwrap();
        }
        _ => {
            let db = redb::Database::create(path).unwrap();
            let tx = db.begin_write().unwrap();
            {
                let def: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new(table);
                tx.open_table(def)
                    .unwrap()
                    .insert(key.as_bytes(), &garbage[..])
                    .unwrap();
            }
            tx.commit().unwrap();
        }
    }
}

// A quarantine moves damaged rows aside and derives the indexes again, so
// the counters and listings stop counting what is no longer stored
// (C-ND-5: index = records after a repair too).
#[test]
fn quarantine_rebuilds_the_indexes_c_nd_5() {
    for kind in DISK {
        let dir = tempfile::tempdir().unwrap();
        let path = disk_path(kind, dir.path());
        {
            let mut b: Box<dyn Backend> = Box::new(PathBackend::open(kind, &path));
            let _ = populate(&mut b, false);
        }
        damage(kind, &path, "custody_pending", "ob-02");
        {
            let mut r = kind
                .store_kind()
                .open_for_repair(&path, &abhyasa_store::StoreOptions::default())
                .unwrap();
            let moved = r.quarantine(at(3)).unwrap();
            assert_eq!(moved.len(), 1, "{kind:?}");
        }
        let s = open_disk(kind, &path).unwrap();
        assert_eq!(s.inbox(at(2)).unwrap().pending, 11, "{kind:?}");
        assert_indexes_match(s.as_ref(), at(2), &format!("{kind:?} after quarantine"));
    }
}

/// Splits every event block of the database at `path` into the one-event
/// rows (8-byte id keys, `(at, event)` values) that builds before blocks
/// wrote, as an old database holds them.
fn split_event_blocks(kind: Kind, path: &std::path::Path) {
    use abhyasa_core::store::LogEvent;
    let split = |k: &[u8], v: &[u8]| -> Vec<([u8; 8], Vec<u8>)> {
        assert_eq!(k.len(), 9, "a block key");
        let (at, first, events): (i64, u64, Vec<LogEvent>) = postcard::from_bytes(v).unwrap();
        (first..)
            .zip(events)
            .map(|(id, e)| (id.to_be_bytes(), postcard::to_allocvec(&(at, e)).unwrap()))
            .collect()
    };
    match kind {
        Kind::Sled => {
            let db = reopen_sled(path);
            let t = db.open_tree("events").unwrap();
            let rows: Vec<_> = t.iter().map(|r| r.unwrap()).collect();
            for (k, v) in rows {
                t.remove(&k).unwrap();
                for (id, row) in split(&k, &v) {
                    t.insert(id, row).unwrap();
                }
            }
            db.flush().unwrap();
        }
        _ => {
            let db = redb::Database::create(path).unwrap();
            let tx = db.begin_write().unwrap();
            {
                let def: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("events");
                let mut t = tx.open_table(def).unwrap();
                let rows: Vec<(Vec<u8>, Vec<u8>)> = redb::ReadableTable::iter(&t)
                    .unwrap()
                    .map(|r| {
                        let (k, v) = r.unwrap();
                        (k.value().to_vec(), v.value().to_vec())
                    })
                    .collect();
                for (k, v) in rows {
                    t.remove(k.as_slice()).unwrap();
                    for (id, row) in split(&k, &v) {
                        t.insert(&id[..], row.as_slice()).unwrap();
                    }
                }
            }
            tx.commit().unwrap();
        }
    }
}

// A commit writes its events as one block (issue 14); the one-event rows
// a database written before blocks holds still read, in id order with the
// blocks after them, from any position, and compact with them.
#[test]
fn event_rows_from_before_blocks_read_and_compact_with_blocks() {
    use abhyasa_core::store::{EventId, LogEvent};
    for kind in LEGACY {
        let dir = tempfile::tempdir().unwrap();
        let path = disk_path(kind, dir.path());
        let ob = Obligation::builder()
            .id("ev-1")
            .kind("anumati.consent")
            .target("receiver")
            .payload(serde_json::json!({"decision": "revoke", "scope": "s"}))
            .deadline_seconds(60)
            .max_retries(20)
            .created_at(at(0))
            .build()
            .unwrap();
        let mut c = Custodian::new(custodian_config(), PolarityRegistry::standard());
        c.offer(at(0), ob.clone()).unwrap();
        let opened = c.poll_records().unwrap().records;
        let attempt = |n| Record::AttemptMade {
            obligation_id: ob.id().clone(),
            attempts: n,
            next_at: at(5),
        };
        {
            let mut s = open_disk(kind, &path).unwrap();
            let _ = s.commit(at(0), &[&opened, &[attempt(2)]]).unwrap();
        }
        split_event_blocks(kind, &path);
        let mut s = open_disk(kind, &path).unwrap();
        let c2 = s.commit(at(1), &[&[attempt(3), attempt(4)]]).unwrap();
        assert_eq!(c2.first_event, EventId(2), "{kind:?}");
        let all = s.events(EventId(0), 100).unwrap();
        assert_eq!(
            all.iter().map(|e| (e.id.0, e.at)).collect::<Vec<_>>(),
            vec![(0, at(0)), (1, at(0)), (2, at(1)), (3, at(1))],
            "{kind:?}"
        );
        assert!(matches!(all[0].event, LogEvent::CustodyOpened { .. }));
        assert!(matches!(
            all[3].event,
            LogEvent::AttemptMade { attempts: 4, .. }
        ));
        // From inside the old rows into a block, and from inside a block.
        let ids = |from, n| {
            s.events(EventId(from), n)
                .unwrap()
                .iter()
                .map(|e| e.id.0)
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(1, 2), vec![1, 2], "{kind:?}");
        assert_eq!(ids(3, 9), vec![3], "{kind:?}");
        assert_eq!(ids(4, 9), Vec::<u64>::new(), "{kind:?}");
        let far = at(1)
            .saturating_add(abhyasa_core::store::DEFAULT_RETENTION)
            .saturating_add(Duration::from_secs(120));
        let removed = s
            .compact(far, abhyasa_core::store::DEFAULT_RETENTION)
            .unwrap();
        assert_eq!(removed.events, 4, "{kind:?}: every event counted once");
        assert!(s.events(EventId(0), 100).unwrap().is_empty(), "{kind:?}");
    }
}
