//! On-disk encoding of the core's records.
//!
//! Hot rows (pending custody, terminal summaries, ledger entries, effects,
//! events) are postcard-encoded mirrors of the core types: fixed field
//! order, timestamps as microseconds, digests as 32 raw bytes, obligations
//! as their immutable fields with the payload's canonical JSON. The core
//! types themselves use internally tagged enums, `flatten` and JSON
//! values, which a non-self-describing format cannot read back, so cold
//! rows (escalations, decision items, intents) are stored as JSON.
//! Every decode failure is a [`StoreError::Corrupt`] naming the table and
//! key; nothing read from disk can panic.

use std::borrow::Cow;
use std::collections::HashMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use abhyasa_core::custody::{
    ClosedRecord, EffectValue, EffectWrite, LedgerOutcome, LedgerRecord, PendingRecord,
    TerminalState, TerminalSummary,
};
use abhyasa_core::polarity::STANDARD_RATIONALES;
use abhyasa_core::principal::Authorization;
use abhyasa_core::store::StoreError;
use abhyasa_core::{
    AgentId, DeclineReason, Digest, GovernedKey, Kind, Obligation, ObligationBuilder, ObligationId,
    SafeAction, SafeEffect, Sequence, Timestamp,
};

/// Most distinct values of each identifier a load shares (see
/// [`Shared`]); past it, each further row keeps its own copy.
const SHARED_MAX: usize = 4096;

/// The identifiers a load has read so far, so the rows that repeat one
/// share a single copy: a million pending obligations of a few kinds, to
/// a few targets, hold a few copies of each, not a million (the
/// memory per pending obligation). Bounded by [`SHARED_MAX`] per field.
#[derive(Default)]
pub(crate) struct Shared {
    /// Off for a single row's decode: nothing to share it with.
    on: bool,
    kinds: HashMap<Box<str>, Kind>,
    targets: HashMap<Box<str>, AgentId>,
    keys: HashMap<Box<str>, GovernedKey>,
}

impl Shared {
    /// Shares identifiers across the rows of one load.
    pub(crate) fn new() -> Self {
        Self {
            on: true,
            ..Self::default()
        }
    }

    /// Shares nothing (one row read alone).
    pub(crate) fn none() -> Self {
        Self::default()
    }
}

/// `s` as a `T`, validated, shared with the rows before it that held it
/// (when `on`).
fn shared<T>(
    on: bool,
    seen: &mut HashMap<Box<str>, T>,
    table: &'static str,
    key: &[u8],
    s: &str,
) -> Result<T, StoreError>
where
    T: std::str::FromStr + Clone,
    T::Err: ToString,
{
    if !on {
        return id(table, key, s.as_bytes());
    }
    if let Some(v) = seen.get(s) {
        return Ok(v.clone());
    }
    let v: T = id(table, key, s.as_bytes())?;
    if seen.len() < SHARED_MAX {
        seen.insert(s.into(), v.clone());
    }
    Ok(v)
}

/// A printable form of a key for error messages.
pub(crate) fn show_key(key: &[u8]) -> String {
    String::from_utf8_lossy(key).replace('\0', "/")
}

pub(crate) fn corrupt(table: &'static str, key: &[u8], detail: impl ToString) -> StoreError {
    StoreError::Corrupt {
        table,
        key: show_key(key),
        detail: detail.to_string(),
    }
}

pub(crate) fn unwritable(table: &'static str, key: &[u8], detail: impl ToString) -> StoreError {
    StoreError::Unwritable {
        table,
        key: show_key(key),
        detail: detail.to_string(),
    }
}

/// Encodes a row with postcard.
pub(crate) fn to_bytes<T: Serialize>(
    table: &'static str,
    key: &[u8],
    v: &T,
) -> Result<Vec<u8>, StoreError> {
    to_bytes_in(table, key, v, Vec::with_capacity(ROW_BYTES))
}

/// Room for a typical row's fixed fields (a digest, ids, timestamps): the
/// encoder starts there instead of growing the buffer a few bytes at a
/// time (the reallocations showed in the commit profile).
const ROW_BYTES: usize = 160;

/// Encodes a row with postcard into `buf` (cleared first).
fn to_bytes_in<T: Serialize>(
    table: &'static str,
    key: &[u8],
    v: &T,
    mut buf: Vec<u8>,
) -> Result<Vec<u8>, StoreError> {
    buf.clear();
    postcard::to_extend(v, buf).map_err(|e| corrupt(table, key, format!("cannot encode: {e}")))
}

/// Decodes a postcard row.
pub(crate) fn from_bytes<'a, T: Deserialize<'a>>(
    table: &'static str,
    key: &[u8],
    b: &'a [u8],
) -> Result<T, StoreError> {
    postcard::from_bytes(b).map_err(|e| corrupt(table, key, e))
}

/// Encodes a cold row as JSON.
pub(crate) fn to_json<T: Serialize>(
    table: &'static str,
    key: &[u8],
    v: &T,
) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(v).map_err(|e| corrupt(table, key, format!("cannot encode: {e}")))
}

/// Decodes a JSON row.
pub(crate) fn from_json<T: DeserializeOwned>(
    table: &'static str,
    key: &[u8],
    b: &[u8],
) -> Result<T, StoreError> {
    serde_json::from_slice(b).map_err(|e| corrupt(table, key, e))
}

/// A UTF-8 identifier from a key or row, validated by its type.
pub(crate) fn id<T>(table: &'static str, key: &[u8], s: &[u8]) -> Result<T, StoreError>
where
    T: std::str::FromStr,
    T::Err: ToString,
{
    let s = std::str::from_utf8(s).map_err(|e| corrupt(table, key, e))?;
    s.parse()
        .map_err(|e: T::Err| corrupt(table, key, e.to_string()))
}

/// The `custodian \0 obligation id` key (identifiers never contain
/// control characters, so the separator is unambiguous).
pub(crate) fn pair_key(custodian: &AgentId, id: &ObligationId) -> Vec<u8> {
    let mut k = Vec::with_capacity(custodian.as_str().len() + 1 + id.as_str().len());
    k.extend_from_slice(custodian.as_str().as_bytes());
    k.push(0);
    k.extend_from_slice(id.as_str().as_bytes());
    k
}

/// Whether `key` is [`pair_key`]`(custodian, id)`, without building it.
pub(crate) fn is_pair_key(key: &[u8], custodian: &AgentId, id: &ObligationId) -> bool {
    let (c, id) = (custodian.as_str().as_bytes(), id.as_str().as_bytes());
    key.len() == c.len() + 1 + id.len()
        && key.starts_with(c)
        && key[c.len()] == 0
        && key.ends_with(id)
}

/// Parses a key made by [`pair_key`].
pub(crate) fn split_pair_key(
    table: &'static str,
    key: &[u8],
) -> Result<(AgentId, ObligationId), StoreError> {
    let at = key
        .iter()
        .position(|b| *b == 0)
        .ok_or_else(|| corrupt(table, key, "key lacks the custodian separator"))?;
    let custodian = id::<AgentId>(table, key, &key[..at])?;
    let oid = id::<ObligationId>(table, key, &key[at + 1..])?;
    Ok((custodian, oid))
}

/// An obligation's immutable fields. The strings borrow: from the
/// obligation when a row is written, from the stored bytes when one is
/// read (postcard writes `&str` and `String` alike), so neither writing a
/// row nor checking one copies its payload.
#[derive(Serialize, Deserialize)]
pub(crate) struct ObligationRow<'a> {
    id: &'a str,
    kind: &'a str,
    target: &'a str,
    payload: &'a str,
    deadline_seconds: u64,
    max_retries: u32,
    created_at: i64,
    sequence: Option<u64>,
}

