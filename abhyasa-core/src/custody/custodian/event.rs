//! What the custodian reports: the events a driver drains after commit,
//! the counters behind metrics, and the result of an offer.

use std::time::Duration;

use super::super::record::{DeclineDisposition, Reconciliation, TerminalState};
#[cfg(doc)]
use super::Custodian;
use crate::model::{AgentId, DeclineReason, Escalation, ObligationId, Timestamp};
use crate::principal::DecisionItem;

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
    DecisionRequired(Box<DecisionItem>),
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
