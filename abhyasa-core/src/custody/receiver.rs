//! The receiver: applies each obligation at most once (AB-3), never past
//! its deadline, never behind a newer sequence on its key.
//!
//! # Polling contract
//!
//! Same as the custodian's: feed [`Receiver::handle_obligation`] (and
//! [`Receiver::handle_status_query`], [`Receiver::complete_deferred`],
//! [`Receiver::handle_external_outcome`]); drain [`Receiver::poll_records`],
//! commit, [`Receiver::handle_committed`]; then drain
//! [`Receiver::poll_transmit`] and [`Receiver::poll_event`]. An ack is
//! released only after the ledger entry (with its effect) it reports is
//! durable, so an ack can never attest an application a crash could undo.
//! Consecutive acks to one custodian are coalesced into one frame.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::applier::{Applier, ApplyContext, ApplyDecision};
use super::custodian::Transmit;
use super::outbox::{CommitToken, Outbox, RecordBatch};
use super::record::{
    EffectValue, EffectWrite, ExternalIntent, IntentRecord, LedgerOutcome, LedgerRecord,
    ReceiverSnapshot, Record,
};
use crate::model::{
    AckStatus, AgentId, CustodyAck, DeclineReason, Digest, GovernedKey, Kind, Obligation,
    ObligationId, Sequence, Timestamp,
};
use crate::polarity::PolarityRegistry;
use crate::wire::{ErrorCode, Message, ProtocolError, StatusReply};

/// Most acks coalesced into one frame.
const MAX_ACKS_PER_FRAME: usize = 512;

/// Receiver configuration.
#[derive(Clone, Debug)]
pub struct ReceiverConfig {
    /// This agent.
    pub agent: AgentId,
    /// Clock-skew margin on the safe side: an obligation is declined
    /// `expired` once `now + skew_margin >= deadline_at`.
    pub skew_margin: Duration,
    /// This process incarnation, echoed in acks.
    pub instance: Option<String>,
    /// C-ND-5: an obligation whose `created_at` is further ahead of this
    /// receiver's clock than this is declined (`policy`, the text says
    /// why) and nothing is kept: a peer cannot stretch how long we hold
    /// its ledger entry by dating obligations into the future.
    pub max_created_at_skew: Duration,
    /// C-ND-5: an obligation whose deadline is longer than this is declined
    /// (`policy`) and nothing is kept: its ledger entry would be retained
    /// until the deadline plus retention.
    pub max_deadline: Duration,
    /// C-ND-5: most ledger entries retained per custodian (decided and
    /// undecided, until compaction drops them). Beyond it a new obligation
    /// gets an `overloaded` error frame and nothing is kept; the custodian
    /// keeps custody and retries on its schedule.
    pub ledger_quota: usize,
}

impl ReceiverConfig {
    /// Defaults: 2 s skew margin; `created_at` at most 60 s ahead; deadlines
    /// up to 30 days; 1,000,000 ledger entries per custodian.
    pub fn new(agent: AgentId) -> Self {
        Self {
            agent,
            skew_margin: Duration::from_secs(2),
            instance: None,
            max_created_at_skew: Duration::from_secs(60),
            max_deadline: Duration::from_secs(30 * 24 * 3600),
            ledger_quota: 1_000_000,
        }
    }
}

