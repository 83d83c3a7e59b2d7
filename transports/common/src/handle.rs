//! The runtime-facing side: [`TransportHandle`] and [`Transport`].

use std::net::SocketAddr;
use std::sync::Arc;

use abhyasa_core::wire::Envelope;
use abhyasa_core::AgentId;
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::DropGuard;

use crate::link::Shared;
use crate::routed::Routed;
use crate::{Incoming, TransportStats};

/// A started transport: the handle to send with and the channel to receive
/// from. Split it with a `let Transport { handle, incoming } = ...`.
#[derive(Debug)]
pub struct Transport {
    /// Cloneable sending side.
    pub handle: TransportHandle,
    /// Frames, malformed-frame reports and connection events, in arrival
    /// order per connection.
    pub incoming: mpsc::Receiver<Incoming>,
}

/// Why [`TransportHandle::send`] did not queue a frame. Caller-side and
/// local conditions only: a queued frame may still be lost in flight, and
/// no variant means the peer did or did not get anything.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// The peer is not in this transport's configured (pinned) peer set.
    #[error("unknown peer {0}: not in the configured peer set")]
    UnknownPeer(AgentId),
    /// The peer is known but no authenticated connection to it is up; a
    /// configured peer is being re-dialled.
    #[error("no live connection to peer {0}")]
    NotConnected(AgentId),
    /// The connection's bounded send queue is full (backpressure).
    #[error("send queue to peer {0} is full")]
    QueueFull(AgentId),
    /// The encoded envelope is larger than the frame limit; the peer would
    /// refuse it.
    #[error("frame of {size} bytes exceeds the limit of {max} bytes")]
    FrameTooLarge {
        /// Encoded size without the length prefix.
        size: usize,
        /// The configured limit.
        max: usize,
    },
    /// The envelope's `sender` is not this node; the peer would drop it as
    /// unauthorized.
    #[error("envelope sender {sender} is not this node ({local})")]
    ForeignSender {
        /// The sender in the envelope.
        sender: AgentId,
        /// This node's agent id.
        local: AgentId,
    },
    /// The transport has been shut down.
    #[error("transport is shut down")]
    Closed,
}

/// Cloneable, non-blocking sending side of a transport. The transport shuts
/// down when [`shutdown`](Self::shutdown) is called or the last clone is
/// dropped.
#[derive(Clone, Debug)]
pub struct TransportHandle {
    inner: Inner,
    router: Option<Arc<dyn Router>>,
}

/// One transport's peer table, or several transports routed by peer
/// ([`crate::routed`]).
#[derive(Clone, Debug)]
enum Inner {
    Link {
        shared: Arc<Shared>,
        _stop_on_drop: Arc<DropGuard>,
    },
    Routed(Arc<Routed>),
}

/// Reaches some peers another way than a direct link: a relayed link
/// (`abhyasa-spool`) seals their frames and sends them to a relay. Installed
/// with [`TransportHandle::with_router`]; the driver does not know.
pub trait Router: Send + Sync + std::fmt::Debug {
    /// Whether this router reaches `peer` at all.
    fn routes(&self, peer: &AgentId) -> bool;
    /// Sends `envelope` for `peer` the router's way, over `direct` (the
    /// handle without the router). Called only when `routes(peer)` and no
    /// direct link to `peer` is up (direct first).
    fn send(
        &self,
        direct: &TransportHandle,
        peer: &AgentId,
        envelope: &Envelope,
    ) -> Result<(), SendError>;
    /// Whether the router's way to `peer` is up (its relay is connected).
    fn is_connected(&self, direct: &TransportHandle, peer: &AgentId) -> bool;
    /// Every peer the router reaches.
    fn peers(&self) -> Vec<AgentId>;
}

impl TransportHandle {
    pub(crate) fn new(shared: Arc<Shared>, guard: DropGuard) -> Self {
        Self {
            inner: Inner::Link {
                shared,
                _stop_on_drop: Arc::new(guard),
            },
            router: None,
        }
    }

    pub(crate) fn routed(routed: Arc<Routed>) -> Self {
        Self {
            inner: Inner::Routed(routed),
            router: None,
        }
    }

    /// The part a peer is routed to, or the peer table itself.
    fn part(&self, peer: &AgentId) -> Result<&Arc<Shared>, SendError> {
        match &self.inner {
            Inner::Link { shared, .. } => Ok(shared),
            Inner::Routed(r) => r
                .route(peer)
                .map(|h| match &h.inner {
                    Inner::Link { shared, .. } => Ok(shared),
                    // Routed parts are flattened at composition.
                    Inner::Routed(_) => Err(SendError::UnknownPeer(peer.clone())),
                })
                .unwrap_or_else(|| Err(SendError::UnknownPeer(peer.clone()))),
        }
    }

    /// Every single transport behind this handle (one, unless routed).
    pub(crate) fn parts(&self) -> Vec<Arc<Shared>> {
        match &self.inner {
            Inner::Link { shared, .. } => vec![shared.clone()],
            Inner::Routed(r) => r.parts().iter().flat_map(TransportHandle::parts).collect(),
        }
    }

    /// This handle with `router` reaching the peers it routes whenever no
    /// direct link to them is up (direct first, the router as fallback).
    pub fn with_router(mut self, router: Arc<dyn Router>) -> Self {
        self.router = Some(router);
        self
    }

    /// This handle without its router: direct links only.
    pub fn direct(&self) -> TransportHandle {
        Self {
            inner: self.inner.clone(),
            router: None,
        }
    }

