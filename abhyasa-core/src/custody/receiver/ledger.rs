//! The receiver's ledger path (AB-3): one entry per (custodian, obligation
//! id), written in the same record as the effect it reports; acks built
//! from it; deferred obligations completed; status queries answered;
//! retention and the per-custodian quota (C-ND-5).

use super::super::applier::ApplyDecision;
use super::super::record::{EffectWrite, LedgerOutcome, LedgerRecord, Record};
use super::super::transmit::Transmit;
use super::request::Decider;
use super::{CompleteError, Entry, LedgerKey, Received, Receiver, ReceiverEvent, LEASE_SUFFIX};
use crate::model::{
    AckStatus, AgentId, CustodyAck, DeclineReason, Digest, GovernedKey, Obligation, ObligationId,
    Sequence, Timestamp,
};
use crate::wire::{Message, StatusReply};

impl Receiver {
    /// The ledger outcome for (custodian, id).
    pub fn ledger_outcome(&self, custodian: &AgentId, id: &ObligationId) -> Option<LedgerOutcome> {
        self.ledger
            .get(&(custodian.clone(), id.clone()))
            .map(|e| e.outcome)
    }

    /// Why (custodian, id) was declined, with the receiver's text, if it
    /// was.
    pub fn ledger_decline(
        &self,
        custodian: &AgentId,
        id: &ObligationId,
    ) -> Option<(DeclineReason, Option<String>)> {
        let e = self.ledger.get(&(custodian.clone(), id.clone()))?;
        (e.outcome == LedgerOutcome::Declined)
            .then(|| e.reason.map(|r| (r, e.detail.clone())))
            .flatten()
    }

    /// Ledger entries held.
    pub fn ledger_len(&self) -> usize {
        self.ledger.len()
    }

    /// Ledger entries held for `custodian` (what its quota counts).
    pub fn ledger_held(&self, custodian: &AgentId) -> usize {
        self.held.get(custodian).copied().unwrap_or(0)
    }

    pub(super) fn insert_entry(&mut self, key: LedgerKey, e: Entry) {
        if let Some(entry) = self.ledger.get_mut(&key) {
            *entry = e;
            return;
        }
        // Counted before the key moves into the ledger, without a clone of
        // the custodian's id but for its first entry: the id is shared
        // with the threads that read and write its frames, and every clone
        // and drop of it is an atomic write to one cache line.
        match self.held.get_mut(&key.0) {
            Some(n) => *n += 1,
            None => {
                self.held.insert(key.0.clone(), 1);
            }
        }
        self.ledger.insert(key, e);
    }

    pub(super) fn ack(
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

    pub(super) fn send_ack(&mut self, to: &AgentId, ack: CustodyAck) {
        self.outbox.transmit(Transmit {
            to: to.clone(),
            message: Message::Acks(vec![ack]),
        });
    }

    pub(super) fn ack_entry(
        &mut self,
        now: Timestamp,
        from: &AgentId,
        id: &ObligationId,
        e: &Entry,
    ) {
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

    pub(super) fn record_decision(
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
            ApplyDecision::External(intent) => self.record_intent(now, from, ob, intent),
        }
    }

    pub(super) fn record_applied(
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

    pub(super) fn record_decline(
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
    pub(super) fn write_ledger(
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
        Ok(self.evaluate(now, custodian, ob, true, Decider::Given(decision)))
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
}
