//! The receiver's intent path (the dual-write boundary): an effect on an
//! external system is recorded as a durable intent before it runs, its
//! outcome is reported back, and after a restart an intent without a
//! decided ledger entry is in doubt and settled, never re-executed blindly.

use super::super::record::{
    EffectWrite, ExternalIntent, IntentRecord, LedgerOutcome, LedgerRecord, ReceiverSnapshot,
    Record,
};
use super::{CompleteError, Entry, Received, Receiver, ReceiverEvent};
use crate::model::{AckStatus, AgentId, DeclineReason, Obligation, ObligationId, Timestamp};

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

impl Receiver {
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

    /// Records an external intent durably before its effect runs
    /// (dual-write boundary); the ack is `deferred` until the outcome.
    pub(super) fn record_intent(
        &mut self,
        now: Timestamp,
        from: &AgentId,
        ob: &Obligation,
        intent: ExternalIntent,
    ) -> Received {
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

    /// After a restart: every intent without a decided ledger entry is in
    /// doubt; it is recorded `outcome_unknown` and reported as
    /// [`ReceiverEvent::OutcomeUnknown`], never re-executed blindly.
    pub(super) fn recover_in_doubt(&mut self, snapshot: &ReceiverSnapshot, now: Timestamp) {
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
            self.insert_entry(
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
            self.outbox.record(Record::Ledger(Box::new(rec)));
            self.outbox.event(ReceiverEvent::OutcomeUnknown {
                custodian: i.custodian.clone(),
                obligation: ob.clone(),
                intent: i.intent.clone(),
            });
        }
    }
}
