//! What a transport reports to the node runtime.

use abhyasa_core::wire::Envelope;
use abhyasa_core::{AgentId, PeerError};

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
}

impl Incoming {
    /// The peer this item is about.
    pub fn peer(&self) -> &AgentId {
        match self {
            Self::Frame { peer, .. }
            | Self::Malformed { peer, .. }
            | Self::Unauthorized { peer, .. }
            | Self::Connected(peer)
            | Self::Disconnected(peer) => peer,
        }
    }
}
