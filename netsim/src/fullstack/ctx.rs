//! What a simulated host is given: its role, identity, peers, disk and
//! share of the workload, shared by its incarnations; and the error that
//! ends its software.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use abhyasa_core::store::SimStore;
use abhyasa_core::{AgentId, Obligation, Timestamp};
use abhyasa_identity::{Identity, PeerPin};

use super::scenario::Scenario;
use super::truth::Truth;
use super::udp::Dropper;

/// The port every host's node listens on.
pub(crate) const PORT: u16 = 4433;

/// What a host does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Offers its share of the workload to the receivers.
    Custodian,
    /// Applies, declines or defers what it receives.
    Receiver,
    /// The store-and-forward relay between them.
    Relay,
}

/// One obligation of the workload and when it is offered.
#[derive(Debug, Clone)]
pub(crate) struct Planned {
    pub(crate) at: Duration,
    pub(crate) obligation: Obligation,
}

/// Everything a host's software needs; shared by its incarnations.
pub(crate) struct HostCtx {
    pub(crate) name: String,
    pub(crate) role: Role,
    pub(crate) agent: AgentId,
    pub(crate) identity: Identity,
    /// The peers it talks to: host name and pin.
    pub(crate) peers: Vec<(String, PeerPin)>,
    pub(crate) scenario: Arc<Scenario>,
    pub(crate) seed: u64,
    pub(crate) t0: Timestamp,
    pub(crate) disk: Arc<Mutex<SimStore>>,
    pub(crate) dropper: Arc<Mutex<Dropper>>,
    pub(crate) truth: Truth,
    pub(crate) plan: Arc<Vec<Planned>>,
    /// With a relay: its pin (custodians and receivers dial it and reach
    /// their `peers` through it).
    pub(crate) relay: Option<PeerPin>,
    /// The relay host's spool file.
    pub(crate) spool_path: Option<std::path::PathBuf>,
}

/// Errors that end a host's software (reported as a run error).
#[derive(Debug, thiserror::Error)]
pub(crate) enum HostError {
    #[error("{host}: {what}")]
    Start { host: String, what: String },
}

pub(crate) fn start_err(host: &str, what: impl std::fmt::Display) -> HostError {
    HostError::Start {
        host: host.to_string(),
        what: what.to_string(),
    }
}
