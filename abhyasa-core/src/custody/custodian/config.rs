//! The custodian's configuration: per-kind custody profiles, how acks bind
//! to what they attest, and the admission bound.

use std::collections::HashMap;

use crate::model::{AgentId, DeclinePolicy, Kind, RetryBackoff};
use crate::principal::WeightRange;

/// Per-kind custody behaviour.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CustodyProfile {
    /// Retry backoff.
    pub backoff: RetryBackoff,
    /// What to do on decline.
    pub decline_policy: DeclinePolicy,
}

impl Default for CustodyProfile {
    fn default() -> Self {
        Self {
            backoff: RetryBackoff::DEFAULT,
            decline_policy: DeclinePolicy::ApplySafe,
        }
    }
}

/// How strictly acks are bound to what they attest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AckBinding {
    /// An ack must carry the obligation's digest (default).
    #[default]
    RequireDigest,
    /// Accept a digest-less ack from the authenticated expected receiver
    /// (v1 peers do not send digests). A digest that is present must still
    /// match.
    AllowMissingDigest,
}

/// Custodian configuration.
#[derive(Clone, Debug)]
pub struct CustodianConfig {
    /// This agent.
    pub agent: AgentId,
    /// Profile for kinds without their own.
    pub default_profile: CustodyProfile,
    /// Per-kind profiles.
    pub profiles: HashMap<Kind, CustodyProfile>,
    /// Seed of the jitter stream (same seed, same schedule).
    pub seed: u64,
    /// Bound on pending obligations (admission control).
    pub max_pending: usize,
    /// Ack binding.
    pub ack_binding: AckBinding,
    /// Principal-side weight clip range.
    pub weight_range: WeightRange,
}

impl CustodianConfig {
    /// Defaults for an agent: v1 backoff, 10 % jitter, seed 0, one million
    /// pending, digests required.
    pub fn new(agent: AgentId) -> Self {
        Self {
            agent,
            default_profile: CustodyProfile::default(),
            profiles: HashMap::new(),
            seed: 0,
            max_pending: 1_000_000,
            ack_binding: AckBinding::RequireDigest,
            weight_range: WeightRange::default(),
        }
    }

    /// The profile of a kind.
    pub fn profile(&self, kind: &Kind) -> &CustodyProfile {
        self.profiles.get(kind).unwrap_or(&self.default_profile)
    }
}
