//! The custodian's ack handling: binding an ack to the pending obligation
//! it attests (C-TR-2), discharging custody on `applied` or `declined`,
//! noting deferrals, recording late acks for reconciliation, and the other
//! answers a receiver sends (status replies, protocol errors).

use super::super::record::{
    CustodyOutcome, DeclineDisposition, Reconciliation, Record, TerminalState,
};
use super::{AckBinding, Custodian, CustodianEvent};
use crate::model::{
    AckStatus, AgentId, CustodyAck, DeclinePolicy, DeclineReason, Digest, EscalationCause,
    EscalationTrigger, ObligationId, Timestamp,
};
use crate::principal::{ChangeCause, DecisionItem, PrincipalWrite};
use crate::wire::{ErrorCode, ProtocolError, StatusReply};

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

impl Custodian {
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
        // One lookup per map: an ack for an obligation whose custody has
        // ended (every best-effort one's) is bound and handled on the
        // terminal summary it finds there.
        let Some(p) = self.pending.get(id) else {
            return self.after_terminal(now, from, ack);
        };
        let (target, digest) = (p.obligation.target().clone(), p.obligation.digest());
        let binding = self.config.ack_binding;
        if let Err(why) = bind(&mut self.stats, binding, from, ack, &target, digest) {
            return AckDisposition::Ignored(why);
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

    /// An ack for an obligation not pending: bound to its terminal summary
    /// (or unknown), then a late ack or a duplicate.
    fn after_terminal(
        &mut self,
        now: Timestamp,
        from: &AgentId,
        ack: &CustodyAck,
    ) -> AckDisposition {
        let Some(t) = self.terminal.get_mut(&ack.obligation_id) else {
            self.stats.acks_unknown += 1;
            return AckDisposition::Ignored(IgnoredAck::Unknown);
        };
        let binding = self.config.ack_binding;
        if let Err(why) = bind(&mut self.stats, binding, from, ack, &t.target, t.digest) {
            return AckDisposition::Ignored(why);
        }
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
                self.outbox
                    .event(CustodianEvent::DecisionRequired(Box::new(item)));
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

    /// Handles a status reply: each known member is treated as an ack.
    pub fn handle_status_reply(&mut self, now: Timestamp, from: &AgentId, reply: &StatusReply) {
        for ack in &reply.known {
            let _ = self.handle_ack(now, from, ack);
        }
    }
}

/// Whether `ack`, from the authenticated peer `from`, binds to an
/// obligation for `target` with `digest` (C-TR-2); counts why not.
fn bind(
    stats: &mut super::CustodianStats,
    binding: AckBinding,
    from: &AgentId,
    ack: &CustodyAck,
    target: &AgentId,
    digest: Digest,
) -> Result<(), IgnoredAck> {
    if from != target || &ack.target != target {
        stats.acks_wrong_receiver += 1;
        return Err(IgnoredAck::WrongReceiver);
    }
    match ack.digest {
        Some(d) if d == digest => Ok(()),
        Some(_) => {
            stats.acks_wrong_digest += 1;
            Err(IgnoredAck::WrongDigest)
        }
        None if binding == AckBinding::AllowMissingDigest => Ok(()),
        None => {
            stats.acks_missing_digest += 1;
            Err(IgnoredAck::MissingDigest)
        }
    }
}
