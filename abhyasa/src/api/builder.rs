//! [`NodeBuilder`]: how an embedder opens a node.
//!
//! ```text
//! Node::builder(agent)
//!     .store(store)          // required: where custody is durable
//!     .transport(transport)  // required: its peer set is who `offer` may target
//!     .clock(clock)          // optional: default the system clock
//!     .options(options)      // optional: or per-option setters
//!     .open().await?
//! ```
//!
//! Everything is checked at [`NodeBuilder::open`], before anything starts:
//! a missing store or transport, or options that cannot work, are refused
//! with [`NodeError::InvalidOptions`] naming the field.

use std::sync::Arc;

use abhyasa_core::custody::{Applier, CustodianConfig, PeerPolicy, ReceiverConfig};
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::store::Store;
use abhyasa_core::AgentId;
use abhyasa_transport::Transport;

use super::error::NodeError;
use super::options::NodeOptions;
use crate::clock::Clock;
use crate::compaction::CompactionPolicy;
use crate::node::Node;

/// Builds a [`Node`]: store, transport, clock and options, checked at
/// [`open`](Self::open). Start it with [`Node::builder`].
#[must_use = "a builder does nothing until `open` is awaited"]
pub struct NodeBuilder {
    agent: AgentId,
    options: NodeOptions,
    store: Option<Box<dyn Store>>,
    transport: Option<Transport>,
    // The async applier gets its setter here, beside
    // `sync_applier`; the driver then asks it instead of `options.applier`.
}

impl std::fmt::Debug for NodeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeBuilder")
            .field("agent", &self.agent)
            .field("options", &self.options)
            .field("store", &self.store.as_ref().map(|s| s.backend()))
            .field("transport", &self.transport.is_some())
            .finish()
    }
}

impl NodeBuilder {
    pub(crate) fn new(agent: AgentId) -> Self {
        Self {
            options: NodeOptions::new(agent.clone()),
            agent,
            store: None,
            transport: None,
        }
    }

    /// The durable store (required). Custody is durable in it before any
    /// send (AB-1); the node recovers its pending set from it on open.
    pub fn store(self, store: impl Store + 'static) -> Self {
        self.boxed_store(Box::new(store))
    }

    /// The durable store, already boxed (e.g. chosen at run time).
    pub fn boxed_store(mut self, store: Box<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// The transport (required). Its peer set is the set of targets
    /// [`Node::offer`] accepts ([`NodeError::UnknownPeer`] otherwise).
    pub fn transport(mut self, transport: Transport) -> Self {
        self.transport = Some(transport);
        self
    }

    /// Where `now` comes from (default: the system clock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.options.clock = clock;
        self
    }

    /// Replaces every option. Their agent must be the builder's: a
    /// different one is refused at [`open`](Self::open). A clock set
    /// earlier is replaced by `options.clock`.
    pub fn options(mut self, options: NodeOptions) -> Self {
        self.options = options;
        self
    }

    /// Changes options in place, starting from the defaults (or from what
    /// was set so far).
    pub fn configure(mut self, f: impl FnOnce(&mut NodeOptions)) -> Self {
        f(&mut self.options);
        self
    }

    /// Custodian configuration (its agent must be the builder's).
    pub fn custodian(mut self, config: CustodianConfig) -> Self {
        self.options.custodian = config;
        self
    }

    /// Receiver configuration (its agent must be the builder's).
    pub fn receiver(mut self, config: ReceiverConfig) -> Self {
        self.options.receiver = config;
        self
    }

    /// What `peer` may govern at this node's receiver (C-AZ-1): the kinds
    /// and issuer-less key prefixes it may issue, or nothing if it is a
    /// relay ([`PeerPolicy::relay`]). A peer without one governs every
    /// kind on keys held under its own identity only.
    pub fn peer_policy(mut self, peer: AgentId, policy: PeerPolicy) -> Self {
        self.options.receiver.authority.set_peer(peer, policy);
        self
    }

    /// Polarity rules (default: the standard instantiations).
    pub fn registry(mut self, registry: PolarityRegistry) -> Self {
        self.options.registry = registry;
        self
    }

    /// An applier the driver calls synchronously for each obligation
    /// received (default: the standard applier).
    pub fn sync_applier(mut self, applier: impl Applier + Send + 'static) -> Self {
        self.options.applier = Box::new(applier);
        self
    }

    /// An applier the embedding agent answers asynchronously: the
    /// receiver's apply requests go to it on their own tasks (bounded by
    /// the handle's concurrency) and its decisions come back as inputs, so
    /// a slow decision never stalls the driver. Replaces the synchronous
    /// applier for obligations this node receives.
    pub fn async_applier(mut self, applier: crate::applier::AsyncApplierHandle) -> Self {
        self.options.async_applier = Some(applier);
        self
    }

    /// Most inputs folded into one commit batch (at least 1).
    pub fn max_batch_inputs(mut self, n: usize) -> Self {
        self.options.max_batch_inputs = n;
        self
    }

    /// Runs the store on the driver's task (deterministic simulation).
    pub fn inline_store(mut self, inline: bool) -> Self {
        self.options.inline_store = inline;
        self
    }

    /// Retention and schedule of compaction.
    pub fn compaction(mut self, policy: CompactionPolicy) -> Self {
        self.options.compaction = policy;
        self
    }

    /// Checks everything, recovers state from the store and starts the
    /// node on the current tokio runtime.
    ///
    /// Cancellation: dropping this future before it completes leaves
    /// nothing running. The checks and the recovery happen before the node
    /// starts, and nothing is written to the store by opening; the store
    /// and transport are dropped with the future.
    pub async fn open(self) -> Result<Node, NodeError> {
        let Self {
            agent,
            options,
            store,
            transport,
        } = self;
        if *options.agent() != agent {
            return Err(NodeError::invalid(
                "custodian.agent",
                format!(
                    "the options are for {} but the builder for {agent}",
                    options.agent()
                ),
            ));
        }
        let store = store
            .ok_or_else(|| NodeError::invalid("store", "no store given (NodeBuilder::store)"))?;
        let transport = transport.ok_or_else(|| {
            NodeError::invalid("transport", "no transport given (NodeBuilder::transport)")
        })?;
        Node::open(options, store, transport).await
    }
}
