//! The storage semantics, written once over a minimal key-value
//! transaction so that sled and redb keep exactly the same rules (see
//! `abhyasa_core::store` for the contract).

use std::time::Duration;

use abhyasa_core::custody::{
    CustodianSnapshot, EffectValue, IntentRecord, LedgerOutcome, LedgerRecord, PendingRecord,
    ReceiverSnapshot, Reconciliation, Record, TerminalSummary,
};
use abhyasa_core::principal::{AuthorizationEntry, DecisionItem, PrincipalWrite};
use abhyasa_core::store::{
    past_retention, Committed, Compacted, DurableState, EventId, LogEvent, LogEventRef, StoreError,
    StoredEvent,
};
use abhyasa_core::{AgentId, Digest, Escalation, GovernedKey, ObligationId, Sequence, Timestamp};

use crate::codec::{
    corrupt, from_bytes, from_json, id, pair_key, parse_u64_key, split_pair_key, to_bytes, to_json,
    u64_key, unwritable, EffectRow, LedgerRow, PendingRow, Shared, TerminalRow,
};
use crate::index::Facts;

/// The trees (sled) or tables (redb) of a node's database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Table {
    /// Format version and counters.
    Meta,
    /// Pending custody: obligation, `safe(O)`, attempts, next attempt.
    Pending,
    /// Terminal summaries.
    Terminal,
    /// Escalations, by log position.
    Escalations,
    /// Reconciliation items (late acks), by log position.
    Reconciliations,
    /// Principal state: authorizations, weights, open decisions.
    Principal,
    /// Receiver ledger: (custodian, id) → digest, outcome, reason, effect.
    Ledger,
    /// Receiver per-key newest sequence.
    KeySequences,
    /// Receiver-owned effect state.
    Effects,
    /// External-effect intents.
    Intents,
    /// The append-only event log.
    Events,
    /// Rows moved aside by [`quarantine`]: the raw bytes of every entry that
    /// did not decode, keyed by `table \0 key`, kept for inspection.
    Quarantine,
    /// Secondary indexes of the paged reads (format 2, see
    /// [`crate::index`]): derived from the records, written with them.
    Index,
}

impl Table {
    pub(crate) const ALL: [Table; 13] = [
        Table::Meta,
        Table::Pending,
        Table::Terminal,
        Table::Escalations,
        Table::Reconciliations,
        Table::Principal,
        Table::Ledger,
        Table::KeySequences,
        Table::Effects,
        Table::Intents,
        Table::Events,
        Table::Quarantine,
        Table::Index,
    ];

