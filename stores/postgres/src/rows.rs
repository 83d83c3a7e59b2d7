//! The key-value tables of `abhyasa_store::kv` over `abhyasa_rows`: every
//! statement names its partition, so it is served by a prefix of the
//! primary key `(partition, tbl, key)` and never touches another agent.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

use abhyasa_core::store::StoreError;
use abhyasa_store::kv::{KvTable, KvTxn, KvView, KvVisit};
use postgres::Transaction;

use crate::pg_err;

/// Rows fetched per round trip by a scan.
const PAGE: i64 = 4096;

/// A read view: one `REPEATABLE READ` transaction, so a load sees one
/// consistent snapshot however many pages it reads.
pub(crate) struct PgView<'a, 'c> {
    pub(crate) tx: RefCell<&'a mut Transaction<'c>>,
    pub(crate) partition: &'a str,
}

fn get_one(
    tx: &mut Transaction<'_>,
    partition: &str,
    table: KvTable,
    key: &[u8],
) -> Result<Option<Vec<u8>>, StoreError> {
    let row = tx
        .query_opt(
            "SELECT value FROM abhyasa_rows WHERE partition = $1 AND tbl = $2 AND key = $3",
            &[&partition, &table.name(), &key],
        )
        .map_err(pg_err("read"))?;
    Ok(row.map(|r| r.get(0)))
}

impl KvView for PgView<'_, '_> {
    fn get(&self, table: KvTable, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        get_one(&mut self.tx.borrow_mut(), self.partition, table, key)
    }

    fn scan(&self, table: KvTable, from: &[u8], f: &mut KvVisit<'_>) -> Result<(), StoreError> {
        let mut tx = self.tx.borrow_mut();
        let mut from = from.to_vec();
        let mut inclusive = true;
        loop {
            // Keyset pagination: bytea orders by unsigned bytes, as the
            // embedded engines do, so the log and the tables scan alike.
            let sql = if inclusive {
                "SELECT key, value FROM abhyasa_rows
                 WHERE partition = $1 AND tbl = $2 AND key >= $3 ORDER BY key LIMIT $4"
            } else {
                "SELECT key, value FROM abhyasa_rows
                 WHERE partition = $1 AND tbl = $2 AND key > $3 ORDER BY key LIMIT $4"
            };
            let rows = tx
                .query(sql, &[&self.partition, &table.name(), &from, &PAGE])
                .map_err(pg_err("scan"))?;
            let n = rows.len();
            for r in &rows {
                let k: &[u8] = r.get(0);
                let v: &[u8] = r.get(1);
                if !f(k, v)? {
                    return Ok(());
                }
            }
            match rows.last() {
                Some(last) if n as i64 == PAGE => {
                    from = last.get::<_, Vec<u8>>(0);
                    inclusive = false;
                }
                _ => return Ok(()),
            }
        }
    }
}

type Entry = (KvTable, Vec<u8>);

/// A write transaction: reads are served from the rows prefetched for the
/// batch (or fetched one by one outside that set), writes are buffered and
/// sent in two statements by [`PgTxn::flush`], all inside the caller's SQL
/// transaction, which also holds the fencing check.
pub(crate) struct PgTxn<'a, 'c> {
    tx: &'a mut Transaction<'c>,
    partition: &'a str,
    epoch: i64,
    /// Prefetched entries; `None` is a known-absent row.
    known: HashMap<Entry, Option<Vec<u8>>>,
    /// Buffered writes; `None` deletes.
    writes: BTreeMap<Entry, Option<Vec<u8>>>,
}

impl<'a, 'c> PgTxn<'a, 'c> {
    pub(crate) fn new(tx: &'a mut Transaction<'c>, partition: &'a str, epoch: i64) -> Self {
        Self {
            tx,
            partition,
            epoch,
            known: HashMap::new(),
            writes: BTreeMap::new(),
        }
    }

    /// Reads every entry of `set` in one round trip.
    pub(crate) fn prefetch(&mut self, set: Vec<Entry>) -> Result<(), StoreError> {
        if set.is_empty() {
            return Ok(());
        }
        let tables: Vec<&str> = set.iter().map(|(t, _)| t.name()).collect();
        let keys: Vec<&[u8]> = set.iter().map(|(_, k)| k.as_slice()).collect();
        let rows = self
            .tx
            .query(
                "SELECT r.tbl, r.key, r.value FROM abhyasa_rows r
                 JOIN unnest($2::text[], $3::bytea[]) AS u(tbl, key)
                   ON r.tbl = u.tbl AND r.key = u.key
                 WHERE r.partition = $1",
                &[&self.partition, &tables, &keys],
            )
            .map_err(pg_err("prefetch"))?;
        let mut found: HashMap<Entry, Vec<u8>> = HashMap::with_capacity(rows.len());
        for r in rows {
            let name: &str = r.get(0);
            let Some(t) = KvTable::from_name(name) else {
                continue;
            };
            found.insert((t, r.get(1)), r.get(2));
        }
        for e in set {
            let v = found.remove(&e);
            self.known.insert(e, v);
        }
        Ok(())
    }

    /// Sends the buffered writes: one upsert and one delete statement,
    /// stamping every written row with this owner's epoch.
    pub(crate) fn flush(self) -> Result<(), StoreError> {
        let mut put_t = Vec::new();
        let mut put_k = Vec::new();
        let mut put_v = Vec::new();
        let mut del_t = Vec::new();
        let mut del_k = Vec::new();
        for ((t, k), v) in &self.writes {
            match v {
                Some(v) => {
                    put_t.push(t.name());
                    put_k.push(k.as_slice());
                    put_v.push(v.as_slice());
                }
                None => {
                    del_t.push(t.name());
                    del_k.push(k.as_slice());
                }
            }
        }
        if !put_t.is_empty() {
            self.tx
                .execute(
                    "INSERT INTO abhyasa_rows (partition, tbl, key, value, epoch)
                     SELECT $1, u.tbl, u.key, u.value, $2
                     FROM unnest($3::text[], $4::bytea[], $5::bytea[]) AS u(tbl, key, value)
                     ON CONFLICT (partition, tbl, key)
                     DO UPDATE SET value = EXCLUDED.value, epoch = EXCLUDED.epoch",
                    &[&self.partition, &self.epoch, &put_t, &put_k, &put_v],
                )
                .map_err(pg_err("write"))?;
        }
        if !del_t.is_empty() {
            self.tx
                .execute(
                    "DELETE FROM abhyasa_rows r USING unnest($2::text[], $3::bytea[]) AS u(tbl, key)
                     WHERE r.partition = $1 AND r.tbl = u.tbl AND r.key = u.key",
                    &[&self.partition, &del_t, &del_k],
                )
                .map_err(pg_err("delete"))?;
        }
        Ok(())
    }
}

impl KvTxn for PgTxn<'_, '_> {
    fn get(&mut self, table: KvTable, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let e = (table, key.to_vec());
        if let Some(v) = self.writes.get(&e) {
            return Ok(v.clone());
        }
        if let Some(v) = self.known.get(&e) {
            return Ok(v.clone());
        }
        let v = get_one(self.tx, self.partition, table, key)?;
        self.known.insert(e, v.clone());
        Ok(v)
    }

    fn put(&mut self, table: KvTable, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.writes
            .insert((table, key.to_vec()), Some(value.to_vec()));
        Ok(())
    }

    fn del(&mut self, table: KvTable, key: &[u8]) -> Result<(), StoreError> {
        self.writes.insert((table, key.to_vec()), None);
        Ok(())
    }
}