impl<'a> ObligationRow<'a> {
    pub(crate) fn of(ob: &'a Obligation) -> Self {
        Self {
            id: ob.id().as_str(),
            kind: ob.kind().as_str(),
            target: ob.target().as_str(),
            payload: ob.payload().canonical_json(),
            deadline_seconds: ob.deadline_seconds(),
            max_retries: ob.max_retries(),
            created_at: ob.created_at().unix_micros(),
            sequence: ob.sequence().map(|s| s.0),
        }
    }

    /// Whether this row holds exactly `ob`'s immutable fields: the write
    /// path's read-back check. `ob` was validated when it was built, and
    /// its canonical payload parses back to the same payload (C-T-5, the
    /// builder refuses a number that would not), so equal fields rebuild
    /// `ob` on load without parsing, canonicalising and hashing it again
    /// on every commit.
    pub(crate) fn holds(&self, ob: &Obligation) -> bool {
        self.id == ob.id().as_str()
            && self.kind == ob.kind().as_str()
            && self.target == ob.target().as_str()
            && self.payload == ob.payload().canonical_json()
            && self.deadline_seconds == ob.deadline_seconds()
            && self.max_retries == ob.max_retries()
            && self.created_at == ob.created_at().unix_micros()
            && self.sequence == ob.sequence().map(|s| s.0)
    }

    /// `ob` if this row holds it (see [`ObligationRow::holds`]).
    #[cfg(test)]
    fn read_back(
        &self,
        ob: &Obligation,
        table: &'static str,
        key: &[u8],
    ) -> Result<Obligation, StoreError> {
        if self.holds(ob) {
            Ok(ob.clone())
        } else {
            Err(corrupt(table, key, "the obligation reads back different"))
        }
    }

    /// `b` with the fields both rebuilds set the same way: deadline,
    /// retries, creation time and sequence.
    fn scalars(
        &self,
        b: ObligationBuilder,
        table: &'static str,
        key: &[u8],
    ) -> Result<ObligationBuilder, StoreError> {
        let deadline = i64::try_from(self.deadline_seconds)
            .map_err(|_| corrupt(table, key, "deadline_seconds out of range"))?;
        let mut b = b
            .deadline_seconds(deadline)
            .max_retries(i64::from(self.max_retries))
            .created_at(Timestamp::from_unix_micros(self.created_at));
        if let Some(s) = self.sequence {
            b = b.sequence(s);
        }
        Ok(b)
    }

    /// Rebuilds the obligation from what this store wrote under a row
    /// checksum: the fields are checked as the builder checks them, the
    /// canonical payload and the digest are taken as written (no JSON
    /// parse, JCS or SHA-256 per row on recovery).
    fn build_stored(
        &self,
        digest: [u8; 32],
        table: &'static str,
        key: &[u8],
        seen: &mut Shared,
    ) -> Result<Obligation, StoreError> {
        let b = Obligation::builder()
            .with_id(id(table, key, self.id.as_bytes())?)
            .with_kind(shared(seen.on, &mut seen.kinds, table, key, self.kind)?)
            .with_target(shared(seen.on, &mut seen.targets, table, key, self.target)?);
        self.scalars(b, table, key)?
            .build_stored(self.payload.to_owned(), Digest(digest))
            .map_err(|e| corrupt(table, key, e))
    }

    /// Rebuilds the obligation (validating every field again).
    pub(crate) fn build(&self, table: &'static str, key: &[u8]) -> Result<Obligation, StoreError> {
        let payload: serde_json::Value = serde_json::from_str(self.payload)
            .map_err(|e| corrupt(table, key, format!("payload: {e}")))?;
        let b = Obligation::builder()
            .id(self.id)
            .kind(self.kind)
            .target(self.target)
            .payload(payload);
        self.scalars(b, table, key)?
            .build()
            .map_err(|e| corrupt(table, key, e))
    }
}

#[derive(Serialize, Deserialize)]
enum SafeEffectRow {
    FailClosed,
    DownWeight(f64),
}

/// `safe(O)`; its obligation id and target are stored only when they
/// differ from the obligation's, its rationale as [`stored_rationale`]
/// writes it.
#[derive(Serialize, Deserialize)]
struct SafeRow<'a> {
    effect: SafeEffectRow,
    key: &'a str,
    sequence: Option<u64>,
    #[serde(borrow)]
    rationale: Cow<'a, str>,
    obligation_id: Option<&'a str>,
    target: Option<&'a str>,
}

/// Marks a stored rationale that is not its own text (see
/// [`stored_rationale`]).
const RATIONALE_MARK: char = '\0';

/// The stored form of rationale `r`: a standard rationale (one of
/// [`STANDARD_RATIONALES`], ~100 bytes, in nearly every pending row) as
/// the mark and its index; other text as it is, with one more mark in
/// front if it starts with one. Rows written before (the text alone)
/// read the same way (a third of a pending row's bytes).
fn stored_rationale(r: &str) -> Cow<'_, str> {
    const MARKS: [&str; 3] = ["\u{0}0", "\u{0}1", "\u{0}2"];
    const _: () = assert!(MARKS.len() == STANDARD_RATIONALES.len());
    if let Some(i) = STANDARD_RATIONALES.iter().position(|s| *s == r) {
        if let Some(m) = MARKS.get(i) {
            return Cow::Borrowed(m);
        }
    }
    if r.starts_with(RATIONALE_MARK) {
        return Cow::Owned(format!("{RATIONALE_MARK}{r}"));
    }
    Cow::Borrowed(r)
}

/// What [`stored_rationale`] stored as `stored`: the standard text it
/// stands for, or its own text; `None` for a mark it never writes.
fn rationale_text(stored: &str) -> Option<RationaleText<'_>> {
    let Some(rest) = stored.strip_prefix(RATIONALE_MARK) else {
        return Some(RationaleText::Own(stored));
    };
    if rest.starts_with(RATIONALE_MARK) {
        return Some(RationaleText::Own(rest));
    }
    let i: usize = match rest.as_bytes() {
        [d @ b'0'..=b'9'] => usize::from(d - b'0'),
        _ => return None,
    };
    STANDARD_RATIONALES
        .get(i)
        .map(|s| RationaleText::Standard(s))
}

