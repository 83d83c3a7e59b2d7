//! Storage-suite cases on `PgStore` that the crash enumeration does not
//! reach: refused offers write nothing, reads page across the scan page
//! size, compaction, and the inbox derived from stored records.
#![allow(missing_docs, clippy::unwrap_used)]

use abhyasa_testkit::pg_backend as backend;
use abhyasa_testkit::pg_cluster as cluster;
use abhyasa_testkit::pg_or_skip;
use abhyasa_testkit::store_world as common;

use std::time::Duration;

use abhyasa_core::custody::{Custodian, Record};
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::store::{EventId, Store, StoreError};
use abhyasa_core::Obligation;
use abhyasa_pg::PgStore;
use backend::test_options;
use common::*;
use serde_json::json;

fn opened(ob: &Obligation) -> Vec<Record> {
    let mut c = Custodian::new(custodian_config(), PolarityRegistry::standard());
    c.offer(EPOCH, ob.clone()).unwrap();
    c.poll_records().unwrap().records
}

fn open(name: &str) -> PgStore {
    let url = cluster::url().unwrap();
    PgStore::open(url, &cluster::partition(name), &test_options(name)).unwrap()
}

// Same id, other digest: the whole commit is refused and nothing of it,
// not even the records before the conflict, is written.
#[test]
fn conflicting_offer_is_refused_and_nothing_written() {
    let _ = pg_or_skip!();
    let mut s = open("conflict");
    let _ = s.commit(EPOCH, &[&opened(&phala("a", -0.3))]).unwrap();
    let other = Obligation::builder()
        .id("a")
        .kind(abhyasa_core::polarity::PHALA_KIND)
        .target("receiver")
        .payload(json!({"weight_delta": -0.9, "weight_key": "w-a"}))
        .deadline_seconds(DEADLINE_SECONDS)
        .max_retries(MAX_RETRIES)
        .created_at(EPOCH)
        .build()
        .unwrap();
    let mut batch = opened(&phala("fresh", -0.3));
    batch.extend(opened(&other));
    match s.commit(EPOCH, &[&batch]) {
        Err(StoreError::OfferConflict { obligation_id, .. }) => {
            assert_eq!(obligation_id.as_str(), "a")
        }
        other => panic!("conflict accepted: {other:?}"),
    }
    let st = s.load().unwrap();
    assert_eq!(
        st.custodian.pending.len(),
        1,
        "part of a refused commit landed"
    );
    assert_eq!(st.next_event, EventId(1));
    // The re-offer of the same content is a no-op.
    let _ = s.commit(EPOCH, &[&opened(&phala("a", -0.3))]).unwrap();
    assert_eq!(s.load().unwrap().custodian.pending.len(), 1);
}

// Loads and the event log read in pages (4096 rows per round trip): more
// rows than one page come back complete and in order.
#[test]
fn reads_page_across_the_scan_page_size() {
    let _ = pg_or_skip!();
    let mut s = open("paging");
    let n = 4100;
    let mut batch = Vec::new();
    for i in 0..n {
        batch.extend(opened(&phala(&format!("p{i:05}"), -0.1)));
    }
    let c = s.commit(EPOCH, &[&batch]).unwrap();
    assert_eq!(c.end_event, EventId(n as u64));
    let st = s.load().unwrap();
    assert_eq!(st.custodian.pending.len(), n);
    let all = s.events(EventId(0), 10_000).unwrap();
    assert_eq!(all.len(), n);
    assert!(all.windows(2).all(|w| w[0].id.0 + 1 == w[1].id.0));
    let tail = s.events(EventId(4090), 5).unwrap();
    let ids: Vec<u64> = tail.iter().map(|e| e.id.0).collect();
    assert_eq!(ids, [4090, 4091, 4092, 4093, 4094]);
}

// Compaction drops terminal records past retention (in a fenced write)
// and keeps the rest; the inbox is derived from what is stored.
#[test]
fn compaction_and_inbox_on_postgres() {
    let _ = pg_or_skip!();
    let mut s = open("compact");
    let ob = phala("esc", -0.3);
    let mut c = Custodian::new(custodian_config(), PolarityRegistry::standard());
    c.offer(EPOCH, ob.clone()).unwrap();
    c.handle_timeout(ob.deadline_at());
    let mut records = Vec::new();
    while let Some(b) = c.poll_records() {
        c.handle_committed(b.token());
        records.extend(b.records);
    }
    let _ = s.commit(EPOCH, &[&records]).unwrap();
    let _ = s.commit(EPOCH, &[&opened(&phala("live", -0.3))]).unwrap();
    let inbox = s.inbox(EPOCH).unwrap();
    assert_eq!((inbox.pending, inbox.escalated), (1, 1));
    let retention = Duration::from_secs(3600);
    let late = ob.deadline_at().saturating_add(retention * 2);
    let out = s.compact(late, retention).unwrap();
    assert_eq!((out.terminal, out.escalations), (1, 1));
    let st = s.load().unwrap();
    assert!(st.custodian.terminal.is_empty());
    assert_eq!(st.custodian.pending.len(), 1, "pending custody compacted");
}
