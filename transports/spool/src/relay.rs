//! The relay daemon: QUIC and/or WebSocket endpoints with pinned peers
//! (custodians and edges) in front of a [`Spool`].
//!
//! It never takes custody and never acks: it answers sealed frames with a
//! [`RelayReceipt`] (hop acceptance, sent only after the frames are
//! durable), pushes spooled frames to a destination within the pull budget
//! the destination asked for, and drops a frame only on `Delivered`, on a
//! sealed ack from the destination passing back, or at its hold time. The
//! edge dials out; the relay only listens (an edge needs no public
//! address).
//!
//! **Several transports, one daemon.** A relay listening on QUIC and
//! WebSocket runs one daemon over both: their incoming channels are merged
//! and a frame for a peer goes out on whichever transport that peer is
//! connected over now. (Not `abhyasa_transport::routed::compose`: it
//! routes a peer by which part *pins* it and refuses a peer pinned on two
//! parts, while every relay peer is pinned on every listener and may dial
//! in over either. Not one daemon per transport: the spool, its quotas and
//! the pull budgets are one per relay, and a frame spooled from a QUIC
//! custodian must be pushed to a WebSocket edge.)
//!
//! **Enrolment without a restart.** [`RelayHandle::enrol`] pins a new peer
//! on every listener at once; [`RelayHandle::unenrol`] unpins it, closes
//! its connections and refuses frames for it from then on
//! (`unknown_destination`), while frames already spooled for it stay until
//! their hold time.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use abhyasa_core::wire::{
    DedupKey, Envelope, FrameKey, Message, RelayMessage, RelayReceipt, Sealed,
};
use abhyasa_core::{AgentId, Timestamp};
use abhyasa_identity::{Enrolment, PeerPin};
#[cfg(feature = "quic")]
use abhyasa_quic::QuicConfig;
use abhyasa_transport::{Incoming, SendError, Transport, TransportHandle};
use abhyasa_ws::WsConfig;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::spool::{Spool, SpoolError, SpoolLimits, SpoolStatus};

/// Everything [`start`] needs. At least one of `quic` and `ws`; with both,
/// give them the same identity and peers (a peer may dial in over either).
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// The relay's QUIC endpoint (feature `quic`): its identity, listen
    /// address and pinned peers (every peer may spool and be a
    /// destination).
    #[cfg(feature = "quic")]
    pub quic: Option<QuicConfig>,
    /// The relay's WebSocket listener (`listen` must be set), the same way.
    pub ws: Option<WsConfig>,
    /// The spool file (redb).
    pub spool_path: PathBuf,
    /// Quotas and hold time.
    pub limits: SpoolLimits,
    /// Where to write a JSON [`SpoolStatus`] after changes (for
    /// `abhyasa relay status`), if anywhere.
    pub status_path: Option<PathBuf>,
}

/// The relay could not start, or could not enrol a peer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// The spool did not open.
    #[error(transparent)]
    Spool(#[from] SpoolError),
    /// A listener did not start.
    #[error("cannot start the relay's {kind} endpoint: {reason}")]
    Transport {
        /// "QUIC" or "WebSocket".
        kind: &'static str,
        /// Why.
        reason: String,
    },
    /// Neither `quic` nor `ws` is configured, or `ws` has no `listen`.
    #[error("the relay needs a QUIC endpoint or a WebSocket listen address")]
    NoListener,
    /// The pin was refused (it names the relay itself, or its agent or
    /// fingerprint is already pinned to another).
    #[error("cannot enrol {agent}: {reason}")]
    Enrol {
        /// The peer.
        agent: AgentId,
        /// Why.
        reason: String,
    },
    /// The relay runs over transports it did not start ([`start_with`]),
    /// whose pins it cannot change.
    #[error("this relay's transports were started by its caller; it cannot enrol peers")]
    NotEnrollable,
}

/// A running relay.
#[derive(Debug)]
pub struct RelayHandle {
    parts: Parts,
    enrolments: Vec<Enrolment>,
    serves: Serves,
    quic_addr: Option<SocketAddr>,
    ws_addr: Option<SocketAddr>,
    status: Arc<Mutex<SpoolStatus>>,
    task: JoinHandle<()>,
}

