//! Pins: which agent id each peer certificate fingerprint stands for.
//!
//! A [`PeerPin`] binds an agent id to a [`Fingerprint`]; a [`PinSet`] holds
//! a node's pinned peers, checked so that one key is never bound to two
//! agents, nor one agent to two keys, nor the node to itself.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use abhyasa_core::AgentId;
use sha2::{Digest as _, Sha256};

/// SHA-256 over a certificate's DER encoding: what peers pin.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// The fingerprint of a DER certificate.
    pub fn of(cert_der: &[u8]) -> Self {
        Self(Sha256::digest(cert_der).into())
    }

    /// Lowercase hex, 64 digits.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.to_hex())
    }
}

/// A string that is not a SHA-256 fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a SHA-256 fingerprint (64 hex digits, optionally `sha256:`-prefixed and colon-separated): {0:?}")]
pub struct FingerprintParseError(pub String);

impl FromStr for Fingerprint {
    type Err = FingerprintParseError;

    /// Accepts 64 hex digits, optionally prefixed `sha256:` and separated
    /// by colons (as `openssl x509 -fingerprint -sha256` prints).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || FingerprintParseError(s.to_string());
        let body = s.strip_prefix("sha256:").unwrap_or(s);
        let digits: String = body.chars().filter(|c| *c != ':').collect();
        let mut out = [0u8; 32];
        hex::decode_to_slice(&digits, &mut out).map_err(|_| err())?;
        Ok(Self(out))
    }
}

impl serde::Serialize for Fingerprint {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> serde::Deserialize<'de> for Fingerprint {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A configured peer: its agent id bound to its certificate fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct PeerPin {
    /// The peer's agent id.
    pub agent: AgentId,
    /// SHA-256 fingerprint of its certificate.
    pub fingerprint: Fingerprint,
}

/// A peer configuration that cannot be right.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PinError {
    /// Two pins name the same agent.
    #[error("agent {0} is pinned twice")]
    DuplicateAgent(AgentId),
    /// Two agents share one certificate: the key could not be bound to one
    /// agent id.
    #[error("fingerprint {fingerprint} is pinned for both {first} and {second}")]
    DuplicateFingerprint {
        /// The shared fingerprint.
        fingerprint: Fingerprint,
        /// One agent.
        first: AgentId,
        /// The other.
        second: AgentId,
    },
    /// A pin names this node itself.
    #[error("agent {0} is this node; it cannot be its own peer")]
    SelfPin(AgentId),
}

/// The pinned peers, looked up both ways.
#[derive(Debug, Clone, Default)]
pub struct PinSet {
    by_fingerprint: HashMap<Fingerprint, AgentId>,
    by_agent: HashMap<AgentId, Fingerprint>,
}

impl PinSet {
    /// Checks and indexes `pins` for node `local`.
    pub fn new<'a>(
        local: &AgentId,
        pins: impl IntoIterator<Item = &'a PeerPin>,
    ) -> Result<Self, PinError> {
        let mut set = Self::default();
        for pin in pins {
            if &pin.agent == local {
                return Err(PinError::SelfPin(pin.agent.clone()));
            }
            if set.by_agent.contains_key(&pin.agent) {
                return Err(PinError::DuplicateAgent(pin.agent.clone()));
            }
            if let Some(first) = set.by_fingerprint.get(&pin.fingerprint) {
                return Err(PinError::DuplicateFingerprint {
                    fingerprint: pin.fingerprint,
                    first: first.clone(),
                    second: pin.agent.clone(),
                });
            }
            set.by_agent.insert(pin.agent.clone(), pin.fingerprint);
            set.by_fingerprint
                .insert(pin.fingerprint, pin.agent.clone());
        }
        Ok(set)
    }

    /// The agent pinned to this certificate fingerprint.
    pub fn agent(&self, fingerprint: &Fingerprint) -> Option<&AgentId> {
        self.by_fingerprint.get(fingerprint)
    }

    /// The fingerprint pinned for this agent.
    pub fn fingerprint(&self, agent: &AgentId) -> Option<&Fingerprint> {
        self.by_agent.get(agent)
    }

    /// Every pinned agent.
    pub fn agents(&self) -> impl Iterator<Item = &AgentId> {
        self.by_agent.keys()
    }

    /// Whether `pin` could be added for node `local` (the checks of
    /// [`new`](Self::new)): `Ok(true)` if new, `Ok(false)` if the agent is
    /// already pinned to this fingerprint, an error if the agent is pinned
    /// to another one ([`PinError::DuplicateAgent`]: remove the old pin
    /// first, a key rotation is a deliberate act), the fingerprint to
    /// another agent, or the pin names `local`.
    pub fn check(&self, local: &AgentId, pin: &PeerPin) -> Result<bool, PinError> {
        if &pin.agent == local {
            return Err(PinError::SelfPin(pin.agent.clone()));
        }
        if let Some(fp) = self.by_agent.get(&pin.agent) {
            if *fp == pin.fingerprint {
                return Ok(false);
            }
            return Err(PinError::DuplicateAgent(pin.agent.clone()));
        }
        if let Some(first) = self.by_fingerprint.get(&pin.fingerprint) {
            return Err(PinError::DuplicateFingerprint {
                fingerprint: pin.fingerprint,
                first: first.clone(),
                second: pin.agent.clone(),
            });
        }
        Ok(true)
    }

    /// Adds `pin` after [`check`](Self::check); `Ok(true)` when added.
    pub fn insert(&mut self, local: &AgentId, pin: &PeerPin) -> Result<bool, PinError> {
        let new = self.check(local, pin)?;
        if new {
            self.by_agent.insert(pin.agent.clone(), pin.fingerprint);
            self.by_fingerprint
                .insert(pin.fingerprint, pin.agent.clone());
        }
        Ok(new)
    }

    /// Removes `agent`'s pin; returns the fingerprint it had.
    pub fn remove(&mut self, agent: &AgentId) -> Option<Fingerprint> {
        let fp = self.by_agent.remove(agent)?;
        self.by_fingerprint.remove(&fp);
        Some(fp)
    }
}