/// What the driver learns from the receiver (released after commit).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum ReceiverEvent {
    /// Applied, with the effect committed.
    Applied {
        /// The custodian.
        custodian: AgentId,
        /// The obligation.
        obligation_id: ObligationId,
        /// Its kind.
        kind: Kind,
        /// The effect writes.
        effect: Vec<EffectWrite>,
    },
    /// Declined.
    Declined {
        /// The custodian.
        custodian: AgentId,
        /// The obligation.
        obligation_id: ObligationId,
        /// Reason.
        reason: DeclineReason,
    },
    /// Deferred.
    Deferred {
        /// The custodian.
        custodian: AgentId,
        /// The obligation.
        obligation_id: ObligationId,
    },
    /// The intent is durable: execute the external effect now, passing the
    /// obligation id as the external system's idempotency key, then report
    /// with [`Receiver::handle_external_outcome`].
    Execute {
        /// The custodian.
        custodian: AgentId,
        /// The obligation.
        obligation: Obligation,
        /// What to do.
        intent: ExternalIntent,
    },
    /// After a restart: an external effect whose outcome is in doubt.
    /// Settle it by querying the external system, then report with
    /// [`Receiver::handle_external_outcome`]; it is never re-executed
    /// blindly.
    OutcomeUnknown {
        /// The custodian.
        custodian: AgentId,
        /// The obligation.
        obligation: Obligation,
        /// The intent.
        intent: ExternalIntent,
    },
    /// Same id, different digest: refused, nothing applied.
    Conflict {
        /// The custodian.
        custodian: AgentId,
        /// The obligation.
        obligation_id: ObligationId,
        /// Digest in the ledger.
        existing: Digest,
        /// Digest that arrived.
        offered: Digest,
    },
}

/// What `handle_obligation` did.
#[derive(Clone, Debug, PartialEq)]
pub enum Received {
    /// Applied now.
    Applied,
    /// Declined now.
    Declined(DeclineReason),
    /// Deferred now.
    Deferred,
    /// Intent recorded; the effect runs after commit.
    IntentRecorded,
    /// A redelivery: the stored outcome was re-acked, nothing re-applied.
    Duplicate(LedgerOutcome),
    /// Same id, different digest: `conflict`.
    Conflict,
    /// Not addressed to this agent, or its kind's rule rejects it.
    Rejected(ProtocolError),
}

/// Why `complete_deferred` or `handle_external_outcome` refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CompleteError {
    /// No such obligation in the ledger.
    #[error("no ledger entry for obligation {0}")]
    Unknown(String),
    /// The obligation is already decided.
    #[error("obligation {0} is already decided")]
    AlreadyDecided(String),
    /// The decision cannot complete it (e.g. another deferral of an intent).
    #[error("invalid completion for obligation {0}: {1}")]
    Invalid(String, &'static str),
}

/// How an external effect ended.
#[derive(Clone, Debug, PartialEq)]
pub enum ExternalOutcome {
    /// It took effect (these receiver-owned writes record it).
    Applied(Vec<EffectWrite>),
    /// It failed or was refused.
    Failed {
        /// Reason.
        reason: DeclineReason,
        /// Free text.
        detail: Option<String>,
    },
}

#[derive(Debug, Clone)]
struct Entry {
    digest: Digest,
    outcome: LedgerOutcome,
    reason: Option<DeclineReason>,
    detail: Option<String>,
    deadline_at: Timestamp,
    /// Kept while undecided.
    obligation: Option<Obligation>,
    /// An external effect is executing or in doubt.
    intent: Option<ExternalIntent>,
}

type LedgerKey = (AgentId, ObligationId);

/// The receiver state machine.
///
/// `Clone` lets a model checker explore alternative futures from one state;
/// a driver must never run two clones against the same store and peers.
#[derive(Debug, Clone)]
pub struct Receiver {
    config: ReceiverConfig,
    registry: PolarityRegistry,
    ledger: HashMap<LedgerKey, Entry>,
    /// Ledger entries held per custodian (C-ND-5 quota).
    held: HashMap<AgentId, usize>,
    key_seq: HashMap<GovernedKey, (Sequence, ObligationId)>,
    effects: BTreeMap<String, EffectValue>,
    outbox: Outbox<Transmit, ReceiverEvent>,
    applications: u64,
}

impl Receiver {
    /// A receiver with an empty ledger.
    pub fn new(config: ReceiverConfig, registry: PolarityRegistry) -> Self {
        Self {
            config,
            registry,
            ledger: HashMap::new(),
            held: HashMap::new(),
            key_seq: HashMap::new(),
            effects: BTreeMap::new(),
            outbox: Outbox::default(),
            applications: 0,
        }
    }

