//! The driver's inputs from the embedding: what a [`crate::Node`] call
//! asks, with the channel its answer goes back on.

use abhyasa_core::custody::{ApplyDecision, ExternalOutcome, Offered, Received};
use abhyasa_core::principal::{Authorization, Resolution};
use abhyasa_core::{AgentId, GovernedKey, GuardOutcome, Obligation, ObligationId, Sequence};
use tokio::sync::oneshot;

use crate::api::{NodeError, Outcome, StatusView};
use crate::metrics::MetricsSnapshot;

/// One request to the driver.
#[derive(Debug)]
pub(crate) enum Command {
    Offer {
        obligation: Obligation,
        reply: oneshot::Sender<Result<Offered, NodeError>>,
    },
    WaitOutcome {
        id: ObligationId,
        reply: oneshot::Sender<Result<Outcome, NodeError>>,
    },
    Status {
        id: ObligationId,
        reply: oneshot::Sender<StatusView>,
    },
    Decide {
        key: GovernedKey,
        state: Authorization,
        sequence: Option<Sequence>,
        reply: oneshot::Sender<GuardOutcome>,
    },
    Resolve {
        id: ObligationId,
        resolution: Resolution,
        reply: oneshot::Sender<Result<Option<GuardOutcome>, NodeError>>,
    },
    Complete {
        custodian: AgentId,
        id: ObligationId,
        decision: ApplyDecision,
        reply: oneshot::Sender<Result<Received, NodeError>>,
    },
    External {
        custodian: AgentId,
        id: ObligationId,
        outcome: ExternalOutcome,
        reply: oneshot::Sender<Result<Received, NodeError>>,
    },
    /// C-ND-5: compaction is an input (see `compaction.rs`).
    Compact {
        retention: std::time::Duration,
        reply: oneshot::Sender<crate::compaction::Started>,
    },
    Shutdown {
        reply: oneshot::Sender<()>,
    },
    /// A read of the node's state.
    Read(Read),
}

/// A read: answered from the machines' state, after what is in flight
/// commits where it reports durable state (C-ND-2).
#[derive(Debug)]
pub(crate) enum Read {
    /// The node's counters.
    Metrics {
        reply: oneshot::Sender<MetricsSnapshot>,
    },
    /// Leases: the authority on one governed key, read now.
    Authorized {
        key: String,
        reply: oneshot::Sender<abhyasa_core::custody::lease::Authority>,
    },
    /// Every leased key with its end and authority, read now.
    Leases {
        reply: oneshot::Sender<Vec<crate::leases::LeaseView>>,
    },
    /// The principal's live lease renewal chains.
    Renewals {
        reply: oneshot::Sender<Vec<crate::leases::RenewalView>>,
    },
    /// The lease warnings raised when leased grants were offered.
    LeaseWarnings {
        reply: oneshot::Sender<Vec<crate::leases::LeaseWarning>>,
    },
}
