//! A relayed link for a node: a wrapper around any [`Transport`] that
//! reaches some peers through a relay, or through several
//! ([`relayed_via`]: each peer through its own relay).
//!
//! * **Out.** Frames for a relayed peer with no direct link up (direct
//!   first, the relay as fallback) are sealed with this node's identity key
//!   and sent to the relay, which is itself a pinned peer of the wrapped
//!   transport. Obligations are held at most until their deadline; other
//!   frames (acks, status) for `ack_hold`.
//! * **In.** Sealed frames from the relay are opened against the origin's
//!   pin ([`Opener`]) and handed to the node as frames **from the origin**,
//!   so its receiver ledger is keyed on the origin (AB-3) and only the
//!   target's acks discharge (C-TR-5). A frame that does not open is
//!   reported `Unauthorized` against the relay and nothing of it is used.
//!   Every frame taken from the relay is answered `Delivered`.
//! * **Receipts** are hop acceptance only: counted in [`RelayedStats`] and
//!   logged; they never reach the custodian, which keeps its schedule. A
//!   refusal is passed to the node as [`Incoming::RelayRefused`] (naming
//!   the destination and obligation the link sealed under that key), which
//!   the node surfaces as an event and a metric.
//! * **Pull.** When the relay connects the node asks for its spooled
//!   frames (`Pull`), and asks again while the relay reports more waiting.
//!   The node dials out; it needs no public address.
//!
//! The driver does not know any of this: it sees an ordinary transport.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use abhyasa_core::wire::{Envelope, FrameKey, Message, RelayMessage};
use abhyasa_core::{AgentId, ObligationId};
use abhyasa_identity::{Identity, PeerPin};
use abhyasa_transport::{Incoming, Router, SendError, Transport, TransportHandle};
use tokio::sync::mpsc;

use crate::relay::{system_clock, Clock};
use crate::seal::{Opener, SealFailure, Sealer};

/// How a node reaches peers through one relay.
#[derive(Clone)]
pub struct RelayedConfig {
    /// The relay (a pinned peer of the wrapped transport).
    pub relay: AgentId,
    /// The peers reached through it, with their pins (used to verify what
    /// they seal).
    pub peers: Vec<PeerPin>,
    /// This node's identity (signs what it seals).
    pub identity: Identity,
    /// Frames per `Pull`.
    pub pull_max_frames: u32,
    /// Bytes per `Pull`.
    pub pull_max_bytes: u64,
    /// How long the relay holds this node's acks and status frames.
    pub ack_hold: Duration,
    /// Where `now` comes from when stamping the hold of acks and status
    /// frames: the node's clock (simulated time in the simulator).
    pub clock: Clock,
}

impl std::fmt::Debug for RelayedConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayedConfig")
            .field("relay", &self.relay)
            .field("peers", &self.peers)
            .field("pull_max_frames", &self.pull_max_frames)
            .field("pull_max_bytes", &self.pull_max_bytes)
            .field("ack_hold", &self.ack_hold)
            .finish_non_exhaustive()
    }
}

impl RelayedConfig {
    /// A configuration with default pull budget (256 frames, 4 MiB) and
    /// ack hold (one day).
    pub fn new(relay: AgentId, peers: Vec<PeerPin>, identity: Identity) -> Self {
        Self {
            relay,
            peers,
            identity,
            pull_max_frames: 256,
            pull_max_bytes: 4 << 20,
            ack_hold: Duration::from_secs(24 * 3600),
            clock: system_clock(),
        }
    }
}

