//! The embedding API: [`Node::builder`], offer, await outcomes, subscribe,
//! query, decide.
//!
//! The public types it speaks (options, errors, events, status views) are in
//! `crate::api`; the driver depends on them, and this module on the driver.

use std::sync::Arc;
use std::time::Duration;

use abhyasa_core::custody::{ApplyDecision, ExternalOutcome, Offered, Received};
use abhyasa_core::principal::DecisionItem;
use abhyasa_core::principal::{Authorization, Resolution};
use abhyasa_core::store::{
    DurableState, EscalationEntry, EventId, Inbox, ListState, Listed, Page, Store, StoreError,
    StoredEvent,
};
use abhyasa_core::{
    AgentId, GovernedKey, GuardOutcome, Obligation, ObligationId, Sequence, Timestamp,
};
use abhyasa_transport::Transport;
use tokio::sync::{broadcast, mpsc, oneshot, watch};

use crate::api::{NodeBuilder, NodeError, NodeEvent, NodeOptions, Outcome, StatusView};
use crate::clock::Clock;
use crate::command::{Command, Read};
use crate::driver::Driver;
use crate::metrics::MetricsSnapshot;
use crate::store_thread::{self, Job, LogSink, Query, StoreJobs};
use crate::subscription::Subscription;

/// A running node. Cheap to clone; the node stops when
/// [`Node::shutdown`] is called or every clone is dropped.
///
/// # Cancellation
///
/// Every async method hands one command to the node's driver and awaits
/// its answer. Dropping the future before the command is queued (its first
/// poll, unless the command queue is full) does nothing at all; dropping it
/// after, while it awaits the answer, only discards the answer: the driver
/// carries the command out in full, durably, exactly as if the answer had
/// been read. No command is ever half done: an `offer` whose future was
/// dropped is either fully accepted (durable, shown by [`Node::status`],
/// resumed after a restart) or absent. Each method's doc says what that
/// means for it.
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
    /// Set once the driver has ended: how it ended.
    stopped: watch::Receiver<Option<Result<(), Arc<NodeError>>>>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("agent", &self.agent)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Starts building a node for `agent` (store, transport, clock,
    /// options); see [`NodeBuilder`].
    pub fn builder(agent: AgentId) -> NodeBuilder {
        NodeBuilder::new(agent)
    }

    /// Opens a node from options, store and transport: the back end of
    /// [`NodeBuilder::open`], which embedders should prefer. Checks the
    /// options ([`NodeOptions::validate`]) and that the transport is bound
    /// to the same agent, recovers custodian and receiver state from
    /// `store` (every pending transfer resumes its remaining window), then
    /// starts the store thread and the driver task on the current tokio
    /// runtime.
    ///
    /// The store is loaded on the store thread, so opening a
    /// node with a million records never blocks the runtime's worker.
    ///
    /// Cancellation: dropping the future before it returns stops the store
    /// thread, leaves no node running and writes nothing; the store and
    /// transport are dropped.
    pub async fn open(
        options: NodeOptions,
        store: Box<dyn Store>,
        transport: Transport,
    ) -> Result<Node, NodeError> {
        options.validate()?;
        let agent = options.custodian.agent.clone();
        if *transport.handle.local() != agent {
            return Err(NodeError::invalid(
                "transport",
                format!(
                    "is bound to {} but the node is {agent}",
                    transport.handle.local()
                ),
            ));
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
        let renewals = abhyasa_core::custody::renewal::Renewals::new(
            options.custodian.seed,
            options.receiver.skew_margin,
            options.revocation_deadline,
        );
        let DurableState {
            custodian: custodian_state,
            receiver: receiver_state,
            ..
        } = state;
        let custodian = abhyasa_core::custody::Custodian::restore_owned(
            options.custodian,
            options.registry.clone(),
            custodian_state,
        );
        let receiver = abhyasa_core::custody::Receiver::restore(
            options.receiver,
            options.registry,
            &receiver_state,
            now,
        );
        drop(receiver_state);
        let (cmd_tx, cmd_rx) = mpsc::channel(8192);
        let Transport { handle, incoming } = transport;
        let transport = handle.clone();
        let driver = Driver::new(
            agent.clone(),
            abhyasa_core::agent::Agent::new(custodian, receiver, renewals),
            options.applier,
            options.clock.clone(),
            handle,
            incoming,
            cmd_rx,
            store_jobs.clone(),
            commit_done,
            store_join,
            ev_tx.clone(),
            options.max_batch_inputs,
        )
        .with_async_applier(options.async_applier);
        let (stopped_tx, stopped) = watch::channel(None);
        tokio::spawn(async move {
            let result = driver.run().await.map_err(Arc::new);
            stopped_tx.send_replace(Some(result));
        });
        crate::schedule::spawn_schedule(&cmd_tx, options.compaction);
        Ok(Node {
            agent,
            commands: cmd_tx,
            events: ev_tx,
            published,
            store_jobs,
            clock: options.clock,
            transport,
            stopped,
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

    /// True when `peer` is in the transport's peer table: a target
    /// [`Node::offer`] accepts.
    pub fn is_known_peer(&self, peer: &AgentId) -> bool {
        self.transport.is_known(peer)
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
    ///
    /// A target that is not in the transport's peer table (not a pinned
    /// peer: no connection to it could ever be authenticated) is refused
    /// with [`NodeError::UnknownPeer`] before anything else.
    ///
    /// Cancellation: dropped before its command is queued, nothing was
    /// offered; dropped after, the offer is carried out in full (custody
    /// durable and visible to [`Node::status`]) and only the answer is lost.
    /// Never half-accepted. Offering the same obligation again is the way
    /// to learn the answer: it is idempotent (`AlreadyPending` /
    /// `AlreadyTerminal`).
    pub async fn offer(&self, obligation: Obligation) -> Result<Offered, NodeError> {
        if !self.transport.is_known(obligation.target()) {
            return Err(NodeError::UnknownPeer(obligation.target().clone()));
        }
        self.ask(|reply| Command::Offer { obligation, reply })
            .await?
    }

    /// Waits for the terminal outcome of an obligation this node offered
    /// (reported only once its close is durable).
    ///
    /// Cancellation: dropping it abandons the wait and nothing else; the
    /// transfer goes on, and the abandoned waiter is pruned (C-ND-5).
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
        // lies before it or reaches this receiver (C-ND-5).
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

    /// Where an obligation stands; everything it says is durable.
    ///
    /// Cancellation: a read; dropping it discards the answer.
    pub async fn status(&self, id: &ObligationId) -> Result<StatusView, NodeError> {
        let id = id.clone();
        self.ask(|reply| Command::Status { id, reply }).await
    }

    /// The principal's own decision on a governed key (sequence-guarded),
    /// answered once its record is durable.
    ///
    /// Cancellation: dropped after its command is queued, the decision is
    /// still made and committed; only the answer is lost.
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

    /// Resolves a surfaced decline, answered once its record is durable;
    /// [`NodeError::UnknownDecisionItem`] when no decision awaits under
    /// `id`.
    ///
    /// Cancellation: dropped after its command is queued, the resolution is
    /// still applied and committed; only the answer is lost.
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

    /// Completes an obligation this node deferred as receiver, answered
    /// once the ledger entry (and effect) is durable.
    ///
    /// Cancellation: dropped after its command is queued, the completion
    /// is still committed and acked; only the answer is lost.
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

    /// Reports how an external effect ended, answered once the ledger
    /// entry is durable.
    ///
    /// Cancellation: dropped after its command is queued, the outcome is
    /// still committed and acked; only the answer is lost.
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
    ///
    /// Cancellation: a read; dropping it discards the answer.
    pub async fn metrics(&self) -> Result<MetricsSnapshot, NodeError> {
        let mut m = self
            .ask(|reply| Command::Read(Read::Metrics { reply }))
            .await?;
        m.peers_connected = self.transport.connected_peers().len() as u64;
        Ok(m)
    }

    /// What this agent may do on governed key `key` now: a
    /// leased grant holds only while `now + skew_margin < lease_until`.
    /// Check before exercising the authority; answered after the commit
    /// in flight. Cancel-safe: dropping the future changes nothing.
    pub async fn authorized(
        &self,
        key: &str,
    ) -> Result<abhyasa_core::custody::lease::Authority, NodeError> {
        let key = key.to_string();
        self.ask(|reply| Command::Read(Read::Authorized { key, reply }))
            .await
    }

    /// Every governed key that holds or held a leased grant, in key order,
    /// with its authority now (`abhyasa leases`). Cancel-safe.
    pub async fn leases(&self) -> Result<Vec<crate::leases::LeaseView>, NodeError> {
        self.ask(|reply| Command::Read(Read::Leases { reply }))
            .await
    }

    /// The leases this node renews as principal: one chain per
    /// governed key on which it offered a sequenced leased grant and still
    /// grants, with the latest grant sent and when the next renewal is due.
    /// Cancel-safe.
    pub async fn renewals(&self) -> Result<Vec<crate::leases::RenewalView>, NodeError> {
        self.ask(|reply| Command::Read(Read::Renewals { reply }))
            .await
    }

    /// The warnings raised when leased grants were offered (a lease term
    /// longer than [`NodeOptions::revocation_deadline`], or an unsequenced
    /// grant that cannot be renewed), oldest first; each was also logged.
    /// Cancel-safe.
    pub async fn lease_warnings(&self) -> Result<Vec<crate::leases::LeaseWarning>, NodeError> {
        self.ask(|reply| Command::Read(Read::LeaseWarnings { reply }))
            .await
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
    /// a deadline index on the embedded stores, not a scan.
    ///
    /// Cancellation: a read; dropping it discards the answer.
    pub async fn inbox(&self) -> Result<Inbox, NodeError> {
        let now = self.now();
        self.query(|r| Query::Inbox(now, r)).await
    }

    /// One page of the obligations this node is custodian of, in `state`
    /// (all when `None`), with id `> after`, in id order, at most `limit`
    /// (clamped to [`abhyasa_core::store::MAX_PAGE`]): an indexed read on
    /// the store thread, never a scan of every record.
    pub async fn list(
        &self,
        state: Option<ListState>,
        after: Option<ObligationId>,
        limit: usize,
    ) -> Result<Page<Listed, ObligationId>, NodeError> {
        self.query(|r| Query::List(state, after, limit, r)).await
    }

    /// One page of the retained escalations after log position `after`, in
    /// the order they happened (an indexed read).
    pub async fn escalations(
        &self,
        after: Option<EventId>,
        limit: usize,
    ) -> Result<Page<EscalationEntry, EventId>, NodeError> {
        self.query(|r| Query::Escalations(after, limit, r)).await
    }

    /// One page of the surfaced declines awaiting the principal's decision,
    /// by obligation id after `after` (an indexed read).
    pub async fn decisions(
        &self,
        after: Option<ObligationId>,
        limit: usize,
    ) -> Result<Page<DecisionItem, ObligationId>, NodeError> {
        self.query(|r| Query::Decisions(after, limit, r)).await
    }

    /// The durable state (escalations, decisions, ledger) as stored.
    ///
    /// Cancellation: a read; dropping it discards the answer.
    pub async fn durable_state(&self) -> Result<DurableState, NodeError> {
        self.query(Query::Load).await
    }

    /// Up to `limit` durable log events with id `>= from`, in id order
    /// (what a [`Subscription`] refills a gap from).
    ///
    /// Cancellation: a read; dropping it discards the answer.
    pub async fn events(&self, from: EventId, limit: usize) -> Result<Vec<StoredEvent>, NodeError> {
        self.query(|r| Query::Events(from, limit, r)).await
    }

    /// Compacts what is past `retention` now, from the custodian, the
    /// receiver and the store alike (the node also does this on its
    /// schedule, [`NodeOptions::compaction`]).
    ///
    /// Cancellation: dropped after its command is queued, the run still
    /// completes in the machines and the store; only the report is lost.
    pub async fn compact(
        &self,
        retention: Duration,
    ) -> Result<crate::compaction::CompactionReport, NodeError> {
        crate::schedule::run(&self.commands, retention).await
    }

    /// Waits until the node has stopped and says how: `Ok(())` after
    /// [`Node::shutdown`] (or once every handle is dropped), the error when
    /// it stopped on its own because it could no longer keep its promise
    /// durably (a failed commit, or a store that reports it was taken over:
    /// [`abhyasa_core::store::StoreError::Fenced`]). A process embedding
    /// the node should exit or restart on the error, never serve on.
    ///
    /// Cancellation: a wait; dropping it changes nothing.
    pub async fn stopped(&self) -> Result<(), Arc<NodeError>> {
        let mut rx = self.stopped.clone();
        let done = match rx.wait_for(Option::is_some).await {
            Ok(done) => done.clone(),
            // The driver task was dropped without a word (runtime shut
            // down): it stopped, with nothing more to say.
            Err(_) => Some(Err(Arc::new(NodeError::Stopped))),
        };
        done.unwrap_or(Ok(()))
    }

    /// Stops the node after flushing what is in flight.
    ///
    /// Cancellation: dropped after its command is queued, the node still
    /// stops (after flushing); only the confirmation is lost.
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
