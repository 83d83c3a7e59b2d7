//! Machinery for transport implementations: the peer table behind a
//! [`TransportHandle`], one [`Link`] per
//! authenticated connection, dial loops, and the accept loop with its
//! pre-authentication admission ([`Admission`]).
//!
//! A transport crate creates a [`Registry`] with [`Registry::new`], adds
//! its configured peers, and for every connection it has authenticated
//! calls [`Registry::attach`]. It then moves bytes between its socket and
//! the [`Link`]: frames from `outbound` to the wire, bytes from the wire
//! into `inbound`. When the connection ends it calls
//! [`LinkGuard::close`]. Connection events, the frame decoder and the
//! sender binding check are handled here, once for every transport.

mod accept;
mod dial;
mod inbound;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use abhyasa_core::AgentId;
use bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use accept::{Accepted, Admission, Admitted, Attempt};
pub use dial::DialError;
pub use inbound::{decode_message, InboundSink, ReceiverGone};

use crate::stats::{bump, Counters};
use crate::{Incoming, LinkConfig, SendError, Transport, TransportHandle};

/// Why a connection could not be attached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AttachError {
    /// The authenticated peer is not in the peer table.
    #[error("peer {0} is not configured")]
    UnknownPeer(AgentId),
    /// The transport is shutting down.
    #[error("transport is shutting down")]
    ShuttingDown,
}

/// The peer table and task set of one transport instance. Cheap to clone;
/// clones share state. Holding a `Registry` does not keep the transport
/// alive: it stops when its last [`TransportHandle`] is dropped.
#[derive(Clone, Debug)]
pub struct Registry {
    shared: Arc<Shared>,
}

/// One authenticated connection's end of the peer table.
#[derive(Debug)]
pub struct Link {
    /// Detaches the connection from the table when closed or dropped.
    pub guard: LinkGuard,
    /// Encoded frames (length prefix included) to write to this
    /// connection, in order.
    pub outbound: mpsc::Receiver<Bytes>,
    /// Where bytes read from this connection go.
    pub inbound: InboundSink,
}

/// Keeps a connection registered. [`close`](Self::close) it when the
/// connection ends so `Disconnected` is reported in order; dropping it
/// detaches too, reporting from a spawned task.
#[derive(Debug)]
pub struct LinkGuard {
    shared: Arc<Shared>,
    peer: AgentId,
    id: u64,
    closed: bool,
}

/// One connection's send queue: the channel and the bytes it holds.
#[derive(Debug)]
struct SendQueue {
    id: u64,
    tx: mpsc::Sender<Bytes>,
    /// Bytes queued and not yet written (released when the transport
    /// drops the frame, see [`Budgeted`]).
    queued: Arc<AtomicUsize>,
}

/// A queued frame that gives its bytes back to its connection's budget
/// when the transport drops it (after writing it, or with the connection).
struct Budgeted {
    frame: Bytes,
    queued: Arc<AtomicUsize>,
}

impl AsRef<[u8]> for Budgeted {
    fn as_ref(&self) -> &[u8] {
        &self.frame
    }
}

impl Drop for Budgeted {
    fn drop(&mut self) {
        self.queued.fetch_sub(self.frame.len(), Ordering::AcqRel);
    }
}

#[derive(Debug)]
struct PeerState {
    /// Live connections, newest last; sends use the newest.
    links: Vec<SendQueue>,
    count: watch::Sender<usize>,
}

impl PeerState {
    fn new() -> Self {
        Self {
            links: Vec::new(),
            count: watch::Sender::new(0),
        }
    }
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) local: AgentId,
    pub(crate) config: LinkConfig,
    peers: Mutex<abhyasa_core::Map<AgentId, PeerState>>,
    /// Serialises connection events with the table changes that cause
    /// them, so `Connected`/`Disconnected` reach the runtime in the order
    /// the connection count changed.
    events: tokio::sync::Mutex<()>,
    incoming: mpsc::Sender<Incoming>,
    pub(crate) shutdown: CancellationToken,
    pub(crate) tasks: TaskTracker,
    next_link: AtomicU64,
    local_addr: Mutex<Option<SocketAddr>>,
    pub(crate) counters: Arc<Counters>,
}

