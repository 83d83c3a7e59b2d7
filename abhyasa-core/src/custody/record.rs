//! Durable records: what must be committed before anything that depends on
//! it is sent (the write-ahead rule).
//!
//! Every record states absolute values, so folding a record twice into a
//! snapshot gives the same result as folding it once. The fold is the
//! records' meaning: [`CustodianSnapshot::apply`] and
//! [`ReceiverSnapshot::apply`] are what every store must reproduce.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::model::{
    AckStatus, AgentId, DeclineReason, Digest, Escalation, GovernedKey, GuardOutcome, Kind,
    Obligation, ObligationId, SafeAction, Sequence, Timestamp,
};
use crate::principal::{Authorization, PrincipalWrite};

/// A pending custody transfer, as stored.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PendingRecord {
    /// The obligation (a store keeps its digest and checks the row it is
    /// stored in; see `ObligationBuilder::build_stored`).
    pub obligation: Obligation,
    /// `safe(O)` as classified at offer.
    pub safe: SafeAction,
    /// Attempts made (counted before each transmit is released).
    pub attempts: u32,
    /// When the next attempt is due.
    pub next_at: Timestamp,
    /// Whether the receiver ever answered `deferred`.
    pub deferred: bool,
    /// When custody was opened.
    pub offered_at: Timestamp,
}

/// How a decline was handled principal-side.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "disposition")]
pub enum DeclineDisposition {
    /// `safe(O)` went through the guard.
    SafeApplied {
        /// What the guard did.
        guard: GuardOutcome,
    },
    /// Surfaced as a decision-required item.
    Surfaced,
}

/// How custody ended.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum CustodyOutcome {
    /// The receiver applied it.
    Applied,
    /// The receiver declined it.
    Declined {
        /// Its reason (absent from a v1 peer).
        reason: Option<DeclineReason>,
        /// Its free text.
        detail: Option<String>,
        /// What the custodian did about it.
        #[serde(flatten)]
        disposition: DeclineDisposition,
    },
    /// Escalated with the fail-safe applied.
    Escalated,
}

impl CustodyOutcome {
    /// The terminal state this outcome puts a transfer in.
    pub fn state(&self) -> TerminalState {
        match self {
            Self::Applied => TerminalState::Applied,
            Self::Declined { .. } => TerminalState::Declined,
            Self::Escalated => TerminalState::Escalated,
        }
    }
}

/// The terminal record: terminal mark, principal-side writes (`safe(O)`)
/// and escalation, committed atomically so a crash can never apply a
/// fail-safe or escalate twice.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ClosedRecord {
    /// The obligation.
    pub obligation_id: ObligationId,
    /// Its digest.
    pub digest: Digest,
    /// Its kind.
    pub kind: Kind,
    /// Its target.
    pub target: AgentId,
    /// How custody ended.
    pub outcome: CustodyOutcome,
    /// Attempts made.
    pub attempts: u32,
    /// When.
    pub closed_at: Timestamp,
    /// Its absolute deadline (drives retention).
    pub deadline_at: Timestamp,
    /// Principal-side writes made by this close.
    pub principal: Vec<PrincipalWrite>,
    /// The escalation, if escalated (boxed: most closes have none, and
    /// inline it would make every close record ~450 bytes).
    pub escalation: Option<Box<Escalation>>,
}

impl ClosedRecord {
    /// What the custodian keeps about the transfer this record closes.
    pub fn summary(&self) -> TerminalSummary {
        TerminalSummary {
            obligation_id: self.obligation_id.clone(),
            digest: self.digest,
            target: self.target.clone(),
            state: self.outcome.state(),
            deadline_at: self.deadline_at,
            closed_at: self.closed_at,
            late_ack_recorded: false,
            attempts: self.attempts,
        }
    }
}

/// An ack that arrived after custody ended (e.g. `applied` after
/// escalation): recorded for reconciliation, terminal state unchanged.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Reconciliation {
    /// The obligation.
    pub obligation_id: ObligationId,
    /// Its target.
    pub target: AgentId,
    /// The late status.
    pub status: AckStatus,
    /// The receiver's ack time.
    pub acked_at: Timestamp,
    /// When it reached us.
    pub received_at: Timestamp,
}

/// The terminal state of a transfer, as the custodian remembers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TerminalState {
    /// Applied.
    Applied,
    /// Declined.
    Declined,
    /// Escalated.
    Escalated,
    /// Sent best-effort (never under custody).
    BestEffort,
}

/// What the custodian keeps about a finished transfer (for idempotent
/// re-offers and late acks) until retention compacts it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TerminalSummary {
    /// The obligation.
    pub obligation_id: ObligationId,
    /// Its digest.
    pub digest: Digest,
    /// Its target.
    pub target: AgentId,
    /// How it ended.
    pub state: TerminalState,
    /// Its absolute deadline.
    pub deadline_at: Timestamp,
    /// When it ended.
    pub closed_at: Timestamp,
    /// Whether a late ack was already recorded.
    pub late_ack_recorded: bool,
    /// Attempts sent: under custody, the count its close recorded; 1 for
    /// a best-effort send. 0 when not known (a summary read from a row
    /// stored before the count was kept).
    #[serde(default)]
    pub attempts: u32,
}

