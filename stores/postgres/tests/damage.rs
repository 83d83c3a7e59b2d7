//! Damage to a partition's rows behind the store's back (C-SD-2, C-SD-4
//! on PostgreSQL): a row deleted, a row's bytes with one bit flipped, one
//! table's rows deleted, every row of the partition deleted. The server
//! keeps its own pages whole, so the damage a `PgStore` can meet is rows
//! changed outside it; each must make the open or the load fail with
//! `StoreError::Corrupt` naming the table, never load without the row.
#![allow(missing_docs, clippy::unwrap_used)]

use abhyasa_testkit::pg_backend as backend;
use abhyasa_testkit::pg_cluster as cluster;
use abhyasa_testkit::pg_or_skip;
use abhyasa_testkit::store_world as common;

use abhyasa_core::custody::{
    Custodian, EffectValue, EffectWrite, LedgerOutcome, LedgerRecord, Record,
};
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::store::{Store, StoreError};
use abhyasa_core::{GovernedKey, Sequence};
use abhyasa_pg::PgStore;
use backend::test_options;
use common::*;
use postgres::{Client, NoTls};

fn ledger(i: usize) -> Record {
    let ob = phala(&format!("in-{i}"), -0.1);
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

/// A partition holding acknowledged custody: revocations pending with
/// their withholds, applied ledger entries. Returns its name.
fn filled(name: &str) -> String {
    let url = cluster::url().unwrap();
    let p = cluster::partition(name);
    let mut s = PgStore::open(url, &p, &test_options(name)).unwrap();
    let mut c = Custodian::new(custodian_config(), PolarityRegistry::standard());
    for i in 0..6 {
        c.offer(EPOCH, revoke(&format!("rv-{i}"), &format!("scope-{i}"), 1))
            .unwrap();
        let b = c.poll_records().unwrap();
        c.handle_committed(b.token());
        let _ = s.commit(EPOCH, &[&b.records, &[ledger(i)]]).unwrap();
    }
    let st = s.load().unwrap();
    assert_eq!(st.custodian.pending.len(), 6);
    assert_eq!(st.receiver.ledger.len(), 6);
    p.as_str().to_string()
}

fn sql() -> Client {
    Client::connect(cluster::url().unwrap(), NoTls).unwrap()
}

/// Reopens the partition as its node would and loads it.
fn reopen(name: &str, partition: &str) -> Result<(), StoreError> {
    let url = cluster::url().unwrap();
    let mut o = test_options(name);
    o.partition = Some(partition.to_string());
    let s = PgStore::open(url, &agent(name), &o)?;
    s.load().map(drop)
}

fn assert_refused(name: &str, partition: &str, table: &str) {
    match reopen(name, partition) {
        Err(StoreError::Corrupt {
            table: t,
            key,
            detail,
        }) => {
            assert_eq!(t, table, "{key}: {detail}");
        }
        other => panic!("damage in {table} not refused: {other:?}"),
    }
}

/// Flips one bit of the value of the first row of `tbl`.
fn flip(partition: &str, tbl: &str, byte: i32) {
    let n = sql()
        .execute(
            "UPDATE abhyasa_rows SET value = set_byte(value, $3, get_byte(value, $3) # 4)
             WHERE partition = $1 AND tbl = $2
               AND key = (SELECT key FROM abhyasa_rows WHERE partition = $1 AND tbl = $2 ORDER BY key LIMIT 1)",
            &[&partition, &tbl, &byte],
        )
        .unwrap();
    assert_eq!(n, 1);
}

fn delete_one(partition: &str, tbl: &str) {
    let n = sql()
        .execute(
            "DELETE FROM abhyasa_rows WHERE partition = $1 AND tbl = $2
               AND key = (SELECT key FROM abhyasa_rows WHERE partition = $1 AND tbl = $2 ORDER BY key DESC LIMIT 1)",
            &[&partition, &tbl],
        )
        .unwrap();
    assert_eq!(n, 1);
}

// C-SD-2, C-SD-4: a row deleted behind the store's back is refused by
// name, for pending custody, its principal withhold and a ledger entry.
#[test]
fn a_deleted_row_is_refused_by_table_c_sd_2() {
    let _ = pg_or_skip!();
    for tbl in ["custody_pending", "principal", "receiver_ledger"] {
        let name = format!("del-{}", tbl.replace('_', "-"));
        let p = filled(&name);
        delete_one(&p, tbl);
        assert_refused(&name, &p, tbl);
    }
}

// C-SD-2: one bit flipped in a row's bytes: a pending row fails its
// checksum, a principal or ledger row its table's witness.
#[test]
fn a_flipped_bit_in_a_row_is_refused_c_sd_2() {
    let _ = pg_or_skip!();
    for (tbl, byte) in [
        ("custody_pending", 30),
        ("principal", 2),
        ("receiver_ledger", 20),
    ] {
        let name = format!("flip-{}", tbl.replace('_', "-"));
        let p = filled(&name);
        flip(&p, tbl, byte);
        assert_refused(&name, &p, tbl);
    }
}

// C-SD-2: a whole table's rows deleted, and every row of the partition
// deleted (a TRUNCATE): refused, never a new empty store.
#[test]
fn a_table_or_partition_emptied_is_refused_c_sd_2() {
    let _ = pg_or_skip!();
    let p = filled("empty-table");
    sql()
        .execute(
            "DELETE FROM abhyasa_rows WHERE partition = $1 AND tbl = 'custody_pending'",
            &[&p],
        )
        .unwrap();
    assert_refused("empty-table", &p, "custody_pending");

    let p = filled("empty-all");
    sql()
        .execute("DELETE FROM abhyasa_rows WHERE partition = $1", &[&p])
        .unwrap();
    assert_refused("empty-all", &p, "meta");

    // The witness itself deleted: the store cannot vouch for its rows.
    let p = filled("no-witness");
    sql()
        .execute(
            "DELETE FROM abhyasa_rows WHERE partition = $1 AND tbl = 'meta'
               AND key = 'witness.receiver_ledger'::bytea",
            &[&p],
        )
        .unwrap();
    assert_refused("no-witness", &p, "receiver_ledger");
}
