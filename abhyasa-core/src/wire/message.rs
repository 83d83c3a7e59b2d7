//! The protocol's messages: what one frame carries, independent of how it
//! is encoded (protobuf frames here, JSON v1 in [`super::json`]).

use super::code::ErrorCode;
use super::relay::RelayMessage;
use crate::error::PeerError;
use crate::model::{AgentId, CustodyAck, Digest, Obligation, ObligationId};

/// A typed protocol error, optionally about one obligation.
#[derive(Clone, Debug, PartialEq)]
pub struct ProtocolError {
    /// The code.
    pub code: ErrorCode,
    /// The obligation it is about, if any.
    pub obligation_id: Option<ObligationId>,
    /// That obligation's digest as received.
    pub digest: Option<Digest>,
    /// Human-readable message.
    pub message: String,
}

impl ProtocolError {
    /// The error frame answering a peer error.
    pub fn from_peer_error(e: &PeerError) -> Self {
        Self {
            code: e.code(),
            obligation_id: None,
            digest: None,
            message: e.to_string(),
        }
    }
}

/// Answer to a status query.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusReply {
    /// The receiver.
    pub target: AgentId,
    /// Ids it knows, with their current ack.
    pub known: Vec<CustodyAck>,
    /// Ids it has never seen (or compacted).
    pub unknown: Vec<ObligationId>,
}

/// A message body.
#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    /// An obligation.
    Obligation(Obligation),
    /// Acks from one receiver for one or more obligations.
    Acks(Vec<CustodyAck>),
    /// Status query by obligation id.
    StatusQuery(Vec<ObligationId>),
    /// Status reply.
    StatusReply(StatusReply),
    /// Protocol error.
    Error(ProtocolError),
    /// Store-and-forward: sealed frames, relay receipts, edge pull
    /// (spec/protocol.md §7). A node without a relayed link answers it
    /// `unknown_message_type`.
    Relay(RelayMessage),
}

/// A frame: the sender and one message.
#[derive(Clone, Debug, PartialEq)]
pub struct Envelope {
    /// The sender as it claims; transports bind it to the peer's key.
    pub sender: AgentId,
    /// The body.
    pub message: Message,
}

impl Envelope {
    /// A new envelope.
    pub fn new(sender: AgentId, message: Message) -> Self {
        Self { sender, message }
    }
}
