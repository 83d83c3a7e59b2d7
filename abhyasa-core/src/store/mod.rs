//! Durable custody: the [`Store`] trait every backend implements, the state
//! it recovers, and [`SimStore`], the in-memory store of the simulator and
//! the model checker.
//!
//! # Contract
//!
//! A store commits the [`Record`]s the state machines emit, **in batches**:
//! one [`Store::commit`] call makes every record it carries durable with one
//! flush, atomically (all or nothing), in order. A call may carry the
//! records of many obligations and of both the custodian and the receiver
//! of a node (group commit). Only after it returns `Ok` may the driver hand
//! the batches' tokens to `handle_committed` (AB-1: nothing that depends on a
//! record is sent before the record is durable).
//!
//! [`Store::load`] returns the durable state as [`CustodianSnapshot`] and
//! [`ReceiverSnapshot`], ready for `Custodian::restore` and
//! `Receiver::restore`. What it returns is the fold of every committed
//! record ([`CustodianSnapshot::apply`], [`ReceiverSnapshot::apply`]), with
//! these rules, which every backend keeps and the shared storage suite
//! checks:
//!
//! * **Idempotent offers.** A `CustodyOpened` or `BestEffortSent` for an id
//!   that is already pending or terminal is a no-op when the digest is the
//!   same (the existing record stands: attempts and deadline are not reset)
//!   and refuses the whole commit with [`StoreError::OfferConflict`] when it
//!   differs. Nothing is ever overwritten by a re-offer.
//! * **Terminal is final.** The first `CustodyClosed` of an id applies its
//!   principal-side writes (`safe(O)`) and stores its escalation; a later
//!   one changes nothing, so a fail-safe is never applied twice and no
//!   transfer escalates twice.
//! * **Decided ledger entries are final.** A `Ledger` record for a
//!   (custodian, id) already `applied` or `declined` changes nothing; its
//!   effect and key sequence are written in the same commit as the entry
//!   (AB-3).
//! * **Principal state is kept folded**: one write per governed key and one
//!   item per open decision, so the `principal` list of a loaded snapshot
//!   is not the raw write history but restores the same state.
//!
//! Every committed record also appends one [`StoredEvent`] to an
//! append-only event log with monotonic [`EventId`]s.
//!
//! # Retention
//!
//! [`Store::compact`] drops terminal summaries (with their escalation and
//! reconciliation items) and decided ledger entries whose absolute deadline
//! is more than `retention` before `now`, and log events older than
//! `retention`. Pending custody, undecided ledger entries, intents, key
//! sequences, effect state and open decisions are never compacted. Inside
//! the window a redelivery is re-acked from the ledger; after it the
//! obligation is past its deadline and the receiver declines it `expired`,
//! so compaction never enables a second application.
//! [`DEFAULT_RETENTION`] is seven days.

mod read;
mod sim;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

pub use read::{page_limit, EscalationEntry, ListState, Listed, Page, UnknownListState, MAX_PAGE};
pub use sim::{CrashTiming, SimStore};

use crate::custody::{CustodianSnapshot, LedgerOutcome, ReceiverSnapshot, Record, TerminalState};
use crate::model::{AckStatus, AgentId, Digest, ObligationId, Timestamp};
use crate::principal::{DecisionItem, PrincipalState, PrincipalWrite, WeightRange};

/// The format version of the in-memory [`SimStore`] and the baseline of the
/// record encoding. Each backend reports its own on-disk layout version
/// through [`Store::format_version`] (the embedded stores of
/// `abhyasa-store` are at their own version 2, which added the indexes of
/// the paged reads).
pub const FORMAT_VERSION: u32 = 1;

