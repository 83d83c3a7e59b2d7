//! The custodian: holds admissible obligations under custody until they are
//! applied, declined or escalated (AB-1, AB-2, AB-4).
//!
//! # Polling contract
//!
//! The custodian never reads a clock and never does I/O. A driver:
//!
//! 1. feeds inputs: [`Custodian::offer`], [`Custodian::handle_ack`],
//!    [`Custodian::handle_error`], [`Custodian::handle_status_reply`],
//!    [`Custodian::handle_timeout`] (whenever `now >= poll_timeout()`);
//! 2. drains [`Custodian::poll_records`] and commits the batch durably
//!    (group commit: one flush for the whole batch), then hands its token to
//!    [`Custodian::handle_committed`];
//! 3. drains [`Custodian::poll_transmit`] and [`Custodian::poll_event`].
//!
//! A transmit or event is released only after every record emitted before
//! it is committed, so nothing is sent before the custody it depends on is
//! durable (AB-1) — the driver cannot get this wrong. Batches must be
//! committed in the order they were polled.
//!
//! # `max_retries`
//!
//! `max_retries` counts retries after the first attempt: a transfer makes at
//! most `1 + max_retries` attempts. After the last attempt the custodian
//! waits one more backoff interval for an ack; custody ends at the absolute
//! deadline (`created_at + deadline_seconds`) or when that interval runs
//! out, whichever is first (AB-4).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::outbox::{CommitToken, Outbox, RecordBatch};
use super::record::{
    ClosedRecord, CustodianSnapshot, CustodyOutcome, DeclineDisposition, PendingRecord,
    Reconciliation, Record, TerminalState, TerminalSummary,
};
use super::transmit::Transmit;
use crate::error::{OfferError, ProfileError};
use crate::model::{
    AckStatus, AgentId, Backoff, CustodyAck, DeclinePolicy, DeclineReason, Digest, Escalation,
    EscalationCause, EscalationTrigger, GovernedKey, Kind, Obligation, ObligationId, SafeAction,
    Sequence, Timestamp,
};
use crate::polarity::{Admission, PolarityRegistry};
use crate::principal::{
    Authorization, ChangeCause, DecisionItem, PrincipalState, PrincipalWrite, Resolution,
    WeightRange,
};
use crate::wire::{ErrorCode, Message, ProtocolError, StatusReply};

/// Per-kind custody behaviour.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CustodyProfile {
    /// Retry backoff.
    pub backoff: Backoff,
    /// What to do on decline.
    pub decline_policy: DeclinePolicy,
}

impl Default for CustodyProfile {
    fn default() -> Self {
        Self {
            backoff: Backoff::DEFAULT,
            decline_policy: DeclinePolicy::ApplySafe,
        }
    }
}

/// How strictly acks are bound to what they attest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AckBinding {
    /// An ack must carry the obligation's digest (default).
    #[default]
    RequireDigest,
    /// Accept a digest-less ack from the authenticated expected receiver
    /// (v1 peers do not send digests). A digest that is present must still
    /// match.
    AllowMissingDigest,
}

/// Custodian configuration.
#[derive(Clone, Debug)]
pub struct CustodianConfig {
    /// This agent.
    pub agent: AgentId,
    /// Profile for kinds without their own.
    pub default_profile: CustodyProfile,
    /// Per-kind profiles.
    pub profiles: HashMap<Kind, CustodyProfile>,
    /// Seed of the jitter stream (same seed, same schedule).
    pub seed: u64,
    /// Bound on pending obligations (admission control).
    pub max_pending: usize,
    /// Ack binding.
    pub ack_binding: AckBinding,
    /// Principal-side weight clip range.
    pub weight_range: WeightRange,
}

impl CustodianConfig {
    /// Defaults for an agent: v1 backoff, 10 % jitter, seed 0, one million
    /// pending, digests required.
    pub fn new(agent: AgentId) -> Self {
        Self {
            agent,
            default_profile: CustodyProfile::default(),
            profiles: HashMap::new(),
            seed: 0,
            max_pending: 1_000_000,
            ack_binding: AckBinding::RequireDigest,
            weight_range: WeightRange::default(),
        }
    }