/// Counters of a relayed link.
#[derive(Debug, Default)]
pub struct RelayedStats {
    /// Frames sealed and queued to the relay.
    pub sealed_sent: AtomicU64,
    /// Sealed frames opened and handed to the node.
    pub opened: AtomicU64,
    /// Sealed frames that did not open (tampered, replayed, misrouted).
    pub rejected: AtomicU64,
    /// Frames the relay receipted as spooled.
    pub accepted: AtomicU64,
    /// Frames the relay refused (any code).
    pub refused: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Most frame keys remembered for naming refusals: a relay answers within
/// a round trip, so the newest keys suffice, and a peer cannot make the
/// link hold more than this.
const SENT_KEYS: usize = 65_536;

/// What the link sealed under each recent frame key, so a refusal (which
/// names only the key) can name the destination and obligation.
#[derive(Debug, Default)]
struct SentKeys {
    by_key: HashMap<FrameKey, (AgentId, Option<ObligationId>)>,
    order: VecDeque<FrameKey>,
}

impl SentKeys {
    fn remember(&mut self, key: FrameKey, destination: &AgentId, ob: Option<&ObligationId>) {
        // Retries of one obligation share a key: remembered once.
        if self.by_key.contains_key(&key) {
            return;
        }
        if self.order.len() >= SENT_KEYS {
            if let Some(old) = self.order.pop_front() {
                self.by_key.remove(&old);
            }
        }
        self.by_key.insert(key, (destination.clone(), ob.cloned()));
        self.order.push_back(key);
    }

    fn lookup(&self, key: &FrameKey) -> (Option<AgentId>, Option<ObligationId>) {
        match self.by_key.get(key) {
            Some((d, o)) => (Some(d.clone()), o.clone()),
            None => (None, None),
        }
    }
}

fn lock(m: &Mutex<SentKeys>) -> std::sync::MutexGuard<'_, SentKeys> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One relay of a relayed link and the peers reached through it.
struct Route {
    relay: AgentId,
    peers: HashSet<AgentId>,
    sealer: Sealer,
    ack_hold: Duration,
    clock: Clock,
}

struct SealRouter {
    routes: Vec<Route>,
    stats: Arc<RelayedStats>,
    sent: Arc<Mutex<SentKeys>>,
}

impl std::fmt::Debug for SealRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("SealRouter");
        for r in &self.routes {
            d.field(r.relay.as_str(), &r.peers);
        }
        d.finish_non_exhaustive()
    }
}

impl SealRouter {
    /// The relay to reach `peer` through: the first of its relays that is
    /// connected, else its first (the send then fails `NotConnected` and
    /// custody retries).
    fn route(&self, direct: &TransportHandle, peer: &AgentId) -> Option<&Route> {
        let mut of_peer = self.routes.iter().filter(|r| r.peers.contains(peer));
        let first = of_peer.next()?;
        if direct.is_connected(&first.relay) {
            return Some(first);
        }
        of_peer
            .find(|r| direct.is_connected(&r.relay))
            .or(Some(first))
    }
}

impl Router for SealRouter {
    fn routes(&self, peer: &AgentId) -> bool {
        self.routes.iter().any(|r| r.peers.contains(peer))
    }

    fn send(
        &self,
        direct: &TransportHandle,
        peer: &AgentId,
        envelope: &Envelope,
    ) -> Result<(), SendError> {
        let Some(route) = self.route(direct, peer) else {
            return Err(SendError::UnknownPeer(peer.clone()));
        };
        let expires_at = match &envelope.message {
            // The deadline binds the relay too: never delivered after it.
            Message::Obligation(o) => o.deadline_at(),
            _ => (route.clock)().saturating_add(route.ack_hold),
        };
        let sealed = route
            .sealer
            .seal(peer, envelope, expires_at)
            .map_err(|e| match e {
                SealFailure::TooLarge { size, max } => SendError::FrameTooLarge { size, max },
                SealFailure::ForeignSender { sender, local } => {
                    SendError::ForeignSender { sender, local }
                }
                other => {
                    tracing::error!(%peer, error = %other, "cannot seal");
                    SendError::NotConnected(peer.clone())
                }
            })?;
        let ob = match &envelope.message {
            Message::Obligation(o) => Some(o.id()),
            _ => None,
        };
        lock(&self.sent).remember(sealed.key(), peer, ob);
        let outer = Envelope::new(
            route.sealer.local().clone(),
            Message::Relay(RelayMessage::Sealed(Box::new(sealed))),
        );
        direct.send(&route.relay, &outer).map_err(|e| match e {
            // Report the peer the caller asked for, not the relay.
            SendError::NotConnected(_) => SendError::NotConnected(peer.clone()),
            SendError::QueueFull(_) => SendError::QueueFull(peer.clone()),
            other => other,
        })?;
        bump(&self.stats.sealed_sent);
        Ok(())
    }