/// The peers the relay spools for and pushes to, shared with the daemon
/// so enrolment changes them while it runs.
type Serves = Arc<Mutex<HashSet<AgentId>>>;

fn serves_lock(s: &Serves) -> std::sync::MutexGuard<'_, HashSet<AgentId>> {
    // Single inserts and removes: poisoning leaves the set consistent.
    s.lock().unwrap_or_else(|e| e.into_inner())
}

impl RelayHandle {
    /// The address the relay listens on: QUIC's when it has a QUIC
    /// endpoint, else the WebSocket one.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.quic_addr.or(self.ws_addr)
    }

    /// The QUIC endpoint's address, if the relay has one.
    pub fn quic_addr(&self) -> Option<SocketAddr> {
        self.quic_addr
    }

    /// The WebSocket listener's address, if the relay has one.
    pub fn ws_addr(&self) -> Option<SocketAddr> {
        self.ws_addr
    }

    /// The spool's counts as of the relay's last change.
    pub fn status(&self) -> SpoolStatus {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The peers the relay serves now, sorted.
    pub fn peers(&self) -> Vec<AgentId> {
        let mut v: Vec<AgentId> = serves_lock(&self.serves).iter().cloned().collect();
        v.sort();
        v
    }

    /// Whether `peer` is connected to the relay over any listener.
    pub fn is_connected(&self, peer: &AgentId) -> bool {
        self.parts.is_connected(peer)
    }

    /// Pins `pin` on every listener while the relay runs: the peer may
    /// connect, spool and receive from now on. `Ok(false)` when it was
    /// already enrolled with this fingerprint. A refused pin changes
    /// nothing.
    pub async fn enrol(&self, pin: &PeerPin) -> Result<bool, RelayError> {
        if self.enrolments.is_empty() {
            return Err(RelayError::NotEnrollable);
        }
        let mut added = Vec::new();
        for e in &self.enrolments {
            match e.enrol(pin) {
                Ok(true) => added.push(e),
                Ok(false) => {}
                Err(err) => {
                    // Every listener pins the same peers, so a refusal
                    // comes from the first; undo what others added all the
                    // same.
                    for done in added {
                        done.unenrol(&pin.agent).await;
                    }
                    return Err(RelayError::Enrol {
                        agent: pin.agent.clone(),
                        reason: err.to_string(),
                    });
                }
            }
        }
        let added = !added.is_empty();
        // Pinned before it is served: a frame for it is refused
        // `unknown_destination` until it could also connect.
        serves_lock(&self.serves).insert(pin.agent.clone());
        if added {
            tracing::info!(peer = %pin.agent, fingerprint = %pin.fingerprint, "enrolled");
        }
        Ok(added)
    }

    /// Unpins `agent` on every listener and closes its connections. Frames
    /// for it are refused `unknown_destination` from now on; those already
    /// spooled stay until their hold time (a re-enrolled peer still gets
    /// them). Returns whether it was enrolled.
    pub async fn unenrol(&self, agent: &AgentId) -> Result<bool, RelayError> {
        if self.enrolments.is_empty() {
            return Err(RelayError::NotEnrollable);
        }
        // Not served first: nothing new is spooled for it while its
        // connections close.
        let served = serves_lock(&self.serves).remove(agent);
        let mut pinned = false;
        for e in &self.enrolments {
            pinned |= e.unenrol(agent).await;
        }
        if served || pinned {
            tracing::info!(peer = %agent, "unenrolled");
        }
        Ok(served || pinned)
    }

    /// Stops the relay: closes its connections and its spool. Everything
    /// receipted stays in the spool file.
    pub async fn shutdown(self) {
        for h in &self.parts.0 {
            h.shutdown().await;
        }
        self.task.abort();
        let _ = self.task.await;
    }
}

/// Where the relay (and a relayed link) reads `now`: the wall clock for the
/// daemon ([`system_clock`]), simulated time in the simulator. Expiry and
/// hold times are measured on it, so it must be the clock the origins
/// stamp deadlines with.
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// The system wall clock.
pub fn system_clock() -> Clock {
    Arc::new(|| {
        let micros = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        Timestamp::from_unix_micros(micros)
    })
}