    /// The profile of a kind.
    pub fn profile(&self, kind: &Kind) -> &CustodyProfile {
        self.profiles.get(kind).unwrap_or(&self.default_profile)
    }
}

/// What the driver learns from the custodian (released after commit).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum CustodianEvent {
    /// Custody opened (durable).
    Opened {
        /// The obligation.
        obligation_id: ObligationId,
        /// Its absolute deadline.
        deadline_at: Timestamp,
    },
    /// A retry was sent.
    Retrying {
        /// The obligation.
        obligation_id: ObligationId,
        /// The attempt number (2 = first retry).
        attempt: u32,
    },
    /// A best-effort obligation was sent once.
    BestEffortSent {
        /// The obligation.
        obligation_id: ObligationId,
        /// Its target.
        target: AgentId,
    },
    /// The receiver applied it; custody discharged.
    Applied {
        /// The obligation.
        obligation_id: ObligationId,
        /// Its target.
        target: AgentId,
        /// Attempts made.
        attempts: u32,
        /// From offer to discharge.
        latency: Duration,
    },
    /// The receiver declined it; custody discharged.
    Declined {
        /// The obligation.
        obligation_id: ObligationId,
        /// Its target.
        target: AgentId,
        /// Reason.
        reason: Option<DeclineReason>,
        /// What the custodian did.
        disposition: DeclineDisposition,
    },
    /// A decline awaits the principal's decision.
    DecisionRequired(DecisionItem),
    /// The receiver answered deferred.
    Deferred {
        /// The obligation.
        obligation_id: ObligationId,
        /// Attempts made so far.
        attempts: u32,
    },
    /// Escalated, with the fail-safe applied.
    Escalated(Box<Escalation>),
    /// An ack arrived after custody ended.
    LateAck(Reconciliation),
}

/// What `handle_ack` did with one ack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckDisposition {
    /// Discharged custody as applied.
    Applied,
    /// Discharged custody as declined.
    Declined,
    /// Escalated at once (conflict).
    Escalated,
    /// Noted a deferral; schedule unchanged.
    Deferred,
    /// Recorded for reconciliation (custody already ended).
    Late,
    /// Duplicate of what is known; nothing to do.
    Duplicate,
    /// Ignored: it does not bind to a pending obligation.
    Ignored(IgnoredAck),
}

/// Why an ack was ignored (C-TR-2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IgnoredAck {
    /// No such obligation (or compacted).
    Unknown,
    /// Sent by, or naming, an agent other than the expected receiver.
    WrongReceiver,
    /// Digest does not match the obligation.
    WrongDigest,
    /// No digest and the binding requires one.
    MissingDigest,
    /// Invalid ack (e.g. reason with a non-decline status).
    Invalid,
}

/// Counters (for metrics and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CustodianStats {
    /// Admissible obligations taken into custody.
    pub opened: u64,
    /// Best-effort sends.
    pub best_effort: u64,
    /// Transmits of obligations (first attempts and retries) handed to the
    /// transport, less those it refused (see
    /// [`Custodian::handle_send_failed`]).
    pub attempts_sent: u64,
    /// Transmits the transport could not queue (nothing left this node).
    pub attempts_refused: u64,
    /// Applied.
    pub applied: u64,
    /// Declined.
    pub declined: u64,
    /// Escalated.
    pub escalated: u64,
    /// Acks that discharged or updated custody.
    pub acks_accepted: u64,
    /// Acks for unknown ids.
    pub acks_unknown: u64,
    /// Acks from or naming the wrong receiver.
    pub acks_wrong_receiver: u64,
    /// Acks with the wrong digest.
    pub acks_wrong_digest: u64,
    /// Acks missing a required digest.
    pub acks_missing_digest: u64,
    /// Invalid acks.
    pub acks_invalid: u64,
    /// Duplicate acks.
    pub acks_duplicate: u64,
    /// Late acks recorded.
    pub late_acks: u64,
}

/// The result of a successful offer.
#[derive(Clone, Debug, PartialEq)]
pub enum Offered {
    /// Taken into custody; the first attempt is queued behind its commit.
    Custody {
        /// Absolute deadline.
        deadline_at: Timestamp,
    },
    /// Not admissible: sent once, best-effort.
    BestEffort,
    /// The same obligation (same digest) is already pending.
    AlreadyPending,
    /// The same obligation (same digest) already finished.
    AlreadyTerminal(TerminalState),
}

