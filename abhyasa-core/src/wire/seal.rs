//! The parts of store-and-forward that look inside an envelope: the checks
//! a destination makes on a [`Sealed`] frame that need no key, and the
//! dedup key an origin gives each message it seals. Apart from the relay
//! types so that those need nothing from [`Message`], which carries them.

use sha2::{Digest as _, Sha256};

use super::message::{Envelope, Message};
use super::relay::{DedupKey, SealError, Sealed};
use crate::model::AgentId;

impl DedupKey {
    /// The key an origin uses for `message`: for an obligation its id and
    /// digest (one copy per obligation and content, whatever the attempt),
    /// for a status query a constant (the newest query wins), for anything
    /// else a hash of the encoded inner envelope (acks by frame hash).
    pub fn for_message(message: &Message, inner: &[u8]) -> Self {
        let mut h = Sha256::new();
        match message {
            Message::Obligation(o) => return Self::for_obligation(o.id(), &o.digest()),
            Message::StatusQuery(_) => h.update(b"status-query\0"),
            _ => {
                h.update(b"frame\0");
                h.update(inner);
            }
        }
        Self(h.finalize().to_vec())
    }
}

impl Sealed {
    /// The checks a destination makes that need no key: addressed to
    /// `local`, inner decodes, inner sender is the origin, no nesting.
    /// Returns the inner envelope. The caller must also verify the
    /// signature against the origin's pinned key before acting on it.
    pub fn open(&self, local: &AgentId) -> Result<Envelope, SealError> {
        if &self.destination != local {
            return Err(SealError::WrongDestination {
                destination: self.destination.clone(),
                local: local.clone(),
            });
        }
        let env = Envelope::decode(&self.inner).map_err(|error| SealError::Inner {
            origin: self.origin.clone(),
            error,
        })?;
        if env.sender != self.origin {
            return Err(SealError::InnerSender {
                origin: self.origin.clone(),
                sender: env.sender,
            });
        }
        if matches!(env.message, Message::Relay(_)) {
            return Err(SealError::Nested(self.origin.clone()));
        }
        Ok(env)
    }
}
