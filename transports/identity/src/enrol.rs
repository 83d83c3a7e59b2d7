//! Peers that change while a transport runs: [`LivePins`] (the pin set
//! the handshakes check) and [`Enrolment`] (pins and peer table together),
//! for a relay that enrols and unenrols edges without a restart.

use std::sync::{Arc, RwLock};

use abhyasa_core::AgentId;

use crate::pin::{Fingerprint, PeerPin, PinError, PinSet};

/// A [`PinSet`] that can change while a transport runs (a relay enrolling
/// and unenrolling edges without a restart). Cheap to clone; clones share
/// the set. Lookups copy the answer out, so no lock is held across a
/// handshake; a handshake that checked a pin just before its removal is
/// stopped at the peer table ([`Enrolment::unenrol`] removes the peer
/// there too).
#[derive(Debug, Clone)]
pub struct LivePins {
    local: AgentId,
    set: Arc<RwLock<PinSet>>,
}

impl LivePins {
    /// Shares `set` (already checked for `local`).
    pub fn new(local: AgentId, set: PinSet) -> Self {
        Self {
            local,
            set: Arc::new(RwLock::new(set)),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, PinSet> {
        // Every mutation is a pair of map operations that cannot panic
        // half-way in a way that matters: ignore poisoning.
        self.set.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, PinSet> {
        self.set.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The agent pinned to this certificate fingerprint.
    pub fn agent(&self, fingerprint: &Fingerprint) -> Option<AgentId> {
        self.read().agent(fingerprint).cloned()
    }

    /// The fingerprint pinned for this agent.
    pub fn fingerprint(&self, agent: &AgentId) -> Option<Fingerprint> {
        self.read().fingerprint(agent).copied()
    }

    /// Whether a pin could be added (see [`PinSet::check`]).
    pub fn check(&self, pin: &PeerPin) -> Result<bool, PinError> {
        self.read().check(&self.local, pin)
    }

    /// Adds a pin (see [`PinSet::insert`]).
    pub fn insert(&self, pin: &PeerPin) -> Result<bool, PinError> {
        let local = self.local.clone();
        self.write().insert(&local, pin)
    }

    /// Removes a pin (see [`PinSet::remove`]).
    pub fn remove(&self, agent: &AgentId) -> Option<Fingerprint> {
        self.write().remove(agent)
    }

    /// Every pinned agent, sorted.
    pub fn agents(&self) -> Vec<AgentId> {
        let mut v: Vec<AgentId> = self.read().agents().cloned().collect();
        v.sort();
        v
    }
}

/// Adds and removes a running transport's accepted peers: the pin its
/// handshake checks and the entry in its peer table, together. Returned
/// by the transports' `start_enrollable` (QUIC here, WebSocket in
/// abhyasa-ws). Enrolled peers are accept-only: the transport does not
/// dial them (a relay's edges dial out to it).
#[derive(Debug, Clone)]
pub struct Enrolment {
    pins: LivePins,
    registry: abhyasa_transport::link::Registry,
}

impl Enrolment {
    /// The enrolment of a transport that checks `pins` and keeps its peer
    /// table in `registry` (for transport implementations).
    pub fn new(pins: LivePins, registry: abhyasa_transport::link::Registry) -> Self {
        Self { pins, registry }
    }

    /// Accepts `pin` from now on. The peer table first, then the pin: a
    /// handshake the new pin admits always finds its peer. `Ok(true)` when
    /// new, `Ok(false)` when already enrolled with this fingerprint.
    pub fn enrol(&self, pin: &PeerPin) -> Result<bool, PinError> {
        // Checked before the table changes, so a refused pin leaves
        // nothing behind.
        if !self.pins.check(pin)? {
            return Ok(false);
        }
        self.registry.add_peer(pin.agent.clone());
        self.pins.insert(pin)
    }

    /// Stops accepting `agent` and closes its connections (reported
    /// `Disconnected`). The pin first, so no new handshake passes while
    /// the peer table entry goes. Returns whether it was enrolled.
    pub async fn unenrol(&self, agent: &AgentId) -> bool {
        let pinned = self.pins.remove(agent).is_some();
        let listed = self.registry.remove_peer(agent).await;
        pinned || listed
    }

    /// The peers enrolled now, sorted.
    pub fn peers(&self) -> Vec<AgentId> {
        self.pins.agents()
    }
}