impl TerminalSummary {
    /// [`TerminalSummary::attempts`], if known.
    pub fn known_attempts(&self) -> Option<u32> {
        (self.attempts > 0).then_some(self.attempts)
    }
}

/// The receiver ledger's verdict on one obligation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LedgerOutcome {
    /// Applied; the effect is in the same record.
    Applied,
    /// Declined (remembered, never re-decided).
    Declined,
    /// Received, not yet applied.
    Deferred,
    /// An external effect whose outcome is in doubt after a crash.
    OutcomeUnknown,
}

/// A value in receiver-owned effect state.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "type", content = "value")]
pub enum EffectValue {
    /// A governed authority.
    Authorization(Authorization),
    /// A belief/routing weight.
    Weight(f64),
    /// Application-defined JSON.
    Json(serde_json::Value),
}

/// One write to receiver-owned effect state (absolute value).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EffectWrite {
    /// The state key.
    pub key: String,
    /// The new value.
    pub value: EffectValue,
}

/// The receiver's ledger entry, with the effect and the key sequence it
/// sets: one atomic record (AB-3).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LedgerRecord {
    /// The authenticated custodian (half of the AB-3 key).
    pub custodian: AgentId,
    /// The obligation id (the other half).
    pub obligation_id: ObligationId,
    /// Its digest.
    pub digest: Digest,
    /// Its kind.
    pub kind: Kind,
    /// The verdict.
    pub outcome: LedgerOutcome,
    /// Decline reason.
    pub reason: Option<DeclineReason>,
    /// Free text.
    pub detail: Option<String>,
    /// Effect writes (only with `applied`).
    pub effect: Vec<EffectWrite>,
    /// The governed key's new newest sequence (only with `applied`).
    pub key_sequence: Option<(GovernedKey, Sequence)>,
    /// When recorded.
    pub recorded_at: Timestamp,
    /// The obligation's absolute deadline (drives retention).
    pub deadline_at: Timestamp,
    /// The obligation itself, kept while it is undecided (deferred or in
    /// doubt) so it can be completed after a restart.
    pub obligation: Option<Obligation>,
}

/// An external-effect intent, durable before the effect runs
/// (dual-write boundary).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ExternalIntent {
    /// Propagated to the external system as its idempotency key.
    pub idempotency_key: ObligationId,
    /// What to do, in the application's terms.
    pub action: String,
    /// Application data.
    pub data: serde_json::Value,
}

/// The intent record.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct IntentRecord {
    /// The custodian.
    pub custodian: AgentId,
    /// The obligation.
    pub obligation: Obligation,
    /// The intent.
    pub intent: ExternalIntent,
    /// When recorded.
    pub recorded_at: Timestamp,
}

/// A durable record.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "record")]
pub enum Record {
    /// Custody opened (AB-1), first attempt counted, with the offer's
    /// principal-side decision (Anumati withhold) in the same commit.
    CustodyOpened {
        /// The pending transfer.
        pending: PendingRecord,
        /// Principal-side writes of the offer.
        principal: Vec<PrincipalWrite>,
    },
    /// A retry is about to be sent (counted before it is released).
    AttemptMade {
        /// The obligation.
        obligation_id: ObligationId,
        /// Attempts made including this one.
        attempts: u32,
        /// When the next attempt is due.
        next_at: Timestamp,
    },
    /// The receiver answered `deferred` (first time).
    DeferralSeen {
        /// The obligation.
        obligation_id: ObligationId,
    },
    /// Custody ended.
    CustodyClosed(Box<ClosedRecord>),
    /// A best-effort send, with the offer's principal-side decision.
    BestEffortSent {
        /// Summary kept for idempotent re-offers.
        summary: TerminalSummary,
        /// Principal-side writes of the offer.
        principal: Vec<PrincipalWrite>,
    },
    /// Principal decisions and resolutions.
    Principal {
        /// The writes.
        writes: Vec<PrincipalWrite>,
        /// When.
        at: Timestamp,
    },
    /// A late ack for reconciliation.
    LateAck(Reconciliation),
    /// A receiver ledger entry (with its effect).
    Ledger(Box<LedgerRecord>),
    /// An external-effect intent.
    Intent(Box<IntentRecord>),
}

