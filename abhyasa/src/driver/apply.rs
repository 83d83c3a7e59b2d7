//! The asynchronous apply path: the receiver's apply requests run as
//! tasks of the embedding's [`AsyncApplier`](crate::AsyncApplier), at most
//! its concurrency at a time, and their decisions come back to the driver
//! as inputs.

use std::collections::VecDeque;

use abhyasa_core::custody::{ApplyDecision, ApplyRequest, ApplyTicket};
use tokio::sync::mpsc;

use crate::applier::AsyncApplierHandle;

/// The asynchronous apply path: requests waiting for a slot, tasks
/// running, and the channel their decisions come back on.
pub(super) struct AsyncApply {
    pub(super) applier: AsyncApplierHandle,
    pub(super) queue: VecDeque<ApplyRequest>,
    pub(super) running: usize,
    /// Dropped with the driver, which aborts decisions still running:
    /// nothing durable was written for them.
    pub(super) tasks: tokio::task::JoinSet<()>,
    pub(super) decided: mpsc::UnboundedSender<(ApplyTicket, Option<ApplyDecision>)>,
    pub(super) decisions: mpsc::UnboundedReceiver<(ApplyTicket, Option<ApplyDecision>)>,
}

impl AsyncApply {
    pub(super) fn new(applier: AsyncApplierHandle) -> Self {
        let (decided, decisions) = mpsc::unbounded_channel();
        Self {
            applier,
            queue: VecDeque::new(),
            running: 0,
            tasks: tokio::task::JoinSet::new(),
            decided,
            decisions,
        }
    }

    /// Starts queued requests while fewer than the concurrency run. The
    /// queue is bounded by the receiver's outstanding-request quota.
    pub(super) fn start_ready(&mut self) {
        while self.running < self.applier.concurrency() {
            let Some(req) = self.queue.pop_front() else {
                return;
            };
            let answer = Answer {
                ticket: req.ticket,
                to: Some(self.decided.clone()),
            };
            let fut = self.applier.start(req);
            self.running += 1;
            self.tasks.spawn(async move {
                let decision = fut.await;
                answer.send(decision);
            });
        }
    }
}

/// Sends the decision back; if the task ends without one (the applier
/// panicked), says so, so the slot and the request are released.
struct Answer {
    ticket: ApplyTicket,
    to: Option<mpsc::UnboundedSender<(ApplyTicket, Option<ApplyDecision>)>>,
}

impl Answer {
    fn send(mut self, decision: ApplyDecision) {
        if let Some(to) = self.to.take() {
            let _ = to.send((self.ticket, Some(decision)));
        }
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if let Some(to) = self.to.take() {
            let _ = to.send((self.ticket, None));
        }
    }
}

pub(super) async fn recv_decision(
    apply: &mut Option<AsyncApply>,
) -> Option<(ApplyTicket, Option<ApplyDecision>)> {
    match apply {
        Some(a) => a.decisions.recv().await,
        None => std::future::pending().await,
    }
}
