//! The embedding API: [`Node::open`], offer, await outcomes, subscribe,
//! query, decide.

use std::sync::Arc;
use std::time::Duration;

use abhyasa_core::custody::{
    Applier, ApplyDecision, CustodianConfig, CustodianEvent, ExternalOutcome, Offered, Received,
    ReceiverConfig, ReceiverEvent, TerminalState,
};
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::principal::{Authorization, Resolution};
use abhyasa_core::store::{DurableState, EventId, Inbox, Store, StoreError, StoredEvent};
use abhyasa_core::{
    AgentId, DeclineReason, Escalation, GovernedKey, GuardOutcome, Obligation, ObligationId,
    OfferError, Sequence, Timestamp,
};
use abhyasa_transport::Transport;
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::clock::{Clock, SystemClock};
use crate::driver::{Command, Driver};
use crate::metrics::MetricsSnapshot;
use crate::store_thread::{self, Job, Query, StoreJobs};

/// Everything a node needs besides its transport and store.
pub struct NodeOptions {
    /// Custodian configuration (its `agent` is this node).
    pub custodian: CustodianConfig,
    /// Receiver configuration (its `agent` is this node).
    pub receiver: ReceiverConfig,
    /// Polarity rules.
    pub registry: PolarityRegistry,
    /// How this agent applies obligations it receives.
    pub applier: Box<dyn Applier + Send>,
    /// If set, the receiver's apply requests go to this asynchronous
    /// applier on their own tasks instead of `applier` (default `None`:
    /// `applier` answers at once on the driver). See [`crate::applier`].
    pub async_applier: Option<crate::applier::AsyncApplierHandle>,
    /// Where `now` comes from.
    pub clock: Arc<dyn Clock>,
    /// Most inputs folded into one commit batch before it is flushed.
    pub max_batch_inputs: usize,
    /// Run the store on the driver's task instead of a store thread
    /// (default `false`). For deterministic simulation (netsim under
    /// turmoil) with an in-memory store: every commit then happens on the
    /// simulated executor, and what depends on it is still released only
    /// on a later turn of the driver's loop.
    pub inline_store: bool,
    /// Retention and schedule of compaction (C-ND-5; see
    /// [`crate::compaction`]).
    pub compaction: crate::compaction::CompactionPolicy,
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
            compaction: crate::compaction::CompactionPolicy::default(),
        }
    }
}

impl std::fmt::Debug for NodeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeOptions")
            .field("agent", &self.custodian.agent)
            .field("registry", &self.registry)
            .finish_non_exhaustive()
    }
}

/// Errors of the node API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The custodian refused the offer; nothing was accepted.
    #[error(transparent)]
    Offer(#[from] OfferError),
    /// The store failed; the node stops rather than send what is not durable.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The node has stopped.
    #[error("the node has stopped")]
    Stopped,
    /// A deferred obligation or external effect could not be completed.
    #[error(transparent)]
    Complete(#[from] abhyasa_core::custody::CompleteError),
    /// A best-effort obligation's one send was refused by the transport
    /// (peer down, queue full, frame too large): nothing left this node.
    /// It is recorded as best-effort with 0 attempts; offering it again
    /// answers `AlreadyTerminal`.
    #[error("best-effort obligation {obligation_id} was not sent: {reason}")]
    NotSent {
        /// The obligation.
        obligation_id: ObligationId,
        /// Why the transport refused it.
        reason: abhyasa_transport::SendError,
    },
    /// The send queue towards the target is near its byte budget; nothing
    /// was accepted. Offer again once it drains.
    #[error(
        "backpressure: {queued_bytes} bytes queued towards {peer} (limit {limit}); nothing was accepted"
    )]
    Backpressure {
        /// The target.
        peer: AgentId,
        /// Bytes queued or about to be.
        queued_bytes: usize,
        /// The limit the offer would pass.
        limit: usize,
    },
    /// No such obligation or decision item.
    #[error("unknown: {0}")]
    Unknown(String),
    /// Configuration or environment problem.
    #[error("{0}")]
    Config(String),
    /// I/O.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// How a custody transfer ended, as seen by the custodian.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The obligation.
    pub obligation_id: ObligationId,
    /// Terminal state.
    pub state: TerminalState,
    /// Attempts made, when known.
    pub attempts: Option<u32>,
    /// Decline reason, for declines.
    pub reason: Option<DeclineReason>,
    /// The escalation, for escalations.
    pub escalation: Option<Box<Escalation>>,
}