    /// Rebuilds a receiver from its durable state. Intents without a
    /// decided ledger entry are in doubt: they are recorded
    /// `outcome_unknown` and reported as [`ReceiverEvent::OutcomeUnknown`].
    pub fn restore(
        config: ReceiverConfig,
        registry: PolarityRegistry,
        snapshot: &ReceiverSnapshot,
        now: Timestamp,
    ) -> Self {
        let mut r = Self::new(config, registry);
        for (key, l) in &snapshot.ledger {
            r.insert_entry(
                key.clone(),
                Entry {
                    digest: l.digest,
                    outcome: l.outcome,
                    reason: l.reason,
                    detail: l.detail.clone(),
                    deadline_at: l.deadline_at,
                    obligation: l.obligation.clone(),
                    intent: snapshot.intents.get(key).map(|i| i.intent.clone()),
                },
            );
        }
        r.key_seq = snapshot.key_sequences.clone();
        r.effects = snapshot.effects.clone();
        let mut in_doubt: Vec<&IntentRecord> = snapshot
            .intents
            .iter()
            .filter(|(k, _)| {
                !snapshot.ledger.get(*k).is_some_and(|l| {
                    matches!(l.outcome, LedgerOutcome::Applied | LedgerOutcome::Declined)
                })
            })
            .map(|(_, i)| i)
            .collect();
        in_doubt.sort_by(|a, b| a.obligation.id().cmp(b.obligation.id()));
        for i in in_doubt {
            let ob = &i.obligation;
            let key = (i.custodian.clone(), ob.id().clone());
            let rec = LedgerRecord {
                custodian: i.custodian.clone(),
                obligation_id: ob.id().clone(),
                digest: ob.digest(),
                kind: ob.kind().clone(),
                outcome: LedgerOutcome::OutcomeUnknown,
                reason: None,
                detail: Some("outcome_unknown: external effect in doubt after restart".into()),
                effect: Vec::new(),
                key_sequence: None,
                recorded_at: now,
                deadline_at: ob.deadline_at(),
                obligation: Some(ob.clone()),
            };
            r.insert_entry(
                key,
                Entry {
                    digest: ob.digest(),
                    outcome: LedgerOutcome::OutcomeUnknown,
                    reason: None,
                    detail: rec.detail.clone(),
                    deadline_at: ob.deadline_at(),
                    obligation: Some(ob.clone()),
                    intent: Some(i.intent.clone()),
                },
            );
            r.outbox.record(Record::Ledger(Box::new(rec)));
            r.outbox.event(ReceiverEvent::OutcomeUnknown {
                custodian: i.custodian.clone(),
                obligation: ob.clone(),
                intent: i.intent.clone(),
            });
        }
        r
    }

    /// The configuration.
    pub fn config(&self) -> &ReceiverConfig {
        &self.config
    }

    /// Receiver-owned effect state (including uncommitted writes).
    pub fn effects(&self) -> &BTreeMap<String, EffectValue> {
        &self.effects
    }

    /// Applications performed by this instance (since start or restore).
    pub fn applications(&self) -> u64 {
        self.applications
    }

    /// The ledger outcome for (custodian, id).
    pub fn ledger_outcome(&self, custodian: &AgentId, id: &ObligationId) -> Option<LedgerOutcome> {
        self.ledger
            .get(&(custodian.clone(), id.clone()))
            .map(|e| e.outcome)
    }

    /// Ledger entries held.
    pub fn ledger_len(&self) -> usize {
        self.ledger.len()
    }

    /// Ledger entries held for `custodian` (what its quota counts).
    pub fn ledger_held(&self, custodian: &AgentId) -> usize {
        self.held.get(custodian).copied().unwrap_or(0)
    }

