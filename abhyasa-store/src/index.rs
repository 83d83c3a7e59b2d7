//! Secondary indexes and durable counters of the paged reads (format
//! version 2).
//!
//! Every write to a table an index derives from goes through [`Indexed`],
//! a wrapper of the write transaction that reads the row's old value,
//! writes the new one and moves the derived index entries and counters by
//! the difference — in the same transaction as the record. So the indexes
//! can never disagree with the records, not even after a crash in the
//! middle of a commit (write-ahead: they are durable together or not at
//! all). [`rebuild`] derives them from the records alone: the migration of
//! a version-1 database and the repair after a quarantine.
//!
//! The `index` table holds keys only (empty values):
//!
//! | prefix | key                                   | one per                                   |
//! |--------|---------------------------------------|-------------------------------------------|
//! | `s`    | `s` state-byte obligation-id          | terminal summary (list by state)          |
//! | `c`    | `c` deadline obligation-id            | deferred transfer under custody           |
//! | `r`    | `r` deadline custodian `\0` id        | ledger entry `deferred` without an intent |
//!
//! Deadlines are microseconds with the sign bit flipped, big-endian, so
//! byte order is time order. The counters live in `meta`.

use abhyasa_core::custody::{LedgerOutcome, Reconciliation, TerminalState};
use abhyasa_core::model::AckStatus;
use abhyasa_core::store::{ListState, StoreError};

use crate::codec::{
    corrupt, from_bytes, parse_u64_key, u64_key, LedgerRow, PendingRow, TerminalRow,
};
use crate::engine::{Deletions, Table, Txn, View};

/// A durable counter kept in `meta`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Counter {
    /// Rows of `custody_pending`.
    Pending,
    /// Open decision items (`d` rows of `principal`).
    Decisions,
    /// Rows of `escalations`.
    Escalated,
    /// Reconciliation items whose late status is `applied`.
    LateApplied,
    /// Ledger entries `outcome_unknown`.
    OutcomeUnknown,
}

impl Counter {
    const ALL: [Counter; 5] = [
        Counter::Pending,
        Counter::Decisions,
        Counter::Escalated,
        Counter::LateApplied,
        Counter::OutcomeUnknown,
    ];

    fn key(self) -> &'static [u8] {
        match self {
            Counter::Pending => b"count.pending",
            Counter::Decisions => b"count.decisions",
            Counter::Escalated => b"count.escalated",
            Counter::LateApplied => b"count.late_applied",
            Counter::OutcomeUnknown => b"count.outcome_unknown",
        }
    }
}

/// Reads a counter (absent: 0).
pub(crate) fn counter(v: &dyn View, c: Counter) -> Result<u64, StoreError> {
    match v.get(Table::Meta, c.key())? {
        None => Ok(0),
        Some(b) => parse_u64_key("meta", &b),
    }
}

/// Index key prefixes.
pub(crate) const BY_STATE: u8 = b's';
/// Deferred transfers under custody, by deadline.
pub(crate) const CUSTODY_DEFERRED: u8 = b'c';
/// Ledger entries deferred without an intent, by deadline.
pub(crate) const LEDGER_DEFERRED: u8 = b'r';

/// The byte of a state in a `s` key.
pub(crate) fn state_byte(s: ListState) -> u8 {
    match s {
        ListState::Pending => b'p',
        ListState::Applied => b'a',
        ListState::Declined => b'd',
        ListState::Escalated => b'e',
        ListState::BestEffort => b'b',
    }
}

/// The `s` key prefix of one state.
pub(crate) fn state_prefix(s: ListState) -> [u8; 2] {
    [BY_STATE, state_byte(s)]
}

/// The `s` key of one state followed by `rest` (a terminal row's id, or
/// where a listing starts), built at its full length at once.
pub(crate) fn state_key(s: ListState, rest: &[u8]) -> Vec<u8> {
    let prefix = state_prefix(s);
    let mut k = Vec::with_capacity(prefix.len() + rest.len());
    k.extend_from_slice(&prefix);
    k.extend_from_slice(rest);
    k
}

/// Microseconds in byte order = time order.
pub(crate) fn time_key(micros: i64) -> [u8; 8] {
    ((micros as u64) ^ (1 << 63)).to_be_bytes()
}

/// The index entry of a deferred pending row: its obligation's deadline
/// and id.
pub(crate) fn deferred_custody_key(deadline_at: i64, id: &[u8]) -> Vec<u8> {
    deadline_key(CUSTODY_DEFERRED, deadline_at, id)
}

