//! What the receiver reports: the events a driver drains after commit,
//! what one delivery came to, and why a completion was refused.

use super::super::applier::ApplyTicket;
use super::super::record::{EffectWrite, ExternalIntent, LedgerOutcome};
#[cfg(doc)]
use super::Receiver;
use crate::model::{AgentId, DeclineReason, Digest, Kind, Obligation, ObligationId, Timestamp};
use crate::wire::ProtocolError;

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