/// A stored rationale's text.
enum RationaleText<'a> {
    Standard(&'static str),
    Own(&'a str),
}

impl RationaleText<'_> {
    fn as_str(&self) -> &str {
        match self {
            RationaleText::Standard(s) => s,
            RationaleText::Own(s) => s,
        }
    }
}

impl<'a> SafeRow<'a> {
    fn of(s: &'a SafeAction, ob: &Obligation) -> Self {
        Self {
            effect: match s.effect {
                SafeEffect::FailClosed => SafeEffectRow::FailClosed,
                SafeEffect::DownWeight { magnitude } => SafeEffectRow::DownWeight(magnitude),
            },
            key: s.key.as_str(),
            sequence: s.sequence.map(|q| q.0),
            rationale: stored_rationale(&s.rationale),
            obligation_id: (&s.obligation_id != ob.id()).then(|| s.obligation_id.as_str()),
            target: (&s.target != ob.target()).then(|| s.target.as_str()),
        }
    }

    /// Whether [`SafeRow::build`] of this row, for `ob`, gives back `s`
    /// exactly (see [`PendingRow::rebuilds`]).
    fn rebuilds(&self, s: &SafeAction, ob: &Obligation) -> bool {
        let effect = match (&self.effect, &s.effect) {
            (SafeEffectRow::FailClosed, SafeEffect::FailClosed) => true,
            (SafeEffectRow::DownWeight(a), SafeEffect::DownWeight { magnitude }) => a == magnitude,
            _ => false,
        };
        effect
            && match self.obligation_id {
                Some(id) => id == s.obligation_id.as_str(),
                None => ob.id() == &s.obligation_id,
            }
            && match self.target {
                Some(t) => t == s.target.as_str(),
                None => ob.target() == &s.target,
            }
            && self.key == s.key.as_str()
            && self.sequence == s.sequence.map(|q| q.0)
            && rationale_text(&self.rationale).is_some_and(|r| r.as_str() == s.rationale)
    }

    fn build(
        self,
        ob: &Obligation,
        table: &'static str,
        key: &[u8],
        seen: &mut Shared,
    ) -> Result<SafeAction, StoreError> {
        Ok(SafeAction {
            obligation_id: match self.obligation_id {
                Some(s) => id::<ObligationId>(table, key, s.as_bytes())?,
                None => ob.id().clone(),
            },
            target: match self.target {
                Some(s) => id::<AgentId>(table, key, s.as_bytes())?,
                None => ob.target().clone(),
            },
            effect: match self.effect {
                SafeEffectRow::FailClosed => SafeEffect::FailClosed,
                SafeEffectRow::DownWeight(magnitude) => SafeEffect::DownWeight { magnitude },
            },
            key: shared(seen.on, &mut seen.keys, table, key, self.key)?,
            sequence: self.sequence.map(Sequence),
            rationale: match rationale_text(&self.rationale) {
                Some(RationaleText::Standard(r)) => Cow::Borrowed(r),
                Some(RationaleText::Own(r)) => SafeAction::rationale_of(r),
                None => return Err(corrupt(table, key, "unknown rationale mark")),
            },
        })
    }
}

/// A pending transfer, keyed by obligation id.
#[derive(Serialize, Deserialize)]
pub(crate) struct PendingRow<'a> {
    /// Checked against the rebuilt obligation on load.
    pub(crate) digest: [u8; 32],
    #[serde(borrow)]
    obligation: ObligationRow<'a>,
    #[serde(borrow)]
    safe: SafeRow<'a>,
    pub(crate) attempts: u32,
    pub(crate) next_at: i64,
    pub(crate) deferred: bool,
    offered_at: i64,
}

impl<'a> PendingRow<'a> {
    pub(crate) fn of(p: &'a PendingRecord) -> Self {
        Self {
            digest: p.obligation.digest().0,
            obligation: ObligationRow::of(&p.obligation),
            safe: SafeRow::of(&p.safe, &p.obligation),
            attempts: p.attempts,
            next_at: p.next_at.unix_micros(),
            deferred: p.deferred,
            offered_at: p.offered_at.unix_micros(),
        }
    }

    /// The absolute deadline, computed as `Obligation::deadline_at` does
    /// (`created_at + deadline`, saturating), without rebuilding the
    /// obligation.
    pub(crate) fn deadline_at_micros(&self) -> i64 {
        Timestamp::from_unix_micros(self.obligation.created_at)
            .saturating_add(std::time::Duration::from_secs(
                self.obligation.deadline_seconds,
            ))
            .unix_micros()
    }

    pub(crate) fn build(
        self,
        table: &'static str,
        key: &[u8],
    ) -> Result<PendingRecord, StoreError> {
        let obligation = self.obligation.build(table, key)?;
        self.finish(obligation, table, key, &mut Shared::none())
    }

    /// Encodes the row with its checksum: postcard, then the CRC-32 of
    /// those bytes (little-endian). [`PendingRow::decode`] trusts a row
    /// whose checksum holds without re-validating its obligation.
    pub(crate) fn encode(&self, table: &'static str, key: &[u8]) -> Result<Vec<u8>, StoreError> {
        let room = ROW_BYTES + self.obligation.payload.len() + self.safe.rationale.len() + 4;
        let mut v = to_bytes_in(table, key, self, Vec::with_capacity(room))?;
        let crc = crc32fast::hash(&v);
        v.extend_from_slice(&crc.to_le_bytes());
        Ok(v)
    }

    /// Decodes a row [`PendingRow::encode`] wrote, or one written before
    /// rows carried a checksum (format 2: postcard alone); the second flag
    /// says which.
    pub(crate) fn decode(
        table: &'static str,
        key: &[u8],
        b: &'a [u8],
    ) -> Result<(Self, bool), StoreError> {
        let (row, rest): (Self, &[u8]) =
            postcard::take_from_bytes(b).map_err(|e| corrupt(table, key, e))?;
        match rest.len() {
            0 => Ok((row, false)),
            4 => {
                let body = &b[..b.len() - 4];
                if crc32fast::hash(body).to_le_bytes() != rest {
                    return Err(corrupt(table, key, "row checksum does not match"));
                }
                Ok((row, true))
            }
            n => Err(corrupt(
                table,
                key,
                format!("{n} stray bytes after the row"),
            )),
        }
    }

    /// Decodes and rebuilds a stored row: under its checksum without
    /// re-validating the obligation, else (an unchecksummed row) by
    /// rebuilding and re-hashing it.
    pub(crate) fn load(
        table: &'static str,
        key: &[u8],
        b: &'a [u8],
    ) -> Result<PendingRecord, StoreError> {
        Self::load_shared(table, key, b, &mut Shared::none())
    }

