//! The embedding API: [`Node::open`], offer, await outcomes, subscribe,
//! query, decide.

use std::sync::Arc;
use std::time::Duration;

use abhyasa_core::custody::{
    Applier, ApplyDecision, CustodianConfig, CustodianEvent, ExternalOutcome, Offered, Received,
    ReceiverConfig, ReceiverEvent, TerminalState,
};
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::principal::DecisionItem;
use abhyasa_core::principal::{Authorization, Resolution};
use abhyasa_core::store::{
    DurableState, EscalationEntry, EventId, Inbox, ListState, Listed, Page, Store, StoreError,
    StoredEvent,
};
use abhyasa_core::{
    AgentId, DeclineReason, Escalation, GovernedKey, GuardOutcome, Obligation, ObligationId,
    OfferError, Sequence, Timestamp,
};
use abhyasa_transport::Transport;
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::clock::{Clock, SystemClock};
use crate::driver::{Command, Driver};
use crate::metrics::MetricsSnapshot;
use crate::store_thread::{self, Job, LogSink, Query, StoreJobs};
use crate::subscription::Subscription;

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
    /// Capacity of the event channel behind [`Node::subscribe`] (default
    /// 65,536). A subscriber that falls further behind is refilled from
    /// the store's log, so this bounds memory, not what is delivered.
    pub event_capacity: usize,
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
            clock: Arc::new(SystemClock),
            max_batch_inputs: 4096,
            inline_store: false,
            compaction: crate::compaction::CompactionPolicy::default(),
            event_capacity: 65_536,
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
    /// A durable event: one committed record, with its position in the
    /// store's event log. A [`Subscription`] yields every one, in id
    /// order, exactly once (refilling from the log after a lag).
    Logged(StoredEvent),
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
    /// One past the last committed event id (see [`LogSink`]).
    published: Arc<std::sync::atomic::AtomicU64>,
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
    ///
    /// The store is loaded on the store thread (issue 11 §5), so opening a
    /// node with a million records never blocks the runtime's worker: the
    /// future waits for the load without holding the thread. Dropping it
    /// before it completes stops the store thread; nothing was started.
    pub async fn open(
        options: NodeOptions,
        store: Box<dyn Store>,
        transport: Transport,
    ) -> Result<Node, NodeError> {
        let agent = options.custodian.agent.clone();
        if options.receiver.agent != agent {
            return Err(NodeError::Config(format!(
                "custodian agent {} and receiver agent {} differ",
                agent, options.receiver.agent
            )));
        }
        let (ev_tx, _) = broadcast::channel(options.event_capacity.max(1));
        let log = LogSink {
            events: ev_tx.clone(),
            published: Arc::default(),
        };
        let published = log.published.clone();
        let (store_jobs, commit_done, store_join) = if options.inline_store {
            let (jobs, done) = store_thread::spawn_inline(store, log);
            (jobs, done, None)
        } else {
            store_thread::spawn(store, log)?
        };
        // Stops the store thread if the load fails or this future is dropped.
        let stop = StopOnDrop(Some(store_jobs.clone()));
        let (tx, rx) = oneshot::channel();
        store_jobs
            .send(Job::Query(Query::Load(tx)))
            .map_err(|_| NodeError::Stopped)?;
        let state: DurableState = rx.await.map_err(|_| NodeError::Stopped)??;
        stop.disarm();
        published.store(state.next_event.0, std::sync::atomic::Ordering::SeqCst);
        let now = options.clock.now();
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
        drop(state);
        let (cmd_tx, cmd_rx) = mpsc::channel(8192);
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
        );
        tokio::spawn(driver.run());
        crate::compaction::spawn_schedule(&cmd_tx, options.compaction);
        Ok(Node {
            agent,
            commands: cmd_tx,
            events: ev_tx,
            published,
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

    /// Subscribes to events (released after their records are durable),
    /// from now on: every durable event committed from here is yielded as
    /// [`NodeEvent::Logged`], in order, exactly once, even if the
    /// subscriber falls behind (see [`Subscription`]).
    pub fn subscribe(&self) -> Subscription {
        // Subscribe first, then read the published end: an event either
        // lies before it or reaches this receiver (C-ND-5, issue 11 §6).
        let rx = self.events.subscribe();
        let next = EventId(self.published.load(std::sync::atomic::Ordering::SeqCst));
        Subscription::new(rx, self.store_jobs.clone(), next, false)
    }

    /// Subscribes from log position `from` (a [`Subscription::resume_from`]
    /// saved earlier, or `EventId(0)`): the retained log from there is
    /// read from the store first, then the live events follow without a
    /// gap or a repeat.
    pub fn subscribe_from(&self, from: EventId) -> Subscription {
        Subscription::new(self.events.subscribe(), self.store_jobs.clone(), from, true)
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

    /// Inbox counters derived from the stored records: durable counters and
    /// a deadline index on the embedded stores, not a scan (issue 11 §5).
    pub async fn inbox(&self) -> Result<Inbox, NodeError> {
        let now = self.now();
        self.query(|r| Query::Inbox(now, r)).await
    }

    /// One page of the obligations this node is custodian of, in `state`
    /// (all when `None`), with id `> after`, in id order, at most `limit`
    /// (clamped to [`abhyasa_core::store::MAX_PAGE`]): an indexed read on
    /// the store thread, never a scan of every record (issue 11 §5).
    pub async fn list(
        &self,
        state: Option<ListState>,
        after: Option<ObligationId>,
        limit: usize,
    ) -> Result<Page<Listed, ObligationId>, NodeError> {
        self.query(|r| Query::List(state, after, limit, r)).await
    }

    /// One page of the retained escalations after log position `after`, in
    /// the order they happened (an indexed read, issue 11 §5).
    pub async fn escalations(
        &self,
        after: Option<EventId>,
        limit: usize,
    ) -> Result<Page<EscalationEntry, EventId>, NodeError> {
        self.query(|r| Query::Escalations(after, limit, r)).await
    }

    /// One page of the surfaced declines awaiting the principal's decision,
    /// by obligation id after `after` (an indexed read, issue 11 §5).
    pub async fn decisions(
        &self,
        after: Option<ObligationId>,
        limit: usize,
    ) -> Result<Page<DecisionItem, ObligationId>, NodeError> {
        self.query(|r| Query::Decisions(after, limit, r)).await
    }

    /// The durable state (escalations, decisions, ledger) as stored.
    pub async fn durable_state(&self) -> Result<DurableState, NodeError> {
        self.query(Query::Load).await
    }

    /// Up to `limit` durable log events with id `>= from`, in id order
    /// (what a [`Subscription`] refills a gap from).
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

/// Stops the store thread when dropped armed: [`Node::open`] failed or was
/// cancelled after the thread started.
struct StopOnDrop(Option<StoreJobs>);

impl StopOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(jobs) = self.0.take() {
            let _ = jobs.send(Job::Stop);
        }
    }
}