    fn insert_entry(&mut self, key: LedgerKey, e: Entry) {
        let custodian = key.0.clone();
        if self.ledger.insert(key, e).is_none() {
            *self.held.entry(custodian).or_insert(0) += 1;
        }
    }

    /// C-ND-5: why `ob` from an authenticated peer is refused before it
    /// may occupy the ledger (a stateless `policy` decline), if it is.
    fn out_of_bounds(&self, now: Timestamp, ob: &Obligation) -> Option<String> {
        let ahead = ob.created_at().saturating_duration_since(now);
        if ahead > self.config.max_created_at_skew {
            return Some(format!(
                "created_at {} is {} s ahead of this receiver's clock (at most {} s accepted)",
                ob.created_at(),
                ahead.as_secs(),
                self.config.max_created_at_skew.as_secs()
            ));
        }
        if ob.deadline_seconds() > self.config.max_deadline.as_secs() {
            return Some(format!(
                "deadline of {} s exceeds this receiver's maximum of {} s",
                ob.deadline_seconds(),
                self.config.max_deadline.as_secs()
            ));
        }
        None
    }

    fn ack(
        &self,
        now: Timestamp,
        id: &ObligationId,
        digest: Digest,
        status: AckStatus,
        reason: Option<DeclineReason>,
        detail: Option<String>,
    ) -> CustodyAck {
        CustodyAck {
            obligation_id: id.clone(),
            target: self.config.agent.clone(),
            status,
            acked_at: now,
            digest: Some(digest),
            reason,
            detail,
            receiver_instance: self.config.instance.clone(),
        }
    }

    fn send_ack(&mut self, to: &AgentId, ack: CustodyAck) {
        self.outbox.transmit(Transmit {
            to: to.clone(),
            message: Message::Acks(vec![ack]),
        });
    }

    fn ack_entry(&mut self, now: Timestamp, from: &AgentId, id: &ObligationId, e: &Entry) {
        let (status, detail) = match e.outcome {
            LedgerOutcome::Applied => (AckStatus::Applied, None),
            LedgerOutcome::Declined => (AckStatus::Declined, e.detail.clone()),
            LedgerOutcome::Deferred => (AckStatus::Deferred, e.detail.clone()),
            LedgerOutcome::OutcomeUnknown => (AckStatus::Deferred, e.detail.clone()),
        };
        let reason = (status == AckStatus::Declined)
            .then_some(e.reason)
            .flatten();
        let ack = self.ack(now, id, e.digest, status, reason, detail);
        self.send_ack(from, ack);
    }

