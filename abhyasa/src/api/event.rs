//! What a node tells its embedder: [`NodeEvent`]s (after the records behind
//! them are durable) and [`Outcome`]s of custody transfers.

use abhyasa_core::custody::{CustodianEvent, ReceiverEvent, TerminalState};
use abhyasa_core::{AgentId, DeclineReason, Escalation, ObligationId};

/// How a custody transfer ended, as seen by the custodian.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The obligation.
    pub obligation_id: ObligationId,
    /// Terminal state.
    pub state: TerminalState,
    /// Attempts made, when known.
    pub attempts: Option<u32>,
    /// Decline reason, for declines.
    pub reason: Option<DeclineReason>,
    /// The escalation, for escalations.
    pub escalation: Option<Box<Escalation>>,
}

/// What subscribers see, after the records behind it are durable.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum NodeEvent {
    /// A custodian event.
    Custodian(CustodianEvent),
    /// A receiver event.
    Receiver(ReceiverEvent),
    /// A durable event: one committed record, with its position in the
    /// store's event log. A [`Subscription`](crate::Subscription) yields
    /// every one, in id order, exactly once (refilling from the log after a
    /// lag).
    Logged(abhyasa_core::store::StoredEvent),
    /// A peer connected.
    PeerUp(AgentId),
    /// A peer disconnected.
    PeerDown(AgentId),
    /// A peer sent something bad (logged; nothing accepted was affected).
    PeerMisbehaved {
        /// The peer.
        peer: AgentId,
        /// What it did.
        what: String,
    },
}