    /// [`PendingRow::load`], sharing identifiers with the rows `seen`
    /// before it (a whole load).
    pub(crate) fn load_shared(
        table: &'static str,
        key: &[u8],
        b: &'a [u8],
        seen: &mut Shared,
    ) -> Result<PendingRecord, StoreError> {
        let (row, checked) = Self::decode(table, key, b)?;
        if !checked {
            return row.build(table, key);
        }
        let obligation = row.obligation.build_stored(row.digest, table, key, seen)?;
        row.finish(obligation, table, key, seen)
    }

    /// Whether this row, stored under `key`, loads as `p` exactly: the
    /// write path's check that a store never commits a row it cannot load
    /// back as the record it was given, made on the row the
    /// stored bytes decode to. Field by field, where a load would build a
    /// record and compare it: every identifier of `p` is already a
    /// validated one, so an equal string loads as an equal identifier.
    /// Agrees with [`PendingRow::read_back`] (a property below holds it
    /// to it), without allocating.
    pub(crate) fn rebuilds(&self, key: &[u8], p: &PendingRecord) -> bool {
        let ob = &p.obligation;
        self.digest == ob.digest().0
            && key == ob.id().as_str().as_bytes()
            && self.obligation.holds(ob)
            && self.safe.rebuilds(&p.safe, ob)
            && self.attempts == p.attempts
            && Timestamp::from_unix_micros(self.next_at) == p.next_at
            && self.deferred == p.deferred
            && Timestamp::from_unix_micros(self.offered_at) == p.offered_at
    }

    /// The record this row reads back as, given the obligation it was
    /// written from (the reference [`PendingRow::rebuilds`] is held to).
    #[cfg(test)]
    pub(crate) fn read_back(
        self,
        ob: &Obligation,
        table: &'static str,
        key: &[u8],
    ) -> Result<PendingRecord, StoreError> {
        let obligation = self.obligation.read_back(ob, table, key)?;
        self.finish(obligation, table, key, &mut Shared::none())
    }

    fn finish(
        self,
        obligation: Obligation,
        table: &'static str,
        key: &[u8],
        seen: &mut Shared,
    ) -> Result<PendingRecord, StoreError> {
        if obligation.digest().0 != self.digest {
            return Err(corrupt(
                table,
                key,
                "stored digest does not match the stored obligation",
            ));
        }
        if obligation.id().as_str().as_bytes() != key {
            return Err(corrupt(
                table,
                key,
                "key does not match the stored obligation id",
            ));
        }
        let safe = self.safe.build(&obligation, table, key, seen)?;
        Ok(PendingRecord {
            obligation,
            safe,
            attempts: self.attempts,
            next_at: Timestamp::from_unix_micros(self.next_at),
            deferred: self.deferred,
            offered_at: Timestamp::from_unix_micros(self.offered_at),
        })
    }
}

/// A finished transfer, keyed by obligation id, with the log positions of
/// its escalation and reconciliation items (compacted together). Stored
/// by [`TerminalRow::encode`]: the postcard fields, then the attempts.
#[derive(Serialize, Deserialize)]
pub(crate) struct TerminalRow<'a> {
    pub(crate) digest: [u8; 32],
    target: &'a str,
    state: TerminalState,
    pub(crate) deadline_at: i64,
    closed_at: i64,
    pub(crate) late_ack_recorded: bool,
    pub(crate) escalation: Option<u64>,
    pub(crate) reconciliation: Option<u64>,
    /// Written after the postcard fields (see [`TerminalRow::encode`]).
    #[serde(skip)]
    attempts: u32,
}

impl<'a> TerminalRow<'a> {
    pub(crate) fn of(t: &'a TerminalSummary, escalation: Option<u64>) -> Self {
        Self {
            digest: t.digest.0,
            target: t.target.as_str(),
            state: t.state,
            deadline_at: t.deadline_at.unix_micros(),
            closed_at: t.closed_at.unix_micros(),
            late_ack_recorded: t.late_ack_recorded,
            escalation,
            reconciliation: None,
            attempts: t.attempts,
        }
    }

    /// The row a close writes: the summary `TerminalSummary` would hold,
    /// read from the close record itself (no copy of its ids).
    pub(crate) fn closed(c: &'a ClosedRecord, escalation: Option<u64>) -> Self {
        Self {
            digest: c.digest.0,
            target: c.target.as_str(),
            state: c.outcome.state(),
            deadline_at: c.deadline_at.unix_micros(),
            closed_at: c.closed_at.unix_micros(),
            late_ack_recorded: false,
            escalation,
            reconciliation: None,
            attempts: c.attempts,
        }
    }

    /// Encodes the row: its postcard fields, then the attempts as a
    /// postcard varint. Rows written before the count was kept end after
    /// the fields ([`TerminalRow::decode`] reads them as 0, unknown); a
    /// build that predates the count reads a new row's fields and ignores
    /// the rest.
    pub(crate) fn encode(&self, table: &'static str, key: &[u8]) -> Result<Vec<u8>, StoreError> {
        let v = to_bytes(table, key, self)?;
        postcard::to_extend(&self.attempts, v)
            .map_err(|e| corrupt(table, key, format!("cannot encode: {e}")))
    }

    /// Decodes a row [`TerminalRow::encode`] wrote, or one without the
    /// attempts (0).
    pub(crate) fn decode(table: &'static str, key: &[u8], b: &'a [u8]) -> Result<Self, StoreError> {
        let (mut row, rest): (Self, &[u8]) =
            postcard::take_from_bytes(b).map_err(|e| corrupt(table, key, e))?;
        if !rest.is_empty() {
            let (attempts, rest): (u32, &[u8]) = postcard::take_from_bytes(rest)
                .map_err(|e| corrupt(table, key, format!("attempts: {e}")))?;
            if !rest.is_empty() {
                return Err(corrupt(
                    table,
                    key,
                    format!("{} stray bytes after the row", rest.len()),
                ));
            }
            row.attempts = attempts;
        }
        Ok(row)
    }

    /// How the transfer ended.
    pub(crate) fn state(&self) -> TerminalState {
        self.state
    }

    pub(crate) fn build(
        self,
        table: &'static str,
        key: &[u8],
    ) -> Result<TerminalSummary, StoreError> {
        Ok(TerminalSummary {
            obligation_id: id::<ObligationId>(table, key, key)?,
            digest: Digest(self.digest),
            target: id::<AgentId>(table, key, self.target.as_bytes())?,
            state: self.state,
            deadline_at: Timestamp::from_unix_micros(self.deadline_at),
            closed_at: Timestamp::from_unix_micros(self.closed_at),
            late_ack_recorded: self.late_ack_recorded,
            attempts: self.attempts,
        })
    }
}

/// A value of receiver-owned effect state.
#[derive(Serialize, Deserialize)]
pub(crate) enum EffectRow {
    Authorization(Authorization),
    Weight(f64),
    Json(String),
}

impl EffectRow {
    pub(crate) fn of(v: &EffectValue) -> Self {
        match v {
            EffectValue::Authorization(a) => Self::Authorization(*a),
            EffectValue::Weight(w) => Self::Weight(*w),
            EffectValue::Json(j) => Self::Json(j.to_string()),
        }
    }