    /// Handles an obligation from the authenticated custodian `from`.
    pub fn handle_obligation(
        &mut self,
        now: Timestamp,
        from: &AgentId,
        ob: Obligation,
        applier: &mut dyn Applier,
    ) -> Received {
        let id = ob.id().clone();
        if ob.target() != &self.config.agent {
            let err = ProtocolError {
                code: ErrorCode::InvalidObligation,
                obligation_id: Some(id),
                digest: Some(ob.digest()),
                message: format!(
                    "obligation targets {}, this agent is {}",
                    ob.target(),
                    self.config.agent
                ),
            };
            self.outbox.transmit(Transmit {
                to: from.clone(),
                message: Message::Error(err.clone()),
            });
            return Received::Rejected(err);
        }
        let lkey = (from.clone(), id.clone());
        let mut previously_deferred = false;
        if let Some(e) = self.ledger.get(&lkey).cloned() {
            if e.digest != ob.digest() {
                // AB-3: same id, other content: a protocol error, never a
                // duplicate and never a new obligation.
                let ack = self.ack(
                    now,
                    &id,
                    ob.digest(),
                    AckStatus::Declined,
                    Some(DeclineReason::Conflict),
                    Some(format!(
                        "obligation id already used with digest {}",
                        e.digest
                    )),
                );
                self.send_ack(from, ack);
                self.outbox.event(ReceiverEvent::Conflict {
                    custodian: from.clone(),
                    obligation_id: id,
                    existing: e.digest,
                    offered: ob.digest(),
                });
                return Received::Conflict;
            }
            match e.outcome {
                LedgerOutcome::Applied
                | LedgerOutcome::Declined
                | LedgerOutcome::OutcomeUnknown => {
                    self.ack_entry(now, from, &id, &e);
                    return Received::Duplicate(e.outcome);
                }
                LedgerOutcome::Deferred if e.intent.is_some() => {
                    self.ack_entry(now, from, &id, &e);
                    return Received::Duplicate(e.outcome);
                }
                LedgerOutcome::Deferred => previously_deferred = true,
            }
        }
        if !previously_deferred {
            // C-ND-5: a new entry only within bounds. These declines keep
            // nothing (no ledger entry, no commit): the check is a pure
            // function of the obligation and the clock, so a redelivery
            // gets the same answer without the receiver remembering it.
            if let Some(why) = self.out_of_bounds(now, &ob) {
                let ack = self.ack(
                    now,
                    &id,
                    ob.digest(),
                    AckStatus::Declined,
                    Some(DeclineReason::Policy),
                    Some(why),
                );
                self.send_ack(from, ack);
                self.outbox.event(ReceiverEvent::Declined {
                    custodian: from.clone(),
                    obligation_id: id,
                    reason: DeclineReason::Policy,
                });
                return Received::Declined(DeclineReason::Policy);
            }
            let held = self.ledger_held(from);
            if held >= self.config.ledger_quota {
                let err = ProtocolError {
                    code: ErrorCode::Overloaded,
                    obligation_id: Some(id),
                    digest: Some(ob.digest()),
                    message: format!(
                        "ledger quota reached: {held} entries held for custodian {from} \
                         (at most {}); retry later",
                        self.config.ledger_quota
                    ),
                };
                self.outbox.transmit(Transmit {
                    to: from.clone(),
                    message: Message::Error(err.clone()),
                });
                return Received::Rejected(err);
            }
        }
        self.decide(now, from, ob, applier, previously_deferred)
    }

    fn decide(
        &mut self,
        now: Timestamp,
        from: &AgentId,
        ob: Obligation,
        applier: &mut dyn Applier,
        previously_deferred: bool,
    ) -> Received {
        // Deadlines bind both sides: never apply at or past the deadline
        // (minus the skew margin), even after an earlier deferral.
        if now.saturating_add(self.config.skew_margin) >= ob.deadline_at() {
            return self.record_decline(
                now,
                from,
                &ob,
                DeclineReason::Expired,
                Some(format!("deadline {} passed", ob.deadline_at())),
            );
        }
        let class = match self.registry.classify(&ob) {
            Ok(c) => c,
            Err(e) => {
                let err = ProtocolError {
                    code: ErrorCode::InvalidObligation,
                    obligation_id: Some(ob.id().clone()),
                    digest: Some(ob.digest()),
                    message: e.to_string(),
                };
                self.outbox.transmit(Transmit {
                    to: from.clone(),
                    message: Message::Error(err.clone()),
                });
                return Received::Rejected(err);
            }
        };
        let guarded_key = class.key.clone().filter(|_| class.guarded);
        #[cfg(not(feature = "mutations"))]
        let guard_on = true;
        #[cfg(feature = "mutations")]
        let guard_on = !crate::mutations::active(crate::mutations::Mutation::SupersessionGuardOff);
        if let (Some(key), Some(seq), true) = (&guarded_key, ob.sequence(), guard_on) {
            if let Some((newest, by)) = self.key_seq.get(key) {
                if seq <= *newest && by != ob.id() {
                    let detail = format!("sequence {seq} on {key} superseded by {newest} ({by})");
                    return self.record_decline(
                        now,
                        from,
                        &ob,
                        DeclineReason::Superseded,
                        Some(detail),
                    );
                }
            }
        }
        let decision = {
            let ctx = ApplyContext {
                now,
                custodian: from,
                key: class.key.as_ref(),
                effects: &self.effects,
                previously_deferred,
            };
            applier.decide(&ctx, &ob)
        };
        let key_sequence = guarded_key.zip(ob.sequence());
        self.record_decision(now, from, &ob, decision, key_sequence)
    }