/// A relay over a transport the caller started: what [`start_with`] needs.
/// The simulator uses it to run the daemon over turmoil UDP with
/// simulated time; [`start`] builds one from a [`RelayConfig`].
pub struct RelayParts {
    /// The relay's transport, already started, with every peer it serves
    /// pinned (custodians and edges; it dials none of them).
    pub transport: Transport,
    /// The peers it spools for and pushes to.
    pub serves: HashSet<AgentId>,
    /// The spool file (redb).
    pub spool_path: PathBuf,
    /// Quotas and hold time.
    pub limits: SpoolLimits,
    /// Where to write a JSON [`SpoolStatus`] after changes, if anywhere.
    pub status_path: Option<PathBuf>,
    /// Where `now` comes from.
    pub clock: Clock,
}

impl std::fmt::Debug for RelayParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayParts")
            .field("serves", &self.serves)
            .field("spool_path", &self.spool_path)
            .finish_non_exhaustive()
    }
}

/// Opens the spool, starts the QUIC endpoint and/or the WebSocket listener
/// and runs the relay until [`RelayHandle::shutdown`].
pub async fn start(config: RelayConfig) -> Result<RelayHandle, RelayError> {
    #[cfg(feature = "quic")]
    let has_quic = config.quic.is_some();
    #[cfg(not(feature = "quic"))]
    let has_quic = false;
    if !has_quic && config.ws.as_ref().is_none_or(|w| w.listen.is_none()) {
        return Err(RelayError::NoListener);
    }
    let mut serves: HashSet<AgentId> = HashSet::new();
    #[cfg(feature = "quic")]
    if let Some(q) = &config.quic {
        serves.extend(q.peers.iter().map(|p| p.pin.agent.clone()));
    }
    if let Some(w) = &config.ws {
        serves.extend(w.peers.iter().map(|p| p.pin.agent.clone()));
    }
    // The spool opens first: a relay whose spool cannot open never listens.
    let spool = Spool::open(&config.spool_path, config.limits.clone())?;
    let mut transports: Vec<Transport> = Vec::new();
    let mut enrolments: Vec<Enrolment> = Vec::new();
    #[cfg_attr(not(feature = "quic"), allow(unused_mut))]
    let (mut quic_addr, mut ws_addr) = (None, None);
    #[cfg(feature = "quic")]
    if let Some(q) = config.quic {
        let (t, e) =
            abhyasa_quic::start_enrollable(q)
                .await
                .map_err(|e| RelayError::Transport {
                    kind: "QUIC",
                    reason: e.to_string(),
                })?;
        quic_addr = t.handle.local_addr();
        transports.push(t);
        enrolments.push(e);
    }
    if let Some(w) = config.ws {
        let started = abhyasa_ws::start_enrollable(w).await;
        let (t, e) = match started {
            Ok(x) => x,
            Err(e) => {
                for t in &transports {
                    t.handle.shutdown().await;
                }
                return Err(RelayError::Transport {
                    kind: "WebSocket",
                    reason: e.to_string(),
                });
            }
        };
        ws_addr = t.handle.local_addr();
        transports.push(t);
        enrolments.push(e);
    }
    let mut relay = run_daemon(
        spool,
        transports,
        serves,
        config.status_path,
        system_clock(),
    );
    relay.enrolments = enrolments;
    relay.quic_addr = quic_addr;
    relay.ws_addr = ws_addr;
    Ok(relay)
}

/// Runs the relay over `parts.transport` (see [`RelayParts`]) until
/// [`RelayHandle::shutdown`]. Behaves as [`start`] does, on the supplied
/// transport and clock, except that it cannot enrol peers
/// ([`RelayError::NotEnrollable`]).
pub async fn start_with(parts: RelayParts) -> Result<RelayHandle, RelayError> {
    let spool = Spool::open(&parts.spool_path, parts.limits)?;
    let addr = parts.transport.handle.local_addr();
    let mut relay = run_daemon(
        spool,
        vec![parts.transport],
        parts.serves,
        parts.status_path,
        parts.clock,
    );
    relay.quic_addr = addr;
    Ok(relay)
}

