//! What a node tells its embedder: [`NodeEvent`]s (after the records behind
//! them are durable) and [`Outcome`]s of custody transfers.

use abhyasa_core::custody::{CustodianEvent, ReceiverEvent, TerminalState};
use abhyasa_core::wire::RefusalCode;
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
    /// A store-and-forward relay refused a frame this node sealed (quota,
    /// spool full, expired, unknown destination, too large, unauthorized).
    /// Hop acceptance only: custody is kept and the custodian retries on
    /// its schedule, so the obligation still ends applied, declined or
    /// escalated at its deadline (never dropped). Counted in
    /// `MetricsSnapshot::relay_refused`.
    RelayRefused {
        /// The relay.
        relay: AgentId,
        /// The peer the frame was sealed for, when known.
        destination: Option<AgentId>,
        /// The obligation the frame carried, when it carried one.
        obligation_id: Option<ObligationId>,
        /// Why the relay refused it.
        code: RefusalCode,
        /// The relay's retry hint in seconds (0 is no hint).
        retry_after_seconds: u32,
    },
}