/// Default retention past each record's deadline: seven days.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Position in a store's append-only event log. Ids are assigned in commit
/// order, start at 0 and are never reused, even after compaction.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct EventId(pub u64);

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What one committed record did, as the event log remembers it.
///
/// Generic over how it holds its ids only so that [`LogEventRef`], the
/// same event borrowing them from its record, is the same type: a commit
/// encodes its events without copying an id (each copy is an atomic write
/// to a cache line the driver that made the record is using),
/// and what it writes is what a `LogEvent` reads back, by construction.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum LogEvent<O = ObligationId, A = AgentId> {
    /// Custody opened (or an idempotent re-offer of the same obligation).
    CustodyOpened {
        /// The obligation.
        obligation_id: O,
        /// Its target.
        target: A,
        /// Its absolute deadline.
        deadline_at: Timestamp,
    },
    /// A retry was counted.
    AttemptMade {
        /// The obligation.
        obligation_id: O,
        /// Attempts made including this one.
        attempts: u32,
    },
    /// The receiver answered `deferred` (first time).
    DeferralSeen {
        /// The obligation.
        obligation_id: O,
    },
    /// Custody ended.
    CustodyClosed {
        /// The obligation.
        obligation_id: O,
        /// How.
        state: TerminalState,
    },
    /// A best-effort send.
    BestEffortSent {
        /// The obligation.
        obligation_id: O,
    },
    /// Principal decisions or resolutions.
    Principal {
        /// Number of writes.
        writes: u32,
    },
    /// A late ack recorded for reconciliation.
    LateAck {
        /// The obligation.
        obligation_id: O,
        /// Its status.
        status: AckStatus,
    },
    /// A receiver ledger entry.
    Ledger {
        /// The custodian.
        custodian: A,
        /// The obligation.
        obligation_id: O,
        /// The verdict.
        outcome: LedgerOutcome,
    },
    /// An external-effect intent.
    Intent {
        /// The custodian.
        custodian: A,
        /// The obligation.
        obligation_id: O,
    },
}

/// A [`LogEvent`] borrowing its ids from the record it describes.
pub type LogEventRef<'a> = LogEvent<&'a ObligationId, &'a AgentId>;

impl LogEvent {
    /// The event a record appends to the log.
    pub fn of(record: &Record) -> Self {
        LogEventRef::borrowed(record).into_owned()
    }
}

impl<'a> LogEventRef<'a> {
    /// The event `record` appends to the log, borrowing its ids.
    pub fn borrowed(record: &'a Record) -> Self {
        match record {
            Record::CustodyOpened { pending, .. } => LogEvent::CustodyOpened {
                obligation_id: pending.obligation.id(),
                target: pending.obligation.target(),
                deadline_at: pending.obligation.deadline_at(),
            },
            Record::AttemptMade {
                obligation_id,
                attempts,
                ..
            } => LogEvent::AttemptMade {
                obligation_id,
                attempts: *attempts,
            },
            Record::DeferralSeen { obligation_id } => LogEvent::DeferralSeen { obligation_id },
            Record::CustodyClosed(c) => LogEvent::CustodyClosed {
                obligation_id: &c.obligation_id,
                state: c.outcome.state(),
            },
            Record::BestEffortSent { summary, .. } => LogEvent::BestEffortSent {
                obligation_id: &summary.obligation_id,
            },
            Record::Principal { writes, .. } => LogEvent::Principal {
                writes: u32::try_from(writes.len()).unwrap_or(u32::MAX),
            },
            Record::LateAck(r) => LogEvent::LateAck {
                obligation_id: &r.obligation_id,
                status: r.status,
            },
            Record::Ledger(l) => LogEvent::Ledger {
                custodian: &l.custodian,
                obligation_id: &l.obligation_id,
                outcome: l.outcome,
            },
            Record::Intent(i) => LogEvent::Intent {
                custodian: &i.custodian,
                obligation_id: i.obligation.id(),
            },
        }
    }