fn run_daemon(
    spool: Spool,
    transports: Vec<Transport>,
    serves: HashSet<AgentId>,
    status_path: Option<PathBuf>,
    clock: Clock,
) -> RelayHandle {
    let status = Arc::new(Mutex::new(spool.status(clock())));
    let serves: Serves = Arc::new(Mutex::new(serves));
    let (handles, incoming) = merge(transports);
    let parts = Parts(handles);
    let mut daemon = Daemon {
        parts: parts.clone(),
        spool,
        serves: serves.clone(),
        budgets: HashMap::new(),
        pushed: HashMap::new(),
        status: status.clone(),
        status_path,
        published: tokio::time::Instant::now(),
        clock,
    };
    daemon.publish();
    let task = tokio::spawn(async move { daemon.run(incoming).await });
    RelayHandle {
        parts,
        enrolments: Vec::new(),
        serves,
        quic_addr: None,
        ws_addr: None,
        status,
        task,
    }
}

/// One incoming channel for several transports: the single transport's
/// own, or a forwarder per transport into a merged one (order kept within
/// each transport, which is all the daemon needs: a peer's frames arrive
/// over one connection at a time).
fn merge(mut transports: Vec<Transport>) -> (Vec<TransportHandle>, mpsc::Receiver<Incoming>) {
    if transports.len() == 1 {
        if let Some(Transport { handle, incoming }) = transports.pop() {
            return (vec![handle], incoming);
        }
    }
    let mut handles = Vec::with_capacity(transports.len());
    let (tx, rx) = mpsc::channel(1024);
    for Transport {
        handle,
        mut incoming,
    } in transports
    {
        handles.push(handle);
        let tx = tx.clone();
        // Ends with its transport (the channel closes at shutdown) or the
        // daemon (the merged receiver is dropped).
        tokio::spawn(async move {
            while let Some(item) = incoming.recv().await {
                if tx.send(item).await.is_err() {
                    break;
                }
            }
        });
    }
    (handles, rx)
}

/// The relay's transports, one per listener, with the same identity and
/// peers.
#[derive(Debug, Clone)]
struct Parts(Vec<TransportHandle>);

impl Parts {
    fn local(&self) -> Option<&AgentId> {
        self.0.first().map(TransportHandle::local)
    }

    fn is_connected(&self, peer: &AgentId) -> bool {
        self.0.iter().any(|h| h.is_connected(peer))
    }

    /// Sends over the transport `peer` is connected on now (the first, if
    /// several).
    fn send(&self, peer: &AgentId, env: &Envelope) -> Result<(), SendError> {
        match self.0.iter().find(|h| h.is_connected(peer)) {
            Some(h) => h.send(peer, env),
            None => Err(SendError::NotConnected(peer.clone())),
        }
    }

    fn envelope(&self, m: RelayMessage) -> Option<Envelope> {
        self.local()
            .map(|l| Envelope::new(l.clone(), Message::Relay(m)))
    }
}

/// What a destination asked for and has not yet been pushed.
#[derive(Debug, Clone, Copy)]
struct Budget {
    frames: u32,
    bytes: u64,
}

struct Daemon {
    parts: Parts,
    spool: Spool,
    serves: Serves,
    budgets: HashMap<AgentId, Budget>,
    /// Frames pushed on the destination's current connection: not pushed
    /// again until it reconnects (they stay spooled until Delivered).
    pushed: HashMap<AgentId, HashSet<FrameKey>>,
    status: Arc<Mutex<SpoolStatus>>,
    status_path: Option<PathBuf>,
    published: tokio::time::Instant,
    clock: Clock,
}

/// Most incoming items folded into one spool commit.
const BATCH: usize = 256;
/// How often the status is refreshed when nothing changes.
const PUBLISH_EVERY: Duration = Duration::from_secs(5);

