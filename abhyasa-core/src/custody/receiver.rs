//! The receiver: applies each obligation at most once (AB-3), never past
//! its deadline, never behind a newer sequence on its key.
//!
//! # Polling contract
//!
//! Same as the custodian's: feed [`Receiver::receive`] (and
//! [`Receiver::decide`], [`Receiver::handle_timeout`],
//! [`Receiver::handle_status_query`], [`Receiver::complete_deferred`],
//! [`Receiver::handle_external_outcome`]); drain
//! [`Receiver::poll_apply_request`] and hand each request to the embedding
//! agent, whose answer comes back later through [`Receiver::decide`];
//! drain [`Receiver::poll_records`], commit, [`Receiver::handle_committed`];
//! then drain [`Receiver::poll_transmit`] and [`Receiver::poll_event`], and
//! arm a timer for [`Receiver::poll_timeout`]. An ack is released only
//! after the ledger entry (with its effect) it reports is durable, so an
//! ack can never attest an application a crash could undo. Consecutive
//! acks to one custodian are coalesced into one frame.
//!
//! # Asking the agent (str0m style)
//!
//! The machine never runs user code: an obligation that needs a decision
//! becomes an [`ApplyRequest`], held in memory only (nothing durable is
//! written until the decision comes back, so effect and ledger entry stay
//! one atomic record, AB-3). While it is outstanding a redelivery asks
//! nothing again and is answered by the ack of the decision. A decision is
//! checked against the rules as they stand when it returns (deadline,
//! supersession); its deadline passing with no decision declines it
//! `expired` ([`Receiver::handle_timeout`]). Outstanding requests are
//! bounded ([`ReceiverConfig::max_outstanding_requests`]); beyond the
//! bound an obligation gets an `overloaded` error and the custodian keeps
//! custody and retries. A crash loses only the requests, which the
//! custodian's redelivery asks again. [`Receiver::handle_obligation`] is
//! the synchronous convenience: it asks a synchronous [`Applier`] at once.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use std::collections::{BTreeSet, VecDeque};

use super::applier::{Applier, ApplyContext, ApplyDecision, ApplyRequest, ApplyTicket};
use super::lease::{self, Authority};
use super::outbox::{CommitToken, Outbox, RecordBatch};
use super::record::{
    EffectValue, EffectWrite, ExternalIntent, IntentRecord, LedgerOutcome, LedgerRecord,
    ReceiverSnapshot, Record,
};
use super::transmit::Transmit;
use crate::model::{
    AckStatus, AgentId, CustodyAck, DeclineReason, Digest, GovernedKey, Kind, Obligation,
    ObligationId, Sequence, Timestamp,
};
use crate::polarity::PolarityRegistry;
use crate::wire::{ErrorCode, Message, ProtocolError, StatusReply};

