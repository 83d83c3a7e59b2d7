//! The embedding's commands: offers (admitted against the send queue and
//! the lease renewal chains), decisions, completions, and the reads, each
//! answered only once what it reports is durable (C-ND-2).

use abhyasa_core::custody::{Offered, TerminalSummary};
use abhyasa_core::wire::Envelope;
use abhyasa_core::{Obligation, ObligationId, Timestamp};
use tokio::sync::oneshot;

use super::outcomes::summary_outcome;
use super::Driver;
use crate::api::{CustodianState, NodeError, Outcome, StatusView};
use crate::command::{Command, Read};

impl Driver {
    /// Returns false on shutdown.
    pub(super) fn on_command(&mut self, c: Command) -> bool {
        let now = self.now();
        match c {
            Command::Offer { obligation, reply } => self.on_offer(now, obligation, reply),
            Command::WaitOutcome { id, reply } => self.on_wait_outcome(id, reply),
            Command::Status { id, reply } => self.on_status(id, reply),
            Command::Decide {
                key,
                state,
                sequence,
                reply,
            } => {
                let g = self.core.custodian_mut().decide(now, &key, state, sequence);
                // C-ND-2: answered once its `Record::Principal` commits.
                self.after_commit(Box::new(move |_: &Driver| {
                    let _ = reply.send(g);
                }));
            }
            Command::Resolve {
                id,
                resolution,
                reply,
            } => {
                let r = self
                    .core
                    .custodian_mut()
                    .resolve_decision(now, &id, resolution)
                    .ok_or(NodeError::UnknownDecisionItem(id));
                self.reply_after_commit(reply, r);
            }
            Command::Complete {
                custodian,
                id,
                decision,
                reply,
            } => {
                let r = self
                    .core
                    .receiver_mut()
                    .complete_deferred(now, &custodian, &id, decision)
                    .map_err(NodeError::from);
                self.reply_after_commit(reply, r);
            }
            Command::External {
                custodian,
                id,
                outcome,
                reply,
            } => {
                let r = self
                    .core
                    .receiver_mut()
                    .handle_external_outcome(now, &custodian, &id, outcome)
                    .map_err(NodeError::from);
                self.reply_after_commit(reply, r);
            }
            Command::Compact { retention, reply } => {
                let started = crate::compaction::start(now, retention, &mut self.core, &self.store);
                let _ = reply.send(started);
            }
            Command::Read(r) => self.on_read(r),
            Command::Shutdown { reply } => {
                self.shutdown = Some(reply);
                return false;
            }
        }
        true
    }

    /// A read of the node's state.
    fn on_read(&mut self, r: Read) {
        match r {
            Read::Metrics { reply } => {
                self.metrics.absorb_custodian(
                    self.core.custodian().stats(),
                    self.core.custodian().pending_len(),
                );
                self.metrics.outcome_waiters = self.outcome_waiter_count as u64;
                self.metrics.replies_held = self.gate.held() as u64;
                let _ = reply.send(self.metrics.clone());
            }
            Read::Authorized { key, reply } => {
                // Read after what is in flight commits (C-ND-2): a grant
                // is never reported that a crash could still undo.
                self.after_commit(Box::new(move |d: &Driver| {
                    let _ = reply.send(d.core.receiver().authority(&key, d.now()));
                }));
            }
            Read::Leases { reply } => {
                self.after_commit(Box::new(move |d: &Driver| {
                    let views = d
                        .core
                        .receiver()
                        .leases(d.now())
                        .into_iter()
                        .map(|(k, until, a)| crate::leases::LeaseView::new(k, until, a))
                        .collect();
                    let _ = reply.send(views);
                }));
            }
            Read::Renewals { reply } => {
                // The latest renewal shown is durable (C-ND-2).
                self.after_commit(Box::new(move |d: &Driver| {
                    let _ = reply.send(d.core.renewals().views());
                }));
            }
            Read::LeaseWarnings { reply } => {
                let _ = reply.send(self.core.renewals().warnings());
            }
        }
    }

    /// An offer: admitted against the send queue and the renewal chains,
    /// then handed to the custodian; answered once its record is durable.
    fn on_offer(
        &mut self,
        now: Timestamp,
        obligation: Obligation,
        reply: oneshot::Sender<Result<Offered, NodeError>>,
    ) {
        let id = obligation.id().clone();
        let target = obligation.target().clone();
        let bytes = match self.admit_bytes(&obligation) {
            Ok(n) => n,
            Err(e) => {
                // Nothing was accepted (C-ND-4).
                let _ = reply.send(Err(e));
                return;
            }
        };
        match self.core.offer(now, obligation) {
            Ok(Offered::Custody { .. } | Offered::BestEffort) => {
                while let Some(w) = self.core.poll_warning() {
                    tracing::warn!(key = %w.key, id = %w.obligation_id, "{}", w.message);
                }
                self.unreleased.add(id.clone(), target, bytes);
                // Answered once the record is durable.
                self.offer_waiters.entry(id).or_default().push(reply);
            }
            Ok(Offered::AlreadyPending) if self.offer_waiters.contains_key(&id) => {
                // The first offer's record is still in flight: a
                // retrying caller gets the first offer's answer,
                // when (and only if) it commits (C-ND-2).
                self.offer_waiters.entry(id).or_default().push(reply);
            }
            Ok(other) => {
                // Pending (durable: its first answer went out) or
                // terminal (its close may still be in flight).
                self.after_commit(Box::new(move |_: &Driver| {
                    let _ = reply.send(Ok(other));
                }));
            }
            Err(e) => {
                tracing::info!(%id, error = %e, "offer refused");
                let _ = reply.send(Err(e.into()));
            }
        }
    }