impl Daemon {
    async fn run(&mut self, mut incoming: mpsc::Receiver<Incoming>) {
        loop {
            let wait = self
                .spool
                .next_expiry()
                .map_or(Duration::from_secs(1), |t| {
                    t.saturating_duration_since((self.clock)())
                        .min(Duration::from_secs(1))
                });
            tokio::select! {
                item = incoming.recv() => {
                    let Some(first) = item else { break };
                    // Group commit: every sealed frame already waiting goes
                    // into one spool transaction per hop.
                    let mut batch = vec![first];
                    while batch.len() < BATCH {
                        match incoming.try_recv() {
                            Ok(i) => batch.push(i),
                            Err(_) => break,
                        }
                    }
                    self.handle_batch(batch);
                }
                () = tokio::time::sleep(wait) => {}
            }
            match self.spool.expire((self.clock)()) {
                Ok(gone) if !gone.is_empty() => {
                    self.forget_pushed(&gone);
                    self.publish();
                }
                Ok(_) => {}
                Err(e) => tracing::error!(%e, "spool expiry failed"),
            }
            // Ages move on without changes: refresh the status now and then.
            if self.published.elapsed() >= PUBLISH_EVERY {
                self.publish();
            }
        }
    }

    fn handle_batch(&mut self, batch: Vec<Incoming>) {
        let mut sealed: Vec<(AgentId, Vec<Sealed>)> = Vec::new();
        let mut others = Vec::new();
        for item in batch {
            match item {
                Incoming::Frame {
                    peer,
                    envelope:
                        Envelope {
                            message: Message::Relay(RelayMessage::Sealed(s)),
                            ..
                        },
                } => match sealed.iter_mut().find(|(p, _)| *p == peer) {
                    Some((_, v)) => v.push(*s),
                    None => sealed.push((peer, vec![*s])),
                },
                other => others.push(other),
            }
        }
        let now = (self.clock)();
        let mut changed = false;
        for (hop, frames) in sealed {
            self.drop_answered(&hop, &frames);
            let serves = serves_lock(&self.serves);
            let offered = self.spool.offer(now, &hop, frames, |d| serves.contains(d));
            drop(serves);
            match offered {
                Ok(receipt) => {
                    changed = true;
                    self.answer(&hop, receipt);
                }
                // No receipt: nothing was accepted and the origin's custody
                // retries (write-ahead: never a receipt before the commit).
                Err(e) => tracing::error!(%hop, %e, "spool write failed; no receipt sent"),
            }
        }
        for item in others {
            changed |= self.handle_other(item);
        }
        // Push what arrived to destinations that asked for it.
        let waiting: Vec<AgentId> = self.budgets.keys().cloned().collect();
        for d in waiting {
            self.push(&d, false);
        }
        if changed {
            self.publish();
        }
    }

    /// A sealed ack from a destination passing back proves it received the
    /// obligations it names: their spooled copies towards it are dropped.
    fn drop_answered(&mut self, hop: &AgentId, frames: &[Sealed]) {
        let mut keys = Vec::new();
        for s in frames.iter().filter(|s| &s.origin == hop) {
            let Ok(inner) = Envelope::decode(&s.inner) else {
                continue;
            };
            let acks = match &inner.message {
                Message::Acks(a) => a.as_slice(),
                Message::StatusReply(r) => r.known.as_slice(),
                _ => continue,
            };
            for a in acks {
                if let Some(d) = &a.digest {
                    let dedup = DedupKey::for_obligation(&a.obligation_id, d);
                    keys.push(FrameKey::of(&s.destination, hop, &dedup));
                }
            }
        }
        if !keys.is_empty() {
            if let Err(e) = self.spool.remove(&keys) {
                tracing::error!(%e, "spool removal failed");
            }
            self.forget_pushed(&keys);
        }
    }

    /// A frame that left the spool is no longer "pushed": a later copy
    /// under the same key (a custodian's retry) is a new frame to push.
    fn forget_pushed(&mut self, keys: &[FrameKey]) {
        for set in self.pushed.values_mut() {
            for k in keys {
                set.remove(k);
            }
        }
    }