/// What subscribers see, after the records behind it are durable.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum NodeEvent {
    /// A custodian event.
    Custodian(CustodianEvent),
    /// A receiver event.
    Receiver(ReceiverEvent),
    /// A peer connected.
    PeerUp(AgentId),
    /// A peer disconnected.
    PeerDown(AgentId),
    /// A peer sent something bad (logged; nothing accepted was affected).
    PeerMisbehaved {
        /// The peer.
        peer: AgentId,
        /// What it did.
        what: String,
    },
}

/// Where an obligation stands on this node.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StatusView {
    /// The obligation.
    pub obligation_id: ObligationId,
    /// Custodian side: `pending` or the terminal state, if this node is its custodian.
    pub custodian: Option<String>,
    /// Attempts so far (pending only).
    pub attempts: Option<u32>,
    /// Custodian side deadline (pending only).
    pub deadline_at: Option<Timestamp>,
    /// Receiver side: ledger outcome per custodian, if this node received it.
    pub receiver: Vec<(AgentId, String)>,
}

/// A running node. Cheap to clone; the node stops when
/// [`Node::shutdown`] is called or every clone is dropped.
#[derive(Clone)]
pub struct Node {
    agent: AgentId,
    commands: mpsc::Sender<Command>,
    events: broadcast::Sender<NodeEvent>,
    store_jobs: StoreJobs,
    clock: Arc<dyn Clock>,
    transport: abhyasa_transport::TransportHandle,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("agent", &self.agent)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Opens a node: recovers custodian and receiver state from `store`
    /// (every pending transfer resumes its remaining window), starts the
    /// store thread and the driver task on the current tokio runtime.
    pub async fn open(
        options: NodeOptions,
        store: Box<dyn Store>,
        transport: Transport,
    ) -> Result<Node, NodeError> {
        let state: DurableState = store.load()?;
        let now = options.clock.now();
        let agent = options.custodian.agent.clone();
        if options.receiver.agent != agent {
            return Err(NodeError::Config(format!(
                "custodian agent {} and receiver agent {} differ",
                agent, options.receiver.agent
            )));
        }
        let custodian = abhyasa_core::custody::Custodian::restore(
            options.custodian,
            options.registry.clone(),
            &state.custodian,
        );
        let receiver = abhyasa_core::custody::Receiver::restore(
            options.receiver,
            options.registry,
            &state.receiver,
            now,
        );
        let (store_jobs, commit_done, store_join) = if options.inline_store {
            let (jobs, done) = store_thread::spawn_inline(store);
            (jobs, done, None)
        } else {
            store_thread::spawn(store)?
        };
        let (cmd_tx, cmd_rx) = mpsc::channel(8192);
        let (ev_tx, _) = broadcast::channel(65_536);
        let Transport { handle, incoming } = transport;
        let transport = handle.clone();
        let driver = Driver::new(
            agent.clone(),
            custodian,
            receiver,
            options.applier,
            options.clock.clone(),
            handle,
            incoming,
            cmd_rx,
            store_jobs.clone(),
            commit_done,
            store_join,
            ev_tx.clone(),
            options.max_batch_inputs.max(1),
        )
        .with_async_applier(options.async_applier);
        tokio::spawn(driver.run());
        crate::compaction::spawn_schedule(&cmd_tx, options.compaction);
        Ok(Node {
            agent,
            commands: cmd_tx,
            events: ev_tx,
            store_jobs,
            clock: options.clock,
            transport,
        })
    }

    /// This node's agent id.
    pub fn agent(&self) -> &AgentId {
        &self.agent
    }

    /// True when an authenticated connection to `peer` is up.
    pub fn is_connected(&self, peer: &AgentId) -> bool {
        self.transport.is_connected(peer)
    }