    /// Waits for (or reads) the outcome of a transfer.
    fn on_wait_outcome(
        &mut self,
        id: ObligationId,
        reply: oneshot::Sender<Result<Outcome, NodeError>>,
    ) {
        if let Some(o) = self.recent.get(&id) {
            let _ = reply.send(Ok(o.clone()));
        } else if self.core.custodian().is_pending(&id) || self.offer_waiters.contains_key(&id) {
            self.add_outcome_waiter(id, reply);
        } else if let Some(t) = self.core.custodian().terminal(&id) {
            let o = summary_outcome(t);
            // Only a durable terminal state is reported (C-ND-2),
            // in full if its close was the commit waited for.
            self.after_commit(Box::new(move |d: &Driver| {
                let full = d.recent.get(&o.obligation_id).cloned();
                let _ = reply.send(Ok(full.unwrap_or(o)));
            }));
        } else {
            let _ = reply.send(Err(NodeError::UnknownObligation(id)));
        }
    }

    /// What the custodian and the receiver know of one obligation.
    fn on_status(&mut self, id: ObligationId, reply: oneshot::Sender<StatusView>) {
        let custodian = if self.core.custodian().is_pending(&id) {
            Some(CustodianState::Pending)
        } else {
            self.core
                .custodian()
                .terminal(&id)
                .map(|t| CustodianState::from(t.state))
        };
        let mut receiver = Vec::new();
        let mut declines = Vec::new();
        for peer in self.transport.known_peers() {
            if let Some(o) = self.core.receiver().ledger_outcome(&peer, &id) {
                if let Some((reason, detail)) = self.core.receiver().ledger_decline(&peer, &id) {
                    declines.push((peer.clone(), reason, detail));
                }
                receiver.push((peer, o));
            }
        }
        let view = StatusView {
            obligation_id: id.clone(),
            custodian,
            attempts: self.core.custodian().attempts(&id).or_else(|| {
                self.core
                    .custodian()
                    .terminal(&id)
                    .and_then(TerminalSummary::known_attempts)
            }),
            deadline_at: self.core.custodian().pending_deadline(&id),
            receiver,
            declines,
        };
        // What the view says is durable before it is shown (C-ND-2).
        self.after_commit(Box::new(move |_: &Driver| {
            let _ = reply.send(view);
        }));
    }

    /// Offers the lease renewals due now. Each is a grant
    /// offered like any other: best-effort, and released only after the
    /// record of its sequence commits (write-ahead).
    pub(super) fn renew_leases(&mut self, now: Timestamp) {
        for (key, renewal) in self.core.poll_renewals(now) {
            let bytes = match self.admit_bytes(&renewal) {
                Ok(n) => n,
                Err(e) => {
                    tracing::debug!(%key, error = %e, "lease renewal deferred");
                    self.core.defer_renewal(now, key);
                    continue;
                }
            };
            let (id, target, sequence) = (
                renewal.id().clone(),
                renewal.target().clone(),
                renewal.sequence(),
            );
            match self.core.offer_renewal(now, key.clone(), renewal) {
                Ok(Offered::BestEffort | Offered::Custody { .. }) => {
                    tracing::debug!(%key, %id, ?sequence, "lease renewed");
                    self.unreleased.add(id, target, bytes);
                }
                other => {
                    tracing::warn!(%key, %id, result = ?other, "lease renewal refused; renewals stopped");
                }
            }
        }
    }

    /// The encoded size of `ob`'s first attempt, or `Backpressure` when the
    /// send queue towards its target (queued plus accepted and not yet
    /// released) would pass three quarters of its byte budget: the rest is
    /// headroom for retries and acks, so the queue refuses nothing an
    /// accepted offer depends on (C-ND-4). An empty queue takes any frame.
    pub(super) fn admit_bytes(&self, ob: &Obligation) -> Result<usize, NodeError> {
        let size = Envelope::obligation_len(&self.agent, ob);
        let peer = ob.target();
        let queued = self.transport.queued_bytes(peer) + self.unreleased.to(peer);
        let limit = self.transport.send_queue_budget() / 4 * 3;
        if queued > 0 && queued.saturating_add(size) > limit {
            return Err(NodeError::Backpressure {
                peer: peer.clone(),
                queued_bytes: queued,
                limit,
            });
        }
        Ok(size)
    }
}