#[derive(Debug, Clone)]
struct Pending {
    obligation: Obligation,
    safe: SafeAction,
    attempts: u32,
    next_at: Timestamp,
    due: Timestamp,
    deadline_at: Timestamp,
    deferred: bool,
    offered_at: Timestamp,
}

/// The custodian state machine. See the module docs for the polling
/// contract.
///
/// `Clone` lets a model checker explore alternative futures from one state;
/// a driver must never run two clones against the same store and peers.
#[derive(Debug, Clone)]
pub struct Custodian {
    config: CustodianConfig,
    registry: PolarityRegistry,
    principal: PrincipalState,
    pending: HashMap<ObligationId, Pending>,
    timers: BTreeSet<(Timestamp, ObligationId)>,
    terminal: HashMap<ObligationId, TerminalSummary>,
    outbox: Outbox<Transmit, CustodianEvent>,
    stats: CustodianStats,
}

/// The `u` in `[0, 1)` that jitters attempt `attempt` of the obligation with
/// digest `digest`: a counter-based draw from ChaCha8 seeded by the config
/// seed and the digest, so the schedule is a pure function of (seed,
/// obligation, attempt) and survives restarts unchanged.
fn jitter_draw(seed: u64, digest: &Digest, attempt: u32) -> f64 {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ digest.prefix_u64());
    rng.set_word_pos(u128::from(attempt) * 2);
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

impl Custodian {
    /// A custodian with no history.
    pub fn new(config: CustodianConfig, registry: PolarityRegistry) -> Self {
        let principal = PrincipalState::new(config.weight_range);
        Self {
            config,
            registry,
            principal,
            pending: HashMap::new(),
            timers: BTreeSet::new(),
            terminal: HashMap::new(),
            outbox: Outbox::default(),
            stats: CustodianStats::default(),
        }
    }

    /// Rebuilds a custodian from its durable state after a restart. Every
    /// pending transfer resumes its *remaining* window: the deadline is
    /// absolute and the attempt count is the stored one (AB-2).
    pub fn restore(
        config: CustodianConfig,
        registry: PolarityRegistry,
        snapshot: &CustodianSnapshot,
    ) -> Self {
        let mut c = Self::new(config, registry);
        for w in &snapshot.principal {
            c.principal.apply_write(w);
        }
        for (id, t) in &snapshot.terminal {
            c.terminal.insert(id.clone(), t.clone());
        }
        for p in snapshot.pending.values() {
            let deadline_at = p.obligation.deadline_at();
            #[cfg(feature = "mutations")]
            let deadline_at = crate::mutations::deadline_on_recovery(
                deadline_at,
                p.next_at,
                p.obligation.deadline_seconds(),
            );
            let due = p.next_at.min(deadline_at);
            c.timers.insert((due, p.obligation.id().clone()));
            c.pending.insert(
                p.obligation.id().clone(),
                Pending {
                    obligation: p.obligation.clone(),
                    safe: p.safe.clone(),
                    attempts: p.attempts,
                    next_at: p.next_at,
                    due,
                    deadline_at,
                    deferred: p.deferred,
                    offered_at: p.offered_at,
                },
            );
        }
        c
    }

    /// The configuration.
    pub fn config(&self) -> &CustodianConfig {
        &self.config
    }

    /// The polarity registry.
    pub fn registry(&self) -> &PolarityRegistry {
        &self.registry
    }

    /// Principal-side state.
    pub fn principal(&self) -> &PrincipalState {
        &self.principal
    }

    /// Counters.
    pub fn stats(&self) -> CustodianStats {
        self.stats
    }

    /// Number of obligations under custody.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// True when the id is under custody.
    pub fn is_pending(&self, id: &ObligationId) -> bool {
        self.pending.contains_key(id)
    }

    /// Attempts made for a pending obligation.
    pub fn attempts(&self, id: &ObligationId) -> Option<u32> {
        self.pending.get(id).map(|p| p.attempts)
    }