    /// The same event holding its own ids.
    pub fn into_owned(self) -> LogEvent {
        match self {
            LogEvent::CustodyOpened {
                obligation_id,
                target,
                deadline_at,
            } => LogEvent::CustodyOpened {
                obligation_id: obligation_id.clone(),
                target: target.clone(),
                deadline_at,
            },
            LogEvent::AttemptMade {
                obligation_id,
                attempts,
            } => LogEvent::AttemptMade {
                obligation_id: obligation_id.clone(),
                attempts,
            },
            LogEvent::DeferralSeen { obligation_id } => LogEvent::DeferralSeen {
                obligation_id: obligation_id.clone(),
            },
            LogEvent::CustodyClosed {
                obligation_id,
                state,
            } => LogEvent::CustodyClosed {
                obligation_id: obligation_id.clone(),
                state,
            },
            LogEvent::BestEffortSent { obligation_id } => LogEvent::BestEffortSent {
                obligation_id: obligation_id.clone(),
            },
            LogEvent::Principal { writes } => LogEvent::Principal { writes },
            LogEvent::LateAck {
                obligation_id,
                status,
            } => LogEvent::LateAck {
                obligation_id: obligation_id.clone(),
                status,
            },
            LogEvent::Ledger {
                custodian,
                obligation_id,
                outcome,
            } => LogEvent::Ledger {
                custodian: custodian.clone(),
                obligation_id: obligation_id.clone(),
                outcome,
            },
            LogEvent::Intent {
                custodian,
                obligation_id,
            } => LogEvent::Intent {
                custodian: custodian.clone(),
                obligation_id: obligation_id.clone(),
            },
        }
    }
}

/// One entry of the event log.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StoredEvent {
    /// Its position.
    pub id: EventId,
    /// The `now` of the commit that appended it.
    pub at: Timestamp,
    /// What happened.
    pub event: LogEvent,
}

/// What a successful commit made durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a commit receipt proves durability; release the batches' tokens after it"]
pub struct Committed {
    /// Records committed.
    pub records: usize,
    /// First event id appended (equal to `end` when nothing was appended).
    pub first_event: EventId,
    /// One past the last event id appended.
    pub end_event: EventId,
}

/// Inbox counters, derived at read time from the stored records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Inbox {
    /// Transfers under custody.
    pub pending: u64,
    /// Surfaced declines awaiting the principal's decision.
    pub decision_required: u64,
    /// Escalations retained.
    pub escalated: u64,
    /// Deferrals past their deadline: receiver ledger entries still
    /// `deferred` (no external effect in flight) at or after their
    /// deadline, plus transfers under custody the receiver deferred whose
    /// deadline has passed (their escalation is due).
    pub deferred_overdue: u64,
    /// `applied` acks that arrived after escalation (reconciliation items).
    pub late_applied: u64,
    /// External effects in doubt after a restart, not yet settled.
    pub outcome_unknown: u64,
}

/// What [`Store::compact`] removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Compacted {
    /// Terminal summaries.
    pub terminal: u64,
    /// Escalations (with their terminal summary).
    pub escalations: u64,
    /// Reconciliation items (with their terminal summary).
    pub reconciliations: u64,
    /// Decided ledger entries.
    pub ledger: u64,
    /// Log events.
    pub events: u64,
}

/// The durable state of a node: what a restart recovers.
#[derive(Clone, Debug, Default)]
pub struct DurableState {
    /// For `Custodian::restore`.
    pub custodian: CustodianSnapshot,
    /// For `Receiver::restore`.
    pub receiver: ReceiverSnapshot,
    /// The next event id the log will assign.
    pub next_event: EventId,
}

impl DurableState {
    /// Open decision-required items, by obligation id.
    pub fn decisions(&self) -> Vec<DecisionItem> {
        let mut p = PrincipalState::new(WeightRange::default());
        for w in &self.custodian.principal {
            p.apply_write(w);
        }
        p.decisions().cloned().collect()
    }

    /// The inbox counters at `now` (see [`Inbox`] for each definition).
    pub fn inbox(&self, now: Timestamp) -> Inbox {
        let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        let receiver_overdue = self
            .receiver
            .ledger
            .iter()
            .filter(|(k, l)| {
                l.outcome == LedgerOutcome::Deferred
                    && l.deadline_at <= now
                    && !self.receiver.intents.contains_key(*k)
            })
            .count();
        let custodian_overdue = self
            .custodian
            .pending
            .values()
            .filter(|p| p.deferred && p.obligation.deadline_at() <= now)
            .count();
        Inbox {
            pending: count(self.custodian.pending.len()),
            decision_required: count(self.decisions().len()),
            escalated: count(self.custodian.escalations.len()),
            deferred_overdue: count(receiver_overdue + custodian_overdue),
            late_applied: count(
                self.custodian
                    .reconciliations
                    .iter()
                    .filter(|r| r.status == AckStatus::Applied)
                    .count(),
            ),
            outcome_unknown: count(
                self.receiver
                    .ledger
                    .values()
                    .filter(|l| l.outcome == LedgerOutcome::OutcomeUnknown)
                    .count(),
            ),
        }
    }
}