    fn relay_route(&self, peer: &AgentId) -> Option<&Arc<dyn Router>> {
        self.router
            .as_ref()
            .filter(|r| r.routes(peer) && self.direct_connections(peer) == 0)
    }

    /// Live direct connections to `peer` (0 when no part knows it).
    fn direct_connections(&self, peer: &AgentId) -> usize {
        self.part(peer).map_or(0, |s| s.connections(peer))
    }

    /// This node's agent id.
    pub fn local(&self) -> &AgentId {
        match &self.inner {
            Inner::Link { shared, .. } => &shared.local,
            Inner::Routed(r) => r.local(),
        }
    }

    /// The address the transport listens on, if it listens (for several
    /// transports routed by peer, the first that listens).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.parts().iter().find_map(|s| s.local_addr())
    }

    /// Encodes `envelope` and queues it on the newest live connection to
    /// `peer`. Never blocks. `Ok` means queued, not delivered: custody owns
    /// retries.
    pub fn send(&self, peer: &AgentId, envelope: &Envelope) -> Result<(), SendError> {
        if envelope.sender != *self.local() {
            return Err(SendError::ForeignSender {
                sender: envelope.sender.clone(),
                local: self.local().clone(),
            });
        }
        // Direct first; the router (a relayed link) only when no direct
        // connection to the peer is up.
        if let Some(r) = self.relay_route(peer) {
            return r.send(&self.direct(), peer, envelope);
        }
        let shared = self.part(peer)?;
        if shared.shutdown.is_cancelled() {
            return Err(SendError::Closed);
        }
        let (frame, size) = envelope.encode_length_delimited();
        let max = shared.config.max_frame;
        if size > max {
            return Err(SendError::FrameTooLarge { size, max });
        }
        shared.queue(peer, Bytes::from(frame))
    }

    /// Bytes queued towards `peer` and not yet written by its newest
    /// connection (0 when none is up). With
    /// [`send_queue_budget`](Self::send_queue_budget), lets a runtime push
    /// back on its callers before the queue refuses frames.
    pub fn queued_bytes(&self, peer: &AgentId) -> usize {
        self.part(peer).map_or(0, |s| s.queued_bytes(peer))
    }

    /// The per-connection send budget in bytes
    /// ([`LinkConfig::send_queue_bytes`](crate::LinkConfig::send_queue_bytes));
    /// for several transports routed by peer, the smallest.
    pub fn send_queue_budget(&self) -> usize {
        self.parts()
            .iter()
            .map(|s| s.config.send_queue_bytes)
            .min()
            .unwrap_or(0)
    }

    /// The largest envelope this transport sends, in bytes; for several
    /// transports routed by peer, the smallest, so a frame sized by it
    /// fits every one of them.
    pub fn max_frame(&self) -> usize {
        self.parts()
            .iter()
            .map(|s| s.config.max_frame)
            .min()
            .unwrap_or(0)
    }

    /// The transport's counters since it started (summed over transports
    /// routed by peer).
    pub fn stats(&self) -> TransportStats {
        self.parts()
            .iter()
            .map(|s| s.counters.snapshot())
            .fold(TransportStats::default(), |a, b| a.plus(&b))
    }

    /// Whether at least one authenticated connection to `peer` is up.
    pub fn is_connected(&self, peer: &AgentId) -> bool {
        self.direct_connections(peer) > 0
            || self
                .relay_route(peer)
                .is_some_and(|r| r.is_connected(&self.direct(), peer))
    }

    /// Whether `peer` is in this transport's peer table (a pinned peer, or
    /// an endpoint of the in-memory network), connected or not: the peers
    /// a frame could ever be sent to.
    pub fn is_known(&self, peer: &AgentId) -> bool {
        let direct = match &self.inner {
            Inner::Link { shared, .. } => shared.is_known(peer),
            Inner::Routed(r) => r.route(peer).is_some(),
        };
        direct || self.router.as_ref().is_some_and(|r| r.routes(peer))
    }

    /// Peers with at least one live connection, sorted.
    pub fn connected_peers(&self) -> Vec<AgentId> {
        self.peers_where(|n| n > 0)
    }

    /// Every peer this transport accepts, sorted.
    pub fn known_peers(&self) -> Vec<AgentId> {
        let mut v = self.peers_where(|_| true);
        if let Some(r) = &self.router {
            v.extend(r.peers());
            v.sort();
            v.dedup();
        }
        v
    }

    fn peers_where(&self, pred: impl Fn(usize) -> bool + Copy) -> Vec<AgentId> {
        let mut v: Vec<AgentId> = match &self.inner {
            Inner::Link { shared, .. } => return shared.peers_where(pred),
            // A peer counts for the part it is routed to only.
            Inner::Routed(_) => {
                let parts = self.parts();
                parts
                    .iter()
                    .flat_map(|s| {
                        s.peers_where(pred)
                            .into_iter()
                            .filter(move |p| self.part(p).is_ok_and(|r| Arc::ptr_eq(r, s)))
                    })
                    .collect()
            }
        };
        v.sort();
        v.dedup();
        v
    }

    /// Stops dialling and accepting, closes every connection and waits for
    /// the transport's tasks to finish and its sockets to be released (for
    /// QUIC this includes the closing connections' drain period, at most
    /// three probe timeouts: about 3 s for a peer that never answered).
    /// Idempotent.
    pub async fn shutdown(&self) {
        let parts = self.parts();
        for s in &parts {
            s.shutdown.cancel();
            s.tasks.close();
        }
        for s in &parts {
            s.tasks.wait().await;
        }
        if let Inner::Routed(r) = &self.inner {
            r.wait_forwarders().await;
        }
    }
}
