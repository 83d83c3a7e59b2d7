//! An in-memory network for tests: a [`MemNetwork`] hub joins named
//! endpoints, each a full [`Transport`] with the same handle, queues, frame
//! decoder and sender check as the real ones, and injects faults per
//! direction.
//!
//! Faults come from one seeded RNG per direction and generation, and three
//! draws are made for every frame whatever the outcome, so a direction's
//! fate sequence depends only on the seed and on the order of frames in
//! that direction — not on timing, other directions or partitions. Two runs
//! with the same seed and the same sends deliver the same sequence.
//!
//! * **loss**: the frame is dropped;
//! * **duplication**: the frame is delivered twice;
//! * **reordering**: the frame is held back and delivered right after the
//!   next frame delivered in that direction (or at [`MemNetwork::settle`]);
//! * **partition**: frames are dropped silently, as on a real network: no
//!   `Disconnected` is reported. [`MemNetwork::heal`] ends it.
//!
//! An endpoint that shuts down leaves the network (its peers see
//! `Disconnected`); the same agent may [`join`](MemNetwork::join) again,
//! like a restarted node.

mod pair;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use abhyasa_core::AgentId;
use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use crate::link::Registry;
use crate::{LinkConfig, Transport};

use pair::{Control, Pair};

/// Fault probabilities of one direction, each in `[0, 1]` (values outside
/// behave as clamped). Default: no faults.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Faults {
    /// Probability a frame is dropped.
    pub loss: f64,
    /// Probability a (not lost) frame is delivered twice.
    pub duplicate: f64,
    /// Probability a (not lost) frame is held back behind the next one.
    pub reorder: f64,
}

/// Counters of one direction since the network was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Frames offered to the link.
    pub sent: u64,
    /// Frame copies handed to the receiving endpoint.
    pub delivered: u64,
    /// Frames dropped by loss.
    pub lost: u64,
    /// Frames dropped by a partition.
    pub partitioned: u64,
    /// Frames duplicated.
    pub duplicated: u64,
    /// Frames held back and delivered out of order.
    pub reordered: u64,
}

/// Misuse of the in-memory network.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MemError {
    /// An endpoint with this agent id is already on the network.
    #[error("agent {0} has already joined the network")]
    AlreadyJoined(AgentId),
    /// The two endpoints are not linked (one has not joined or has left).
    #[error("no link from {from} to {to}")]
    NoLink {
        /// Sending side.
        from: AgentId,
        /// Receiving side.
        to: AgentId,
    },
}

#[derive(Debug, Default)]
pub(crate) struct Direction {
    pub(crate) faults: Faults,
    pub(crate) partitioned: bool,
    pub(crate) stats: LinkStats,
}

type DirKey = (AgentId, AgentId);

#[derive(Debug)]
struct Net {
    seed: u64,
    endpoints: BTreeMap<AgentId, Registry>,
    directions: HashMap<DirKey, Arc<Mutex<Direction>>>,
    /// Control channels of live pairs, keyed by (smaller, larger) agent id.
    pairs: HashMap<DirKey, mpsc::UnboundedSender<Control>>,
    generation: u64,
}