fn deadline_key(prefix: u8, micros: i64, rest: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + rest.len());
    k.push(prefix);
    k.extend_from_slice(&time_key(micros));
    k.extend_from_slice(rest);
    k
}

/// What one entity contributes to the indexes.
#[derive(Debug, Default, PartialEq)]
struct Derived {
    keys: Vec<Vec<u8>>,
    counts: Vec<Counter>,
}

/// What the indexes read from a row of `custody_pending`,
/// `custody_terminal` or `receiver_ledger`: taken from the typed row a
/// writer has just encoded ([`Txn::put_known`]), so the commit path does
/// not decode the row it wrote, or read back from stored bytes. Both
/// paths derive the index entries through the same functions below.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Facts {
    /// A pending row: deferred or not, and its absolute deadline.
    Pending { deferred: bool, deadline_at: i64 },
    /// A terminal summary: how custody ended.
    Terminal(TerminalState),
    /// A ledger entry: its outcome and the obligation's deadline.
    Ledger {
        outcome: LedgerOutcome,
        deadline_at: i64,
    },
}

impl Facts {
    pub(crate) fn pending(row: &PendingRow<'_>) -> Self {
        Facts::Pending {
            deferred: row.deferred,
            deadline_at: row.deadline_at_micros(),
        }
    }

    pub(crate) fn terminal(row: &TerminalRow<'_>) -> Self {
        Facts::Terminal(row.state())
    }

    pub(crate) fn ledger(row: &LedgerRow<'_>) -> Self {
        Facts::Ledger {
            outcome: row.outcome,
            deadline_at: row.deadline_at,
        }
    }

    /// The facts of stored bytes of table `t` (`None` for the tables
    /// without any).
    pub(crate) fn read(t: Table, k: &[u8], v: &[u8]) -> Result<Option<Self>, StoreError> {
        Ok(match t {
            Table::Pending => Some(Facts::pending(
                &PendingRow::decode("custody_pending", k, v)?.0,
            )),
            Table::Terminal => Some(Facts::terminal(&TerminalRow::decode(
                "custody_terminal",
                k,
                v,
            )?)),
            Table::Ledger => Some(Facts::ledger(&from_bytes::<LedgerRow>(
                "receiver_ledger",
                k,
                v,
            )?)),
            _ => None,
        })
    }
}

/// The contribution of a pending row or a terminal summary.
fn derive_facts(k: &[u8], f: Facts) -> Derived {
    let mut d = Derived::default();
    match f {
        Facts::Pending {
            deferred,
            deadline_at,
        } => {
            d.counts.push(Counter::Pending);
            if deferred {
                d.keys.push(deferred_custody_key(deadline_at, k));
            }
        }
        Facts::Terminal(st) => {
            d.keys.push(state_key(ListState::of(st), k));
        }
        // A ledger entry's contribution also depends on its intent.
        Facts::Ledger { .. } => {}
    }
    d
}

/// The contribution of a row of a single-row entity table.
fn derive_row(t: Table, k: &[u8], v: &[u8]) -> Result<Derived, StoreError> {
    let mut d = Derived::default();
    match t {
        Table::Pending | Table::Terminal => {
            if let Some(f) = Facts::read(t, k, v)? {
                d = derive_facts(k, f);
            }
        }
        Table::Escalations => d.counts.push(Counter::Escalated),
        Table::Reconciliations => {
            let rec: Reconciliation = from_bytes("reconciliations", k, v)?;
            if rec.status == AckStatus::Applied {
                d.counts.push(Counter::LateApplied);
            }
        }
        Table::Principal if k.first() == Some(&b'd') => d.counts.push(Counter::Decisions),
        _ => {}
    }
    Ok(d)
}

/// The contribution of ledger entry `k` given its row and whether an
/// intent is recorded for it.
fn derive_ledger(k: &[u8], ledger: Option<&[u8]>, intent: bool) -> Result<Derived, StoreError> {
    let facts = match ledger {
        Some(v) => Facts::read(Table::Ledger, k, v)?,
        None => None,
    };
    Ok(derive_ledger_facts(k, facts, intent))
}