impl Shared {
    fn peers(&self) -> MutexGuard<'_, abhyasa_core::Map<AgentId, PeerState>> {
        // A panic while holding the lock leaves the table consistent (every
        // mutation is a single push/retain), so poisoning is ignored.
        self.peers.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn local_addr(&self) -> Option<SocketAddr> {
        *self.local_addr.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn queue(&self, peer: &AgentId, frame: Bytes) -> Result<(), SendError> {
        let peers = self.peers();
        let state = peers
            .get(peer)
            .ok_or_else(|| SendError::UnknownPeer(peer.clone()))?;
        let q = state
            .links
            .last()
            .ok_or_else(|| SendError::NotConnected(peer.clone()))?;
        // The queue is budgeted in bytes (and frames): a few large frames
        // cannot hold more memory than the budget allows.
        let len = frame.len();
        let budget = self.config.send_queue_bytes;
        let reserved = q
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held.saturating_add(len) <= budget || held == 0).then(|| held + len)
            });
        if reserved.is_err() {
            return Err(SendError::QueueFull(peer.clone()));
        }
        // From here on, dropping the frame (sent, refused or written)
        // gives its bytes back.
        let frame = Bytes::from_owner(Budgeted {
            frame,
            queued: q.queued.clone(),
        });
        q.tx.try_send(frame).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => SendError::QueueFull(peer.clone()),
            mpsc::error::TrySendError::Closed(_) => SendError::NotConnected(peer.clone()),
        })?;
        bump(&self.counters.frames_sent);
        Ok(())
    }

    /// Bytes queued on the newest connection to `peer` (0 if none).
    pub(crate) fn queued_bytes(&self, peer: &AgentId) -> usize {
        self.peers()
            .get(peer)
            .and_then(|s| s.links.last())
            .map_or(0, |q| q.queued.load(Ordering::Acquire))
    }

    pub(crate) fn is_known(&self, peer: &AgentId) -> bool {
        self.peers().contains_key(peer)
    }

    pub(crate) fn connections(&self, peer: &AgentId) -> usize {
        self.peers().get(peer).map_or(0, |s| s.links.len())
    }

    pub(crate) fn peers_where(&self, pred: impl Fn(usize) -> bool) -> Vec<AgentId> {
        let mut v: Vec<AgentId> = self
            .peers()
            .iter()
            .filter(|(_, s)| pred(s.links.len()))
            .map(|(p, _)| p.clone())
            .collect();
        v.sort();
        v
    }

    async fn detach(&self, peer: &AgentId, id: u64) {
        let _order = self.events.lock().await;
        let last = self.remove_link(peer, id);
        if last {
            // The runtime may have dropped its receiver; nothing to report to.
            let _ = self
                .incoming
                .send(Incoming::Disconnected(peer.clone()))
                .await;
        }
    }

    /// Removes one link; true if it was the peer's last.
    fn remove_link(&self, peer: &AgentId, id: u64) -> bool {
        let mut peers = self.peers();
        let Some(state) = peers.get_mut(peer) else {
            return false;
        };
        let before = state.links.len();
        state.links.retain(|q| q.id != id);
        let after = state.links.len();
        state.count.send_replace(after);
        before != after && after == 0
    }
}

impl Registry {
    /// A new, empty registry for `local`, and the [`Transport`] the runtime
    /// will use. Must be called within a tokio runtime.
    pub fn new(local: AgentId, config: LinkConfig) -> (Registry, Transport) {
        let (tx, rx) = mpsc::channel(config.incoming_queue.max(1));
        let shutdown = CancellationToken::new();
        let shared = Arc::new(Shared {
            local,
            config,
            peers: Mutex::new(abhyasa_core::Map::default()),
            events: tokio::sync::Mutex::new(()),
            incoming: tx,
            shutdown: shutdown.clone(),
            tasks: TaskTracker::new(),
            next_link: AtomicU64::new(1),
            local_addr: Mutex::new(None),
            counters: Arc::default(),
        });
        let handle = TransportHandle::new(shared.clone(), shutdown.drop_guard());
        (
            Registry { shared },
            Transport {
                handle,
                incoming: rx,
            },
        )
    }