/// Principal-side state kept folded: the newest write per governed key and
/// the open decision items. Replaying [`PrincipalFold::writes`] restores
/// the same principal state as replaying every write ever committed.
#[derive(Clone, Debug, Default)]
pub struct PrincipalFold {
    state: PrincipalState,
}

impl PrincipalFold {
    /// Folds one write in.
    pub fn apply(&mut self, w: &PrincipalWrite) {
        self.state.apply_write(w);
    }

    /// The folded writes, sorted by key (authorizations, then weights, then
    /// open decisions, then issued sequences).
    pub fn writes(&self) -> Vec<PrincipalWrite> {
        let auths: BTreeMap<_, _> = self.state.authorizations().collect();
        let weights: BTreeMap<_, _> = self.state.weights().collect();
        let mut out = Vec::with_capacity(auths.len() + weights.len());
        out.extend(
            auths
                .into_iter()
                .map(|(key, entry)| PrincipalWrite::Authorization {
                    key: key.clone(),
                    entry: entry.clone(),
                }),
        );
        out.extend(
            weights
                .into_iter()
                .map(|(key, value)| PrincipalWrite::Weight {
                    key: key.clone(),
                    value,
                }),
        );
        out.extend(
            self.state
                .decisions()
                .cloned()
                .map(PrincipalWrite::DecisionRaised),
        );
        let issued: BTreeMap<_, _> = self.state.issued_sequences().collect();
        out.extend(
            issued
                .into_iter()
                .map(|(key, (sequence, id))| PrincipalWrite::Issued {
                    key: key.clone(),
                    sequence: *sequence,
                    obligation_id: id.clone(),
                }),
        );
        out
    }
}

