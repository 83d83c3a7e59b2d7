//! The receiver's inbound path: an obligation from an authenticated
//! custodian is checked against the rules that decide alone (target,
//! conflict, duplicate, bounds, deadline, supersession); otherwise the
//! embedding agent is asked (an [`ApplyRequest`], in memory only) and its
//! decision taken back as an input, checked again as the rules stand then.

use std::collections::BTreeMap;

use super::super::applier::{Applier, ApplyContext, ApplyDecision, ApplyRequest, ApplyTicket};
use super::super::lease;
use super::super::record::EffectValue;
use super::super::record::LedgerOutcome;
use super::super::transmit::Transmit;
use super::UNORDERED;
use super::{CompleteError, LedgerKey, Received, Receiver, ReceiverEvent, Waiting};
use crate::model::{
    AckStatus, AgentId, DeclineReason, GovernedKey, Obligation, Sequence, Timestamp,
};
use crate::principal::Authorization;
use crate::wire::{ErrorCode, Message, ProtocolError};

/// Who decides an obligation the rules leave to the agent.
pub(super) enum Decider<'a> {
    /// A request to the agent, answered later through `decide`.
    Ask,
    /// The decision the caller brings (a deferred obligation completed).
    Given(ApplyDecision),
    /// A synchronous applier, asked now.
    Now(&'a mut dyn Applier),
}

