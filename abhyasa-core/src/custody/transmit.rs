//! What a state machine hands the driver to send: one message to one
//! agent. Both the custodian and the receiver emit it through their
//! outbox, released only after the records it depends on are durable.

use crate::model::AgentId;
use crate::wire::Message;

/// A frame to send.
#[derive(Clone, Debug, PartialEq)]
pub struct Transmit {
    /// The destination agent.
    pub to: AgentId,
    /// The message.
    pub message: Message,
}