/// A hub of in-memory endpoints with injectable per-direction faults.
/// Cheap to clone; clones share the network.
#[derive(Debug, Clone)]
pub struct MemNetwork {
    net: Arc<Mutex<Net>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the state consistent; ignore poisoning.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn pair_key(a: &AgentId, b: &AgentId) -> DirKey {
    if a <= b {
        (a.clone(), b.clone())
    } else {
        (b.clone(), a.clone())
    }
}

impl MemNetwork {
    /// An empty network whose faults are drawn from `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            net: Arc::new(Mutex::new(Net {
                seed,
                endpoints: BTreeMap::new(),
                directions: HashMap::new(),
                pairs: HashMap::new(),
                generation: 0,
            })),
        }
    }

    fn direction(net: &mut Net, from: &AgentId, to: &AgentId) -> Arc<Mutex<Direction>> {
        net.directions
            .entry((from.clone(), to.clone()))
            .or_default()
            .clone()
    }

    /// Adds an endpoint for `agent`, linked to every endpoint already on the
    /// network (both sides see `Connected`). Must be called within a tokio
    /// runtime.
    pub async fn join(&self, agent: AgentId, config: LinkConfig) -> Result<Transport, MemError> {
        let (registry, transport) = Registry::new(agent.clone(), config);
        let mut pairs = Vec::new();
        {
            let mut net = lock(&self.net);
            net.endpoints.retain(|_, r| !r.is_shutting_down());
            if net.endpoints.contains_key(&agent) {
                return Err(MemError::AlreadyJoined(agent));
            }
            for (other, other_reg) in &net.endpoints {
                registry.add_peer(other.clone());
                other_reg.add_peer(agent.clone());
                pairs.push((other.clone(), other_reg.clone()));
            }
            net.endpoints.insert(agent.clone(), registry.clone());
        }
        for (other, other_reg) in pairs {
            self.link(&registry, &other_reg, &agent, &other).await;
        }
        Ok(transport)
    }

    async fn link(&self, a_reg: &Registry, b_reg: &Registry, a: &AgentId, b: &AgentId) {
        let (Ok(a_link), Ok(b_link)) = (a_reg.attach(b).await, b_reg.attach(a).await) else {
            // One side is already shutting down: it is leaving, not joining.
            return;
        };
        let (ctl_tx, ctl_rx) = mpsc::unbounded_channel();
        let pair = {
            let mut net = lock(&self.net);
            net.generation += 1;
            let (seed, generation) = (net.seed, net.generation);
            let ab = Self::direction(&mut net, a, b);
            let ba = Self::direction(&mut net, b, a);
            net.pairs.insert(pair_key(a, b), ctl_tx);
            Pair::new(
                seed,
                generation,
                (a_link, a_reg.shutdown_token(), ab),
                (b_link, b_reg.shutdown_token(), ba),
                ctl_rx,
            )
        };
        // Both transports' shutdowns wait for the pair task.
        a_reg.spawn(b_reg.track(pair.run()));
    }

    /// Sets the faults of the direction `from` → `to` (before or after the
    /// endpoints join).
    pub fn set_faults(&self, from: &AgentId, to: &AgentId, faults: Faults) {
        let mut net = lock(&self.net);
        lock(&Self::direction(&mut net, from, to)).faults = faults;
    }

    /// Sets the same faults in both directions between `a` and `b`.
    pub fn set_faults_between(&self, a: &AgentId, b: &AgentId, faults: Faults) {
        self.set_faults(a, b, faults);
        self.set_faults(b, a, faults);
    }

    /// Drops every frame between `a` and `b`, both directions, until
    /// [`heal`](Self::heal).
    pub fn partition(&self, a: &AgentId, b: &AgentId) {
        self.set_partitioned(a, b, true);
        self.set_partitioned(b, a, true);
    }

    /// Ends a partition between `a` and `b`.
    pub fn heal(&self, a: &AgentId, b: &AgentId) {
        self.set_partitioned(a, b, false);
        self.set_partitioned(b, a, false);
    }

    /// Partitions (or heals) one direction only.
    pub fn set_partitioned(&self, from: &AgentId, to: &AgentId, on: bool) {
        let mut net = lock(&self.net);
        lock(&Self::direction(&mut net, from, to)).partitioned = on;
    }

    /// Counters of the direction `from` → `to`.
    pub fn stats(&self, from: &AgentId, to: &AgentId) -> LinkStats {
        let net = lock(&self.net);
        net.directions
            .get(&(from.clone(), to.clone()))
            .map(|d| lock(d).stats)
            .unwrap_or_default()
    }

    /// Queues raw bytes on the link `from` → `to` as if `from` had sent
    /// them as one frame (faults apply). For testing decoders and the
    /// sender check with bytes a correct endpoint would never send.
    pub fn inject(
        &self,
        from: &AgentId,
        to: &AgentId,
        bytes: impl Into<Bytes>,
    ) -> Result<(), MemError> {
        let registry = lock(&self.net).endpoints.get(from).cloned();
        let no_link = || MemError::NoLink {
            from: from.clone(),
            to: to.clone(),
        };
        // Through the sender's own queue, so it keeps its place among the
        // frames the endpoint sends.
        registry
            .ok_or_else(no_link)?
            .queue_raw(to, bytes.into())
            .map_err(|_| no_link())
    }

    /// Waits until every frame sent (or injected) before this call has been
    /// processed by its link and handed to the receiving endpoint, and
    /// releases frames held back for reordering. A barrier for tests; does
    /// not wait on endpoints that are shutting down.
    pub async fn settle(&self) {
        let ctls: Vec<_> = lock(&self.net).pairs.values().cloned().collect();
        let mut waits = Vec::new();
        for ctl in ctls {
            let (tx, rx) = oneshot::channel();
            if ctl.send(Control::Settle(tx)).is_ok() {
                waits.push(rx);
            }
        }
        for rx in waits {
            // A pair that ended has nothing left to settle.
            let _ = rx.await;
        }
    }
}

#[cfg(test)]
mod tests;
