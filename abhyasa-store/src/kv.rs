//! The storage semantics of the embedded stores, opened to other backends.
//!
//! sled and redb keep the custody rules (idempotent offers, terminal marks,
//! the ledger committed with its effect, the read-back check, the event log)
//! in one place, written over a minimal key-value transaction. A
//! server-backed store (`abhyasa-pg`) implements [`KvTxn`] and [`KvView`]
//! over its own tables and calls [`commit`], [`load`], [`events`] and the
//! compaction pair, so it keeps exactly the same rules and runs the same
//! storage suite; nothing here is specific to an engine.

use std::time::Duration;

use abhyasa_core::custody::Record;
use abhyasa_core::principal::PrincipalWrite;
use abhyasa_core::store::{Committed, Compacted, DurableState, EventId, StoreError, StoredEvent};
use abhyasa_core::Timestamp;

use crate::codec::pair_key;
use crate::engine::{self, Format, Table, Txn, View, Visit};

/// One table (a sled tree, a redb table, or a slice of a server table) of
/// a node's database. Its [`KvTable::name`] is stable: backends may store it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvTable(Table);

impl std::hash::Hash for KvTable {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.index().hash(state);
    }
}

impl PartialOrd for KvTable {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for KvTable {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.index().cmp(&other.0.index())
    }
}

impl KvTable {
    /// Every table the semantics use.
    pub fn all() -> impl Iterator<Item = KvTable> {
        Table::ALL.into_iter().map(KvTable)
    }

    /// Its stable name (`custody_pending`, `receiver_ledger`, ...).
    pub fn name(self) -> &'static str {
        self.0.name()
    }

    /// The table of that name, if any.
    pub fn from_name(name: &str) -> Option<KvTable> {
        Self::all().find(|t| t.name() == name)
    }
}

/// A write transaction: reads see its own writes; nothing is visible to
/// others or durable until the backend commits it.
pub trait KvTxn {
    /// The value at `key`, if any.
    fn get(&mut self, table: KvTable, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// Writes `value` at `key`.
    fn put(&mut self, table: KvTable, key: &[u8], value: &[u8]) -> Result<(), StoreError>;
    /// Deletes `key` (absent is fine).
    fn del(&mut self, table: KvTable, key: &[u8]) -> Result<(), StoreError>;
}

/// Entries to delete: (table, key).
pub type KvDeletions = Vec<(KvTable, Vec<u8>)>;

/// A visitor of `(key, value)` entries; returns `false` to stop.
pub type KvVisit<'a> = dyn FnMut(&[u8], &[u8]) -> Result<bool, StoreError> + 'a;

/// A consistent read view.
pub trait KvView {
    /// The value at `key`, if any.
    fn get(&self, table: KvTable, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// Calls `f` on every entry with key `>= from`, in unsigned byte order
    /// of the keys, while it returns `true`.
    fn scan(&self, table: KvTable, from: &[u8], f: &mut KvVisit<'_>) -> Result<(), StoreError>;
}

struct TxnOf<'a>(&'a mut dyn KvTxn);

impl Txn for TxnOf<'_> {
    fn get(&mut self, t: Table, k: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.0.get(KvTable(t), k)
    }
    fn put(&mut self, t: Table, k: &[u8], v: &[u8]) -> Result<(), StoreError> {
        self.0.put(KvTable(t), k, v)
    }
    fn del(&mut self, t: Table, k: &[u8]) -> Result<(), StoreError> {
        self.0.del(KvTable(t), k)
    }
}

struct ViewOf<'a>(&'a dyn KvView);

impl View for ViewOf<'_> {
    fn get(&self, t: Table, k: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.0.get(KvTable(t), k)
    }
    fn scan(&self, t: Table, from: &[u8], f: &mut Visit<'_>) -> Result<(), StoreError> {
        self.0.scan(KvTable(t), from, f)
    }
}

/// The stored format version, `None` for a new (empty) database. Fails
/// with [`StoreError::NewerFormat`] for a newer one and
/// [`StoreError::Corrupt`] when the version is missing but data is present.
pub fn check_format(view: &dyn KvView) -> Result<Option<u32>, StoreError> {
    Ok(match engine::check_format(&ViewOf(view))? {
        Format::Fresh => None,
        Format::Known(v) => Some(v),
    })
}

/// Writes the format version of a new database.
pub fn init_format(txn: &mut dyn KvTxn) -> Result<(), StoreError> {
    engine::init_format(&mut TxnOf(txn))
}

/// What migrating a database of an older format writes: its indexes,
/// counters and row witnesses derived from its records
/// ([`plan_migration`], then [`migrate`] in one transaction).
pub struct Migration(crate::index::Rebuild);

/// Reads what migrating the database in `view` to [`crate::FORMAT_VERSION`]
/// writes (a full scan).
pub fn plan_migration(view: &dyn KvView) -> Result<Migration, StoreError> {
    crate::index::plan_rebuild(&ViewOf(view)).map(Migration)
}

/// Writes a planned migration and the current format version.
pub fn migrate(txn: &mut dyn KvTxn, plan: &Migration) -> Result<(), StoreError> {
    engine::finish_rebuild(&mut TxnOf(txn), &plan.0)
}