    /// The absolute deadline of a pending obligation.
    pub fn pending_deadline(&self, id: &ObligationId) -> Option<Timestamp> {
        self.pending.get(id).map(|p| p.deadline_at)
    }

    /// Ids under custody towards `target` (for a status query after a
    /// session is re-established).
    pub fn pending_for(&self, target: &AgentId) -> Vec<ObligationId> {
        self.pending
            .values()
            .filter(|p| p.obligation.target() == target)
            .map(|p| p.obligation.id().clone())
            .collect()
    }

    /// How a finished transfer ended.
    pub fn terminal(&self, id: &ObligationId) -> Option<&TerminalSummary> {
        self.terminal.get(id)
    }

    /// The backoff interval after attempt `attempt` of `ob`, with jitter.
    pub fn interval(&self, ob: &Obligation, attempt: u32) -> Duration {
        let b = &self.config.profile(ob.kind()).backoff;
        if b.jitter <= 0.0 {
            return b.nominal(attempt);
        }
        b.jittered(
            attempt,
            jitter_draw(self.config.seed, &ob.digest(), attempt),
        )
    }

    /// Offers an obligation. Admissible ones go under custody: the record
    /// is emitted and the first attempt queued behind its commit.
    /// Inadmissible ones are sent once. On error nothing was changed.
    pub fn offer(&mut self, now: Timestamp, ob: Obligation) -> Result<Offered, OfferError> {
        let class = self.registry.classify(&ob)?;
        let id = ob.id().clone();
        if let Some(p) = self.pending.get(&id) {
            return if p.obligation.digest() == ob.digest() {
                Ok(Offered::AlreadyPending)
            } else {
                Err(OfferError::IdConflict {
                    id: id.to_string(),
                    existing: p.obligation.digest(),
                    offered: ob.digest(),
                })
            };
        }
        if let Some(t) = self.terminal.get(&id) {
            return if t.digest == ob.digest() {
                Ok(Offered::AlreadyTerminal(t.state))
            } else {
                Err(OfferError::IdConflict {
                    id: id.to_string(),
                    existing: t.digest,
                    offered: ob.digest(),
                })
            };
        }
        if ob.target() == &self.config.agent {
            return Err(OfferError::SelfTarget { id: id.to_string() });
        }
        let deadline_at = ob.deadline_at();
        if now >= deadline_at {
            return Err(OfferError::Expired {
                id: id.to_string(),
                deadline_at,
            });
        }
        let safe = match class.admission {
            Admission::Custody { safe } => Some(safe),
            Admission::BestEffort => None,
        };
        if let Some(safe) = safe {
            let backoff = self.config.profile(ob.kind()).backoff;
            crate::model::check_sizing(
                ob.deadline_seconds(),
                u64::from(ob.max_retries()),
                backoff.base.as_secs_f64(),
                backoff.cap.as_secs_f64(),
            )
            .map_err(|e: ProfileError| OfferError::IncoherentProfile(e))?;
            if self.pending.len() >= self.config.max_pending {
                return Err(OfferError::Backpressure {
                    pending: self.pending.len(),
                    limit: self.config.max_pending,
                });
            }
            // Validation is over: from here on the offer is accepted whole.
            let principal = self.offer_decision(now, &ob, class.key.as_ref(), class.at_offer);
            let next_at = now.saturating_add(self.interval(&ob, 1));
            let due = next_at.min(deadline_at);
            let pending = Pending {
                obligation: ob.clone(),
                safe,
                attempts: 1,
                next_at,
                due,
                deadline_at,
                deferred: false,
                offered_at: now,
            };
            self.outbox.record(Record::CustodyOpened {
                pending: pending_record(&pending),
                principal,
            });
            self.timers.insert((due, id.clone()));
            self.pending.insert(id.clone(), pending);
            self.stats.opened += 1;
            self.stats.attempts_sent += 1;
            self.outbox.event(CustodianEvent::Opened {
                obligation_id: id,
                deadline_at,
            });
            self.outbox.transmit(Transmit {
                to: ob.target().clone(),
                message: Message::Obligation(ob),
            });
            Ok(Offered::Custody { deadline_at })
        } else {
            let principal = self.offer_decision(now, &ob, class.key.as_ref(), class.at_offer);
            let summary = TerminalSummary {
                obligation_id: id.clone(),
                digest: ob.digest(),
                target: ob.target().clone(),
                state: TerminalState::BestEffort,
                deadline_at,
                closed_at: now,
                late_ack_recorded: false,
            };
            self.terminal.insert(id.clone(), summary.clone());
            self.outbox
                .record(Record::BestEffortSent { summary, principal });
            self.stats.best_effort += 1;
            self.outbox.event(CustodianEvent::BestEffortSent {
                obligation_id: id,
                target: ob.target().clone(),
            });
            self.outbox.transmit(Transmit {
                to: ob.target().clone(),
                message: Message::Obligation(ob),
            });
            Ok(Offered::BestEffort)
        }
    }