    fn record_decision(
        &mut self,
        now: Timestamp,
        from: &AgentId,
        ob: &Obligation,
        decision: ApplyDecision,
        key_sequence: Option<(GovernedKey, Sequence)>,
    ) -> Received {
        match decision {
            ApplyDecision::Apply(effect) => {
                self.record_applied(now, from, ob, effect, key_sequence);
                Received::Applied
            }
            ApplyDecision::Decline { reason, detail } => {
                self.record_decline(now, from, ob, reason, detail)
            }
            ApplyDecision::Defer { detail } => {
                self.write_ledger(
                    now,
                    from,
                    ob,
                    LedgerOutcome::Deferred,
                    None,
                    detail.clone(),
                    Vec::new(),
                    None,
                );
                let ack = self.ack(now, ob.id(), ob.digest(), AckStatus::Deferred, None, detail);
                self.send_ack(from, ack);
                self.outbox.event(ReceiverEvent::Deferred {
                    custodian: from.clone(),
                    obligation_id: ob.id().clone(),
                });
                Received::Deferred
            }
            ApplyDecision::External(intent) => {
                // Dual-write boundary: the intent is durable before the
                // effect runs; the ack waits for the outcome.
                self.outbox.record(Record::Intent(Box::new(IntentRecord {
                    custodian: from.clone(),
                    obligation: ob.clone(),
                    intent: intent.clone(),
                    recorded_at: now,
                })));
                self.insert_entry(
                    (from.clone(), ob.id().clone()),
                    Entry {
                        digest: ob.digest(),
                        outcome: LedgerOutcome::Deferred,
                        reason: None,
                        detail: Some("executing external effect".into()),
                        deadline_at: ob.deadline_at(),
                        obligation: Some(ob.clone()),
                        intent: Some(intent.clone()),
                    },
                );
                let ack = self.ack(
                    now,
                    ob.id(),
                    ob.digest(),
                    AckStatus::Deferred,
                    None,
                    Some("executing external effect".into()),
                );
                self.send_ack(from, ack);
                self.outbox.event(ReceiverEvent::Execute {
                    custodian: from.clone(),
                    obligation: ob.clone(),
                    intent,
                });
                Received::IntentRecorded
            }
        }
    }

    fn record_applied(
        &mut self,
        now: Timestamp,
        from: &AgentId,
        ob: &Obligation,
        effect: Vec<EffectWrite>,
        key_sequence: Option<(GovernedKey, Sequence)>,
    ) {
        for w in &effect {
            self.effects.insert(w.key.clone(), w.value.clone());
        }
        if let Some((k, s)) = &key_sequence {
            self.key_seq.insert(k.clone(), (*s, ob.id().clone()));
        }
        self.applications += 1;
        // AB-3: effect, ledger entry and key sequence in one record.
        self.write_ledger(
            now,
            from,
            ob,
            LedgerOutcome::Applied,
            None,
            None,
            effect.clone(),
            key_sequence,
        );
        let ack = self.ack(now, ob.id(), ob.digest(), AckStatus::Applied, None, None);
        self.send_ack(from, ack);
        self.outbox.event(ReceiverEvent::Applied {
            custodian: from.clone(),
            obligation_id: ob.id().clone(),
            kind: ob.kind().clone(),
            effect,
        });
    }

