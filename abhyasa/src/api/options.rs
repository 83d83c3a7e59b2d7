//! [`NodeOptions`]: everything a node needs besides its store and
//! transport, and the checks [`Node::open`](crate::Node::open) runs on
//! them before anything starts.

use std::sync::Arc;

use abhyasa_core::custody::{Applier, CustodianConfig, CustodyProfile, ReceiverConfig};
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::AgentId;

use super::error::NodeError;
use crate::clock::{Clock, SystemClock};
use crate::compaction::CompactionPolicy;

/// Everything a node needs besides its transport and store.
///
/// `#[non_exhaustive]`: build it with [`NodeOptions::new`] (or let
/// [`Node::builder`](crate::Node::builder) do it) and set the fields you
/// need; new options arrive with defaults, so embedders keep compiling.
/// Options are checked when the node opens ([`NodeOptions::validate`]):
/// an incoherent set is refused with [`NodeError::InvalidOptions`] naming
/// the field.
#[non_exhaustive]
pub struct NodeOptions {
    /// Custodian configuration (its `agent` is this node).
    pub custodian: CustodianConfig,
    /// Receiver configuration (its `agent` is this node).
    pub receiver: ReceiverConfig,
    /// Polarity rules.
    pub registry: PolarityRegistry,
    /// How this agent applies obligations it receives, synchronously on
    /// the driver's task.
    pub applier: Box<dyn Applier + Send>,
    /// If set, the receiver's apply requests go to this asynchronous
    /// applier on their own tasks instead of `applier` (default `None`:
    /// `applier` answers at once on the driver). See [`crate::applier`]
    /// and [`NodeBuilder::async_applier`](crate::NodeBuilder::async_applier).
    pub async_applier: Option<crate::applier::AsyncApplierHandle>,
    /// Where `now` comes from.
    pub clock: Arc<dyn Clock>,
    /// Most inputs folded into one commit batch before it is flushed
    /// (at least 1).
    pub max_batch_inputs: usize,
    /// Run the store on the driver's task instead of a store thread
    /// (default `false`). For deterministic simulation (netsim under
    /// turmoil) with an in-memory store: every commit then happens on the
    /// simulated executor, and what depends on it is still released only
    /// on a later turn of the driver's loop.
    pub inline_store: bool,
    /// Retention and schedule of compaction (C-ND-5; see
    /// [`crate::compaction`]).
    pub compaction: CompactionPolicy,
    /// Capacity of the event channel behind [`Node::subscribe`](crate::Node::subscribe)
    /// (default 65,536). A subscriber that falls further behind is refilled
    /// from the store's log, so this bounds memory, not what is delivered.
    pub event_capacity: usize,
    /// The custody deadline this principal gives its revocations, if known
    /// (default `None`). A leased grant whose term is longer draws a
    /// [`LeaseWarning`](crate::leases::LeaseWarning) when it is offered: for
    /// up to `term - deadline` a partitioned agent may act after the
    /// revocation escalated. The CLI sets it from
    /// `card_deadline_seconds`.
    pub revocation_deadline: Option<std::time::Duration>,
}

impl NodeOptions {
    /// Defaults for `agent`: standard rules, the standard applier, the
    /// system clock.
    pub fn new(agent: AgentId) -> Self {
        Self {
            custodian: CustodianConfig::new(agent.clone()),
            receiver: ReceiverConfig::new(agent),
            registry: PolarityRegistry::standard(),
            applier: Box::new(abhyasa_core::custody::StandardApplier::default()),
            async_applier: None,
            clock: Arc::new(SystemClock),
            max_batch_inputs: 4096,
            inline_store: false,
            compaction: CompactionPolicy::default(),
            event_capacity: 65_536,
            revocation_deadline: None,
        }
    }

    /// This node's agent.
    pub fn agent(&self) -> &AgentId {
        &self.custodian.agent
    }

    /// Checks that the options can work together; the first problem found
    /// is returned as [`NodeError::InvalidOptions`] naming its field.
    pub fn validate(&self) -> Result<(), NodeError> {
        let agent = &self.custodian.agent;
        if self.receiver.agent != *agent {
            return Err(NodeError::invalid(
                "receiver.agent",
                format!(
                    "is {} but the custodian (this node) is {agent}: one node is one agent",
                    self.receiver.agent
                ),
            ));
        }
        if self.max_batch_inputs == 0 {
            return Err(NodeError::invalid(
                "max_batch_inputs",
                "must be at least 1 (one input per commit batch)",
            ));
        }
        if self.custodian.max_pending == 0 {
            return Err(NodeError::invalid(
                "custodian.max_pending",
                "must be at least 1, or every offer is refused",
            ));
        }
        check_profile("custodian.default_profile", &self.custodian.default_profile)?;
        let mut kinds: Vec<_> = self.custodian.profiles.iter().collect();
        kinds.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
        for (kind, profile) in kinds {
            check_profile(&format!("custodian.profiles[{kind}]"), profile)?;
        }
        if self.receiver.ledger_quota == 0 {
            return Err(NodeError::invalid(
                "receiver.ledger_quota",
                "must be at least 1, or every obligation received is refused",
            ));
        }
        if self.receiver.max_deadline.is_zero() {
            return Err(NodeError::invalid(
                "receiver.max_deadline",
                "must be positive, or every obligation received is declined",
            ));
        }
        Ok(())
    }
}

/// A profile's backoff must be usable: base and cap positive, jitter in
/// `0..=1` (a zero base would retry in a busy loop).
fn check_profile(path: &str, p: &CustodyProfile) -> Result<(), NodeError> {
    p.backoff
        .validate()
        .map_err(|e| NodeError::invalid(format!("{path}.{}", e.field), e.problem.to_string()))
}

impl std::fmt::Debug for NodeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeOptions")
            .field("agent", &self.custodian.agent)
            .field("registry", &self.registry)
            .field("max_batch_inputs", &self.max_batch_inputs)
            .field("inline_store", &self.inline_store)
            .field("compaction", &self.compaction)
            .finish_non_exhaustive()
    }
}
