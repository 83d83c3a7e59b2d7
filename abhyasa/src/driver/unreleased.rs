//! First attempts accepted and not yet handed to the transport: counted
//! against the send queue's budget, so `offer` pushes back before the
//! queue would refuse anything an accepted offer depends on (C-ND-4).

use abhyasa_core::{AgentId, Map, ObligationId};

/// Bytes of first attempts accepted by `offer` and not yet handed to the
/// transport, per target.
#[derive(Debug, Default)]
pub(super) struct Unreleased {
    by_id: Map<ObligationId, (AgentId, usize)>,
    by_peer: Map<AgentId, usize>,
}

impl Unreleased {
    pub(super) fn add(&mut self, id: ObligationId, peer: AgentId, bytes: usize) {
        *self.by_peer.entry(peer.clone()).or_default() += bytes;
        self.by_id.insert(id, (peer, bytes));
    }

    pub(super) fn release(&mut self, id: &ObligationId) {
        if let Some((peer, bytes)) = self.by_id.remove(id) {
            if let Some(n) = self.by_peer.get_mut(&peer) {
                *n = n.saturating_sub(bytes);
                if *n == 0 {
                    self.by_peer.remove(&peer);
                }
            }
        }
    }

    pub(super) fn to(&self, peer: &AgentId) -> usize {
        self.by_peer.get(peer).copied().unwrap_or(0)
    }
}