/// Why a store operation failed. Storage and I/O faults, refused commits
/// and format mismatches are told apart; none of them panics.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// An operating-system I/O call failed (open, fsync, metadata).
    #[error("store I/O failed during {op}: {source}")]
    Io {
        /// What the store was doing.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The storage engine reported an error.
    #[error("{backend} failed during {op}: {source}")]
    Backend {
        /// `sled`, `redb`, ...
        backend: &'static str,
        /// What the store was doing.
        op: &'static str,
        /// The engine's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Stored bytes do not decode: the database is damaged or was written
    /// by an incompatible program. Nothing was misread.
    #[error("corrupt {table} entry {key}: {detail}")]
    Corrupt {
        /// The table or tree.
        table: &'static str,
        /// The entry's key, printable.
        key: String,
        /// What is wrong.
        detail: String,
    },
    /// A file of the store is damaged (C-SD-2): bytes that were synced no
    /// longer read back whole (a flipped bit, a zeroed or misdirected
    /// sector, a truncated or missing file), and the damage is not a torn
    /// final write the store can prove was never acknowledged. Nothing was
    /// truncated or rewritten; the store refused to open. `abhyasa store
    /// check` lists every such place and `abhyasa store repair` salvages
    /// around it.
    #[error(
        "damaged store file {file} at byte {offset}: {detail}{}",
        if obligations.is_empty() {
            String::new()
        } else {
            format!("; obligations affected: {}", obligations.join(", "))
        }
    )]
    Damaged {
        /// The file, relative to the store's directory.
        file: String,
        /// The byte of `file` where the damage starts.
        offset: u64,
        /// What is wrong there.
        detail: String,
        /// The ids of the obligations whose rows the damaged bytes held,
        /// as far as they can still be read (empty when none can).
        obligations: Vec<String>,
    },
    /// A record would be written in a form that does not read back as the
    /// same record (for instance an obligation whose stored form no longer
    /// has its digest). The whole commit was refused and nothing was
    /// written: a store never holds a row it cannot load.
    #[error("refused to write {table} entry {key}: it would not read back ({detail})")]
    Unwritable {
        /// The table or tree.
        table: &'static str,
        /// The entry's key, printable.
        key: String,
        /// What would not read back.
        detail: String,
    },
    /// The database was written by a newer format version than this build
    /// understands; it was not read.
    #[error(
        "database format version {found} is newer than this build supports ({supported}); \
         upgrade abhyasa to open it"
    )]
    NewerFormat {
        /// Version stored in the database.
        found: u32,
        /// Newest version this build reads.
        supported: u32,
    },
    /// A `CustodyOpened` or `BestEffortSent` named an id already pending or
    /// terminal with a different digest. The whole commit was refused and
    /// nothing was written.
    #[error("obligation {obligation_id} is already held with digest {existing}; refused offer with digest {offered}")]
    OfferConflict {
        /// The id.
        obligation_id: ObligationId,
        /// Digest of the record already stored.
        existing: Digest,
        /// Digest of the refused record.
        offered: Digest,
    },
    /// A server-backed store whose ownership passed to another node (a
    /// standby took the agent over after this node's lease lapsed). The
    /// commit was refused inside its own transaction and nothing was
    /// written; this node must stop (C-FL-1).
    #[error(
        "fenced: this node held the store at epoch {ours}, but {holder} owns it now \
         (epoch {current}); stopping so no stale write lands"
    )]
    Fenced {
        /// The epoch this node held.
        ours: u64,
        /// The epoch in force.
        current: u64,
        /// The holder in force.
        holder: String,
    },
    /// A server-backed store is leased, under this node's own holder name,
    /// to a node that is still live (two configurations share a holder
    /// name, or this node restarted before its old lease lapsed). Nothing
    /// was taken over, read or written; the lease lapses on its own if that
    /// node is gone (C-PA-4).
    #[error(
        "holder name {holder:?} already owns this store with a live lease ({remaining_ms} ms left): \
         another node runs under the same holder name; refusing to take it over (give each node \
         its own holder name; if that node is gone, start after the lease lapses or as a standby)"
    )]
    HolderInUse {
        /// The holder name in force (ours).
        holder: String,
        /// Milliseconds left on its lease, on the database clock.
        remaining_ms: u64,
    },
    /// A server-backed store is leased to another live node; this node did
    /// not take it over and read or wrote nothing. Start it as a standby
    /// (wait for the lease) or stop the other node.
    #[error("store is owned by {holder} (lease has {remaining_ms} ms left); not taking it over")]
    Owned {
        /// The holder in force.
        holder: String,
        /// Milliseconds left on its lease, on the database clock.
        remaining_ms: u64,
    },
    /// The simulated process crashed (an injected crash point); the commit
    /// in flight may or may not be durable. Call [`SimStore::crash`] and
    /// restore from [`Store::load`].
    #[error("simulated crash at commit {commit}")]
    Crashed {
        /// The commit number (1-based) the crash hit.
        commit: u64,
    },
}

/// Durable storage of custody records. Object-safe, so a node can select
/// its backend at run time (`store = "sled" | "redb"`); kept free of any
/// engine's types so a server-backed store (PostgreSQL) can implement it.
pub trait Store: Send {
    /// A short name of the backend (`sim`, `sled`, `redb`).
    fn backend(&self) -> &'static str;

    /// The format version stored in the database.
    fn format_version(&self) -> u32;

    /// Commits the records of `batches`, in order, atomically and durably
    /// with one flush. `now` stamps the log events. On error nothing was
    /// committed, except after [`StoreError::Crashed`], which models a
    /// process that died in the call.
    fn commit(&mut self, now: Timestamp, batches: &[&[Record]]) -> Result<Committed, StoreError>;

    /// The durable state (see the module docs for the fold's rules).
    fn load(&self) -> Result<DurableState, StoreError>;

    /// Inbox counters at `now`, derived from the stored records. The
    /// default folds a full [`Store::load`]; indexed backends answer from
    /// durable counters and a deadline index instead.
    fn inbox(&self, now: Timestamp) -> Result<Inbox, StoreError> {
        Ok(self.load()?.inbox(now))
    }

    /// One page of the obligations this node is custodian of: those in
    /// `state` (all when `None`) with id `> after`, in id order, at most
    /// `limit` (clamped by [`page_limit`]). The default folds a full
    /// [`Store::load`] (kept so third-party stores compile); indexed
    /// backends read only the page.
    fn list(
        &self,
        state: Option<ListState>,
        after: Option<&ObligationId>,
        limit: usize,
    ) -> Result<Page<Listed, ObligationId>, StoreError> {
        Ok(self.load()?.list(state, after, limit))
    }

