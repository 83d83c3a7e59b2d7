//! The relay daemon: a QUIC endpoint with pinned peers (custodians and
//! edges) in front of a [`Spool`].
//!
//! It never takes custody and never acks: it answers sealed frames with a
//! [`RelayReceipt`] (hop acceptance, sent only after the frames are
//! durable), pushes spooled frames to a destination within the pull budget
//! the destination asked for, and drops a frame only on `Delivered`, on a
//! sealed ack from the destination passing back, or at its hold time. The
//! edge dials out; the relay only listens (an edge needs no public
//! address).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use abhyasa_core::wire::{
    DedupKey, Envelope, FrameKey, Message, RelayMessage, RelayReceipt, Sealed,
};
use abhyasa_core::{AgentId, Timestamp};
use abhyasa_quic::QuicConfig;
use abhyasa_transport::{Incoming, Transport, TransportHandle};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::spool::{Spool, SpoolError, SpoolLimits, SpoolStatus};

/// Everything [`start`] needs.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// The relay's QUIC endpoint: its identity, listen address and pinned
    /// peers (every peer may spool and be a destination).
    pub quic: QuicConfig,
    /// The spool file (redb).
    pub spool_path: PathBuf,
    /// Quotas and hold time.
    pub limits: SpoolLimits,
    /// Where to write a JSON [`SpoolStatus`] after changes (for
    /// `abhyasa relay status`), if anywhere.
    pub status_path: Option<PathBuf>,
}

/// The relay could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// The spool did not open.
    #[error(transparent)]
    Spool(#[from] SpoolError),
    /// The QUIC endpoint did not start.
    #[error("cannot start the relay's QUIC endpoint: {0}")]
    Transport(String),
}

/// A running relay.
#[derive(Debug)]
pub struct RelayHandle {
    transport: TransportHandle,
    status: Arc<Mutex<SpoolStatus>>,
    task: JoinHandle<()>,
}

impl RelayHandle {
    /// The QUIC address the relay listens on.
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.transport.local_addr()
    }

    /// The spool's counts as of the relay's last change.
    pub fn status(&self) -> SpoolStatus {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Stops the relay: closes its connections and its spool. Everything
    /// receipted stays in the spool file.
    pub async fn shutdown(self) {
        self.transport.shutdown().await;
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

/// Opens the spool, starts the QUIC endpoint and runs the relay until
/// [`RelayHandle::shutdown`].
pub async fn start(config: RelayConfig) -> Result<RelayHandle, RelayError> {
    let serves: HashSet<AgentId> = config
        .quic
        .peers
        .iter()
        .map(|p| p.pin.agent.clone())
        .collect();
    // The spool opens first: a relay whose spool cannot open never listens.
    let spool = Spool::open(&config.spool_path, config.limits.clone())?;
    let transport = abhyasa_quic::start(config.quic)
        .await
        .map_err(|e| RelayError::Transport(e.to_string()))?;
    Ok(run_daemon(
        spool,
        transport,
        serves,
        config.status_path,
        system_clock(),
    ))
}

/// Runs the relay over `parts.transport` (see [`RelayParts`]) until
/// [`RelayHandle::shutdown`]. Behaves as [`start`] does, on the supplied
/// transport and clock.
pub async fn start_with(parts: RelayParts) -> Result<RelayHandle, RelayError> {
    let spool = Spool::open(&parts.spool_path, parts.limits)?;
    Ok(run_daemon(
        spool,
        parts.transport,
        parts.serves,
        parts.status_path,
        parts.clock,
    ))
}

fn run_daemon(
    spool: Spool,
    transport: Transport,
    serves: HashSet<AgentId>,
    status_path: Option<PathBuf>,
    clock: Clock,
) -> RelayHandle {
    let status = Arc::new(Mutex::new(spool.status(clock())));
    let mut daemon = Daemon {
        handle: transport.handle.clone(),
        spool,
        serves,
        budgets: HashMap::new(),
        pushed: HashMap::new(),
        status: status.clone(),
        status_path,
        published: tokio::time::Instant::now(),
        clock,
    };
    daemon.publish();
    let task = tokio::spawn(async move { daemon.run(transport.incoming).await });
    RelayHandle {
        transport: transport.handle,
        status,
        task,
    }
}

/// What a destination asked for and has not yet been pushed.
#[derive(Debug, Clone, Copy)]
struct Budget {
    frames: u32,
    bytes: u64,
}

struct Daemon {
    handle: TransportHandle,
    spool: Spool,
    serves: HashSet<AgentId>,
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
            let serves = &self.serves;
            match self.spool.offer(now, &hop, frames, |d| serves.contains(d)) {
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
        let env = Envelope::new(
            self.handle.local().clone(),
            Message::Relay(RelayMessage::Receipt(receipt)),
        );
        if let Err(e) = self.handle.send(hop, &env) {
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
                self.budgets.remove(&peer);
                self.pushed.remove(&peer);
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
        if !self.handle.is_connected(dest) {
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
            let env = Envelope::new(
                self.handle.local().clone(),
                Message::Relay(RelayMessage::Sealed(Box::new(s))),
            );
            let size = env.encode().len() as u64;
            if let Err(e) = self.handle.send(dest, &env) {
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
            let env = Envelope::new(
                self.handle.local().clone(),
                Message::Relay(RelayMessage::PullDone { remaining }),
            );
            let _ = self.handle.send(dest, &env);
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