fn derive_ledger_facts(k: &[u8], facts: Option<Facts>, intent: bool) -> Derived {
    let mut d = Derived::default();
    if let Some(Facts::Ledger {
        outcome,
        deadline_at,
    }) = facts
    {
        match outcome {
            LedgerOutcome::Deferred if !intent => {
                d.keys.push(deadline_key(LEDGER_DEFERRED, deadline_at, k));
            }
            LedgerOutcome::OutcomeUnknown => d.counts.push(Counter::OutcomeUnknown),
            _ => {}
        }
    }
    d
}

/// A write transaction that keeps the indexes in step with every write
/// (see the module docs). Call [`Indexed::finish`] before the commit.
pub(crate) struct Indexed<'a> {
    inner: &'a mut dyn Txn,
    deltas: [i64; 5],
    witness: crate::witness::Moves,
}

impl<'a> Indexed<'a> {
    pub(crate) fn new(inner: &'a mut dyn Txn) -> Self {
        Self {
            inner,
            deltas: [0; 5],
            witness: crate::witness::Moves::default(),
        }
    }

    fn entity(
        &mut self,
        t: Table,
        k: &[u8],
        v: Option<&[u8]>,
    ) -> Result<Option<Derived>, StoreError> {
        Ok(match t {
            Table::Pending
            | Table::Terminal
            | Table::Escalations
            | Table::Reconciliations
            | Table::Principal => Some(match v {
                Some(v) => derive_row(t, k, v)?,
                None => Derived::default(),
            }),
            Table::Ledger => {
                let intent = self.inner.contains(Table::Intents, k)?;
                Some(derive_ledger(k, v, intent)?)
            }
            Table::Intents => {
                let ledger = self.inner.get(Table::Ledger, k)?;
                Some(derive_ledger(k, ledger.as_deref(), v.is_some())?)
            }
            _ => None,
        })
    }

    fn moved(&mut self, before: Derived, after: Derived) -> Result<(), StoreError> {
        if before == after {
            return Ok(());
        }
        for k in &before.keys {
            if !after.keys.contains(k) {
                self.inner.del(Table::Index, k)?;
            }
        }
        for k in &after.keys {
            if !before.keys.contains(k) {
                self.inner.put(Table::Index, k, &[])?;
            }
        }
        for c in before.counts {
            self.deltas[c as usize] -= 1;
        }
        for c in after.counts {
            self.deltas[c as usize] += 1;
        }
        Ok(())
    }

    /// Writes the counters moved by this transaction.
    pub(crate) fn finish(self) -> Result<(), StoreError> {
        self.witness.finish(self.inner)?;
        for c in Counter::ALL {
            let delta = self.deltas[c as usize];
            if delta == 0 {
                continue;
            }
            let now = match self.inner.get(Table::Meta, c.key())? {
                None => 0,
                Some(b) => parse_u64_key("meta", &b)?,
            };
            let next = now.checked_add_signed(delta).ok_or_else(|| {
                corrupt(
                    "meta",
                    c.key(),
                    format!("counter {now} moved by {delta} leaves the u64 range"),
                )
            })?;
            self.inner.put(Table::Meta, c.key(), &u64_key(next))?;
        }
        Ok(())
    }
}

/// The tables whose rows move an index or a counter (`Indexed::entity`
/// is `Some` for them); writes to the others need no read of the old row.
fn derives(t: Table) -> bool {
    matches!(
        t,
        Table::Pending
            | Table::Terminal
            | Table::Escalations
            | Table::Reconciliations
            | Table::Principal
            | Table::Ledger
            | Table::Intents
    )
}

/// The `meta` keys of the counters a commit may move (a server-backed
/// store fetches them with the commit's other reads).
pub(crate) fn counter_keys() -> impl Iterator<Item = &'static [u8]> {
    Counter::ALL.into_iter().map(Counter::key)
}