/// The suffix of [`lease::lease_key`].
const LEASE_SUFFIX: &str = "#lease_until";

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
    /// Most apply requests outstanding at once (asked, not yet decided).
    /// Beyond it a new obligation gets an `overloaded` error frame and
    /// nothing is kept; the custodian keeps custody and retries (C-ND-5:
    /// a slow agent cannot make the receiver hold unbounded requests).
    pub max_outstanding_requests: usize,
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
            max_outstanding_requests: 10_000,
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
    /// A leased grant was not renewed in time: the authority on `key` is
    /// no longer exercisable (C-TR-4). Not a record: the lapse is a
    /// function of the stored lease end and the clock.
    LeaseLapsed {
        /// The governed key.
        key: String,
        /// When the lease ended.
        lease_until: Timestamp,
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
    /// Asked the agent ([`Receiver::poll_apply_request`]), or a redelivery
    /// of an obligation already asked: nothing is recorded until the
    /// decision for this ticket comes back.
    AwaitingDecision(ApplyTicket),
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
    /// The ticket names no outstanding apply request: already decided,
    /// declined `expired` while waiting, cancelled, or from before a
    /// restart (the custodian's redelivery asks again).
    #[error("{0} names no outstanding apply request")]
    UnknownTicket(ApplyTicket),
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

/// An obligation asked of the agent, held in memory only until decided.
#[derive(Debug, Clone)]
struct Waiting {
    ticket: ApplyTicket,
    obligation: Obligation,
    previously_deferred: bool,
    /// The governed key's value when asked (stale-decision check).
    seen: Option<EffectValue>,
    key: Option<GovernedKey>,
    /// The key if the kind's rule guards it by sequence.
    guarded_key: Option<GovernedKey>,
}

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
    /// Outstanding apply requests by ledger key.
    waiting: HashMap<LedgerKey, Waiting>,
    /// Ticket -> ledger key of `waiting`.
    tickets: HashMap<ApplyTicket, LedgerKey>,
    /// When each waiting obligation can no longer be applied
    /// (`deadline - skew_margin`), for the expiry timer.
    expiries: BTreeSet<(Timestamp, ApplyTicket)>,
    /// Requests not yet polled by the driver.
    requests: VecDeque<ApplyRequest>,
    next_ticket: u64,
    /// Lease end per governed key holding a leased grant.
    leases: HashMap<String, Timestamp>,
    /// (`lease_until - skew_margin`, governed key): when each lease lapses.
    lease_timers: BTreeSet<(Timestamp, String)>,
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
            waiting: HashMap::new(),
            tickets: HashMap::new(),
            expiries: BTreeSet::new(),
            requests: VecDeque::new(),
            next_ticket: 0,
            leases: HashMap::new(),
            lease_timers: BTreeSet::new(),
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
        // Leases survive a restart with the effects they ride in; one that
        // lapsed while down is due at the first timer turn.
        let leased: Vec<(String, EffectValue)> = r
            .effects
            .iter()
            .filter(|(k, _)| k.ends_with(LEASE_SUFFIX))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (k, v) in leased {
            r.track_lease(&k, &v);
        }
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

    /// Handles an obligation from the authenticated custodian `from` and,
    /// if it needs a decision, asks the synchronous `applier` at once: the
    /// convenience over [`Receiver::receive`] + [`Receiver::decide`] for
    /// simulators, model checks and agents whose decisions never wait.
    pub fn handle_obligation(
        &mut self,
        now: Timestamp,
        from: &AgentId,
        ob: Obligation,
        applier: &mut dyn Applier,
    ) -> Received {
        let got = self.receive(now, from, ob);
        let Received::AwaitingDecision(ticket) = got else {
            return got;
        };
        let Some(pos) = self.requests.iter().rposition(|r| r.ticket == ticket) else {
            // A redelivery of a request handed out before and not yet
            // decided: its decision will answer this delivery too.
            return got;
        };
        let Some(req) = self.requests.remove(pos) else {
            return got;
        };
        let decision = {
            let ctx = ApplyContext {
                now,
                custodian: from,
                key: req.key.as_ref(),
                effects: &self.effects,
                previously_deferred: req.previously_deferred,
            };
            applier.decide(&ctx, &req.obligation)
        };
        self.decide(now, ticket, decision).unwrap_or(got)
    }

    /// Handles an obligation from the authenticated custodian `from`. What
    /// the rules decide alone (a duplicate, a conflict, expired,
    /// superseded, out of bounds) is recorded at once; otherwise an
    /// [`ApplyRequest`] is queued for [`Receiver::poll_apply_request`] and
    /// [`Received::AwaitingDecision`] returned. A redelivery while the
    /// request is outstanding asks nothing again (AB-3).
    pub fn receive(&mut self, now: Timestamp, from: &AgentId, ob: Obligation) -> Received {
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
        let known = self
            .ledger
            .get(&lkey)
            .map(|e| e.digest)
            .or_else(|| self.waiting.get(&lkey).map(|w| w.obligation.digest()));
        if let Some(existing) = known.filter(|d| *d != ob.digest()) {
            // AB-3: same id, other content: a protocol error, never a
            // duplicate and never a new obligation.
            let ack = self.ack(
                now,
                &id,
                ob.digest(),
                AckStatus::Declined,
                Some(DeclineReason::Conflict),
                Some(format!("obligation id already used with digest {existing}")),
            );
            self.send_ack(from, ack);
            self.outbox.event(ReceiverEvent::Conflict {
                custodian: from.clone(),
                obligation_id: id,
                existing,
                offered: ob.digest(),
            });
            return Received::Conflict;
        }
        if let Some(e) = self.ledger.get(&lkey).cloned() {
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
        if let Some(ticket) = self.waiting.get(&lkey).map(|w| w.ticket) {
            if now.saturating_add(self.config.skew_margin) >= ob.deadline_at() {
                // Never apply late, even if the decision is still coming.
                self.expire(now, ticket);
                return Received::Declined(DeclineReason::Expired);
            }
            // AB-3: asked once; the decision's ack answers this delivery.
            return Received::AwaitingDecision(ticket);
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
        self.evaluate(now, from, ob, previously_deferred, None)
    }

    /// Takes the agent's decision for an outstanding request back as an
    /// input. The rules are applied as they stand now: past the deadline
    /// (with the skew margin) it is declined `expired` whatever the
    /// decision; behind a newer sequence on its key, `superseded`; an
    /// `Apply` computed from a key value that has changed since the
    /// request is stale and the agent is asked again (a new ticket, in
    /// [`Received::AwaitingDecision`]). Otherwise the decision is recorded
    /// (effect and ledger entry in one record, AB-3) and its ack, released
    /// after commit, answers every delivery received while waiting.
    pub fn decide(
        &mut self,
        now: Timestamp,
        ticket: ApplyTicket,
        decision: ApplyDecision,
    ) -> Result<Received, CompleteError> {
        let (lkey, w) = self
            .take_waiting(ticket)
            .ok_or(CompleteError::UnknownTicket(ticket))?;
        let from = lkey.0;
        let ob = w.obligation;
        // Deadlines bind both sides: a decision that comes too late is
        // declined `expired`, whatever it says (C-DL-1).
        if now.saturating_add(self.config.skew_margin) >= ob.deadline_at() {
            let detail = format!("deadline {} passed", ob.deadline_at());
            return Ok(self.record_decline(now, &from, &ob, DeclineReason::Expired, Some(detail)));
        }
        // A newer sequence applied on the key while waiting (C-SS-2).
        if let Some(detail) = self.superseded(w.guarded_key.as_ref(), &ob) {
            return Ok(self.record_decline(
                now,
                &from,
                &ob,
                DeclineReason::Superseded,
                Some(detail),
            ));
        }
        let stale = matches!(decision, ApplyDecision::Apply(_))
            && w.key
                .as_ref()
                .is_some_and(|k| self.effects.get(k.as_str()) != w.seen.as_ref());
        if stale {
            return Ok(self.ask(now, &from, ob, w.previously_deferred, w.key, w.guarded_key));
        }
        let key_sequence = w.guarded_key.zip(ob.sequence());
        Ok(self.record_decision(now, &from, &ob, decision, key_sequence))
    }

    /// Forgets an outstanding request without deciding it (the agent
    /// could not answer, e.g. its task failed). Nothing durable changes;
    /// the custodian's redelivery asks again. False if the ticket names no
    /// outstanding request.
    pub fn abandon_request(&mut self, ticket: ApplyTicket) -> bool {
        self.take_waiting(ticket).is_some()
    }

    /// The next question for the embedding agent. Answer each with
    /// [`Receiver::decide`] (from any task, in any order).
    #[must_use]
    pub fn poll_apply_request(&mut self) -> Option<ApplyRequest> {
        self.requests.pop_front()
    }

    /// Apply requests asked and not yet decided.
    pub fn outstanding_requests(&self) -> usize {
        self.waiting.len()
    }

    /// Answers every queued request at once with a synchronous applier
    /// (the adapter for drivers without an asynchronous agent).
    pub fn answer_requests_with(&mut self, now: Timestamp, applier: &mut dyn Applier) {
        while let Some(req) = self.requests.pop_front() {
            let decision = req.answer_with(applier);
            // The ticket came from this queue, so it is outstanding.
            let _ = self.decide(now, req.ticket, decision);
        }
    }

    /// When [`Receiver::handle_timeout`] must next run: the earliest
    /// moment an outstanding request can no longer be applied, or a lease
    /// lapses.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        let request = self.expiries.first().map(|(at, _)| *at);
        let lease = self.lease_timers.first().map(|(at, _)| *at);
        match (request, lease) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Declines `expired` every outstanding request whose deadline (less
    /// the skew margin) has come: the decision did not come in time, and a
    /// receiver never applies late (C-DL-1). Reports every lease that
    /// lapsed ([`ReceiverEvent::LeaseLapsed`]); the authority itself ends
    /// at read time ([`Receiver::authority`]), timer or not.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        while let Some(&(at, ticket)) = self.expiries.first() {
            if at > now {
                break;
            }
            self.expire(now, ticket);
        }
        while let Some((at, key)) = self.lease_timers.first().cloned() {
            if at > now {
                break;
            }
            self.lease_timers.remove(&(at, key.clone()));
            if let Some(lease_until) = self.leases.remove(&key) {
                if self.authority(&key, now) == (Authority::Lapsed { lease_until }) {
                    self.outbox
                        .event(ReceiverEvent::LeaseLapsed { key, lease_until });
                }
            }
        }
    }

    /// What this agent may do on governed key `key` at `now`, read at the
    /// moment of use: a leased grant holds only while
    /// `now + skew_margin < lease_until` (C-TR-4), so a partitioned agent
    /// stops at lease expiry though no revocation arrives. Reflects
    /// uncommitted writes too: check before acting, after the commit that
    /// an ack reports.
    pub fn authority(&self, key: &str, now: Timestamp) -> Authority {
        let state = match self.effects.get(key) {
            Some(EffectValue::Authorization(a)) => Some(*a),
            _ => None,
        };
        let until = self
            .effects
            .get(&lease::lease_key(key))
            .and_then(lease::decode_lease);
        Authority::at(state, until, now, self.config.skew_margin)
    }

    /// Every governed key that holds or held a lease, with its end and its
    /// authority at `now` (for `abhyasa leases`), in key order.
    pub fn leases(&self, now: Timestamp) -> Vec<(String, Timestamp, Authority)> {
        let mut out: Vec<_> = self
            .effects
            .iter()
            .filter_map(|(k, v)| {
                let key = k.strip_suffix(LEASE_SUFFIX)?;
                let until = lease::decode_lease(v)?;
                Some((key.to_string(), until, self.authority(key, now)))
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Follows a lease write (`lease_key`, value) in the lapse timers.
    fn track_lease(&mut self, lease_key: &str, value: &EffectValue) {
        let Some(key) = lease_key.strip_suffix(LEASE_SUFFIX) else {
            return;
        };
        if let Some(old) = self.leases.remove(key) {
            let at = old.saturating_sub(self.config.skew_margin);
            self.lease_timers.remove(&(at, key.to_string()));
        }
        if let Some(until) = lease::decode_lease(value) {
            self.leases.insert(key.to_string(), until);
            let at = until.saturating_sub(self.config.skew_margin);
            self.lease_timers.insert((at, key.to_string()));
        }
    }

    fn expire(&mut self, now: Timestamp, ticket: ApplyTicket) {
        if let Some(((from, _), w)) = self.take_waiting(ticket) {
            let detail = format!(
                "deadline {} passed while awaiting the agent's decision",
                w.obligation.deadline_at()
            );
            self.record_decline(
                now,
                &from,
                &w.obligation,
                DeclineReason::Expired,
                Some(detail),
            );
        } else {
            self.expiries.retain(|(_, t)| *t != ticket);
        }
    }

    fn expiry_of(&self, ob: &Obligation) -> Timestamp {
        ob.deadline_at().saturating_sub(self.config.skew_margin)
    }

    fn take_waiting(&mut self, ticket: ApplyTicket) -> Option<(LedgerKey, Waiting)> {
        let lkey = self.tickets.remove(&ticket)?;
        let w = self.waiting.remove(&lkey)?;
        let at = self.expiry_of(&w.obligation);
        self.expiries.remove(&(at, ticket));
        if let Some(pos) = self.requests.iter().position(|r| r.ticket == ticket) {
            self.requests.remove(pos);
        }
        Some((lkey, w))
    }

    /// Why `ob` is behind a newer sequence on its guarded key, if it is.
    fn superseded(&self, guarded_key: Option<&GovernedKey>, ob: &Obligation) -> Option<String> {
        #[cfg(not(feature = "mutations"))]
        let guard_on = true;
        #[cfg(feature = "mutations")]
        let guard_on = !crate::mutations::active(crate::mutations::Mutation::SupersessionGuardOff);
        let key = guarded_key.filter(|_| guard_on)?;
        let seq = ob.sequence()?;
        let (newest, by) = self.key_seq.get(key)?;
        (seq <= *newest && by != ob.id())
            .then(|| format!("sequence {seq} on {key} superseded by {newest} ({by})"))
    }

    /// The rules that decide alone, then the decision: `decision` if the
    /// caller brings one, else a request to the agent.
    fn evaluate(
        &mut self,
        now: Timestamp,
        from: &AgentId,
        ob: Obligation,
        previously_deferred: bool,
        decision: Option<ApplyDecision>,
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
        if let Some(detail) = self.superseded(guarded_key.as_ref(), &ob) {
            return self.record_decline(now, from, &ob, DeclineReason::Superseded, Some(detail));
        }
        let Some(decision) = decision else {
            if self.waiting.len() >= self.config.max_outstanding_requests {
                // C-ND-5: nothing kept; the custodian retries on schedule.
                let err = ProtocolError {
                    code: ErrorCode::Overloaded,
                    obligation_id: Some(ob.id().clone()),
                    digest: Some(ob.digest()),
                    message: format!(
                        "{} apply requests outstanding (at most {}); retry later",
                        self.waiting.len(),
                        self.config.max_outstanding_requests
                    ),
                };
                self.outbox.transmit(Transmit {
                    to: from.clone(),
                    message: Message::Error(err.clone()),
                });
                return Received::Rejected(err);
            }
            return self.ask(now, from, ob, previously_deferred, class.key, guarded_key);
        };
        let key_sequence = guarded_key.zip(ob.sequence());
        self.record_decision(now, from, &ob, decision, key_sequence)
    }

    /// Queues a request to the agent; nothing durable is written.
    fn ask(
        &mut self,
        now: Timestamp,
        from: &AgentId,
        ob: Obligation,
        previously_deferred: bool,
        key: Option<GovernedKey>,
        guarded_key: Option<GovernedKey>,
    ) -> Received {
        let ticket = ApplyTicket(self.next_ticket);
        self.next_ticket += 1;
        let seen = key
            .as_ref()
            .and_then(|k| self.effects.get(k.as_str()).cloned());
        let mut effects = BTreeMap::new();
        if let Some(k) = &key {
            if let Some(v) = &seen {
                effects.insert(k.to_string(), v.clone());
            }
            let lk = lease::lease_key(k.as_str());
            if let Some(v) = self.effects.get(&lk) {
                effects.insert(lk, v.clone());
            }
        }
        let lkey = (from.clone(), ob.id().clone());
        self.expiries.insert((self.expiry_of(&ob), ticket));
        self.tickets.insert(ticket, lkey.clone());
        self.requests.push_back(ApplyRequest {
            ticket,
            custodian: from.clone(),
            obligation: ob.clone(),
            key: key.clone(),
            asked_at: now,
            previously_deferred,
            effects,
        });
        self.waiting.insert(
            lkey,
            Waiting {
                ticket,
                obligation: ob,
                previously_deferred,
                seen,
                key,
                guarded_key,
            },
        );
        Received::AwaitingDecision(ticket)
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
            if w.key.ends_with(LEASE_SUFFIX) {
                self.track_lease(&w.key, &w.value);
            }
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
        // An explicit completion answers for the agent: a re-ask still
        // outstanding for this obligation is withdrawn, never applied too.
        if let Some(t) = self
            .waiting
            .get(&(custodian.clone(), id.clone()))
            .map(|w| w.ticket)
        {
            self.take_waiting(t);
        }
        Ok(self.evaluate(now, custodian, ob, true, Some(decision)))
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