/// The custodian's durable state: the fold of its records.
#[derive(Clone, Debug, Default)]
pub struct CustodianSnapshot {
    /// Pending transfers.
    pub pending: HashMap<ObligationId, PendingRecord>,
    /// Finished transfers.
    pub terminal: HashMap<ObligationId, TerminalSummary>,
    /// Principal-side writes in commit order (later wins per key).
    pub principal: Vec<PrincipalWrite>,
    /// Escalations in commit order.
    pub escalations: Vec<Escalation>,
    /// Reconciliation items.
    pub reconciliations: Vec<Reconciliation>,
    /// Pending transfers a store repair could not prove (C-SD-4): their
    /// offer was salvaged from damaged bytes, what came after it was not.
    /// [`crate::custody::Custodian::restore`] escalates each at once with
    /// [`crate::model::EscalationCause::StoreDamaged`] and its fail-safe,
    /// instead of resuming custody. An id here that is not pending is
    /// already terminal and ignored.
    pub damaged: HashSet<ObligationId>,
}

impl CustodianSnapshot {
    /// Folds one record in (receiver records are ignored).
    pub fn apply(&mut self, r: &Record) {
        match r {
            Record::CustodyOpened { pending, principal } => {
                // Offers are idempotent: a replayed open never resets a
                // pending transfer's attempts nor reopens a terminal one.
                let id = pending.obligation.id();
                if self.pending.contains_key(id) || self.terminal.contains_key(id) {
                    return;
                }
                self.pending.insert(id.clone(), pending.clone());
                self.principal.extend(principal.iter().cloned());
            }
            Record::AttemptMade {
                obligation_id,
                attempts,
                next_at,
            } => {
                if let Some(p) = self.pending.get_mut(obligation_id) {
                    p.attempts = (*attempts).max(p.attempts);
                    p.next_at = *next_at;
                }
            }
            Record::DeferralSeen { obligation_id } => {
                if let Some(p) = self.pending.get_mut(obligation_id) {
                    p.deferred = true;
                }
            }
            Record::CustodyClosed(c) => {
                self.pending.remove(&c.obligation_id);
                // Terminal is final: a second close changes nothing (no
                // second fail-safe, no second escalation, no new state).
                if self.terminal.contains_key(&c.obligation_id) {
                    return;
                }
                self.terminal.insert(c.obligation_id.clone(), c.summary());
                self.principal.extend(c.principal.iter().cloned());
                if let Some(e) = &c.escalation {
                    self.escalations.push(Escalation::clone(e));
                }
            }
            Record::BestEffortSent { summary, principal } => {
                if self.terminal.contains_key(&summary.obligation_id) {
                    return;
                }
                self.terminal
                    .insert(summary.obligation_id.clone(), summary.clone());
                self.principal.extend(principal.iter().cloned());
            }
            Record::Principal { writes, .. } => self.principal.extend(writes.iter().cloned()),
            Record::LateAck(rec) => {
                if let Some(t) = self.terminal.get_mut(&rec.obligation_id) {
                    if !t.late_ack_recorded {
                        t.late_ack_recorded = true;
                        self.reconciliations.push(rec.clone());
                    }
                }
            }
            Record::Ledger(_) | Record::Intent(_) => {}
        }
    }
}

/// The receiver's durable state: the fold of its records.
#[derive(Clone, Debug, Default)]
pub struct ReceiverSnapshot {
    /// Ledger keyed on (custodian, obligation id).
    pub ledger: HashMap<(AgentId, ObligationId), LedgerRecord>,
    /// Newest applied sequence per governed key, with the obligation that set it.
    pub key_sequences: HashMap<GovernedKey, (Sequence, ObligationId)>,
    /// Receiver-owned effect state.
    pub effects: BTreeMap<String, EffectValue>,
    /// Intents recorded, by (custodian, id).
    pub intents: HashMap<(AgentId, ObligationId), IntentRecord>,
    /// Set by a store repair that read around damage (C-SD-4): ledger
    /// entries may be gone, so the receiver declines, rather than applies,
    /// an obligation it does not hold that was created at or before this
    /// instant (it cannot rule out having applied it).
    pub damaged_before: Option<Timestamp>,
}

impl ReceiverSnapshot {
    /// Folds one record in (custodian records are ignored).
    pub fn apply(&mut self, r: &Record) {
        match r {
            Record::Ledger(l) => {
                let key = (l.custodian.clone(), l.obligation_id.clone());
                // A decided entry is final: never overwritten by a replay.
                if let Some(existing) = self.ledger.get(&key) {
                    if matches!(
                        existing.outcome,
                        LedgerOutcome::Applied | LedgerOutcome::Declined
                    ) {
                        return;
                    }
                }
                if l.outcome == LedgerOutcome::Applied {
                    for w in &l.effect {
                        self.effects.insert(w.key.clone(), w.value.clone());
                    }
                    if let Some((k, s)) = &l.key_sequence {
                        self.key_sequences
                            .insert(k.clone(), (*s, l.obligation_id.clone()));
                    }
                }
                if matches!(l.outcome, LedgerOutcome::Applied | LedgerOutcome::Declined) {
                    self.intents.remove(&key);
                }
                self.ledger.insert(key, (**l).clone());
            }
            Record::Intent(i) => {
                self.intents.insert(
                    (i.custodian.clone(), i.obligation.id().clone()),
                    (**i).clone(),
                );
            }
            _ => {}
        }
    }
}
