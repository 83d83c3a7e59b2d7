//! Released events and the answers they complete: offers answered when
//! their custody opens, outcome waiters when their transfer ends, and the
//! recent outcomes kept for callers that ask later.

use abhyasa_core::custody::{
    CustodianEvent, Offered, ReceiverEvent, TerminalState, TerminalSummary,
};
use abhyasa_core::{DeclineReason, ObligationId};
use tokio::sync::oneshot;

use super::{Driver, OUTCOME_WAITERS_FLOOR};
use crate::api::{NodeError, NodeEvent, Outcome};

/// Full outcomes kept for callers that ask after the transfer ended.
const RECENT_OUTCOMES: usize = 65_536;

impl Driver {
    pub(super) fn release(&mut self) {
        while let Some(t) = self.core.poll_transmit() {
            self.send(t);
        }
        // Whether anyone listens, asked once per batch: a send takes the
        // channel's lock even with no receiver (~1% of a best-effort
        // obligation's CPU). A subscriber that joins during the
        // batch misses only events it could as well have missed by
        // subscribing a moment later; anything it does after subscribing
        // reaches this driver as a command, so its events come in a later
        // batch, which sees it.
        let listening = self.events.receiver_count() > 0;
        while let Some(e) = self.core.custodian_mut().poll_event() {
            self.on_custodian_event(&e);
            if listening {
                let _ = self.events.send(NodeEvent::Custodian(e));
            }
        }
        while let Some(e) = self.core.receiver_mut().poll_event() {
            match &e {
                ReceiverEvent::Applied { .. } => self.metrics.receiver_applied += 1,
                ReceiverEvent::Declined { reason, .. } => {
                    self.metrics.receiver_declined += 1;
                    if *reason == DeclineReason::Unauthorized {
                        self.metrics.receiver_unauthorized += 1;
                    }
                }
                _ => {}
            }
            tracing::debug!(event = ?e, "receiver");
            if listening {
                let _ = self.events.send(NodeEvent::Receiver(e));
            }
        }
    }

    pub(super) fn on_custodian_event(&mut self, e: &CustodianEvent) {
        let done = |id: &ObligationId, state, attempts, reason, escalation| Outcome {
            obligation_id: id.clone(),
            state,
            attempts,
            reason,
            escalation,
        };
        let (id, outcome) = match e {
            CustodianEvent::Opened {
                obligation_id,
                deadline_at,
            } => {
                tracing::info!(id = %obligation_id, %deadline_at, "custody opened");
                self.answer_offer(
                    obligation_id,
                    Offered::Custody {
                        deadline_at: *deadline_at,
                    },
                );
                return;
            }
            CustodianEvent::BestEffortSent { obligation_id, .. } => {
                // The one send happened just before this event: if the
                // transport refused it, nothing left and the caller is told.
                let attempts = match self.refused_best_effort.remove(obligation_id) {
                    Some(reason) => {
                        self.metrics.best_effort_refused += 1;
                        tracing::info!(id = %obligation_id, %reason, "best-effort obligation not sent");
                        self.answer_offer_with(obligation_id, || {
                            Err(NodeError::NotSent {
                                obligation_id: obligation_id.clone(),
                                reason: reason.clone(),
                            })
                        });
                        0
                    }
                    None => {
                        self.answer_offer(obligation_id, Offered::BestEffort);
                        1
                    }
                };
                (
                    obligation_id.clone(),
                    done(
                        obligation_id,
                        TerminalState::BestEffort,
                        Some(attempts),
                        None,
                        None,
                    ),
                )
            }
            CustodianEvent::Applied {
                obligation_id,
                attempts,
                latency,
                ..
            } => {
                tracing::info!(id = %obligation_id, attempts, "applied");
                self.metrics.record_ack_latency(*latency);
                (
                    obligation_id.clone(),
                    done(
                        obligation_id,
                        TerminalState::Applied,
                        Some(*attempts),
                        None,
                        None,
                    ),
                )
            }
            CustodianEvent::Declined {
                obligation_id,
                reason,
                ..
            } => {
                tracing::info!(id = %obligation_id, ?reason, "declined");
                (
                    obligation_id.clone(),
                    done(obligation_id, TerminalState::Declined, None, *reason, None),
                )
            }
            CustodianEvent::Escalated(esc) => {
                tracing::warn!(id = %esc.obligation_id, cause = %esc.cause, attempts = esc.attempts, "escalated; fail-safe applied");
                (
                    esc.obligation_id.clone(),
                    done(
                        &esc.obligation_id,
                        TerminalState::Escalated,
                        Some(esc.attempts),
                        None,
                        Some(esc.clone()),
                    ),
                )
            }
            other => {
                tracing::debug!(event = ?other, "custodian");
                return;
            }
        };
        self.settle(id, outcome);
    }