impl Txn for Indexed<'_> {
    fn get(&mut self, t: Table, k: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(t, k)
    }

    fn contains(&mut self, t: Table, k: &[u8]) -> Result<bool, StoreError> {
        self.inner.contains(t, k)
    }

    fn put(&mut self, t: Table, k: &[u8], v: &[u8]) -> Result<(), StoreError> {
        if !derives(t) {
            if crate::witness::witnessed(t) {
                // Effects and key sequences: no index, but a witness,
                // which the old row moves (a server-backed store fetched
                // it with the commit's other reads, `kv::read_set`).
                let old = self.inner.get(t, k)?;
                self.inner.put(t, k, v)?;
                self.witness.row(t, k, old.as_deref(), Some(v));
                return Ok(());
            }
            // The log, the index itself: no old row to read (a read is a
            // round trip on a server-backed store).
            return self.inner.put(t, k, v);
        }
        let old = self.inner.get(t, k)?;
        self.put_over(t, k, old.as_deref(), v)
    }

    fn put_over(
        &mut self,
        t: Table,
        k: &[u8],
        old: Option<&[u8]>,
        v: &[u8],
    ) -> Result<(), StoreError> {
        if !derives(t) {
            self.inner.put(t, k, v)?;
            self.witness.row(t, k, old, Some(v));
            return Ok(());
        }
        if let Some(facts) = Facts::read(t, k, v)? {
            // Pending, terminal and ledger rows: one path, whether the
            // facts come from the bytes (here) or from the writer.
            return self.put_known(t, k, old, v, facts);
        }
        // The caller's promise, checked wherever debug assertions are on
        // (the storage suite): a wrong `old` would move the wrong index
        // entries and counters.
        debug_assert!(
            self.inner.get(t, k)?.as_deref() == old,
            "put_over on {} with a stale old value",
            t.name()
        );
        let before = self.entity(t, k, old)?.unwrap_or_default();
        let after = self.entity(t, k, Some(v))?.unwrap_or_default();
        self.inner.put(t, k, v)?;
        self.witness.row(t, k, old, Some(v));
        self.moved(before, after)
    }

    fn put_known(
        &mut self,
        t: Table,
        k: &[u8],
        old: Option<&[u8]>,
        v: &[u8],
        facts: Facts,
    ) -> Result<(), StoreError> {
        // The caller's promises, checked wherever debug assertions are on
        // (the storage suite): `old` is the stored row (a wrong one would
        // move the wrong index entries and counters) and `facts` are
        // those of `v`.
        debug_assert!(
            self.inner.get(t, k)?.as_deref() == old,
            "put_known on {} with a stale old value",
            t.name()
        );
        debug_assert_eq!(
            Facts::read(t, k, v)?,
            Some(facts),
            "put_known on {} with facts that are not the row's",
            t.name()
        );
        let (before, after) = match t {
            Table::Ledger => {
                // Both sides of a ledger entry depend on the same intent,
                // which this write does not touch: read it once.
                let intent = self.inner.contains(Table::Intents, k)?;
                (
                    derive_ledger(k, old, intent)?,
                    derive_ledger_facts(k, Some(facts), intent),
                )
            }
            Table::Pending | Table::Terminal => (
                match old {
                    Some(old) => derive_row(t, k, old)?,
                    None => Derived::default(),
                },
                derive_facts(k, facts),
            ),
            // A table without facts (`Facts::read` gives `None`, so this
            // does not come back here).
            _ => return self.put_over(t, k, old, v),
        };
        self.inner.put(t, k, v)?;
        self.witness.row(t, k, old, Some(v));
        self.moved(before, after)
    }

    fn del_pending(&mut self, k: &[u8], deadline_at: i64) -> Result<bool, StoreError> {
        const T: Table = Table::Pending;
        // The caller's promise, checked wherever debug assertions are on:
        // a wrong deadline would leave a deferred row's index entry behind.
        #[cfg(debug_assertions)]
        let old = self
            .inner
            .get(T, k)?
            .map(|old| Facts::read(T, k, &old))
            .transpose()?
            .flatten();
        // Whether the row was there, not what it says: the deadline gives
        // its index entries (a pending row's obligation is a long value the
        // log store would otherwise read back from disk).
        if !self.inner.del_found(T, k)? {
            return Ok(false);
        }
        // A pending row's value is not part of its witness.
        self.witness.row(T, k, Some(&[]), None);
        // A pending row is indexed under its deadline only while deferred.
        let deferred = self
            .inner
            .contains(Table::Index, &deferred_custody_key(deadline_at, k))?;
        let facts = Facts::Pending {
            deferred,
            deadline_at,
        };
        #[cfg(debug_assertions)]
        debug_assert_eq!(
            old,
            Some(facts),
            "del_pending with a deadline that is not the row's"
        );
        self.moved(derive_facts(k, facts), Derived::default())?;
        Ok(true)
    }

    fn del(&mut self, t: Table, k: &[u8]) -> Result<(), StoreError> {
        if !derives(t) {
            if crate::witness::witnessed(t) {
                if let Some(old) = self.inner.get(t, k)? {
                    self.inner.del(t, k)?;
                    self.witness.row(t, k, Some(&old), None);
                }
                return Ok(());
            }
            return self.inner.del(t, k);
        }
        let old = if t == Table::Intents {
            // An intent's index entries depend on whether it is there,
            // not on its bytes (a whole obligation, which the log store
            // would read back from disk); its witness does, so one that
            // is there is read.
            if self.inner.contains(t, k)? {
                self.inner.get(t, k)?
            } else {
                None
            }
        } else {
            self.inner.get(t, k)?
        };
        let Some(old) = old else {
            return Ok(());
        };
        let before = self.entity(t, k, Some(&old))?;
        self.inner.del(t, k)?;
        self.witness.row(t, k, Some(&old), None);
        if let Some(before) = before {
            let after = self.entity(t, k, None)?.unwrap_or_default();
            self.moved(before, after)?;
        }
        Ok(())
    }
}