    fn answer(&self, hop: &AgentId, receipt: RelayReceipt) {
        for r in &receipt.refused {
            tracing::warn!(%hop, key = %r.key, code = r.code.as_str(), "sealed frame refused");
        }
        let Some(env) = self.parts.envelope(RelayMessage::Receipt(receipt)) else {
            return;
        };
        if let Err(e) = self.parts.send(hop, &env) {
            // The origin retries under custody and gets a new receipt.
            tracing::debug!(%hop, %e, "receipt not sent");
        }
    }

    fn handle_other(&mut self, item: Incoming) -> bool {
        match item {
            Incoming::Frame { peer, envelope } => match envelope.message {
                Message::Relay(RelayMessage::Pull {
                    max_frames,
                    max_bytes,
                }) => {
                    self.budgets.insert(
                        peer.clone(),
                        Budget {
                            frames: max_frames,
                            bytes: max_bytes,
                        },
                    );
                    self.push(&peer, true);
                    false
                }
                Message::Relay(RelayMessage::Delivered(keys)) => {
                    // Only frames addressed to the peer that says it got them.
                    let own: Vec<FrameKey> = keys
                        .into_iter()
                        .filter(|k| self.spool.destination_of(k) == Some(&peer))
                        .collect();
                    let removed = self.spool.remove(&own);
                    self.forget_pushed(&own);
                    match removed {
                        Ok(n) => n > 0,
                        Err(e) => {
                            tracing::error!(%e, "spool removal failed");
                            false
                        }
                    }
                }
                other => {
                    tracing::debug!(%peer, ?other, "not a relay message; ignored");
                    false
                }
            },
            Incoming::Disconnected(peer) => {
                // Frames pushed on the connection that ended may not have
                // arrived: push them again (the destination dedups, AB-3).
                self.pushed.remove(&peer);
                // Its budget holds while it is still up over another
                // listener.
                if !self.parts.is_connected(&peer) {
                    self.budgets.remove(&peer);
                }
                false
            }
            other => {
                tracing::debug!(?other, "relay transport");
                false
            }
        }
    }

    /// Pushes spooled frames to `dest` in order within its budget; after a
    /// `Pull` (`answer_pull`) ends with `PullDone`.
    fn push(&mut self, dest: &AgentId, answer_pull: bool) {
        let Some(budget) = self.budgets.get(dest).copied() else {
            return;
        };
        if !self.parts.is_connected(dest) {
            return;
        }
        let skip = self.pushed.entry(dest.clone()).or_default();
        let (frames, remaining) = match self.spool.pending_for(
            (self.clock)(),
            dest,
            budget.frames as usize,
            budget.bytes,
            skip,
        ) {
            Ok(x) => x,
            Err(e) => {
                tracing::error!(%e, "spool read failed");
                return;
            }
        };
        if frames.is_empty() && !answer_pull {
            return;
        }
        let mut left = budget;
        let mut stopped = false;
        for s in frames {
            let key = s.key();
            let Some(env) = self.parts.envelope(RelayMessage::Sealed(Box::new(s))) else {
                break;
            };
            let size = env.encode().len() as u64;
            if let Err(e) = self.parts.send(dest, &env) {
                tracing::debug!(%dest, %e, "push stopped");
                stopped = true;
                break;
            }
            skip.insert(key);
            left.frames = left.frames.saturating_sub(1);
            left.bytes = left.bytes.saturating_sub(size);
        }
        if left.frames == 0 || left.bytes == 0 || stopped {
            self.budgets.remove(dest);
        } else {
            self.budgets.insert(dest.clone(), left);
        }
        if answer_pull || left.frames == 0 || left.bytes == 0 {
            if let Some(env) = self.parts.envelope(RelayMessage::PullDone { remaining }) {
                let _ = self.parts.send(dest, &env);
            }
        }
    }

    fn publish(&mut self) {
        self.published = tokio::time::Instant::now();
        let st = self.spool.status((self.clock)());
        if let Some(path) = &self.status_path {
            if let Ok(json) = serde_json::to_vec_pretty(&st) {
                let tmp = path.with_extension("tmp");
                if std::fs::write(&tmp, json).is_ok() {
                    let _ = std::fs::rename(&tmp, path);
                }
            }
        }
        *self.status.lock().unwrap_or_else(|e| e.into_inner()) = st;
    }
}