    fn record_decline(
        &mut self,
        now: Timestamp,
        from: &AgentId,
        ob: &Obligation,
        reason: DeclineReason,
        detail: Option<String>,
    ) -> Received {
        // Declines are remembered, not re-decided.
        self.write_ledger(
            now,
            from,
            ob,
            LedgerOutcome::Declined,
            Some(reason),
            detail.clone(),
            Vec::new(),
            None,
        );
        let ack = self.ack(
            now,
            ob.id(),
            ob.digest(),
            AckStatus::Declined,
            Some(reason),
            detail,
        );
        self.send_ack(from, ack);
        self.outbox.event(ReceiverEvent::Declined {
            custodian: from.clone(),
            obligation_id: ob.id().clone(),
            reason,
        });
        Received::Declined(reason)
    }

    #[allow(clippy::too_many_arguments)]
    fn write_ledger(
        &mut self,
        now: Timestamp,
        from: &AgentId,
        ob: &Obligation,
        outcome: LedgerOutcome,
        reason: Option<DeclineReason>,
        detail: Option<String>,
        effect: Vec<EffectWrite>,
        key_sequence: Option<(GovernedKey, Sequence)>,
    ) {
        let undecided = matches!(
            outcome,
            LedgerOutcome::Deferred | LedgerOutcome::OutcomeUnknown
        );
        let keep = undecided.then(|| ob.clone());
        self.insert_entry(
            (from.clone(), ob.id().clone()),
            Entry {
                digest: ob.digest(),
                outcome,
                reason,
                detail: detail.clone(),
                deadline_at: ob.deadline_at(),
                obligation: keep.clone(),
                intent: None,
            },
        );
        #[cfg(feature = "mutations")]
        if outcome == LedgerOutcome::Applied
            && crate::mutations::active(crate::mutations::Mutation::LedgerNotCommittedWithEffect)
        {
            return;
        }
        self.outbox.record(Record::Ledger(Box::new(LedgerRecord {
            custodian: from.clone(),
            obligation_id: ob.id().clone(),
            digest: ob.digest(),
            kind: ob.kind().clone(),
            outcome,
            reason,
            detail,
            effect,
            key_sequence,
            recorded_at: now,
            deadline_at: ob.deadline_at(),
            obligation: keep,
        })));
    }