    /// The node's `now`.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, NodeError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(make(tx))
            .await
            .map_err(|_| NodeError::Stopped)?;
        rx.await.map_err(|_| NodeError::Stopped)
    }

    /// Offers an obligation. Returns once custody is durable (or the
    /// best-effort send is released); on error nothing was accepted.
    pub async fn offer(&self, obligation: Obligation) -> Result<Offered, NodeError> {
        self.ask(|reply| Command::Offer { obligation, reply })
            .await?
    }

    /// Waits for the terminal outcome of an obligation this node offered.
    pub async fn outcome(&self, id: &ObligationId) -> Result<Outcome, NodeError> {
        let id = id.clone();
        self.ask(|reply| Command::WaitOutcome { id, reply }).await?
    }

    /// Subscribes to events (released after their records are durable).
    pub fn subscribe(&self) -> broadcast::Receiver<NodeEvent> {
        self.events.subscribe()
    }

    /// Where an obligation stands.
    pub async fn status(&self, id: &ObligationId) -> Result<StatusView, NodeError> {
        let id = id.clone();
        self.ask(|reply| Command::Status { id, reply }).await
    }

    /// The principal's own decision on a governed key (sequence-guarded).
    pub async fn decide(
        &self,
        key: GovernedKey,
        state: Authorization,
        sequence: Option<Sequence>,
    ) -> Result<GuardOutcome, NodeError> {
        self.ask(|reply| Command::Decide {
            key,
            state,
            sequence,
            reply,
        })
        .await
    }

    /// Resolves a surfaced decline.
    pub async fn resolve(
        &self,
        id: ObligationId,
        resolution: Resolution,
    ) -> Result<Option<GuardOutcome>, NodeError> {
        self.ask(|reply| Command::Resolve {
            id,
            resolution,
            reply,
        })
        .await?
    }

    /// Completes an obligation this node deferred as receiver.
    pub async fn complete_deferred(
        &self,
        custodian: AgentId,
        id: ObligationId,
        decision: ApplyDecision,
    ) -> Result<Received, NodeError> {
        self.ask(|reply| Command::Complete {
            custodian,
            id,
            decision,
            reply,
        })
        .await?
    }

    /// Reports how an external effect ended.
    pub async fn external_outcome(
        &self,
        custodian: AgentId,
        id: ObligationId,
        outcome: ExternalOutcome,
    ) -> Result<Received, NodeError> {
        self.ask(|reply| Command::External {
            custodian,
            id,
            outcome,
            reply,
        })
        .await?
    }

    /// A metrics snapshot.
    pub async fn metrics(&self) -> Result<MetricsSnapshot, NodeError> {
        self.ask(|reply| Command::Metrics { reply }).await
    }

    /// What this agent may do on governed key `key` now (issue 13): a
    /// leased grant holds only while `now + skew_margin < lease_until`.
    /// Check before exercising the authority; answered after the commit
    /// in flight. Cancel-safe: dropping the future changes nothing.
    pub async fn authorized(
        &self,
        key: &str,
    ) -> Result<abhyasa_core::custody::lease::Authority, NodeError> {
        let key = key.to_string();
        self.ask(|reply| Command::Authorized { key, reply }).await
    }

    /// Every governed key that holds or held a leased grant, in key order,
    /// with its authority now (`abhyasa leases`). Cancel-safe.
    pub async fn leases(&self) -> Result<Vec<crate::leases::LeaseView>, NodeError> {
        self.ask(|reply| Command::Leases { reply }).await
    }

    async fn query<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Query,
    ) -> Result<T, NodeError> {
        let (tx, rx) = oneshot::channel();
        self.store_jobs
            .send(Job::Query(make(tx)))
            .map_err(|_| NodeError::Stopped)?;
        Ok(rx.await.map_err(|_| NodeError::Stopped)??)
    }

    /// Inbox counters derived from the stored records.
    pub async fn inbox(&self) -> Result<Inbox, NodeError> {
        let now = self.now();
        self.query(|r| Query::Inbox(now, r)).await
    }

    /// The durable state (escalations, decisions, ledger) as stored.
    pub async fn durable_state(&self) -> Result<DurableState, NodeError> {
        self.query(Query::Load).await
    }

    /// Log events from `from`.
    pub async fn events(&self, from: EventId, limit: usize) -> Result<Vec<StoredEvent>, NodeError> {
        self.query(|r| Query::Events(from, limit, r)).await
    }

    /// Compacts what is past `retention` now, from the custodian, the
    /// receiver and the store alike (the node also does this on its
    /// schedule, [`NodeOptions::compaction`]).
    pub async fn compact(
        &self,
        retention: Duration,
    ) -> Result<crate::compaction::CompactionReport, NodeError> {
        crate::compaction::run(&self.commands, retention).await
    }

    /// Stops the node after flushing what is in flight.
    pub async fn shutdown(&self) -> Result<(), NodeError> {
        self.ask(|reply| Command::Shutdown { reply }).await
    }
}