    /// The tables whose rows hold custody state and must all decode.
    const DATA: [Table; 10] = [
        Table::Pending,
        Table::Terminal,
        Table::Escalations,
        Table::Reconciliations,
        Table::Principal,
        Table::Ledger,
        Table::KeySequences,
        Table::Effects,
        Table::Intents,
        Table::Events,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Table::Meta => "meta",
            Table::Pending => "custody_pending",
            Table::Terminal => "custody_terminal",
            Table::Escalations => "escalations",
            Table::Reconciliations => "reconciliations",
            Table::Principal => "principal",
            Table::Ledger => "receiver_ledger",
            Table::KeySequences => "receiver_key_sequences",
            Table::Effects => "receiver_effects",
            Table::Intents => "intents",
            Table::Events => "events",
            Table::Quarantine => "quarantine",
            Table::Index => "index",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// The on-disk layout version of the embedded stores. Version 2 added the
/// `index` table and the counters in `meta`; version 3 the row witnesses
/// (`crate::witness`). An older database is migrated on open by deriving
/// them from its records.
pub const FORMAT_VERSION: u32 = 3;

/// Meta key of the format version (`u32`, big-endian).
pub(crate) const META_FORMAT: &[u8] = b"format_version";
/// Meta key present while the indexes may disagree with the records (set
/// by the transaction that quarantines rows, cleared by the one that
/// rebuilds them): a crash between the two is repaired on the next open.
const META_INDEX_STALE: &[u8] = b"index_stale";
/// Meta key of the next event id (`u64`, big-endian).
const META_NEXT_EVENT: &[u8] = b"next_event";
/// `damaged.<id>`: a pending transfer a repair salvaged from damaged
/// bytes and could not prove (C-SD-4); see [`hand_over_damaged`].
const META_DAMAGED: &[u8] = b"damaged.";
/// When a repair last read around damage: the receiver declines what it
/// does not hold that was created before (`ReceiverSnapshot::damaged_before`).
const META_RECEIVER_DAMAGED: &[u8] = b"receiver_damaged_before";

/// A write transaction: reads see the transaction's own writes; nothing is
/// visible to others or durable until the backend commits it.
pub(crate) trait Txn {
    fn get(&mut self, t: Table, k: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    fn put(&mut self, t: Table, k: &[u8], v: &[u8]) -> Result<(), StoreError>;
    fn del(&mut self, t: Table, k: &[u8]) -> Result<(), StoreError>;
    /// Whether `k` holds a value in this transaction. An engine that keeps
    /// long values out of memory ([`crate::LogStore`]) answers from its
    /// index, without reading the value back.
    fn contains(&mut self, t: Table, k: &[u8]) -> Result<bool, StoreError> {
        Ok(self.get(t, k)?.is_some())
    }
    /// [`Txn::put`] of a key whose value in this transaction the caller
    /// has just read as `old`, with no write to it since: a layer that
    /// derives from the old row ([`crate::index::Indexed`]) takes it from
    /// here instead of reading it a second time.
    fn put_over(
        &mut self,
        t: Table,
        k: &[u8],
        old: Option<&[u8]>,
        v: &[u8],
    ) -> Result<(), StoreError> {
        let _ = old;
        self.put(t, k, v)
    }

    /// [`Txn::put_over`] of a row the caller has just encoded from a
    /// typed row whose index [`Facts`] it passes along:
    /// [`crate::index::Indexed`] derives the new index entries from them
    /// instead of decoding `v` again. Checked against the
    /// bytes wherever debug assertions are on (the storage suite).
    fn put_known(
        &mut self,
        t: Table,
        k: &[u8],
        old: Option<&[u8]>,
        v: &[u8],
        facts: Facts,
    ) -> Result<(), StoreError> {
        let _ = facts;
        self.put_over(t, k, old, v)
    }

    /// [`Txn::del`] that says whether `k` held a row (`Ok(true)`: it did,
    /// and it is gone). An engine whose delete finds the row anyway
    /// ([`crate::LogStore`]) answers without a second look.
    fn del_found(&mut self, t: Table, k: &[u8]) -> Result<bool, StoreError> {
        if !self.contains(t, k)? {
            return Ok(false);
        }
        self.del(t, k)?;
        Ok(true)
    }

    /// [`Txn::del`] of the pending row `k`, whose obligation's absolute
    /// deadline (`deadline_at`, microseconds) the caller knows:
    /// [`crate::index::Indexed`] finds the row's index entries from it
    /// instead of decoding the row. Checked against the row
    /// wherever debug assertions are on (the storage suite).
    ///
    /// Says whether a pending row was there (and is gone), as
    /// [`Txn::del_found`] does.
    fn del_pending(&mut self, k: &[u8], deadline_at: i64) -> Result<bool, StoreError> {
        let _ = deadline_at;
        self.del_found(Table::Pending, k)
    }
}

/// A visitor of `(key, value)` entries; returns `false` to stop.
pub(crate) type Visit<'a> = dyn FnMut(&[u8], &[u8]) -> Result<bool, StoreError> + 'a;

/// Keys to delete, by table.
pub(crate) type Deletions = Vec<(Table, Vec<u8>)>;

/// A consistent read view.
pub(crate) trait View {
    fn get(&self, t: Table, k: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// Calls `f` on every entry with key `>= from`, in key order, while it
    /// returns `true`.
    fn scan(&self, t: Table, from: &[u8], f: &mut Visit<'_>) -> Result<(), StoreError>;
}

/// Whether a database holds a format version.
pub(crate) enum Format {
    /// No version and no data: a new database.
    Fresh,
    /// A version this build reads.
    Known(u32),
}

/// Checks the stored format version.
pub(crate) fn check_format(v: &dyn View) -> Result<Format, StoreError> {
    match v.get(Table::Meta, META_FORMAT)? {
        Some(b) => {
            let arr: [u8; 4] = b
                .as_slice()
                .try_into()
                .map_err(|_| corrupt("meta", META_FORMAT, "format version is not 4 bytes"))?;
            let found = u32::from_be_bytes(arr);
            if found > FORMAT_VERSION {
                return Err(StoreError::NewerFormat {
                    found,
                    supported: FORMAT_VERSION,
                });
            }
            Ok(Format::Known(found))
        }
        None => {
            for t in Table::ALL {
                let mut any = false;
                v.scan(t, &[], &mut |_, _| {
                    any = true;
                    Ok(false)
                })?;
                if any {
                    return Err(corrupt(
                        "meta",
                        META_FORMAT,
                        format!("missing, but table {} holds data", t.name()),
                    ));
                }
            }
            Ok(Format::Fresh)
        }
    }
}

/// Writes the format version of a new database.
pub(crate) fn init_format(txn: &mut dyn Txn) -> Result<(), StoreError> {
    for t in crate::witness::WITNESSED {
        crate::witness::write(txn, t, crate::witness::Witness::default())?;
    }
    txn.put(Table::Meta, META_FORMAT, &FORMAT_VERSION.to_be_bytes())
}

/// Whether the indexes must be derived again on open: the database is of
/// an older format (migration) or a quarantine did not finish.
fn needs_rebuild(v: &dyn View, found: u32) -> Result<bool, StoreError> {
    Ok(found < FORMAT_VERSION || v.get(Table::Meta, META_INDEX_STALE)?.is_some())
}

/// What an embedded database needs written, in one transaction, before
/// it is used ([`setup`]).
pub(crate) enum Setup {
    /// A new database: its format version.
    Init,
    /// A version-1 database (no indexes) or one whose quarantine did not
    /// finish: the indexes derived from the records, with the current
    /// version.
    Rebuild(crate::index::Rebuild),
}

impl Setup {
    /// The name of the transaction, for its errors.
    pub(crate) fn op(&self) -> &'static str {
        match self {
            Setup::Init => "init",
            Setup::Rebuild(_) => "migrate",
        }
    }

    /// Writes it.
    pub(crate) fn write(&self, txn: &mut dyn Txn) -> Result<(), StoreError> {
        match self {
            Setup::Init => init_format(txn),
            Setup::Rebuild(plan) => finish_rebuild(txn, plan),
        }
    }
}

/// On open: the format the database has once set up, and what must be
/// written first to set it up, if anything. Fails as [`check_format`]
/// does.
pub(crate) fn setup(v: &dyn View) -> Result<(u32, Option<Setup>), StoreError> {
    setup_existing(v, None)
}

/// [`setup`] of a database whose files were there before this open
/// (`existed`: where, for the error). Every database is created with its
/// format version in a transaction of its own, so one that existed and
/// reads as new lost everything it held (an emptied or recreated file, a
/// missing one the engine made again): [`StoreError::Corrupt`], never a
/// new, empty store under a node that acknowledged custody.
pub(crate) fn setup_existing(
    v: &dyn View,
    existed: Option<&std::path::Path>,
) -> Result<(u32, Option<Setup>), StoreError> {
    if let (Some(path), Format::Fresh) = (existed, check_format(v)?) {
        return Err(corrupt(
            "meta",
            META_FORMAT,
            format!(
                "missing from the existing database {}: it reads as empty, so its files \
                 were lost or emptied (restore them; a new store is created only where \
                 none exists)",
                path.display()
            ),
        ));
    }
    Ok(match check_format(v)? {
        Format::Known(found) if needs_rebuild(v, found)? => (
            FORMAT_VERSION,
            Some(Setup::Rebuild(crate::index::plan_rebuild(v)?)),
        ),
        Format::Known(found) => (found, None),
        Format::Fresh => (FORMAT_VERSION, Some(Setup::Init)),
    })
}

/// Rebuilds the indexes from the records and marks the database current,
/// in one transaction (the migration from version 1 is this rebuild).
pub(crate) fn finish_rebuild(
    txn: &mut dyn Txn,
    plan: &crate::index::Rebuild,
) -> Result<(), StoreError> {
    crate::index::write_rebuild(txn, plan)?;
    if plan.skipped {
        txn.put(Table::Meta, META_INDEX_STALE, &[1])?;
    } else {
        txn.del(Table::Meta, META_INDEX_STALE)?;
    }
    txn.put(Table::Meta, META_FORMAT, &FORMAT_VERSION.to_be_bytes())
}

/// Makes the next event id at least `past` (after a repair dropped the
/// record that last advanced it).
pub(crate) fn raise_next_event(txn: &mut dyn Txn, past: u64) -> Result<(), StoreError> {
    if next_event(txn.get(Table::Meta, META_NEXT_EVENT)?)? < past {
        txn.put(Table::Meta, META_NEXT_EVENT, &u64_key(past))?;
    }
    Ok(())
}

fn next_event(get: Option<Vec<u8>>) -> Result<u64, StoreError> {
    match get {
        None => Ok(0),
        Some(b) => {
            parse_u64_key("meta", &b).map_err(|_| corrupt("meta", META_NEXT_EVENT, "not 8 bytes"))
        }
    }
}

fn principal_key(prefix: u8, s: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + s.len());
    k.push(prefix);
    k.extend_from_slice(s.as_bytes());
    k
}

/// The `principal` row a write sets or clears.
pub(crate) fn principal_write_key(w: &PrincipalWrite) -> Vec<u8> {
    match w {
        PrincipalWrite::Authorization { key, .. } => principal_key(b'a', key.as_str()),
        PrincipalWrite::Weight { key, .. } => principal_key(b'w', key.as_str()),
        PrincipalWrite::DecisionRaised(item) => principal_key(b'd', item.obligation_id.as_str()),
        PrincipalWrite::DecisionClosed { obligation_id } => {
            principal_key(b'd', obligation_id.as_str())
        }
        PrincipalWrite::Issued { key, .. } => principal_key(b's', key.as_str()),
    }
}

fn put_principal(txn: &mut dyn Txn, w: &PrincipalWrite) -> Result<(), StoreError> {
    const T: &str = "principal";
    let k = principal_write_key(w);
    match w {
        PrincipalWrite::Authorization { entry, .. } => {
            txn.put(Table::Principal, &k, &to_bytes(T, &k, entry)?)
        }
        PrincipalWrite::Weight { value, .. } => txn.put(Table::Principal, &k, &value.to_le_bytes()),
        PrincipalWrite::DecisionRaised(item) => {
            txn.put(Table::Principal, &k, &to_json(T, &k, item)?)
        }
        PrincipalWrite::DecisionClosed { .. } => txn.del(Table::Principal, &k),
        PrincipalWrite::Issued {
            sequence,
            obligation_id,
            ..
        } => txn.put(
            Table::Principal,
            &k,
            &to_bytes(T, &k, &(sequence.0, obligation_id.as_str()))?,
        ),
    }
}

pub(crate) fn read_principal(k: &[u8], v: &[u8]) -> Result<PrincipalWrite, StoreError> {
    const T: &str = "principal";
    let (prefix, rest) = k.split_first().ok_or_else(|| corrupt(T, k, "empty key"))?;
    Ok(match prefix {
        b'a' => PrincipalWrite::Authorization {
            key: id::<GovernedKey>(T, k, rest)?,
            entry: from_bytes::<AuthorizationEntry>(T, k, v)?,
        },
        b'w' => PrincipalWrite::Weight {
            key: id::<GovernedKey>(T, k, rest)?,
            value: f64::from_le_bytes(
                v.try_into()
                    .map_err(|_| corrupt(T, k, "weight is not 8 bytes"))?,
            ),
        },
        b'd' => PrincipalWrite::DecisionRaised(from_json::<DecisionItem>(T, k, v)?),
        b's' => {
            let (sequence, by) = from_bytes::<(u64, String)>(T, k, v)?;
            PrincipalWrite::Issued {
                key: id::<GovernedKey>(T, k, rest)?,
                sequence: Sequence(sequence),
                obligation_id: id::<ObligationId>(T, k, by.as_bytes())?,
            }
        }
        _ => return Err(corrupt(T, k, "unknown key prefix")),
    })
}

/// The digest an id is held under (pending or terminal), if any.
fn held_digest(txn: &mut dyn Txn, id: &ObligationId) -> Result<Option<Digest>, StoreError> {
    let k = id.as_str().as_bytes();
    if let Some(b) = txn.get(Table::Pending, k)? {
        return Ok(Some(Digest(
            PendingRow::decode("custody_pending", k, &b)?.0.digest,
        )));
    }
    if let Some(b) = txn.get(Table::Terminal, k)? {
        return Ok(Some(Digest(
            TerminalRow::decode("custody_terminal", k, &b)?.digest,
        )));
    }
    Ok(None)
}

/// Idempotent offers: `Ok(true)` when the id is new, `Ok(false)` when it is
/// held with the same digest, an error when held with another.
fn offer_is_new(txn: &mut dyn Txn, id: &ObligationId, digest: Digest) -> Result<bool, StoreError> {
    match held_digest(txn, id)? {
        None => Ok(true),
        Some(existing) if existing == digest => Ok(false),
        Some(existing) => Err(StoreError::OfferConflict {
            obligation_id: id.clone(),
            existing,
            offered: digest,
        }),
    }
}

/// Returns `bytes` if they read `back` as `record`: a store never commits
/// a row it cannot load (one such row used to stop the whole
/// store from opening).
fn verified<R: PartialEq>(
    table: &'static str,
    k: &[u8],
    bytes: Vec<u8>,
    back: Result<R, StoreError>,
    record: &R,
) -> Result<Vec<u8>, StoreError> {
    checked(table, k, bytes, back.map(|b| b == *record))
}

/// Returns `bytes` if the row they decode to loads as the record
/// (`Ok(true)`), else why not.
fn checked(
    table: &'static str,
    k: &[u8],
    bytes: Vec<u8>,
    loads: Result<bool, StoreError>,
) -> Result<Vec<u8>, StoreError> {
    match loads {
        Ok(true) => Ok(bytes),
        Ok(false) => Err(unwritable(table, k, "the record reads back different")),
        Err(e) => Err(unwritable(table, k, e)),
    }
}

/// Encodes a pending row, proved to read back as the same record, with
/// its index facts.
fn pending_bytes(k: &[u8], p: &PendingRecord) -> Result<(Vec<u8>, Facts), StoreError> {
    const T: &str = "custody_pending";
    let row = PendingRow::of(p);
    let bytes = row.encode(T, k)?;
    // The stored bytes decode to a row that loads as `p`: checked on the
    // decoded row field by field, not by building a record.
    let loads = PendingRow::decode(T, k, &bytes).map(|(r, _)| r.rebuilds(k, p));
    Ok((checked(T, k, bytes, loads)?, Facts::pending(&row)))
}

/// Encodes a ledger row, proved to read back as the same record, with its
/// index facts.
fn ledger_bytes(k: &[u8], l: &LedgerRecord) -> Result<(Vec<u8>, Facts), StoreError> {
    const T: &str = "receiver_ledger";
    let row = LedgerRow::of(l);
    let bytes = to_bytes(T, k, &row)?;
    let loads = from_bytes::<LedgerRow>(T, k, &bytes).map(|r| r.rebuilds(k, l));
    Ok((checked(T, k, bytes, loads)?, Facts::ledger(&row)))
}

/// Encodes an intent row, proved to read back as the same record.
fn intent_bytes(k: &[u8], i: &IntentRecord) -> Result<Vec<u8>, StoreError> {
    const T: &str = "intents";
    let bytes = to_json(T, k, i)?;
    let back = from_json::<IntentRecord>(T, k, &bytes);
    verified(T, k, bytes, back, i)
}

fn update_pending(
    txn: &mut dyn Txn,
    id: &ObligationId,
    f: impl FnOnce(&mut PendingRow),
) -> Result<(), StoreError> {
    const T: &str = "custody_pending";
    let k = id.as_str().as_bytes();
    if let Some(b) = txn.get(Table::Pending, k)? {
        let (mut row, checked) = PendingRow::decode(T, k, &b)?;
        if !checked {
            // A row from before checksums: rewritten with one only once
            // it has been validated in full, so a damaged old row is
            // never blessed with a checksum.
            PendingRow::load(T, k, &b)?;
        }
        f(&mut row);
        txn.put_over(Table::Pending, k, Some(&b), &row.encode(T, k)?)?;
    }
    Ok(())
}

fn apply(txn: &mut dyn Txn, event: u64, r: &Record) -> Result<(), StoreError> {
    match r {
        Record::CustodyOpened { pending, principal } => {
            let id = pending.obligation.id();
            if offer_is_new(txn, id, pending.obligation.digest())? {
                // New: neither pending nor terminal (just read).
                let k = id.as_str().as_bytes();
                let (v, facts) = pending_bytes(k, pending)?;
                txn.put_known(Table::Pending, k, None, &v, facts)?;
                for w in principal {
                    put_principal(txn, w)?;
                }
            }
        }
        Record::AttemptMade {
            obligation_id,
            attempts,
            next_at,
        } => update_pending(txn, obligation_id, |p| {
            p.attempts = p.attempts.max(*attempts);
            p.next_at = next_at.unix_micros();
        })?,
        Record::DeferralSeen { obligation_id } => {
            update_pending(txn, obligation_id, |p| p.deferred = true)?
        }
        Record::CustodyClosed(c) => {
            // Custodian atomicity: terminal mark, safe(O) writes and the
            // escalation go into this one transaction, and a second close
            // finds the terminal mark and changes nothing.
            let k = c.obligation_id.as_str().as_bytes();
            // An id is pending or terminal, never both (a pending row is
            // only written for an id that is neither): the close of a
            // pending row needs no look for a terminal one.
            let was_pending = txn.del_pending(k, c.deadline_at.unix_micros())?;
            debug_assert!(
                !(was_pending && txn.contains(Table::Terminal, k)?),
                "an id both pending and terminal"
            );
            if was_pending || !txn.contains(Table::Terminal, k)? {
                for w in &c.principal {
                    put_principal(txn, w)?;
                }
                let escalation = match &c.escalation {
                    Some(e) => {
                        let ek = u64_key(event);
                        txn.put(Table::Escalations, &ek, &to_json("escalations", &ek, e)?)?;
                        Some(event)
                    }
                    None => None,
                };
                let row = TerminalRow::closed(c, escalation);
                let v = row.encode("custody_terminal", k)?;
                txn.put_known(Table::Terminal, k, None, &v, Facts::terminal(&row))?;
            }
        }
        Record::BestEffortSent { summary, principal } => {
            if offer_is_new(txn, &summary.obligation_id, summary.digest)? {
                let k = summary.obligation_id.as_str().as_bytes();
                let row = TerminalRow::of(summary, None);
                let v = row.encode("custody_terminal", k)?;
                txn.put_known(Table::Terminal, k, None, &v, Facts::terminal(&row))?;
                for w in principal {
                    put_principal(txn, w)?;
                }
            }
        }
        Record::Principal { writes, .. } => {
            for w in writes {
                put_principal(txn, w)?;
            }
        }
        Record::LateAck(rec) => {
            const T: &str = "custody_terminal";
            let k = rec.obligation_id.as_str().as_bytes();
            if let Some(b) = txn.get(Table::Terminal, k)? {
                let mut row = TerminalRow::decode(T, k, &b)?;
                if !row.late_ack_recorded {
                    row.late_ack_recorded = true;
                    row.reconciliation = Some(event);
                    let rk = u64_key(event);
                    txn.put(
                        Table::Reconciliations,
                        &rk,
                        &to_bytes("reconciliations", &rk, rec)?,
                    )?;
                    txn.put_over(Table::Terminal, k, Some(&b), &row.encode(T, k)?)?;
                }
            }
        }
        Record::Ledger(l) => {
            // Receiver atomicity (AB-3): effect, ledger entry and key
            // sequence in this one transaction; a decided entry is final.
            const T: &str = "receiver_ledger";
            let k = pair_key(&l.custodian, &l.obligation_id);
            let old = txn.get(Table::Ledger, &k)?;
            if let Some(b) = &old {
                let existing: LedgerRow = from_bytes(T, &k, b)?;
                if matches!(
                    existing.outcome,
                    LedgerOutcome::Applied | LedgerOutcome::Declined
                ) {
                    return Ok(());
                }
            }
            if l.outcome == LedgerOutcome::Applied {
                for w in &l.effect {
                    let ek = w.key.as_bytes();
                    txn.put(
                        Table::Effects,
                        ek,
                        &to_bytes("receiver_effects", ek, &EffectRow::of(&w.value))?,
                    )?;
                }
                if let Some((key, seq)) = &l.key_sequence {
                    let sk = key.as_str().as_bytes();
                    let v = (seq.0, l.obligation_id.as_str());
                    txn.put(
                        Table::KeySequences,
                        sk,
                        &to_bytes("receiver_key_sequences", sk, &v)?,
                    )?;
                }
            }
            if matches!(l.outcome, LedgerOutcome::Applied | LedgerOutcome::Declined) {
                txn.del(Table::Intents, &k)?;
            }
            // Nothing above wrote the ledger entry: `old` is still its value.
            let (v, facts) = ledger_bytes(&k, l)?;
            txn.put_known(Table::Ledger, &k, old.as_deref(), &v, facts)?;
        }
        Record::Intent(i) => {
            let k = pair_key(&i.custodian, i.obligation.id());
            txn.put(Table::Intents, &k, &intent_bytes(&k, i)?)?;
        }
    }
    Ok(())
}

/// Applies `batches` inside `txn` and appends their log events. The caller
/// commits the transaction (durably) only if this returns `Ok`.
pub(crate) fn commit(
    txn: &mut dyn Txn,
    now: Timestamp,
    batches: &[&[Record]],
) -> Result<Committed, StoreError> {
    // Every write of the records moves their indexes in this same
    // transaction (write-ahead: index and records are durable together).
    let mut indexed = crate::index::Indexed::new(txn);
    let c = commit_records(&mut indexed, now, batches)?;
    indexed.finish()?;
    Ok(c)
}

fn commit_records(
    txn: &mut dyn Txn,
    now: Timestamp,
    batches: &[&[Record]],
) -> Result<Committed, StoreError> {
    let first = next_event(txn.get(Table::Meta, META_NEXT_EVENT)?)?;
    let mut event = first;
    let mut records = 0;
    let mut log = Vec::new();
    for r in batches.iter().flat_map(|b| b.iter()) {
        apply(txn, event, r)?;
        log.push(LogEventRef::borrowed(r));
        event += 1;
        records += 1;
    }
    if event != first {
        // The commit's events, one row (an event block; see `EventRow`).
        let k = block_key(event - 1);
        let row = (now.unix_micros(), first, log);
        txn.put(Table::Events, &k, &to_bytes("events", &k, &row)?)?;
        txn.put(Table::Meta, META_NEXT_EVENT, &u64_key(event))?;
    }
    Ok(Committed {
        records,
        first_event: EventId(first),
        end_event: EventId(event),
    })
}

/// One decoded row of a data table.
enum Row {
    Pending(PendingRecord),
    Terminal(TerminalSummary),
    Principal(PrincipalWrite),
    Escalation(Escalation),
    Reconciliation(Reconciliation),
    Ledger(LedgerRecord),
    KeySequence(GovernedKey, Sequence, ObligationId),
    Effect(String, EffectValue),
    Intent((AgentId, ObligationId), IntentRecord),
    Event,
}

/// Decodes one row of a data table, validating it fully (the same checks
/// `load` relies on), or says why it is corrupt.
fn decode_row(t: Table, k: &[u8], b: &[u8], seen: &mut Shared) -> Result<Row, StoreError> {
    let name = t.name();
    Ok(match t {
        Table::Pending => Row::Pending(PendingRow::load_shared(name, k, b, seen)?),
        Table::Terminal => Row::Terminal(TerminalRow::decode(name, k, b)?.build(name, k)?),
        Table::Principal => Row::Principal(read_principal(k, b)?),
        Table::Escalations => Row::Escalation(from_json::<Escalation>(name, k, b)?),
        Table::Reconciliations => Row::Reconciliation(from_bytes::<Reconciliation>(name, k, b)?),
        Table::Ledger => Row::Ledger(from_bytes::<LedgerRow>(name, k, b)?.build(name, k)?),
        Table::KeySequences => {
            let (seq, oid): (u64, String) = from_bytes(name, k, b)?;
            Row::KeySequence(
                id::<GovernedKey>(name, k, k)?,
                Sequence(seq),
                id::<ObligationId>(name, k, oid.as_bytes())?,
            )
        }
        Table::Effects => {
            let key = std::str::from_utf8(k)
                .map_err(|e| corrupt(name, k, e))?
                .to_string();
            Row::Effect(key, from_bytes::<EffectRow>(name, k, b)?.build(name, k)?)
        }
        Table::Intents => Row::Intent(
            split_pair_key(name, k)?,
            from_json::<IntentRecord>(name, k, b)?,
        ),
        Table::Events => {
            EventRow::decode(k, b)?;
            Row::Event
        }
        Table::Meta | Table::Quarantine | Table::Index => {
            return Err(corrupt(name, k, "not a data table"));
        }
    })
}

/// Reads the durable state. The first row that does not decode fails the
/// load with [`StoreError::Corrupt`] naming it: nothing is misread or
/// skipped silently ([`check`] lists every such row, [`quarantine`] moves
/// them aside).
/// Most pending rows a load reserves room for ahead of reading them.
const PRESIZE_MAX: u64 = 1 << 24;

pub(crate) fn load(v: &dyn View) -> Result<DurableState, StoreError> {
    let mut c = CustodianSnapshot::default();
    let mut r = ReceiverSnapshot::default();
    // Sized once from the durable count: a million pending rows inserted
    // into a growing map rehash every entry ~20 times over (a fifth of a
    // recovery's CPU). Bounded, so a damaged counter cannot make
    // the load reserve more than the rows it may hold.
    let pending = crate::index::counter(v, crate::index::Counter::Pending)?;
    c.pending
        .reserve(usize::try_from(pending.min(PRESIZE_MAX)).unwrap_or(0));
    let mut seen = Shared::new();
    for t in Table::DATA {
        if t == Table::Events {
            // The log is read by `events`, not folded into the state.
            continue;
        }
        // Every row read is counted against the table's witness: a row the
        // engine no longer finds fails the load as surely as one that does
        // not decode.
        let mut found = crate::witness::Witness::default();
        let witnessed = crate::witness::witnessed(t);
        v.scan(t, &[], &mut |k, b| {
            if witnessed {
                found.add(t, k, b);
            }
            match decode_row(t, k, b, &mut seen)? {
                Row::Pending(p) => {
                    c.pending.insert(p.obligation.id().clone(), p);
                }
                Row::Terminal(s) => {
                    c.terminal.insert(s.obligation_id.clone(), s);
                }
                Row::Principal(w) => c.principal.push(w),
                Row::Escalation(e) => c.escalations.push(e),
                Row::Reconciliation(x) => c.reconciliations.push(x),
                Row::Ledger(l) => {
                    r.ledger
                        .insert((l.custodian.clone(), l.obligation_id.clone()), l);
                }
                Row::KeySequence(key, seq, oid) => {
                    r.key_sequences.insert(key, (seq, oid));
                }
                Row::Effect(key, value) => {
                    r.effects.insert(key, value);
                }
                Row::Intent(key, i) => {
                    r.intents.insert(key, i);
                }
                Row::Event => {}
            }
            Ok(true)
        })?;
        if witnessed {
            crate::witness::verify(v, t, found)?;
        }
    }
    c.damaged = damaged(v)?;
    r.damaged_before = match v.get(Table::Meta, META_RECEIVER_DAMAGED)? {
        None => None,
        Some(b) => {
            let micros = parse_u64_key("meta", &b)
                .map_err(|_| corrupt("meta", META_RECEIVER_DAMAGED, "not 8 bytes"))?;
            Some(Timestamp::from_unix_micros(
                i64::try_from(micros).unwrap_or(i64::MAX),
            ))
        }
    };
    Ok(DurableState {
        custodian: c,
        receiver: r,
        next_event: EventId(next_event(v.get(Table::Meta, META_NEXT_EVENT)?)?),
    })
}

/// The ids [`hand_over_damaged`] marked.
fn damaged(v: &dyn View) -> Result<std::collections::HashSet<ObligationId>, StoreError> {
    let mut out = std::collections::HashSet::new();
    v.scan(Table::Meta, META_DAMAGED, &mut |k, _| {
        let Some(id) = k.strip_prefix(META_DAMAGED) else {
            return Ok(false);
        };
        out.insert(self::id::<ObligationId>("meta", k, id)?);
        Ok(true)
    })?;
    Ok(out)
}

/// Hands custody a repair salvaged from damaged bytes back to the core as
/// custody it cannot prove (C-SD-4): each obligation is opened again (the
/// offer as its CRC-checked pending row stated it; a no-op for one still
/// held) and marked `damaged.<id>` in the same transaction, so the first
/// start after the repair escalates it with cause `store_damaged` and its
/// fail-safe (`Custodian::restore`). Returns the ids marked.
pub(crate) fn hand_over_damaged(
    txn: &mut dyn Txn,
    now: Timestamp,
    salvaged: Vec<PendingRecord>,
) -> Result<Vec<String>, StoreError> {
    let mut ids = Vec::with_capacity(salvaged.len());
    let mut records = Vec::with_capacity(salvaged.len());
    for p in salvaged {
        let id = p.obligation.id().clone();
        if held_digest(txn, &id)?.is_some() {
            continue;
        }
        ids.push(id.as_str().to_string());
        records.push(Record::CustodyOpened {
            pending: p,
            principal: Vec::new(),
        });
    }
    if records.is_empty() {
        return Ok(ids);
    }
    // Durable with the caller's transaction; nothing waits on a token.
    let _ = commit(txn, now, &[&records])?;
    for id in &ids {
        let mut k = META_DAMAGED.to_vec();
        k.extend_from_slice(id.as_bytes());
        txn.put(Table::Meta, &k, &[1])?;
    }
    Ok(ids)
}

/// Records that a repair read around damage at `now`: receiver rows
/// (ledger entries, key sequences, effects) may be gone with it, so the
/// receiver declines what it does not hold that was created before
/// (`ReceiverSnapshot::damaged_before`, C-SD-4).
pub(crate) fn mark_receiver_damaged(txn: &mut dyn Txn, now: Timestamp) -> Result<(), StoreError> {
    let micros = u64::try_from(now.unix_micros()).unwrap_or(0);
    txn.put(Table::Meta, META_RECEIVER_DAMAGED, &u64_key(micros))
}

/// A pending row salvaged from damaged bytes: its value decodes whole and
/// its own CRC checks (`None` otherwise).
pub(crate) fn salvage_pending(k: &[u8], v: &[u8]) -> Option<PendingRecord> {
    match decode_row(Table::Pending, k, v, &mut Shared::none()) {
        Ok(Row::Pending(p)) if p.obligation.id().as_str().as_bytes() == k => Some(p),
        _ => None,
    }
}

/// A stored entry that does not decode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CorruptRow {
    /// The table or tree.
    pub table: &'static str,
    /// The entry's key, printable.
    pub key: String,
    /// What is wrong with it.
    pub detail: String,
    /// The raw key.
    pub raw_key: Vec<u8>,
}

/// An entry moved aside by [`quarantine`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QuarantinedRow {
    /// The table it was in.
    pub table: String,
    /// Its key, printable.
    pub key: String,
    /// Why it was moved.
    pub detail: String,
    /// When it was moved.
    pub quarantined_at: Timestamp,
    /// Its raw key and value, verbatim.
    pub raw_key: Vec<u8>,
    /// The raw value.
    pub raw_value: Vec<u8>,
}

/// Every entry of every data table that does not decode. A storage fault
/// (not a decode failure) still fails the call.
pub(crate) fn check(v: &dyn View) -> Result<Vec<CorruptRow>, StoreError> {
    let mut bad = Vec::new();
    for t in Table::DATA {
        // The witness is checked against the rows that decode: an
        // undecodable one is named on its own (planted from outside, it
        // never was in the witness; damaged, its old bytes are unknown).
        let mut found = crate::witness::Witness::default();
        let mut undecodable = 0u64;
        v.scan(t, &[], &mut |k, b| {
            match decode_row(t, k, b, &mut Shared::none()) {
                Ok(_) => found.add(t, k, b),
                Err(StoreError::Corrupt { table, key, detail }) => {
                    undecodable += 1;
                    bad.push(CorruptRow {
                        table,
                        key,
                        detail,
                        raw_key: k.to_vec(),
                    })
                }
                Err(other) => return Err(other),
            }
            Ok(true)
        })?;
        if !crate::witness::witnessed(t) {
            continue;
        }
        let stored = crate::witness::read(v, t)?;
        if undecodable > 0 && stored.is_some_and(|w| w.rows() == found.rows() + undecodable) {
            // Every row the witness misses is one named above.
            continue;
        }
        if let Some(mut detail) = crate::witness::mismatch(t, stored, found) {
            if t == Table::Pending {
                let gone = missing_custody(v)?;
                if !gone.is_empty() {
                    detail.push_str(&format!(
                        "; opened in the event log and neither pending nor closed: {}",
                        gone.join(", ")
                    ));
                }
            }
            bad.push(CorruptRow {
                table: t.name(),
                key: crate::witness::WITNESS_LABEL.to_string(),
                detail,
                raw_key: crate::witness::meta_key(t),
            });
        }
    }
    Ok(bad)
}

/// The obligations whose custody the event log opened and never closed
/// but that have no pending row: custody a damaged store lost, named
/// while the events that opened it are inside the retention window.
fn missing_custody(v: &dyn View) -> Result<Vec<String>, StoreError> {
    let mut open = std::collections::BTreeSet::new();
    v.scan(Table::Events, &[], &mut |k, b| {
        // An event row that does not decode is reported on its own.
        let Ok(row) = EventRow::decode(k, b) else {
            return Ok(true);
        };
        for e in row.events {
            match e {
                LogEvent::CustodyOpened { obligation_id, .. } => {
                    open.insert(obligation_id);
                }
                LogEvent::CustodyClosed { obligation_id, .. } => {
                    open.remove(&obligation_id);
                }
                _ => {}
            }
        }
        Ok(true)
    })?;
    let mut gone = Vec::new();
    for id in open {
        if v.get(Table::Pending, id.as_str().as_bytes())?.is_none()
            && v.get(Table::Terminal, id.as_str().as_bytes())?.is_none()
        {
            gone.push(id.as_str().to_string());
        }
    }
    Ok(gone)
}

/// Moves the `bad` rows (from [`check`]) into the quarantine table, their
/// bytes verbatim, in one transaction. Every other row stays as it was.
pub(crate) fn quarantine(
    txn: &mut dyn Txn,
    now: Timestamp,
    bad: &[CorruptRow],
) -> Result<Vec<QuarantinedRow>, StoreError> {
    let mut out = Vec::with_capacity(bad.len());
    for row in bad {
        if row.key == crate::witness::WITNESS_LABEL {
            // Rows the witness says are gone cannot be moved: the stored
            // witness is kept here, with what is missing, and the rebuild
            // that follows vouches for the rows as they are.
            let value = txn.get(Table::Meta, &row.raw_key)?.unwrap_or_default();
            let q = QuarantinedRow {
                table: row.table.to_string(),
                key: row.key.clone(),
                detail: row.detail.clone(),
                quarantined_at: now,
                raw_key: row.raw_key.clone(),
                raw_value: value,
            };
            let mut qk = b"meta\0".to_vec();
            qk.extend_from_slice(&row.raw_key);
            txn.put(Table::Quarantine, &qk, &to_json("quarantine", &qk, &q)?)?;
            out.push(q);
            continue;
        }
        let t = Table::DATA
            .into_iter()
            .find(|t| t.name() == row.table)
            .ok_or_else(|| corrupt(row.table, &row.raw_key, "not a data table"))?;
        let Some(value) = txn.get(t, &row.raw_key)? else {
            continue;
        };
        let q = QuarantinedRow {
            table: row.table.to_string(),
            key: row.key.clone(),
            detail: row.detail.clone(),
            quarantined_at: now,
            raw_key: row.raw_key.clone(),
            raw_value: value,
        };
        let mut qk = row.table.as_bytes().to_vec();
        qk.push(0);
        qk.extend_from_slice(&row.raw_key);
        txn.put(Table::Quarantine, &qk, &to_json("quarantine", &qk, &q)?)?;
        txn.del(t, &row.raw_key)?;
        out.push(q);
    }
    // A corrupt row's index entries cannot be derived: the caller rebuilds
    // the indexes next, and an open after a crash in between does.
    if !out.is_empty() {
        txn.put(Table::Meta, META_INDEX_STALE, &[1])?;
    }
    Ok(out)
}

/// The rows moved aside so far.
pub(crate) fn quarantined(v: &dyn View) -> Result<Vec<QuarantinedRow>, StoreError> {
    let mut out = Vec::new();
    v.scan(Table::Quarantine, &[], &mut |k, b| {
        out.push(from_json::<QuarantinedRow>("quarantine", k, b)?);
        Ok(true)
    })?;
    Ok(out)
}

/// The key of the event block whose last event is `last`: the event id
/// (big-endian, so key order is id order) and a tag byte, which sets a
/// block apart from the one-event rows earlier builds wrote (8-byte keys)
/// and sorts it after any such row of the same id.
fn block_key(last: u64) -> [u8; 9] {
    let mut k = [BLOCK_TAG; 9];
    k[..8].copy_from_slice(&u64_key(last));
    k
}

/// The tag byte of an event block's key.
const BLOCK_TAG: u8 = 1;

/// One row of the event log. A commit writes its events as one block (one
/// write per commit instead of one per record: the log doubled
/// every write); rows of one event each, keyed by the bare id, are what
/// format 2 wrote before blocks and still read.
struct EventRow {
    /// When the commit happened.
    at: i64,
    /// The id of the first event.
    first: u64,
    /// The events, ids `first..`.
    events: Vec<LogEvent>,
}

impl EventRow {
    fn decode(k: &[u8], b: &[u8]) -> Result<Self, StoreError> {
        const T: &str = "events";
        match k.len() {
            8 => {
                let (at, event): (i64, LogEvent) = from_bytes(T, k, b)?;
                Ok(Self {
                    at,
                    first: parse_u64_key(T, k)?,
                    events: vec![event],
                })
            }
            9 if k[8] == BLOCK_TAG => {
                let last = parse_u64_key(T, &k[..8])?;
                let (at, first, events): (i64, u64, Vec<LogEvent>) = from_bytes(T, k, b)?;
                let n = u64::try_from(events.len()).unwrap_or(u64::MAX);
                if n == 0 || first.checked_add(n - 1) != Some(last) {
                    return Err(corrupt(
                        T,
                        k,
                        format!("a block of {n} events from {first} does not end at {last}"),
                    ));
                }
                Ok(Self { at, first, events })
            }
            _ => Err(corrupt(T, k, "not an event id or an event block key")),
        }
    }
}

/// Reads up to `limit` log events from `from`.
pub(crate) fn events(
    v: &dyn View,
    from: EventId,
    limit: usize,
) -> Result<Vec<StoredEvent>, StoreError> {
    let mut out = Vec::new();
    if limit == 0 {
        return Ok(out);
    }
    // A block is keyed by its last event: the scan from `from` starts at
    // the row holding `from` (a block whose last event is >= `from`).
    v.scan(Table::Events, &u64_key(from.0), &mut |k, b| {
        let row = EventRow::decode(k, b)?;
        let at = Timestamp::from_unix_micros(row.at);
        for (id, event) in (row.first..).zip(row.events) {
            if id < from.0 {
                continue;
            }
            out.push(StoredEvent {
                id: EventId(id),
                at,
                event,
            });
            if out.len() >= limit {
                return Ok(false);
            }
        }
        Ok(true)
    })?;
    Ok(out)
}

/// The deletions a compaction makes, read from a view before the write
/// transaction (the store has a single writer, so nothing changes between).
pub(crate) fn plan_compaction(
    v: &dyn View,
    now: Timestamp,
    retention: Duration,
) -> Result<(Deletions, Compacted), StoreError> {
    let mut dels = Vec::new();
    let mut out = Compacted::default();
    v.scan(Table::Terminal, &[], &mut |k, b| {
        let row = TerminalRow::decode("custody_terminal", k, b)?;
        if past_retention(Timestamp::from_unix_micros(row.deadline_at), now, retention) {
            dels.push((Table::Terminal, k.to_vec()));
            out.terminal += 1;
            if let Some(e) = row.escalation {
                dels.push((Table::Escalations, u64_key(e).to_vec()));
                out.escalations += 1;
            }
            if let Some(r) = row.reconciliation {
                dels.push((Table::Reconciliations, u64_key(r).to_vec()));
                out.reconciliations += 1;
            }
        }
        Ok(true)
    })?;
    v.scan(Table::Ledger, &[], &mut |k, b| {
        let row: LedgerRow = from_bytes("receiver_ledger", k, b)?;
        if matches!(
            row.outcome,
            LedgerOutcome::Applied | LedgerOutcome::Declined
        ) && past_retention(Timestamp::from_unix_micros(row.deadline_at), now, retention)
        {
            dels.push((Table::Ledger, k.to_vec()));
            out.ledger += 1;
        }
        Ok(true)
    })?;
    v.scan(Table::Events, &[], &mut |k, b| {
        let row = EventRow::decode(k, b)?;
        if past_retention(Timestamp::from_unix_micros(row.at), now, retention) {
            dels.push((Table::Events, k.to_vec()));
            out.events += row.events.len() as u64;
        }
        Ok(true)
    })?;
    Ok((dels, out))
}

/// Applies planned deletions.
pub(crate) fn delete(txn: &mut dyn Txn, dels: &[(Table, Vec<u8>)]) -> Result<(), StoreError> {
    let mut indexed = crate::index::Indexed::new(txn);
    for (t, k) in dels {
        indexed.del(*t, k)?;
    }
    indexed.finish()
}