    /// Completes a deferred obligation and pushes its final ack to the
    /// custodian. Past the deadline it is declined `expired` whatever the
    /// decision; behind a newer sequence, `superseded`.
    pub fn complete_deferred(
        &mut self,
        now: Timestamp,
        custodian: &AgentId,
        id: &ObligationId,
        decision: ApplyDecision,
    ) -> Result<Received, CompleteError> {
        let e = self
            .ledger
            .get(&(custodian.clone(), id.clone()))
            .cloned()
            .ok_or_else(|| CompleteError::Unknown(id.to_string()))?;
        if e.outcome != LedgerOutcome::Deferred || e.intent.is_some() {
            return Err(CompleteError::AlreadyDecided(id.to_string()));
        }
        if matches!(
            decision,
            ApplyDecision::Defer { .. } | ApplyDecision::External(_)
        ) {
            return Err(CompleteError::Invalid(
                id.to_string(),
                "a completion must apply or decline",
            ));
        }
        let ob = e
            .obligation
            .ok_or_else(|| CompleteError::Unknown(id.to_string()))?;
        let mut decision = Some(decision);
        let mut once = move |_: &ApplyContext<'_>, _: &Obligation| {
            decision
                .take()
                .unwrap_or(ApplyDecision::Defer { detail: None })
        };
        Ok(self.decide(now, custodian, ob, &mut once, true))
    }

    /// Reports how an external effect ended (after [`ReceiverEvent::Execute`]
    /// or [`ReceiverEvent::OutcomeUnknown`]); records it and pushes the
    /// final ack.
    pub fn handle_external_outcome(
        &mut self,
        now: Timestamp,
        custodian: &AgentId,
        id: &ObligationId,
        outcome: ExternalOutcome,
    ) -> Result<Received, CompleteError> {
        let e = self
            .ledger
            .get(&(custodian.clone(), id.clone()))
            .cloned()
            .ok_or_else(|| CompleteError::Unknown(id.to_string()))?;
        if e.intent.is_none()
            || matches!(e.outcome, LedgerOutcome::Applied | LedgerOutcome::Declined)
        {
            return Err(CompleteError::AlreadyDecided(id.to_string()));
        }
        let ob = e
            .obligation
            .ok_or_else(|| CompleteError::Unknown(id.to_string()))?;
        // The effect already happened (or not) in the external system; the
        // deadline check does not apply to reporting what is true.
        Ok(match outcome {
            ExternalOutcome::Applied(effect) => {
                self.record_applied(now, custodian, &ob, effect, None);
                Received::Applied
            }
            ExternalOutcome::Failed { reason, detail } => {
                self.record_decline(now, custodian, &ob, reason, detail)
            }
        })
    }

    /// Answers a status query from `from` with what the ledger knows.
    pub fn handle_status_query(&mut self, now: Timestamp, from: &AgentId, ids: &[ObligationId]) {
        let mut known = Vec::new();
        let mut unknown = Vec::new();
        for id in ids {
            match self.ledger.get(&(from.clone(), id.clone())) {
                Some(e) => {
                    let status = match e.outcome {
                        LedgerOutcome::Applied => AckStatus::Applied,
                        LedgerOutcome::Declined => AckStatus::Declined,
                        LedgerOutcome::Deferred | LedgerOutcome::OutcomeUnknown => {
                            AckStatus::Deferred
                        }
                    };
                    let reason = (status == AckStatus::Declined)
                        .then_some(e.reason)
                        .flatten();
                    known.push(self.ack(now, id, e.digest, status, reason, e.detail.clone()));
                }
                None => unknown.push(id.clone()),
            }
        }
        self.outbox.transmit(Transmit {
            to: from.clone(),
            message: Message::StatusReply(StatusReply {
                target: self.config.agent.clone(),
                known,
                unknown,
            }),
        });
    }

    /// Drops decided ledger entries whose deadline is older than `before`
    /// (retention). A redelivery after that is past its deadline and is
    /// declined `expired`, so compaction never enables a second application.
    /// The per-custodian quota counts follow (C-ND-5).
    pub fn compact(&mut self, before: Timestamp) -> usize {
        let n = self.ledger.len();
        let held = &mut self.held;
        self.ledger.retain(|(custodian, _), e| {
            let keep = e.deadline_at >= before
                || !matches!(e.outcome, LedgerOutcome::Applied | LedgerOutcome::Declined);
            if !keep {
                if let Some(h) = held.get_mut(custodian) {
                    *h = h.saturating_sub(1);
                }
            }
            keep
        });
        held.retain(|_, h| *h > 0);
        n - self.ledger.len()
    }

    /// The records to commit before the acks that report them.
    #[must_use]
    pub fn poll_records(&mut self) -> Option<RecordBatch> {
        self.outbox.poll_records()
    }

    /// Marks a polled batch durable.
    pub fn handle_committed(&mut self, token: CommitToken) {
        self.outbox.committed(token);
    }

    /// The next frame to send. Consecutive releasable acks to the same
    /// custodian are coalesced into one frame.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        let mut t = self.outbox.poll_transmit()?;
        if let Message::Acks(acks) = &mut t.message {
            while acks.len() < MAX_ACKS_PER_FRAME {
                let same = matches!(
                    self.outbox.peek_transmit(),
                    Some(Transmit { to, message: Message::Acks(_) }) if *to == t.to
                );
                if !same {
                    break;
                }
                if let Some(Transmit {
                    message: Message::Acks(more),
                    ..
                }) = self.outbox.poll_transmit()
                {
                    acks.extend(more);
                }
            }
        }
        Some(t)
    }

    /// The next event, once its records are committed.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<ReceiverEvent> {
        self.outbox.poll_event()
    }

    /// Records emitted but not yet committed.
    pub fn uncommitted_records(&self) -> u64 {
        self.outbox.uncommitted()
    }
}