    /// One page of the retained escalations after log position `after`, in
    /// commit order. The default folds a full [`Store::load`] and numbers
    /// escalations by ordinal (see [`DurableState::escalation_page`]).
    fn escalations(
        &self,
        after: Option<EventId>,
        limit: usize,
    ) -> Result<Page<EscalationEntry, EventId>, StoreError> {
        Ok(self.load()?.escalation_page(after, limit))
    }

    /// One page of the open decision items (surfaced declines) with id
    /// `> after`, in id order. The default folds a full [`Store::load`].
    fn decisions(
        &self,
        after: Option<&ObligationId>,
        limit: usize,
    ) -> Result<Page<DecisionItem, ObligationId>, StoreError> {
        Ok(self.load()?.decision_page(after, limit))
    }

    /// Up to `limit` log events with id `>= from`, in id order.
    fn events(&self, from: EventId, limit: usize) -> Result<Vec<StoredEvent>, StoreError>;

    /// Drops what is past retention (see the module docs), atomically.
    fn compact(&mut self, now: Timestamp, retention: Duration) -> Result<Compacted, StoreError>;

    /// Whether the store can still be written, asked while the node is
    /// idle (the store thread asks about every half second between jobs).
    /// An error stops the node just as a failed commit does. Embedded
    /// stores have nothing to report; a store whose ownership is leased
    /// (PostgreSQL) reports a takeover ([`StoreError::Fenced`]) here, so an
    /// owner that was replaced while it had nothing to commit stops at once
    /// instead of holding custody it can no longer write (C-FL-1).
    fn health(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Housekeeping between commits: the store thread calls it whenever it
    /// finds no job waiting, before it waits for the next one. It must not
    /// change what any read returns, and should return at once when it has
    /// nothing to do. An error stops the node just as a failed commit
    /// does. The default does nothing; the log store grows its log ahead
    /// here, so that under light load no commit waits for the zeros.
    fn idle(&mut self) -> Result<(), StoreError> {
        Ok(())
    }
}

impl<S: Store + ?Sized> Store for Box<S> {
    fn backend(&self) -> &'static str {
        (**self).backend()
    }
    fn format_version(&self) -> u32 {
        (**self).format_version()
    }
    fn commit(&mut self, now: Timestamp, batches: &[&[Record]]) -> Result<Committed, StoreError> {
        (**self).commit(now, batches)
    }
    fn load(&self) -> Result<DurableState, StoreError> {
        (**self).load()
    }
    fn inbox(&self, now: Timestamp) -> Result<Inbox, StoreError> {
        (**self).inbox(now)
    }
    fn list(
        &self,
        state: Option<ListState>,
        after: Option<&ObligationId>,
        limit: usize,
    ) -> Result<Page<Listed, ObligationId>, StoreError> {
        (**self).list(state, after, limit)
    }
    fn escalations(
        &self,
        after: Option<EventId>,
        limit: usize,
    ) -> Result<Page<EscalationEntry, EventId>, StoreError> {
        (**self).escalations(after, limit)
    }
    fn decisions(
        &self,
        after: Option<&ObligationId>,
        limit: usize,
    ) -> Result<Page<DecisionItem, ObligationId>, StoreError> {
        (**self).decisions(after, limit)
    }
    fn events(&self, from: EventId, limit: usize) -> Result<Vec<StoredEvent>, StoreError> {
        (**self).events(from, limit)
    }
    fn compact(&mut self, now: Timestamp, retention: Duration) -> Result<Compacted, StoreError> {
        (**self).compact(now, retention)
    }
    fn health(&self) -> Result<(), StoreError> {
        (**self).health()
    }
    fn idle(&mut self) -> Result<(), StoreError> {
        (**self).idle()
    }
}

/// True when a record with deadline `deadline_at` is past retention at
/// `now` (the rule every backend applies).
pub fn past_retention(deadline_at: Timestamp, now: Timestamp, retention: Duration) -> bool {
    deadline_at.saturating_add(retention) < now
}