    /// This node's agent id.
    pub fn local(&self) -> &AgentId {
        &self.shared.local
    }

    /// The link configuration.
    pub fn config(&self) -> &LinkConfig {
        &self.shared.config
    }

    /// Adds a peer this transport accepts and can send to. Idempotent.
    pub fn add_peer(&self, peer: AgentId) {
        self.shared
            .peers()
            .entry(peer)
            .or_insert_with(PeerState::new);
    }

    /// Removes a peer at runtime (a relay unenrolling an edge): sends to it
    /// fail with `UnknownPeer` from now on, a connection it opens later is
    /// refused at [`attach`](Self::attach), and its live connections are
    /// closed: their send queues are dropped, which ends the transport's
    /// write loop. Reports `Disconnected(peer)` if one was up. Returns
    /// whether the peer was known.
    pub async fn remove_peer(&self, peer: &AgentId) -> bool {
        let shared = &self.shared;
        // Ordered with attach/detach, so the runtime sees Disconnected after
        // the Connected it pairs with.
        let _order = shared.events.lock().await;
        let Some(state) = shared.peers().remove(peer) else {
            return false;
        };
        let was_up = !state.links.is_empty();
        state.count.send_replace(0);
        // Dropping the queues closes each link's `outbound`; the connection
        // ends and its guard's detach finds the peer gone (no second event).
        drop(state);
        if was_up {
            let _ = shared
                .incoming
                .send(Incoming::Disconnected(peer.clone()))
                .await;
        }
        true
    }

    /// Whether `peer` is in the table.
    pub fn is_known(&self, peer: &AgentId) -> bool {
        self.shared.peers().contains_key(peer)
    }

    /// Live connections to `peer`.
    pub fn connections(&self, peer: &AgentId) -> usize {
        self.shared.connections(peer)
    }

    /// Records the address the transport listens on (shown by the handle).
    pub fn set_local_addr(&self, addr: SocketAddr) {
        *self
            .shared
            .local_addr
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(addr);
    }

    /// Cancelled when the transport shuts down; every task of the transport
    /// must stop soon after.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shared.shutdown.clone()
    }

    /// Whether the transport is shutting down.
    pub fn is_shutting_down(&self) -> bool {
        self.shared.shutdown.is_cancelled()
    }

    pub(crate) fn queue_raw(&self, peer: &AgentId, frame: Bytes) -> Result<(), SendError> {
        self.shared.queue(peer, frame)
    }

    /// Counts an inbound connection refused before it was attached
    /// (handshake failure, authentication, timeout).
    pub fn count_refused(&self) {
        bump(&self.shared.counters.refused);
    }

    fn count_dial_failure(&self) {
        bump(&self.shared.counters.dial_failures);
    }

    /// Spawns a task that [`TransportHandle::shutdown`] waits for.
    pub fn spawn<F>(&self, fut: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.shared.tasks.spawn(fut)
    }

    /// Wraps `fut` so that [`TransportHandle::shutdown`] also waits for it
    /// (for a task spawned by someone else's tracker).
    pub fn track<F: Future>(&self, fut: F) -> impl Future<Output = F::Output> {
        self.shared.tasks.track_future(fut)
    }

    /// Registers an authenticated connection to `peer`. Reports
    /// `Connected(peer)` if it is the peer's first, before any frame of the
    /// connection can be delivered.
    pub async fn attach(&self, peer: &AgentId) -> Result<Link, AttachError> {
        if self.is_shutting_down() {
            return Err(AttachError::ShuttingDown);
        }
        let shared = &self.shared;
        let _order = shared.events.lock().await;
        let (tx, rx) = mpsc::channel(shared.config.send_queue.max(1));
        let id = shared.next_link.fetch_add(1, Ordering::Relaxed);
        let first = {
            let mut peers = shared.peers();
            let state = peers
                .get_mut(peer)
                .ok_or_else(|| AttachError::UnknownPeer(peer.clone()))?;
            state.links.push(SendQueue {
                id,
                tx,
                queued: Arc::new(AtomicUsize::new(0)),
            });
            let n = state.links.len();
            state.count.send_replace(n);
            n == 1
        };
        bump(&shared.counters.connections);
        if first {
            let _ = shared
                .incoming
                .send(Incoming::Connected(peer.clone()))
                .await;
        }
        Ok(Link {
            guard: LinkGuard {
                shared: shared.clone(),
                peer: peer.clone(),
                id,
                closed: false,
            },
            outbound: rx,
            inbound: InboundSink::new(
                peer.clone(),
                shared.incoming.clone(),
                shared.config.max_frame,
                shared.counters.clone(),
            ),
        })
    }

    /// Waits until no connection to `peer` is up (or the transport shuts
    /// down). Returns at once for an unknown peer.
    pub async fn wait_disconnected(&self, peer: &AgentId) {
        let rx = self.shared.peers().get(peer).map(|s| s.count.subscribe());
        let Some(mut rx) = rx else { return };
        tokio::select! {
            _ = self.shared.shutdown.cancelled() => {}
            _ = rx.wait_for(|n| *n == 0) => {}
        }
    }
}

