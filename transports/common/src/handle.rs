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

impl TransportHandle {
    pub(crate) fn new(shared: Arc<Shared>, guard: DropGuard) -> Self {
        Self {
            inner: Inner::Link {
                shared,
                _stop_on_drop: Arc::new(guard),
            },
        }
    }

    pub(crate) fn routed(routed: Arc<Routed>) -> Self {
        Self {
            inner: Inner::Routed(routed),
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
        let shared = self.part(peer)?;
        if shared.shutdown.is_cancelled() {
            return Err(SendError::Closed);
        }
        if envelope.sender != shared.local {
            return Err(SendError::ForeignSender {
                sender: envelope.sender.clone(),
                local: shared.local.clone(),
            });
        }
        let body = envelope.encode();
        let max = shared.config.max_frame;
        if body.len() > max {
            return Err(SendError::FrameTooLarge {
                size: body.len(),
                max,
            });
        }
        let mut frame = Vec::with_capacity(body.len() + 10);
        prost::encoding::encode_varint(body.len() as u64, &mut frame);
        frame.extend_from_slice(&body);
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
        self.part(peer).is_ok_and(|s| s.connections(peer) > 0)
    }

    /// Whether `peer` is in this transport's peer table (a pinned peer, or
    /// an endpoint of the in-memory network), connected or not: the peers
    /// a frame could ever be sent to.
    pub fn is_known(&self, peer: &AgentId) -> bool {
        match &self.inner {
            Inner::Link { shared, .. } => shared.is_known(peer),
            Inner::Routed(r) => r.route(peer).is_some(),
        }
    }

    /// Peers with at least one live connection, sorted.
    pub fn connected_peers(&self) -> Vec<AgentId> {
        self.peers_where(|n| n > 0)
    }

    /// Every peer this transport accepts, sorted.
    pub fn known_peers(&self) -> Vec<AgentId> {
        self.peers_where(|_| true)
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