    fn offer_decision(
        &mut self,
        now: Timestamp,
        ob: &Obligation,
        key: Option<&GovernedKey>,
        at_offer: Option<Authorization>,
    ) -> Vec<PrincipalWrite> {
        match (key, at_offer) {
            (Some(key), Some(state)) => self
                .principal
                .decide_at_offer(key, state, ob.sequence(), ob.id(), now)
                .1
                .into_iter()
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The earliest instant at which [`Custodian::handle_timeout`] has work.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        self.timers.first().map(|(t, _)| *t)
    }

    /// Runs every timer due at `now`: retries (AB-2) and escalations at the
    /// deadline or on retry exhaustion (AB-4).
    pub fn handle_timeout(&mut self, now: Timestamp) {
        while let Some((due, _)) = self.timers.first() {
            if *due > now {
                break;
            }
            let Some((_, id)) = self.timers.pop_first() else {
                break;
            };
            let Some(p) = self.pending.get(&id) else {
                continue;
            };
            if now >= p.deadline_at {
                self.escalate(now, &id, EscalationTrigger::Deadline, None);
            } else if p.attempts > p.obligation.max_retries() {
                self.escalate(now, &id, EscalationTrigger::RetriesExhausted, None);
            } else {
                self.retry(now, &id);
            }
        }
    }

    fn retry(&mut self, now: Timestamp, id: &ObligationId) {
        let Some(p) = self.pending.get(id) else {
            return;
        };
        let attempt = p.attempts + 1;
        let ob = p.obligation.clone();
        let next_at = now.saturating_add(self.interval(&ob, attempt));
        let Some(p) = self.pending.get_mut(id) else {
            return;
        };
        p.attempts = attempt;
        p.next_at = next_at;
        p.due = next_at.min(p.deadline_at);
        self.timers.insert((p.due, id.clone()));
        // The attempt is counted durably before it is released, so a crash
        // can never grant more than 1 + max_retries attempts.
        self.outbox.record(Record::AttemptMade {
            obligation_id: id.clone(),
            attempts: attempt,
            next_at,
        });
        self.stats.attempts_sent += 1;
        self.outbox.event(CustodianEvent::Retrying {
            obligation_id: id.clone(),
            attempt,
        });
        self.outbox.transmit(Transmit {
            to: ob.target().clone(),
            message: Message::Obligation(ob),
        });
    }

    fn take_pending(&mut self, id: &ObligationId) -> Option<Pending> {
        let p = self.pending.remove(id)?;
        self.timers.remove(&(p.due, id.clone()));
        Some(p)
    }

    fn escalate(
        &mut self,
        now: Timestamp,
        id: &ObligationId,
        trigger: EscalationTrigger,
        cause: Option<EscalationCause>,
    ) {
        let Some(p) = self.take_pending(id) else {
            return;
        };
        let cause = cause.unwrap_or(if p.deferred {
            EscalationCause::ResponsiveButDeferring
        } else {
            EscalationCause::Unreachable
        });
        let (guard, write) =
            self.principal
                .apply_safe_at(&p.safe, ChangeCause::FailSafeEscalation, now);
        let escalation = Escalation {
            event_type: crate::model::ESCALATION_EVENT_TYPE.to_string(),
            obligation_id: id.clone(),
            kind: p.obligation.kind().clone(),
            target: p.obligation.target().clone(),
            digest: p.obligation.digest(),
            attempts: p.attempts,
            cause,
            trigger,
            last_error: cause.describe().to_string(),
            safe_action: p.safe.clone(),
            guard,
            escalated_at: now,
            deadline_at: p.deadline_at,
        };
        self.close(
            now,
            &p,
            CustodyOutcome::Escalated,
            write.into_iter().collect(),
            Some(escalation.clone()),
        );
        self.stats.escalated += 1;
        self.outbox
            .event(CustodianEvent::Escalated(Box::new(escalation)));
    }

    fn close(
        &mut self,
        now: Timestamp,
        p: &Pending,
        outcome: CustodyOutcome,
        principal: Vec<PrincipalWrite>,
        escalation: Option<Escalation>,
    ) {
        let state = outcome.state();
        let id = p.obligation.id().clone();
        self.terminal.insert(
            id.clone(),
            TerminalSummary {
                obligation_id: id.clone(),
                digest: p.obligation.digest(),
                target: p.obligation.target().clone(),
                state,
                deadline_at: p.deadline_at,
                closed_at: now,
                late_ack_recorded: false,
            },
        );
        self.outbox
            .record(Record::CustodyClosed(Box::new(ClosedRecord {
                obligation_id: id,
                digest: p.obligation.digest(),
                kind: p.obligation.kind().clone(),
                target: p.obligation.target().clone(),
                outcome,
                attempts: p.attempts,
                closed_at: now,
                deadline_at: p.deadline_at,
                principal,
                escalation,
            })));
    }

    /// Handles one ack from the authenticated peer `from`. It discharges
    /// custody only if it names a pending obligation, carries its digest
    /// (see [`AckBinding`]) and comes from, and names, the expected
    /// receiver; anything else is counted and ignored.
    pub fn handle_ack(
        &mut self,
        now: Timestamp,
        from: &AgentId,
        ack: &CustodyAck,
    ) -> AckDisposition {
        if ack.validate().is_err() {
            self.stats.acks_invalid += 1;
            return AckDisposition::Ignored(IgnoredAck::Invalid);
        }
        let id = &ack.obligation_id;
        let (target, digest) = if let Some(p) = self.pending.get(id) {
            (p.obligation.target().clone(), p.obligation.digest())
        } else if let Some(t) = self.terminal.get(id) {
            (t.target.clone(), t.digest)
        } else {
            self.stats.acks_unknown += 1;
            return AckDisposition::Ignored(IgnoredAck::Unknown);
        };
        if let Err(why) = self.bind(from, ack, &target, digest) {
            return AckDisposition::Ignored(why);
        }
        if !self.pending.contains_key(id) {
            return self.after_terminal(now, ack);
        }
        self.stats.acks_accepted += 1;
        match (ack.status, ack.reason) {
            (AckStatus::Applied, _) => {
                let Some(p) = self.take_pending(id) else {
                    return AckDisposition::Duplicate;
                };
                self.close(now, &p, CustodyOutcome::Applied, Vec::new(), None);
                self.stats.applied += 1;
                self.outbox.event(CustodianEvent::Applied {
                    obligation_id: id.clone(),
                    target,
                    attempts: p.attempts,
                    latency: now.saturating_duration_since(p.offered_at),
                });
                AckDisposition::Applied
            }
            (AckStatus::Declined, Some(DeclineReason::Conflict)) => {
                // Same id, other content at the receiver: not a discharge.
                self.escalate(
                    now,
                    id,
                    EscalationTrigger::ProtocolError,
                    Some(EscalationCause::Conflict),
                );
                AckDisposition::Escalated
            }
            (AckStatus::Declined, reason) => {
                self.declined(now, id, reason, ack.detail.clone());
                AckDisposition::Declined
            }
            (AckStatus::Deferred, _) => {
                // Deferred extends neither the deadline nor the retry budget.
                if let Some(p) = self.pending.get_mut(id) {
                    let attempts = p.attempts;
                    if !p.deferred {
                        p.deferred = true;
                        self.outbox.record(Record::DeferralSeen {
                            obligation_id: id.clone(),
                        });
                    }
                    self.outbox.event(CustodianEvent::Deferred {
                        obligation_id: id.clone(),
                        attempts,
                    });
                }
                AckDisposition::Deferred
            }
        }
    }

    fn bind(
        &mut self,
        from: &AgentId,
        ack: &CustodyAck,
        target: &AgentId,
        digest: Digest,
    ) -> Result<(), IgnoredAck> {
        if from != target || &ack.target != target {
            self.stats.acks_wrong_receiver += 1;
            return Err(IgnoredAck::WrongReceiver);
        }
        match ack.digest {
            Some(d) if d == digest => Ok(()),
            Some(_) => {
                self.stats.acks_wrong_digest += 1;
                Err(IgnoredAck::WrongDigest)
            }
            None if self.config.ack_binding == AckBinding::AllowMissingDigest => Ok(()),
            None => {
                self.stats.acks_missing_digest += 1;
                Err(IgnoredAck::MissingDigest)
            }
        }
    }

    fn after_terminal(&mut self, now: Timestamp, ack: &CustodyAck) -> AckDisposition {
        let Some(t) = self.terminal.get_mut(&ack.obligation_id) else {
            return AckDisposition::Ignored(IgnoredAck::Unknown);
        };
        if t.state == TerminalState::Escalated && ack.status == AckStatus::Applied {
            if t.late_ack_recorded {
                self.stats.acks_duplicate += 1;
                return AckDisposition::Duplicate;
            }
            // The race is bounded to over-protection: record, never reopen.
            t.late_ack_recorded = true;
            let rec = Reconciliation {
                obligation_id: ack.obligation_id.clone(),
                target: ack.target.clone(),
                status: ack.status,
                acked_at: ack.acked_at,
                received_at: now,
            };
            self.outbox.record(Record::LateAck(rec.clone()));
            self.stats.late_acks += 1;
            self.outbox.event(CustodianEvent::LateAck(rec));
            return AckDisposition::Late;
        }
        self.stats.acks_duplicate += 1;
        AckDisposition::Duplicate
    }

    fn declined(
        &mut self,
        now: Timestamp,
        id: &ObligationId,
        reason: Option<DeclineReason>,
        detail: Option<String>,
    ) {
        let Some(p) = self.take_pending(id) else {
            return;
        };
        #[cfg(feature = "mutations")]
        if crate::mutations::active(crate::mutations::Mutation::DeclineAsApplied) {
            return self.close(now, &p, CustodyOutcome::Applied, Vec::new(), None);
        }
        let policy = self.config.profile(p.obligation.kind()).decline_policy;
        let (disposition, principal) = match policy {
            DeclinePolicy::ApplySafe => {
                // Declined ≠ applied: a decline discharges delivery, not
                // protection.
                let (guard, write) =
                    self.principal
                        .apply_safe_at(&p.safe, ChangeCause::FailSafeDecline, now);
                (
                    DeclineDisposition::SafeApplied { guard },
                    write.into_iter().collect::<Vec<_>>(),
                )
            }
            DeclinePolicy::Surface => {
                let item = DecisionItem {
                    obligation_id: id.clone(),
                    kind: p.obligation.kind().clone(),
                    target: p.obligation.target().clone(),
                    reason: reason.unwrap_or(DeclineReason::Policy),
                    detail: detail.clone(),
                    safe_action: p.safe.clone(),
                    raised_at: now,
                };
                let w = PrincipalWrite::DecisionRaised(item.clone());
                self.principal.apply_write(&w);
                self.outbox.event(CustodianEvent::DecisionRequired(item));
                (DeclineDisposition::Surfaced, vec![w])
            }
        };
        self.close(
            now,
            &p,
            CustodyOutcome::Declined {
                reason,
                detail,
                disposition: disposition.clone(),
            },
            principal,
            None,
        );
        self.stats.declined += 1;
        self.outbox.event(CustodianEvent::Declined {
            obligation_id: id.clone(),
            target: p.obligation.target().clone(),
            reason,
            disposition,
        });
    }

    /// Handles a protocol error from `from`. An error that names a pending
    /// obligation with its digest and says the receiver can never accept it
    /// (`invalid_obligation`) escalates at once with cause `rejected`; other
    /// errors are transient and change nothing.
    pub fn handle_error(&mut self, now: Timestamp, from: &AgentId, err: &ProtocolError) {
        let Some(id) = &err.obligation_id else {
            return;
        };
        let Some(p) = self.pending.get(id) else {
            return;
        };
        if p.obligation.target() != from || err.digest != Some(p.obligation.digest()) {
            return;
        }
        if err.code == ErrorCode::InvalidObligation {
            self.escalate(
                now,
                id,
                EscalationTrigger::ProtocolError,
                Some(EscalationCause::Rejected),
            );
        }
    }

    /// The transport could not queue an attempt of `id` (peer down, queue
    /// full, frame too large): nothing left this node, so it is not counted
    /// as sent (C-ND-4). Custody is unchanged: the schedule retries at the
    /// next backoff, and the deadline still binds (AB-2, AB-4). The attempt
    /// number stays spent, so a crash can never grant more than
    /// `1 + max_retries` transmissions.
    pub fn handle_send_failed(&mut self, id: &ObligationId) {
        if self.pending.contains_key(id) {
            self.stats.attempts_sent = self.stats.attempts_sent.saturating_sub(1);
            self.stats.attempts_refused += 1;
        }
    }

    /// Handles a status reply: each known member is treated as an ack.
    pub fn handle_status_reply(&mut self, now: Timestamp, from: &AgentId, reply: &StatusReply) {
        for ack in &reply.known {
            let _ = self.handle_ack(now, from, ack);
        }
    }

    /// The principal's own decision on a governed key (guarded).
    pub fn decide(
        &mut self,
        now: Timestamp,
        key: &GovernedKey,
        state: Authorization,
        sequence: Option<Sequence>,
    ) -> crate::model::GuardOutcome {
        let (guard, write) = self.principal.decide_at(key, state, sequence, now);
        if let Some(w) = write {
            self.outbox.record(Record::Principal {
                writes: vec![w],
                at: now,
            });
        }
        guard
    }

    /// Resolves a decision-required item. Returns `None` if there is no
    /// such item.
    pub fn resolve_decision(
        &mut self,
        now: Timestamp,
        id: &ObligationId,
        resolution: Resolution,
    ) -> Option<Option<crate::model::GuardOutcome>> {
        let item = self.principal.decision(id)?.clone();
        let mut writes = Vec::new();
        let guard = match resolution {
            Resolution::ApplySafe => {
                let (g, w) = self.principal.apply_safe_at(
                    &item.safe_action,
                    ChangeCause::FailSafeDecline,
                    now,
                );
                writes.extend(w);
                Some(g)
            }
            Resolution::Dismiss => None,
        };
        let close = PrincipalWrite::DecisionClosed {
            obligation_id: id.clone(),
        };
        self.principal.apply_write(&close);
        writes.push(close);
        self.outbox.record(Record::Principal { writes, at: now });
        Some(guard)
    }

    /// Drops terminal summaries whose deadline is older than `before`
    /// (retention). Re-offers and acks of compacted ids are then unknown.
    pub fn compact(&mut self, before: Timestamp) -> usize {
        let n = self.terminal.len();
        self.terminal.retain(|_, t| t.deadline_at >= before);
        n - self.terminal.len()
    }

    /// The records to commit before anything that depends on them is
    /// released.
    #[must_use]
    pub fn poll_records(&mut self) -> Option<RecordBatch> {
        self.outbox.poll_records()
    }

    /// Marks a polled batch durable, releasing what waits behind it.
    pub fn handle_committed(&mut self, token: CommitToken) {
        self.outbox.committed(token);
    }

    /// The next frame to send, if its records are committed.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.outbox.poll_transmit()
    }

    /// The next event, if its records are committed.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<CustodianEvent> {
        self.outbox.poll_event()
    }

    /// Records emitted but not yet committed.
    pub fn uncommitted_records(&self) -> u64 {
        self.outbox.uncommitted()
    }

    /// Transmits waiting (behind a commit or to be polled).
    pub fn queued_transmits(&self) -> usize {
        self.outbox.held_transmits()
    }
}

fn pending_record(p: &Pending) -> PendingRecord {
    PendingRecord {
        obligation: p.obligation.clone(),
        safe: p.safe.clone(),
        attempts: p.attempts,
        next_at: p.next_at,
        deferred: p.deferred,
        offered_at: p.offered_at,
    }
}