    /// A transfer ended with `outcome`: its waiters are answered, and the
    /// outcome is kept for later callers unless the terminal summary tells
    /// all of it.
    fn settle(&mut self, id: ObligationId, outcome: Outcome) {
        if let Some(ws) = self.outcome_waiters.remove(&id) {
            self.outcome_waiter_count = self.outcome_waiter_count.saturating_sub(ws.len());
            for w in ws {
                let _ = w.send(Ok(outcome.clone()));
            }
        }
        // A caller may ask after the transfer ended (on a fast link, even
        // before `offer` returned to it): keep the full outcome a while —
        // unless the terminal summary already says all of it (an applied
        // transfer, a best-effort send that went out), which `WaitOutcome`
        // reads instead: no insert and eviction per obligation, and the
        // same answer after the cache would have let it go or a restart.
        if self
            .core
            .custodian()
            .terminal(&id)
            .is_some_and(|t| summary_tells(t, &outcome))
        {
            return;
        }
        if self.recent.insert(id.clone(), outcome).is_none() {
            self.recent_order.push_back(id);
            if self.recent_order.len() > RECENT_OUTCOMES {
                if let Some(old) = self.recent_order.pop_front() {
                    self.recent.remove(&old);
                }
            }
        }
    }

    pub(super) fn answer_offer(&mut self, id: &ObligationId, offered: Offered) {
        self.answer_offer_with(id, || Ok(offered.clone()));
    }

    pub(super) fn answer_offer_with(
        &mut self,
        id: &ObligationId,
        answer: impl Fn() -> Result<Offered, NodeError>,
    ) {
        if let Some(ws) = self.offer_waiters.remove(id) {
            for w in ws {
                let _ = w.send(answer());
            }
        }
    }

    /// Registers an outcome waiter. A caller that gives up drops its
    /// receiver; abandoned senders are swept whenever the count doubles
    /// past the last sweep, so they cost amortised O(1) and never pile up
    /// (C-ND-5).
    pub(super) fn add_outcome_waiter(
        &mut self,
        id: ObligationId,
        reply: oneshot::Sender<Result<Outcome, NodeError>>,
    ) {
        self.outcome_waiters.entry(id).or_default().push(reply);
        self.outcome_waiter_count += 1;
        if self.outcome_waiter_count > self.outcome_sweep_at {
            self.outcome_waiters.retain(|_, ws| {
                ws.retain(|w| !w.is_closed());
                !ws.is_empty()
            });
            self.outcome_waiter_count = self.outcome_waiters.values().map(Vec::len).sum();
            self.outcome_sweep_at = (2 * self.outcome_waiter_count).max(OUTCOME_WAITERS_FLOOR);
        }
    }
}

/// The outcome a terminal summary tells on its own: the state and the
/// attempts (an applied transfer, a best-effort send). What an event adds
/// to it (a decline's reason, an escalation, a best-effort send the
/// transport refused) is kept in `Driver::recent` for a while.
pub(super) fn summary_outcome(t: &TerminalSummary) -> Outcome {
    Outcome {
        obligation_id: t.obligation_id.clone(),
        state: t.state,
        attempts: t.known_attempts(),
        reason: None,
        escalation: None,
    }
}

/// Whether `summary_outcome(t)` is `o`, without building it: building
/// it would bump the count of an id the store thread is reading (the
/// close record in flight holds the same one).
fn summary_tells(t: &TerminalSummary, o: &Outcome) -> bool {
    o.reason.is_none()
        && o.escalation.is_none()
        && o.state == t.state
        && o.attempts == t.known_attempts()
        && o.obligation_id == t.obligation_id
}
