//! What a transport reports to the node runtime.

use abhyasa_core::wire::{Envelope, FrameKey, RefusalCode};
use abhyasa_core::{AgentId, ObligationId, PeerError};

/// One item from a transport's incoming channel.
///
/// `peer` is always the peer the transport **authenticated** (its pinned
/// key), never a field the bytes claim: AB-3 keys idempotency on it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Incoming {
    /// A well-formed frame whose `sender` is the authenticated peer.
    Frame {
        /// The authenticated peer.
        peer: AgentId,
        /// The decoded envelope; `envelope.sender == peer`.
        envelope: Envelope,
    },
    /// A frame that did not decode (malformed, oversize, unknown version or
    /// message type, bad field, digest mismatch). The frame was consumed
    /// whole and the connection stays up (C-T-4); the runtime may answer
    /// with an `Error` frame built by `ProtocolError::from_peer_error`.
    Malformed {
        /// The authenticated peer that sent it.
        peer: AgentId,
        /// What was wrong.
        error: PeerError,
    },
    /// A well-formed frame whose `sender` is not the authenticated peer.
    /// It is dropped, never delivered (wire code `Unauthorized`); the
    /// connection stays up.
    Unauthorized {
        /// The authenticated peer that sent it.
        peer: AgentId,
        /// The sender the envelope claimed.
        claimed: AgentId,
    },
    /// The first authenticated connection to this peer is up.
    Connected(AgentId),
    /// The last connection to this peer is gone. Frames queued on it may
    /// have been lost: custody retries them.
    Disconnected(AgentId),
    /// A store-and-forward relay refused a frame sealed for `destination`
    /// (a relayed link reports it). Hop acceptance only: the runtime
    /// surfaces it and the custodian keeps its schedule; nothing is
    /// discharged or escalated by it (spec/protocol.md §7).
    RelayRefused {
        /// The relay (an authenticated peer).
        peer: AgentId,
        /// The frame the relay named.
        key: FrameKey,
        /// The peer the frame was sealed for, when the link still knows it.
        destination: Option<AgentId>,
        /// The obligation in the frame, when it carried one and the link
        /// still knows it.
        obligation_id: Option<ObligationId>,
        /// Why the relay refused it.
        code: RefusalCode,
        /// The relay's hint: a retry may succeed after this many seconds
        /// (0 is no hint).
        retry_after_seconds: u32,
    },
}

impl Incoming {
    /// The peer this item is about.
    pub fn peer(&self) -> &AgentId {
        match self {
            Self::Frame { peer, .. }
            | Self::Malformed { peer, .. }
            | Self::Unauthorized { peer, .. }
            | Self::RelayRefused { peer, .. }
            | Self::Connected(peer)
            | Self::Disconnected(peer) => peer,
        }
    }
}