/// The indexes and counters derived from the records of `v` alone, as the
/// writes that replace whatever the index table and counters hold now.
pub(crate) struct Rebuild {
    stale: Deletions,
    keys: Vec<Vec<u8>>,
    counts: [u64; 5],
    witnesses: Vec<(Table, crate::witness::Witness)>,
    /// Rows that did not decode were left out: the indexes stay marked
    /// stale, so the open after their quarantine derives them again.
    pub(crate) skipped: bool,
}

/// A row's contribution, or `None` (and `skipped`) when it does not decode:
/// a damaged row must not stop the store from opening for repair.
fn lenient(
    d: Result<Derived, StoreError>,
    skipped: &mut bool,
) -> Result<Option<Derived>, StoreError> {
    match d {
        Ok(d) => Ok(Some(d)),
        Err(StoreError::Corrupt { .. }) => {
            *skipped = true;
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Derives every index entry and counter from the records (a full scan:
/// only for migration and after a quarantine).
pub(crate) fn plan_rebuild(v: &dyn View) -> Result<Rebuild, StoreError> {
    let mut out = Rebuild {
        stale: Vec::new(),
        keys: Vec::new(),
        counts: [0; 5],
        witnesses: Vec::new(),
        skipped: false,
    };
    // The witnesses of the rows as they are now: a rebuild (after an
    // explicit quarantine, or a migration) vouches for what is there.
    for t in crate::witness::WITNESSED {
        let mut w = crate::witness::Witness::default();
        v.scan(t, &[], &mut |k, b| {
            w.add(t, k, b);
            Ok(true)
        })?;
        out.witnesses.push((t, w));
    }
    v.scan(Table::Index, &[], &mut |k, _| {
        out.stale.push((Table::Index, k.to_vec()));
        Ok(true)
    })?;
    let add = |d: Derived, out: &mut Rebuild| {
        out.keys.extend(d.keys);
        for c in d.counts {
            out.counts[c as usize] += 1;
        }
    };
    for t in [
        Table::Pending,
        Table::Terminal,
        Table::Escalations,
        Table::Reconciliations,
        Table::Principal,
    ] {
        let mut rows = Vec::new();
        let mut skipped = false;
        v.scan(t, &[], &mut |k, b| {
            rows.extend(lenient(derive_row(t, k, b), &mut skipped)?);
            Ok(true)
        })?;
        out.skipped |= skipped;
        for d in rows {
            add(d, &mut out);
        }
    }
    let mut ledger = Vec::new();
    v.scan(Table::Ledger, &[], &mut |k, b| {
        ledger.push((k.to_vec(), b.to_vec()));
        Ok(true)
    })?;
    for (k, b) in ledger {
        let intent = v.get(Table::Intents, &k)?.is_some();
        if let Some(d) = lenient(derive_ledger(&k, Some(&b), intent), &mut out.skipped)? {
            add(d, &mut out);
        }
    }
    Ok(out)
}

/// Writes a planned rebuild (on a raw transaction: it replaces the
/// indexes wholesale).
pub(crate) fn write_rebuild(txn: &mut dyn Txn, r: &Rebuild) -> Result<(), StoreError> {
    for (t, k) in &r.stale {
        txn.del(*t, k)?;
    }
    for k in &r.keys {
        txn.put(Table::Index, k, &[])?;
    }
    for c in Counter::ALL {
        txn.put(Table::Meta, c.key(), &u64_key(r.counts[c as usize]))?;
    }
    for (t, w) in &r.witnesses {
        crate::witness::write(txn, *t, *w)?;
    }
    Ok(())
}