/// Applies `batches` inside `txn` under the store contract and appends
/// their log events. Commit the transaction durably only if it returns `Ok`.
pub fn commit(
    txn: &mut dyn KvTxn,
    now: Timestamp,
    batches: &[&[Record]],
) -> Result<Committed, StoreError> {
    engine::commit(&mut TxnOf(txn), now, batches)
}

/// The entries [`commit`] may read for `batches`, so a backend with
/// expensive reads (a server round trip each) can fetch them all at once
/// before the commit. A read outside this set must still be answered.
pub fn read_set(batches: &[&[Record]]) -> Vec<(KvTable, Vec<u8>)> {
    let mut out = vec![(KvTable(Table::Meta), b"next_event".to_vec())];
    // The index counters the commit moves.
    out.extend(crate::index::counter_keys().map(|k| (KvTable(Table::Meta), k.to_vec())));
    // The row witnesses a commit may move.
    out.extend(
        crate::witness::WITNESSED
            .into_iter()
            .map(|t| (KvTable(Table::Meta), crate::witness::meta_key(t))),
    );
    let principal = |out: &mut Vec<(KvTable, Vec<u8>)>, writes: &[PrincipalWrite]| {
        for w in writes {
            out.push((KvTable(Table::Principal), engine::principal_write_key(w)));
        }
    };
    let by_id = |out: &mut Vec<(KvTable, Vec<u8>)>, id: &str, tables: &[Table]| {
        for t in tables {
            out.push((KvTable(*t), id.as_bytes().to_vec()));
        }
    };
    for r in batches.iter().flat_map(|b| b.iter()) {
        match r {
            Record::CustodyOpened {
                pending,
                principal: p,
            } => {
                principal(&mut out, p);
                by_id(
                    &mut out,
                    pending.obligation.id().as_str(),
                    &[Table::Pending, Table::Terminal],
                )
            }
            Record::AttemptMade { obligation_id, .. } | Record::DeferralSeen { obligation_id } => {
                by_id(&mut out, obligation_id.as_str(), &[Table::Pending])
            }
            Record::CustodyClosed(c) => {
                principal(&mut out, &c.principal);
                by_id(
                    &mut out,
                    c.obligation_id.as_str(),
                    &[Table::Pending, Table::Terminal],
                );
                // Whether the pending row was deferred (`Txn::del_pending`).
                out.push((
                    KvTable(Table::Index),
                    crate::index::deferred_custody_key(
                        c.deadline_at.unix_micros(),
                        c.obligation_id.as_str().as_bytes(),
                    ),
                ));
            }
            Record::BestEffortSent {
                summary,
                principal: p,
            } => {
                principal(&mut out, p);
                by_id(
                    &mut out,
                    summary.obligation_id.as_str(),
                    &[Table::Pending, Table::Terminal],
                )
            }
            Record::LateAck(rec) => by_id(&mut out, rec.obligation_id.as_str(), &[Table::Terminal]),
            // The ledger entry and the intent it may close derive one
            // index entry together (`index::Indexed::entity`).
            Record::Ledger(l) => {
                let k = pair_key(&l.custodian, &l.obligation_id);
                out.push((KvTable(Table::Intents), k.clone()));
                out.push((KvTable(Table::Ledger), k));
                // The rows an applied entry writes move their witnesses.
                for w in &l.effect {
                    out.push((KvTable(Table::Effects), w.key.as_bytes().to_vec()));
                }
                if let Some((key, _)) = &l.key_sequence {
                    out.push((
                        KvTable(Table::KeySequences),
                        key.as_str().as_bytes().to_vec(),
                    ));
                }
            }
            Record::Intent(i) => {
                let k = pair_key(&i.custodian, i.obligation.id());
                out.push((KvTable(Table::Ledger), k.clone()));
                out.push((KvTable(Table::Intents), k));
            }
            Record::Principal { writes, .. } => principal(&mut out, writes),
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The durable state, folded from `view` (see `abhyasa_core::store`).
pub fn load(view: &dyn KvView) -> Result<DurableState, StoreError> {
    engine::load(&ViewOf(view))
}

/// Up to `limit` log events with id `>= from`.
pub fn events(
    view: &dyn KvView,
    from: EventId,
    limit: usize,
) -> Result<Vec<StoredEvent>, StoreError> {
    engine::events(&ViewOf(view), from, limit)
}

/// What a compaction at `now` would delete, read from `view`; apply it with
/// [`delete`] in one transaction of the (single) writer.
pub fn plan_compaction(
    view: &dyn KvView,
    now: Timestamp,
    retention: Duration,
) -> Result<(KvDeletions, Compacted), StoreError> {
    let (dels, out) = engine::plan_compaction(&ViewOf(view), now, retention)?;
    Ok((
        dels.into_iter().map(|(t, k)| (KvTable(t), k)).collect(),
        out,
    ))
}

/// Applies planned deletions inside `txn`, moving the tables' row
/// witnesses and index counters with them as every embedded store does.
pub fn delete(txn: &mut dyn KvTxn, dels: &[(KvTable, Vec<u8>)]) -> Result<(), StoreError> {
    let dels: Vec<(Table, Vec<u8>)> = dels.iter().map(|(t, k)| (t.0, k.clone())).collect();
    engine::delete(&mut TxnOf(txn), &dels)
}
