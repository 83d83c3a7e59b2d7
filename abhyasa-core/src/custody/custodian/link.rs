//! A link to a receiver comes up: ask what became of what we hold for it.

use super::Custodian;
use crate::custody::Transmit;
use crate::model::AgentId;
use crate::wire::Message;

/// Most obligation ids in one status query.
pub const STATUS_QUERY_MAX_IDS: usize = 512;

impl Custodian {
    /// The status queries to send when a link to `peer` comes up: every
    /// id under custody towards `peer`, at most [`STATUS_QUERY_MAX_IDS`] a
    /// query, so a healed partition discharges without waiting for the
    /// retry backoff. The queries depend on no record and go out at once
    /// (the driver sends them, in order, as soon as the link is up).
    ///
    /// The ids are in id order, not hash order: the answers (and any
    /// resends) then go out in the same order on every run, which a seeded
    /// simulation needs to replay.
    #[must_use]
    pub fn status_queries(&self, peer: &AgentId) -> Vec<Transmit> {
        let mut pending = self.pending_for(peer);
        pending.sort();
        pending
            .chunks(STATUS_QUERY_MAX_IDS)
            .map(|chunk| Transmit {
                to: peer.clone(),
                message: Message::StatusQuery(chunk.to_vec()),
            })
            .collect()
    }
}