    fn is_connected(&self, direct: &TransportHandle, peer: &AgentId) -> bool {
        self.routes
            .iter()
            .any(|r| r.peers.contains(peer) && direct.is_connected(&r.relay))
    }

    fn peers(&self) -> Vec<AgentId> {
        let mut v: Vec<AgentId> = self
            .routes
            .iter()
            .flat_map(|r| r.peers.iter().cloned())
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

/// Wraps `transport` so the peers of `config` are reached through its
/// relay. Returns the wrapped transport and the link's counters.
pub fn relayed(transport: Transport, config: RelayedConfig) -> (Transport, Arc<RelayedStats>) {
    relayed_via(transport, vec![config])
}

/// Wraps `transport` so each config's peers are reached through its relay
/// (several relays, one wrapper: the transport's router slot holds one
/// router, so the relays share it). A peer listed under several relays is
/// sent through the first that is connected. Direct first, as for
/// [`relayed`]; the counters cover every relay.
pub fn relayed_via(
    transport: Transport,
    configs: Vec<RelayedConfig>,
) -> (Transport, Arc<RelayedStats>) {
    let Transport { handle, incoming } = transport;
    let local = handle.local().clone();
    let stats = Arc::new(RelayedStats::default());
    let sent = Arc::new(Mutex::new(SentKeys::default()));
    let router = SealRouter {
        routes: configs
            .iter()
            .map(|c| Route {
                relay: c.relay.clone(),
                peers: c.peers.iter().map(|p| p.agent.clone()).collect(),
                sealer: Sealer::new(local.clone(), c.identity.clone(), handle.max_frame()),
                ack_hold: c.ack_hold,
                clock: c.clock.clone(),
            })
            .collect(),
        stats: stats.clone(),
        sent: sent.clone(),
    };
    let relays = configs
        .into_iter()
        .map(|c| RelayLink {
            opener: Opener::new(local.clone(), &c.peers),
            relay: c.relay,
            peers: c.peers.into_iter().map(|p| p.agent).collect(),
            pull: (c.pull_max_frames.max(1), c.pull_max_bytes),
            got_since_pull: 0,
        })
        .collect();
    let direct = handle.direct();
    let handle = handle.with_router(Arc::new(router));
    let (tx, rx) = mpsc::channel(1024);
    let task = LinkTask {
        direct,
        relays,
        stats: stats.clone(),
        sent,
        tx,
    };
    tokio::spawn(task.run(incoming));
    (
        Transport {
            handle,
            incoming: rx,
        },
        stats,
    )
}

/// The link's state towards one relay.
struct RelayLink {
    relay: AgentId,
    peers: Vec<AgentId>,
    opener: Opener,
    pull: (u32, u64),
    got_since_pull: u64,
}

struct LinkTask {
    direct: TransportHandle,
    relays: Vec<RelayLink>,
    stats: Arc<RelayedStats>,
    sent: Arc<Mutex<SentKeys>>,
    tx: mpsc::Sender<Incoming>,
}

impl LinkTask {
    async fn run(mut self, mut incoming: mpsc::Receiver<Incoming>) {
        while let Some(item) = incoming.recv().await {
            if self.handle(item).await.is_err() {
                break;
            }
        }
    }

    fn index(&self, peer: &AgentId) -> Option<usize> {
        self.relays.iter().position(|r| &r.relay == peer)
    }

    fn to_relay(&self, relay: &AgentId, m: RelayMessage) {
        let env = Envelope::new(self.direct.local().clone(), Message::Relay(m));
        if let Err(e) = self.direct.send(relay, &env) {
            tracing::debug!(%relay, %e, "relay message not sent");
        }
    }

    fn ask(&mut self, i: usize) {
        let r = &mut self.relays[i];
        r.got_since_pull = 0;
        let (relay, (max_frames, max_bytes)) = (r.relay.clone(), r.pull);
        self.to_relay(
            &relay,
            RelayMessage::Pull {
                max_frames,
                max_bytes,
            },
        );
    }

    /// Whether `peer` is up some way other than relay `i`: directly, or
    /// through another of its relays that is connected.
    fn up_otherwise(&self, peer: &AgentId, i: usize) -> bool {
        self.direct.is_connected(peer)
            || self.relays.iter().enumerate().any(|(j, r)| {
                j != i && r.peers.contains(peer) && self.direct.is_connected(&r.relay)
            })
    }

    async fn handle(&mut self, item: Incoming) -> Result<(), mpsc::error::SendError<Incoming>> {
        match item {
            Incoming::Frame { peer, envelope } => match self.index(&peer) {
                Some(i) => self.handle_relay_frame(i, peer, envelope).await?,
                None => self.tx.send(Incoming::Frame { peer, envelope }).await?,
            },
            Incoming::Connected(peer) => {
                let Some(i) = self.index(&peer) else {
                    return self.tx.send(Incoming::Connected(peer)).await;
                };
                self.tx.send(Incoming::Connected(peer)).await?;
                self.ask(i);
                for p in self.relays[i].peers.clone() {
                    if !self.up_otherwise(&p, i) {
                        self.tx.send(Incoming::Connected(p)).await?;
                    }
                }
            }
            Incoming::Disconnected(peer) => {
                let Some(i) = self.index(&peer) else {
                    return self.tx.send(Incoming::Disconnected(peer)).await;
                };
                self.tx.send(Incoming::Disconnected(peer)).await?;
                for p in self.relays[i].peers.clone() {
                    if !self.up_otherwise(&p, i) {
                        self.tx.send(Incoming::Disconnected(p)).await?;
                    }
                }
            }
            other => self.tx.send(other).await?,
        }
        Ok(())
    }

    /// A frame from relay `i`.
    async fn handle_relay_frame(
        &mut self,
        i: usize,
        peer: AgentId,
        envelope: Envelope,
    ) -> Result<(), mpsc::error::SendError<Incoming>> {
        match envelope.message {
            Message::Relay(RelayMessage::Sealed(s)) => {
                self.relays[i].got_since_pull += 1;
                let key = s.key();
                match self.relays[i].opener.open(&s) {
                    Ok(inner) => {
                        bump(&self.stats.opened);
                        self.tx
                            .send(Incoming::Frame {
                                peer: s.origin.clone(),
                                envelope: inner,
                            })
                            .await?;
                    }
                    Err(e) => {
                        bump(&self.stats.rejected);
                        tracing::warn!(relay = %peer, error = %e, "sealed frame rejected");
                        self.tx
                            .send(Incoming::Unauthorized {
                                peer: peer.clone(),
                                claimed: s.origin.clone(),
                            })
                            .await?;
                    }
                }
                // Handed over (or never usable): the relay may drop it.
                // Custody, not the relay, covers a crash after this.
                self.to_relay(&peer, RelayMessage::Delivered(vec![key]));
            }
            Message::Relay(RelayMessage::Receipt(r)) => {
                // Hop acceptance only: never discharges or escalates.
                self.stats
                    .accepted
                    .fetch_add(r.accepted.len() as u64, Ordering::Relaxed);
                for x in r.refused {
                    bump(&self.stats.refused);
                    let (destination, obligation_id) = lock(&self.sent).lookup(&x.key);
                    tracing::warn!(
                        relay = %peer,
                        key = %x.key,
                        code = x.code.as_str(),
                        retry_after_seconds = x.retry_after_seconds,
                        "relay refused a sealed frame; custody keeps retrying"
                    );
                    self.tx
                        .send(Incoming::RelayRefused {
                            peer: peer.clone(),
                            key: x.key,
                            destination,
                            obligation_id,
                            code: x.code,
                            retry_after_seconds: x.retry_after_seconds,
                        })
                        .await?;
                }
            }
            Message::Relay(RelayMessage::PullDone { remaining }) => {
                if remaining > 0 || self.relays[i].got_since_pull > 0 {
                    self.ask(i);
                }
            }
            message => {
                self.tx
                    .send(Incoming::Frame {
                        peer,
                        envelope: Envelope {
                            sender: envelope.sender,
                            message,
                        },
                    })
                    .await?
            }
        }
        Ok(())
    }
}