impl Receiver {
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
        // Asked and answered in one step: the same checks `decide` would
        // make at this instant (deadline, supersession, a key value that
        // cannot have changed) hold, so no request is queued, ticketed or
        // timed only to be taken back at once (the receiver's
        // hot path).
        self.receive_with(now, from, ob, Decider::Now(applier))
    }

    /// Handles an obligation from the authenticated custodian `from`. What
    /// the rules decide alone (a duplicate, a conflict, expired,
    /// superseded, out of bounds) is recorded at once; otherwise an
    /// [`ApplyRequest`] is queued for [`Receiver::poll_apply_request`] and
    /// [`Received::AwaitingDecision`] returned. A redelivery while the
    /// request is outstanding asks nothing again (AB-3).
    pub fn receive(&mut self, now: Timestamp, from: &AgentId, ob: Obligation) -> Received {
        self.receive_with(now, from, ob, Decider::Ask)
    }

    fn receive_with(
        &mut self,
        now: Timestamp,
        from: &AgentId,
        ob: Obligation,
        decider: Decider<'_>,
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
        // One lookup in each map (the ledger is the large one).
        let entry = self.ledger.get(&lkey).cloned();
        let waiting = self
            .waiting
            .get(&lkey)
            .map(|w| (w.obligation.digest(), w.ticket));
        let known = entry.as_ref().map(|e| e.digest).or(waiting.map(|w| w.0));
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
        if let Some(e) = entry {
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
        if let Some((_, ticket)) = waiting {
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
        self.evaluate(now, from, ob, previously_deferred, decider)
    }

    /// C-ND-5: why `ob` from an authenticated peer is refused before it
    /// may occupy the ledger (a stateless `policy` decline), if it is.
    pub(super) fn out_of_bounds(&self, now: Timestamp, ob: &Obligation) -> Option<String> {
        if let Some(t) = self.damaged_before.filter(|t| ob.created_at() <= *t) {
            // C-SD-4: the ledger that would answer a redelivery may have
            // lost this entry; a second apply is worse than a decline
            // (on which the custodian applies its fail-safe).
            return Some(format!(
                "store_damaged: this receiver's store was repaired at {t} and may have lost \
                 its record of an obligation created before then; declined rather than \
                 risk a second apply"
            ));
        }
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

    /// The rules that decide alone, then the decision: as `decider` says,
    /// brought by the caller, asked of a synchronous applier now, or a
    /// request to the agent.
    pub(super) fn evaluate(
        &mut self,
        now: Timestamp,
        from: &AgentId,
        ob: Obligation,
        previously_deferred: bool,
        decider: Decider<'_>,
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
        // C-AZ-1: only what the peer's policy lets it issue; a relay
        // governs nothing.
        if let Some(why) = self
            .config
            .authority
            .refuses(from, ob.kind(), class.key.as_ref())
        {
            return self.record_decline(now, from, &ob, DeclineReason::Unauthorized, Some(why));
        }
        // C-AZ-2: the state it governs is held under its issuer, the
        // authenticated peer, so it never touches another issuer's.
        let key = class.key.map(|k| k.issued_by(from));
        let guarded_key = key.clone().filter(|_| class.guarded);
        let widening = class.at_offer == Some(Authorization::Granted);
        if let Some(detail) = self.superseded(guarded_key.as_ref(), &ob, widening) {
            return self.record_decline(now, from, &ob, DeclineReason::Superseded, Some(detail));
        }
        let decision = match decider {
            Decider::Given(d) => d,
            Decider::Now(applier) => {
                let ctx = ApplyContext {
                    now,
                    custodian: from,
                    key: key.as_ref(),
                    effects: &self.effects,
                    previously_deferred,
                };
                applier.decide(&ctx, &ob)
            }
            Decider::Ask => {
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
                return self.ask(
                    now,
                    from,
                    ob,
                    previously_deferred,
                    key,
                    guarded_key,
                    widening,
                );
            }
        };
        let key_sequence = key_order(guarded_key, &ob, widening);
        self.record_decision(now, from, &ob, decision, key_sequence)
    }

    /// Why `ob` is behind a newer decision on its guarded key, if it is
    /// (C-SS-2, C-OR-3). A sequenced obligation is superseded by a newer
    /// (or equal) sequence applied on the key by another obligation. A
    /// withhold that came without a sequence cannot be ordered, so it
    /// counts as newer than every widening obligation until a sequenced
    /// restrictive one orders the key again. An unsequenced widening
    /// obligation cannot prove it is newer than anything: it is superseded
    /// whenever its key is withheld.
    pub(super) fn superseded(
        &self,
        guarded_key: Option<&GovernedKey>,
        ob: &Obligation,
        widening: bool,
    ) -> Option<String> {
        #[cfg(not(feature = "mutations"))]
        let guard_on = true;
        #[cfg(feature = "mutations")]
        let guard_on = !crate::mutations::active(crate::mutations::Mutation::SupersessionGuardOff);
        let key = guarded_key.filter(|_| guard_on)?;
        let Some(seq) = ob.sequence() else {
            let withheld = matches!(
                self.effects.get(key.as_str()),
                Some(EffectValue::Authorization(Authorization::Withheld))
            );
            return (widening && withheld).then(|| {
                format!(
                    "{key} is withheld and an obligation without a sequence cannot prove it is \
                     newer than the withhold"
                )
            });
        };
        if let Some((newest, by)) = self.legacy_key_seq.get(key.unqualified()) {
            if seq <= *newest && by != ob.id() {
                return Some(format!(
                    "sequence {seq} on {key} superseded by {newest} ({by}, recorded before keys \
                     carried their issuer)"
                ));
            }
        }
        let (newest, by) = self.key_seq.get(key)?;
        if *newest == UNORDERED {
            return (widening && by != ob.id()).then(|| {
                format!(
                    "{key} holds a withhold issued without a sequence ({by}): a widening \
                     obligation cannot prove it is newer until a sequenced withhold orders the key"
                )
            });
        }
        (seq <= *newest && by != ob.id())
            .then(|| format!("sequence {seq} on {key} superseded by {newest} ({by})"))
    }

    /// Queues a request to the agent; nothing durable is written.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn ask(
        &mut self,
        now: Timestamp,
        from: &AgentId,
        ob: Obligation,
        previously_deferred: bool,
        key: Option<GovernedKey>,
        guarded_key: Option<GovernedKey>,
        widening: bool,
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
                widening,
            },
        );
        Received::AwaitingDecision(ticket)
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
        if let Some(detail) = self.superseded(w.guarded_key.as_ref(), &ob, w.widening) {
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
            return Ok(self.ask(
                now,
                &from,
                ob,
                w.previously_deferred,
                w.key,
                w.guarded_key,
                w.widening,
            ));
        }
        let key_sequence = key_order(w.guarded_key, &ob, w.widening);
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

    pub(super) fn expire(&mut self, now: Timestamp, ticket: ApplyTicket) {
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

    pub(super) fn expiry_of(&self, ob: &Obligation) -> Timestamp {
        ob.deadline_at().saturating_sub(self.config.skew_margin)
    }

    pub(super) fn take_waiting(&mut self, ticket: ApplyTicket) -> Option<(LedgerKey, Waiting)> {
        let lkey = self.tickets.remove(&ticket)?;
        let w = self.waiting.remove(&lkey)?;
        let at = self.expiry_of(&w.obligation);
        self.expiries.remove(&(at, ticket));
        if let Some(pos) = self.requests.iter().position(|r| r.ticket == ticket) {
            self.requests.remove(pos);
        }
        Some((lkey, w))
    }
}

/// The order an application records on its guarded key: its sequence; for
/// a restrictive obligation without one, [`UNORDERED`] (newer than every
/// widening until a sequenced withhold); nothing for an unsequenced
/// widening one (it never moves the key's order).
fn key_order(
    guarded_key: Option<GovernedKey>,
    ob: &Obligation,
    widening: bool,
) -> Option<(GovernedKey, Sequence)> {
    let key = guarded_key?;
    match ob.sequence() {
        Some(s) => Some((key, s)),
        None if !widening => Some((key, UNORDERED)),
        None => None,
    }
}