    /// Whether [`EffectRow::build`] gives back `v` exactly. A JSON value
    /// is parsed back as a load parses it: its text is where a value
    /// could fail to round-trip (a float).
    fn rebuilds(&self, v: &EffectValue) -> bool {
        match (self, v) {
            (Self::Authorization(a), EffectValue::Authorization(b)) => a == b,
            (Self::Weight(a), EffectValue::Weight(b)) => a == b,
            (Self::Json(s), EffectValue::Json(j)) => {
                serde_json::from_str::<serde_json::Value>(s).is_ok_and(|back| back == *j)
            }
            _ => false,
        }
    }

    pub(crate) fn build(self, table: &'static str, key: &[u8]) -> Result<EffectValue, StoreError> {
        Ok(match self {
            Self::Authorization(a) => EffectValue::Authorization(a),
            Self::Weight(w) => EffectValue::Weight(w),
            Self::Json(s) => {
                EffectValue::Json(serde_json::from_str(&s).map_err(|e| corrupt(table, key, e))?)
            }
        })
    }
}

/// A receiver ledger entry, keyed by (custodian, obligation id).
#[derive(Serialize, Deserialize)]
pub(crate) struct LedgerRow<'a> {
    digest: [u8; 32],
    kind: &'a str,
    pub(crate) outcome: LedgerOutcome,
    reason: Option<DeclineReason>,
    detail: Option<&'a str>,
    #[serde(borrow)]
    effect: Vec<(&'a str, EffectRow)>,
    key_sequence: Option<(&'a str, u64)>,
    recorded_at: i64,
    pub(crate) deadline_at: i64,
    #[serde(borrow)]
    obligation: Option<ObligationRow<'a>>,
}

impl<'a> LedgerRow<'a> {
    pub(crate) fn of(l: &'a LedgerRecord) -> Self {
        Self {
            digest: l.digest.0,
            kind: l.kind.as_str(),
            outcome: l.outcome,
            reason: l.reason,
            detail: l.detail.as_deref(),
            effect: l
                .effect
                .iter()
                .map(|w| (w.key.as_str(), EffectRow::of(&w.value)))
                .collect(),
            key_sequence: l.key_sequence.as_ref().map(|(k, s)| (k.as_str(), s.0)),
            recorded_at: l.recorded_at.unix_micros(),
            deadline_at: l.deadline_at.unix_micros(),
            obligation: l.obligation.as_ref().map(ObligationRow::of),
        }
    }

    pub(crate) fn build(self, table: &'static str, key: &[u8]) -> Result<LedgerRecord, StoreError> {
        let obligation = match &self.obligation {
            Some(o) => Some(o.build(table, key)?),
            None => None,
        };
        self.finish(obligation, table, key)
    }

    /// Whether this row, stored under `key`, loads as `l` exactly (see
    /// [`PendingRow::rebuilds`]). Agrees with [`LedgerRow::read_back`].
    pub(crate) fn rebuilds(&self, key: &[u8], l: &LedgerRecord) -> bool {
        is_pair_key(key, &l.custodian, &l.obligation_id)
            && self.digest == l.digest.0
            && self.kind == l.kind.as_str()
            && self.outcome == l.outcome
            && self.reason == l.reason
            && self.detail == l.detail.as_deref()
            && self.effect.len() == l.effect.len()
            && self
                .effect
                .iter()
                .zip(&l.effect)
                .all(|((k, v), w)| *k == w.key && v.rebuilds(&w.value))
            && match (&self.key_sequence, &l.key_sequence) {
                (Some((k, s)), Some((key, seq))) => *k == key.as_str() && *s == seq.0,
                (None, None) => true,
                _ => false,
            }
            && Timestamp::from_unix_micros(self.recorded_at) == l.recorded_at
            && Timestamp::from_unix_micros(self.deadline_at) == l.deadline_at
            && match (&self.obligation, &l.obligation) {
                (Some(row), Some(ob)) => row.holds(ob),
                (None, None) => true,
                _ => false,
            }
    }

    /// The record this row reads back as, given the obligation it was
    /// written from (the reference [`LedgerRow::rebuilds`] is held to).
    #[cfg(test)]
    pub(crate) fn read_back(
        self,
        ob: Option<&Obligation>,
        table: &'static str,
        key: &[u8],
    ) -> Result<LedgerRecord, StoreError> {
        let obligation = match (&self.obligation, ob) {
            (Some(row), Some(ob)) => Some(row.read_back(ob, table, key)?),
            (None, None) => None,
            _ => return Err(corrupt(table, key, "the obligation reads back different")),
        };
        self.finish(obligation, table, key)
    }

    fn finish(
        self,
        obligation: Option<Obligation>,
        table: &'static str,
        key: &[u8],
    ) -> Result<LedgerRecord, StoreError> {
        let (custodian, obligation_id) = split_pair_key(table, key)?;
        let effect = self
            .effect
            .into_iter()
            .map(|(k, v)| {
                Ok(EffectWrite {
                    value: v.build(table, key)?,
                    key: k.to_owned(),
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let key_sequence = match self.key_sequence {
            Some((k, s)) => Some((id::<GovernedKey>(table, key, k.as_bytes())?, Sequence(s))),
            None => None,
        };
        Ok(LedgerRecord {
            custodian,
            obligation_id,
            digest: Digest(self.digest),
            kind: id::<Kind>(table, key, self.kind.as_bytes())?,
            outcome: self.outcome,
            reason: self.reason,
            detail: self.detail.map(str::to_owned),
            effect,
            key_sequence,
            recorded_at: Timestamp::from_unix_micros(self.recorded_at),
            deadline_at: Timestamp::from_unix_micros(self.deadline_at),
            obligation,
        })
    }
}

/// Big-endian `u64`, so byte order is numeric order.
pub(crate) fn u64_key(n: u64) -> [u8; 8] {
    n.to_be_bytes()
}

/// Parses a [`u64_key`].
pub(crate) fn parse_u64_key(table: &'static str, key: &[u8]) -> Result<u64, StoreError> {
    let b: [u8; 8] = key
        .try_into()
        .map_err(|_| corrupt(table, key, "expected an 8-byte key"))?;
    Ok(u64::from_be_bytes(b))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ob(id: &str, delta: f64, seq: Option<u64>) -> Obligation {
        try_ob(id, delta, seq).unwrap()
    }

    /// The test obligation, or `None` where the builder refuses it.
    fn try_ob(id: &str, delta: f64, seq: Option<u64>) -> Option<Obligation> {
        let mut b = Obligation::builder()
            .id(id)
            .kind("phala.belief_update")
            .target("receiver")
            .payload(
                serde_json::json!({"weight_delta": delta, "weight_key": "w", "note": "é\u{1F600}"}),
            )
            .deadline_seconds(600)
            .max_retries(9)
            .created_at(Timestamp::from_unix_seconds(1_780_000_000));
        if let Some(s) = seq {
            b = b.sequence(s);
        }
        b.build().ok()
    }

    // The write path's cheap read-back agrees with the full
    // rebuild load() does, and refuses a row of any other obligation.
    #[test]
    fn read_back_agrees_with_the_full_rebuild_and_refuses_another_obligation() {
        let a = ob("a", -0.9625043415580151, Some(3));
        let row = || ObligationRow::of(&a);
        assert!(row().holds(&a));
        assert_eq!(row().build("t", b"a").unwrap(), a);
        assert_eq!(row().read_back(&a, "t", b"a").unwrap(), a);
        for other in [
            ob("b", -0.9625043415580151, Some(3)),
            ob("a", -0.5, Some(3)),
            ob("a", -0.9625043415580151, None),
            ob("a", -0.9625043415580151, Some(4)),
        ] {
            assert!(!row().holds(&other), "{other:?}");
            assert!(row().read_back(&other, "t", b"a").is_err());
        }
    }

    fn pending(o: &Obligation) -> PendingRecord {
        PendingRecord {
            obligation: o.clone(),
            safe: SafeAction {
                obligation_id: o.id().clone(),
                target: o.target().clone(),
                effect: SafeEffect::DownWeight { magnitude: 0.5 },
                key: GovernedKey::new("w").unwrap(),
                sequence: o.sequence(),
                rationale: "fail safe".into(),
            },
            attempts: 3,
            next_at: Timestamp::from_unix_seconds(1_780_000_010),
            deferred: true,
            offered_at: Timestamp::from_unix_seconds(1_780_000_001),
        }
    }

    // Memory per pending: the rows of one load share one copy
    // of each kind, target and governed key; a row read alone shares
    // nothing; either way every row reads back exactly as written.
    #[test]
    fn a_load_shares_identifiers_across_its_rows() {
        let (a, b) = (ob("a", -0.5, Some(3)), ob("b", -0.25, None));
        let (pa, pb) = (pending(&a), pending(&b));
        let ra = PendingRow::of(&pa).encode("t", b"a").unwrap();
        let rb = PendingRow::of(&pb).encode("t", b"b").unwrap();
        let same = |x: &PendingRecord, y: &PendingRecord| {
            (
                std::ptr::eq(x.obligation.kind().as_str(), y.obligation.kind().as_str()),
                std::ptr::eq(
                    x.obligation.target().as_str(),
                    y.obligation.target().as_str(),
                ),
                std::ptr::eq(x.safe.key.as_str(), y.safe.key.as_str()),
            )
        };
        let mut seen = Shared::new();
        let la = PendingRow::load_shared("t", b"a", &ra, &mut seen).unwrap();
        let lb = PendingRow::load_shared("t", b"b", &rb, &mut seen).unwrap();
        assert_eq!((la.clone(), lb.clone()), (pa.clone(), pb.clone()));
        assert_eq!(same(&la, &lb), (true, true, true));
        let (la, lb) = (
            PendingRow::load("t", b"a", &ra).unwrap(),
            PendingRow::load("t", b"b", &rb).unwrap(),
        );
        assert_eq!((la.clone(), lb.clone()), (pa, pb));
        assert_eq!(same(&la, &lb), (false, false, false));
    }

    // A checksummed pending row loads without re-validating its
    // obligation, and still reads back exactly (digest, payload, fields);
    // a row from before checksums loads through the full rebuild.
    #[test]
    fn a_checksummed_row_loads_as_written_and_an_old_row_through_the_rebuild() {
        let a = ob("a", -0.9625043415580151, Some(3));
        let p = pending(&a);
        let bytes = PendingRow::of(&p).encode("t", b"a").unwrap();
        let back = PendingRow::load("t", b"a", &bytes).unwrap();
        assert_eq!(back, p);
        assert_eq!(back.obligation.digest(), a.digest());
        assert_eq!(back.obligation.payload().as_map(), a.payload().as_map());
        assert_eq!(
            back.obligation.payload().canonical_json(),
            a.payload().canonical_json()
        );
        let old = &bytes[..bytes.len() - 4];
        assert!(!PendingRow::decode("t", b"a", old).unwrap().1);
        assert_eq!(PendingRow::load("t", b"a", old).unwrap(), p);
    }

    // A standard rationale is stored as two bytes; a row that holds its
    // whole text (as rows did before) loads the same; a mark the writer
    // never uses is refused as damage, not read as text.
    #[test]
    fn a_standard_rationale_is_stored_as_its_index_and_old_rows_still_load() {
        let a = ob("a", 0.25, None);
        for (i, r) in STANDARD_RATIONALES.iter().enumerate() {
            let mut p = pending(&a);
            p.safe.rationale = Cow::Borrowed(r);
            let row = PendingRow::of(&p);
            assert_eq!(row.safe.rationale, format!("\u{0}{i}"));
            let bytes = row.encode("t", b"a").unwrap();
            let back = PendingRow::load("t", b"a", &bytes).unwrap();
            assert_eq!(back, p);
            assert!(matches!(back.safe.rationale, Cow::Borrowed(_)));

            let mut old = PendingRow::of(&p);
            old.safe.rationale = Cow::Borrowed(r);
            let old_bytes = old.encode("t", b"a").unwrap();
            assert_eq!(old_bytes.len(), bytes.len() + r.len() - 2);
            assert_eq!(PendingRow::load("t", b"a", &old_bytes).unwrap(), p);
        }
        let p = pending(&a);
        for text in ["\u{0}", "\u{0}9", "\u{0}x", "\u{0}12"] {
            let mut row = PendingRow::of(&p);
            row.safe.rationale = Cow::Borrowed(text);
            let bytes = row.encode("t", b"a").unwrap();
            let r = PendingRow::load("t", b"a", &bytes);
            assert!(
                matches!(r, Err(StoreError::Corrupt { .. })),
                "{text:?}: {r:?}"
            );
        }
    }

    // Any one damaged byte of a checksummed row fails its load with a
    // typed error (the checksum, or the full rebuild when the damage makes
    // it parse as an old row), and never panics; an old row whose payload
    // was altered is caught by its digest.
    #[test]
    fn every_damaged_byte_of_a_pending_row_is_refused() {
        let a = ob("a", 0.25, None);
        let bytes = PendingRow::of(&pending(&a)).encode("t", b"a").unwrap();
        for i in 0..bytes.len() {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut bad = bytes.clone();
                bad[i] ^= flip;
                assert!(
                    matches!(
                        PendingRow::load("t", b"a", &bad),
                        Err(StoreError::Corrupt { .. })
                    ),
                    "byte {i} ^ {flip:#x} was accepted"
                );
            }
        }
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(PendingRow::load("t", b"a", &extra).is_err());
        let old = bytes[..bytes.len() - 4].to_vec();
        let at = old.windows(4).position(|w| w == b"0.25").unwrap();
        let mut bad = old.clone();
        bad[at + 3] = b'6';
        match PendingRow::load("t", b"a", &bad) {
            Err(StoreError::Corrupt { detail, .. }) => {
                assert!(detail.contains("digest"), "{detail}")
            }
            other => panic!("an altered old row loaded: {other:?}"),
        }
    }

    mod rebuilds {
        //! The write path's field-by-field check ([`PendingRow::rebuilds`],
        //! [`LedgerRow::rebuilds`]) says yes exactly when building the
        //! stored row gives back the record ([`PendingRow::read_back`],
        //! [`LedgerRow::read_back`]): on the record written, and on records
        //! that differ from it in one field.
        use super::*;
        use abhyasa_core::custody::EffectWrite;
        use abhyasa_core::DeclineReason;
        use proptest::prelude::*;
        use proptest::sample::select;

        fn float() -> impl Strategy<Value = f64> {
            prop_oneof![
                any::<f64>(),
                Just(f64::NAN),
                Just(-0.0),
                Just(f64::INFINITY),
                Just(0.1),
                Just(-0.9625043415580151),
            ]
        }

        fn json() -> impl Strategy<Value = serde_json::Value> {
            prop_oneof![
                Just(serde_json::Value::Null),
                any::<i64>().prop_map(serde_json::Value::from),
                float().prop_map(|f| serde_json::json!(f)),
                "\\PC{0,8}".prop_map(serde_json::Value::from),
                (float(), "[a-z]{1,4}").prop_map(|(f, k)| serde_json::json!({ k: [f, true] })),
            ]
        }

        fn effect() -> impl Strategy<Value = EffectValue> {
            prop_oneof![
                select(vec![Authorization::Granted, Authorization::Withheld])
                    .prop_map(EffectValue::Authorization),
                float().prop_map(EffectValue::Weight),
                json().prop_map(EffectValue::Json),
            ]
        }

        fn obligation() -> impl Strategy<Value = Obligation> {
            (
                "[a-z0-9]{1,10}",
                float(),
                proptest::option::of(any::<u64>()),
            )
                .prop_filter_map("the builder refuses it", |(id, delta, seq)| {
                    try_ob(&id, delta, seq)
                })
        }

        fn ledger() -> impl Strategy<Value = LedgerRecord> {
            (
                (
                    select(vec!["custodian", "alice", "a.b-c_9"]),
                    "[a-z0-9-]{1,12}",
                    any::<[u8; 32]>(),
                    select(vec!["phala.belief_update", "anumati.consent"]),
                    select(vec![
                        LedgerOutcome::Applied,
                        LedgerOutcome::Declined,
                        LedgerOutcome::Deferred,
                        LedgerOutcome::OutcomeUnknown,
                    ]),
                    proptest::option::of(select(vec![
                        DeclineReason::Policy,
                        DeclineReason::Expired,
                        DeclineReason::Superseded,
                        DeclineReason::UnsupportedKind,
                        DeclineReason::Conflict,
                        DeclineReason::Unauthorized,
                    ])),
                ),
                (
                    proptest::option::of("\\PC{0,12}"),
                    prop::collection::vec(("\\PC{0,8}", effect()), 0..3),
                    proptest::option::of(("[a-z]{1,6}", any::<u64>())),
                    any::<i64>(),
                    any::<i64>(),
                    proptest::option::of(obligation()),
                ),
            )
                .prop_map(
                    |(
                        (c, id, digest, kind, outcome, reason),
                        (detail, effect, seq, rec, dl, ob),
                    )| {
                        LedgerRecord {
                            custodian: AgentId::new(c).unwrap(),
                            obligation_id: ObligationId::new(id).unwrap(),
                            digest: Digest(digest),
                            kind: Kind::new(kind).unwrap(),
                            outcome,
                            reason,
                            detail,
                            effect: effect
                                .into_iter()
                                .map(|(key, value)| EffectWrite { key, value })
                                .collect(),
                            key_sequence: seq
                                .map(|(k, s)| (GovernedKey::new(k).unwrap(), Sequence(s))),
                            recorded_at: Timestamp::from_unix_micros(rec),
                            deadline_at: Timestamp::from_unix_micros(dl),
                            obligation: ob,
                        }
                    },
                )
        }

        /// `l` with field `which` changed (`other` supplies new values).
        fn ledger_changed(l: &LedgerRecord, other: &LedgerRecord, which: usize) -> LedgerRecord {
            let mut m = l.clone();
            match which % 14 {
                0 => m.custodian = other.custodian.clone(),
                1 => m.obligation_id = other.obligation_id.clone(),
                2 => m.digest = other.digest,
                3 => m.kind = other.kind.clone(),
                4 => m.outcome = other.outcome,
                5 => m.reason = other.reason,
                6 => m.detail = other.detail.clone(),
                7 => m.effect = other.effect.clone(),
                8 => m.key_sequence = other.key_sequence.clone(),
                9 => m.recorded_at = other.recorded_at,
                10 => m.deadline_at = other.deadline_at,
                11 => m.obligation = other.obligation.clone(),
                12 => {
                    if let Some(w) = m.effect.first_mut() {
                        w.key.push('x');
                    }
                }
                _ => {
                    // Same keys, values of the same kinds where it can:
                    // a JSON value against another JSON value.
                    for (i, w) in m.effect.iter_mut().enumerate() {
                        w.value = match (&w.value, other.effect.get(i)) {
                            (_, Some(o)) => o.value.clone(),
                            (EffectValue::Json(_), None) => {
                                EffectValue::Json(serde_json::json!([i]))
                            }
                            (EffectValue::Weight(x), None) => EffectValue::Weight(x + 1.0),
                            (EffectValue::Authorization(_), None) => {
                                EffectValue::Json(serde_json::Value::Null)
                            }
                        };
                    }
                }
            }
            m
        }

        fn safe(ob: &Obligation) -> impl Strategy<Value = SafeAction> {
            let (id, target) = (ob.id().clone(), ob.target().clone());
            (
                prop_oneof![
                    Just(SafeEffect::FailClosed),
                    float().prop_map(|magnitude| SafeEffect::DownWeight { magnitude }),
                ],
                "[a-z]{1,6}",
                proptest::option::of(any::<u64>()),
                prop_oneof![
                    select(abhyasa_core::polarity::STANDARD_RATIONALES.to_vec())
                        .prop_map(std::borrow::Cow::Borrowed),
                    "\\PC{0,10}".prop_map(std::borrow::Cow::Owned),
                    // Texts that look like the stored marks.
                    "\u{0}{1,2}[0-9]{0,2}\\PC{0,3}".prop_map(std::borrow::Cow::Owned),
                ],
                any::<bool>(),
                any::<bool>(),
            )
                .prop_map(move |(effect, key, seq, rationale, own_id, own_target)| {
                    SafeAction {
                        obligation_id: if own_id {
                            id.clone()
                        } else {
                            ObligationId::new("other").unwrap()
                        },
                        target: if own_target {
                            target.clone()
                        } else {
                            AgentId::new("elsewhere").unwrap()
                        },
                        effect,
                        key: GovernedKey::new(key).unwrap(),
                        sequence: seq.map(Sequence),
                        rationale,
                    }
                })
        }

        fn pending() -> impl Strategy<Value = PendingRecord> {
            obligation().prop_flat_map(|ob| {
                (
                    safe(&ob),
                    any::<u32>(),
                    any::<i64>(),
                    any::<bool>(),
                    any::<i64>(),
                )
                    .prop_map(move |(safe, attempts, next, deferred, offered)| {
                        PendingRecord {
                            obligation: ob.clone(),
                            safe,
                            attempts,
                            next_at: Timestamp::from_unix_micros(next),
                            deferred,
                            offered_at: Timestamp::from_unix_micros(offered),
                        }
                    })
            })
        }

        fn pending_changed(
            p: &PendingRecord,
            other: &PendingRecord,
            which: usize,
        ) -> PendingRecord {
            let mut m = p.clone();
            match which % 11 {
                0 => m.obligation = other.obligation.clone(),
                1 => m.safe.effect = other.safe.effect,
                2 => m.safe.key = other.safe.key.clone(),
                3 => m.safe.sequence = other.safe.sequence,
                4 => m.safe.rationale = other.safe.rationale.clone(),
                5 => m.safe.obligation_id = other.safe.obligation_id.clone(),
                6 => m.safe.target = other.safe.target.clone(),
                7 => m.attempts = other.attempts,
                8 => m.next_at = other.next_at,
                9 => m.deferred = other.deferred,
                _ => m.offered_at = other.offered_at,
            }
            m
        }

        proptest! {
            #[test]
            fn ledger_rebuilds_agrees_with_the_full_read_back(
                l in ledger(),
                other in ledger(),
                which in 0usize..14,
            ) {
                const T: &str = "receiver_ledger";
                let k = pair_key(&l.custodian, &l.obligation_id);
                let bytes = to_bytes(T, &k, &LedgerRow::of(&l)).unwrap();
                let changed = ledger_changed(&l, &other, which);
                for want in [&l, &changed] {
                    let cheap = from_bytes::<LedgerRow>(T, &k, &bytes).unwrap().rebuilds(&k, want);
                    let full = from_bytes::<LedgerRow>(T, &k, &bytes)
                        .unwrap()
                        .read_back(want.obligation.as_ref(), T, &k)
                        .is_ok_and(|back| back == *want);
                    prop_assert_eq!(cheap, full, "{:?}", want);
                }
            }

            #[test]
            fn a_pending_row_loads_as_the_record_written(p in pending()) {
                // NaN is never equal to itself: no record holding one
                // compares equal to anything, its own load included.
                prop_assume!(
                    !matches!(p.safe.effect, SafeEffect::DownWeight { magnitude } if magnitude.is_nan())
                );
                const T: &str = "custody_pending";
                let k = p.obligation.id().as_str().as_bytes().to_vec();
                let bytes = PendingRow::of(&p).encode(T, &k).unwrap();
                prop_assert_eq!(PendingRow::load(T, &k, &bytes).unwrap(), p.clone());
                let (row, checked) = PendingRow::decode(T, &k, &bytes).unwrap();
                prop_assert!(checked);
                prop_assert!(row.rebuilds(&k, &p));
            }

            #[test]
            fn pending_rebuilds_agrees_with_the_full_read_back(
                p in pending(),
                other in pending(),
                which in 0usize..11,
            ) {
                const T: &str = "custody_pending";
                let k = p.obligation.id().as_str().as_bytes().to_vec();
                let bytes = PendingRow::of(&p).encode(T, &k).unwrap();
                let changed = pending_changed(&p, &other, which);
                for want in [&p, &changed] {
                    let (row, _) = PendingRow::decode(T, &k, &bytes).unwrap();
                    let cheap = row.rebuilds(&k, want);
                    let (row, _) = PendingRow::decode(T, &k, &bytes).unwrap();
                    let full = row
                        .read_back(&want.obligation, T, &k)
                        .is_ok_and(|back| back == *want);
                    prop_assert_eq!(cheap, full, "{:?}", want);
                }
            }
        }
    }

    mod terminal_rows {
        //! A terminal row keeps every field of its summary, attempts
        //! included; a row stored before the attempts were kept reads
        //! with 0 (unknown); anything after the attempts is refused; no
        //! bytes make the decoder panic.
        use super::*;
        use proptest::prelude::*;
        use proptest::sample::select;

        fn summary() -> impl Strategy<Value = TerminalSummary> {
            (
                "[a-z0-9-]{1,12}",
                any::<[u8; 32]>(),
                "[a-z0-9.]{1,12}",
                select(vec![
                    TerminalState::Applied,
                    TerminalState::Declined,
                    TerminalState::Escalated,
                    TerminalState::BestEffort,
                ]),
                (any::<i64>(), any::<i64>(), any::<bool>(), any::<u32>()),
            )
                .prop_map(
                    |(id, digest, target, state, (dl, closed, late, attempts))| TerminalSummary {
                        obligation_id: ObligationId::new(id).unwrap(),
                        digest: Digest(digest),
                        target: AgentId::new(target).unwrap(),
                        state,
                        deadline_at: Timestamp::from_unix_micros(dl),
                        closed_at: Timestamp::from_unix_micros(closed),
                        late_ack_recorded: late,
                        attempts,
                    },
                )
        }

        const T: &str = "custody_terminal";

        proptest! {
            #[test]
            fn a_terminal_row_round_trips_with_its_attempts(
                t in summary(),
                escalation in proptest::option::of(any::<u64>()),
                tail in proptest::collection::vec(any::<u8>(), 1..6),
            ) {
                let k = t.obligation_id.as_str().as_bytes().to_vec();
                let row = TerminalRow::of(&t, escalation);
                let bytes = row.encode(T, &k).unwrap();
                let back = TerminalRow::decode(T, &k, &bytes).unwrap();
                prop_assert_eq!(back.escalation, escalation);
                prop_assert_eq!(back.build(T, &k).unwrap(), t.clone());

                // A row as stored before the count: the fields alone.
                let old = to_bytes(T, &k, &row).unwrap();
                let back = TerminalRow::decode(T, &k, &old).unwrap().build(T, &k).unwrap();
                prop_assert_eq!(back, TerminalSummary { attempts: 0, ..t.clone() });

                // Stray bytes after the attempts are damage.
                let mut longer = bytes.clone();
                longer.extend_from_slice(&tail);
                let refused = matches!(
                    TerminalRow::decode(T, &k, &longer),
                    Err(StoreError::Corrupt { .. })
                );
                prop_assert!(refused, "{} stray bytes were read", tail.len());
            }

            #[test]
            fn a_terminal_row_decoder_never_panics(
                b in proptest::collection::vec(any::<u8>(), 0..120),
            ) {
                if let Ok(row) = TerminalRow::decode(T, b"k", &b) {
                    let _ = row.build(T, b"k");
                }
            }
        }
    }
}