impl LinkGuard {
    /// The authenticated peer of this connection.
    pub fn peer(&self) -> &AgentId {
        &self.peer
    }

    /// Detaches the connection; reports `Disconnected(peer)` if it was the
    /// peer's last.
    pub async fn close(mut self) {
        self.closed = true;
        self.shared.detach(&self.peer, self.id).await;
    }
}

impl Drop for LinkGuard {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        let (shared, peer, id) = (self.shared.clone(), self.peer.clone(), self.id);
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move { shared.detach(&peer, id).await });
            }
            // No runtime left to report on: just keep the table right.
            Err(_) => {
                shared.remove_link(&peer, id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use abhyasa_core::wire::{Envelope, Message};
    use abhyasa_core::ObligationId;

    use super::*;

    fn id(s: &str) -> AgentId {
        AgentId::new(s).expect("valid agent id")
    }

    fn query(sender: &AgentId, ids: usize) -> Envelope {
        let ids = (0..ids)
            .map(|n| ObligationId::new(format!("obligation-{n:06}")).expect("valid id"))
            .collect();
        Envelope::new(sender.clone(), Message::StatusQuery(ids))
    }

    // C-ND-4: the send queue is budgeted in bytes: large frames hit the
    // budget long before the frame count, and a written frame gives its
    // bytes back.
    #[tokio::test]
    async fn c_nd_4_send_queue_is_budgeted_in_bytes() {
        let config = LinkConfig {
            send_queue: 1_000,
            send_queue_bytes: 64 * 1024,
            ..LinkConfig::default()
        };
        let (registry, transport) = Registry::new(id("a"), config);
        registry.add_peer(id("b"));
        let mut link = registry.attach(&id("b")).await.expect("attached");
        let handle = transport.handle;
        let env = query(&id("a"), 400); // about 8 KiB
        let mut queued = 0;
        let err = loop {
            match handle.send(&id("b"), &env) {
                Ok(()) => queued += 1,
                Err(e) => break e,
            }
            assert!(queued < 1_000, "the byte budget never refused a frame");
        };
        assert_eq!(err, SendError::QueueFull(id("b")));
        let held = handle.queued_bytes(&id("b"));
        assert!(
            held <= 64 * 1024,
            "{held} bytes queued over a 64 KiB budget"
        );
        assert!(
            held > 48 * 1024,
            "{held} bytes: the budget is used, not wasted"
        );
        assert!(queued < 10, "{queued} frames of ~8 KiB fit in 64 KiB");
        // Writing (dropping) one frame frees room for another.
        let frame = link.outbound.recv().await.expect("a queued frame");
        drop(frame);
        assert!(handle.queued_bytes(&id("b")) < held);
        handle.send(&id("b"), &env).expect("room again");
        link.guard.close().await;
    }
}
