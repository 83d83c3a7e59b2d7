//! The driver: one tokio task owns the agent (custodian, receiver, lease
//! renewals), feeds it inputs, arms one timer for the next timeout, and runs the
//! write-ahead pipeline: records go to the store thread as one group
//! commit; what depends on them is released only when it returns.
//!
//! The protocol's rules are the core's; the driver is I/O around them:
//! `links` (frames and link changes in, transmits out), `commands` (the
//! embedding's requests), `outcomes` (released events and the answers they
//! complete), `apply` (the asynchronous apply path) and `unreleased` (the
//! send-queue budget of accepted offers).

mod apply;
mod commands;
mod links;
mod outcomes;
mod unreleased;

use std::collections::VecDeque;
use std::sync::Arc;

use abhyasa_core::agent::Agent;
use abhyasa_core::custody::{Applier, ApplyDecision, ApplyTicket, CompleteError, Offered};
use abhyasa_core::{AgentId, Map, ObligationId, Timestamp};
use abhyasa_transport::{Incoming, SendError, TransportHandle};
use tokio::sync::{broadcast, mpsc, oneshot};

use self::apply::{recv_decision, AsyncApply};
use self::unreleased::Unreleased;
use crate::api::{NodeError, NodeEvent, Outcome};
use crate::applier::AsyncApplierHandle;
use crate::clock::Clock;
use crate::command::Command;
use crate::gate::{Held, ReplyGate};
use crate::metrics::MetricsSnapshot;
use crate::store_thread::{CommitDone, CommitJob, Job, StoreJobs};

/// Outcome waiters tolerated before the first sweep of abandoned ones.
const OUTCOME_WAITERS_FLOOR: usize = 1024;

pub(crate) struct Driver {
    agent: AgentId,
    /// The protocol: custodian, receiver and lease renewals.
    core: Agent,
    applier: Box<dyn Applier + Send>,
    /// Asynchronous apply path; `None`: `applier` answers.
    apply: Option<AsyncApply>,
    clock: Arc<dyn Clock>,
    transport: TransportHandle,
    incoming: mpsc::Receiver<Incoming>,
    commands: mpsc::Receiver<Command>,
    store: StoreJobs,
    commit_done: mpsc::UnboundedReceiver<CommitDone>,
    store_join: Option<std::thread::JoinHandle<()>>,
    in_flight: bool,
    events: broadcast::Sender<NodeEvent>,
    offer_waiters: Map<ObligationId, Vec<oneshot::Sender<Result<Offered, NodeError>>>>,
    outcome_waiters: Map<ObligationId, Vec<oneshot::Sender<Result<Outcome, NodeError>>>>,
    /// Senders in `outcome_waiters` (live or abandoned).
    outcome_waiter_count: usize,
    /// Sweep abandoned outcome waiters when the count passes this.
    outcome_sweep_at: usize,
    /// Replies held until their records commit (C-ND-2).
    gate: ReplyGate<Driver>,
    /// Best-effort obligations whose one send the transport refused, until
    /// their `BestEffortSent` event answers the offer (C-ND-4).
    refused_best_effort: Map<ObligationId, SendError>,
    /// First attempts accepted but not yet handed to the transport, in
    /// bytes, so `offer` pushes back before a send queue overflows.
    unreleased: Unreleased,
    recent: Map<ObligationId, Outcome>,
    recent_order: VecDeque<ObligationId>,
    /// This driver's own copy of each peer's id (see `own_peer_id`).
    peer_ids: Map<AgentId, AgentId>,
    metrics: MetricsSnapshot,
    /// Rate limit of warnings a peer can cause (malformed or foreign
    /// frames, ignored acks, error frames): a hostile or broken peer must
    /// not be able to fill the log (C-ND-5). Counted in metrics either way.
    peer_warnings: abhyasa_transport::limit::WarnLimiter,
    max_batch_inputs: usize,
    shutdown: Option<oneshot::Sender<()>>,
}

impl Driver {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        agent: AgentId,
        core: Agent,
        applier: Box<dyn Applier + Send>,
        clock: Arc<dyn Clock>,
        transport: TransportHandle,
        incoming: mpsc::Receiver<Incoming>,
        commands: mpsc::Receiver<Command>,
        store: StoreJobs,
        commit_done: mpsc::UnboundedReceiver<CommitDone>,
        store_join: Option<std::thread::JoinHandle<()>>,
        events: broadcast::Sender<NodeEvent>,
        max_batch_inputs: usize,
    ) -> Self {
        Self {
            agent,
            core,
            applier,
            apply: None,
            clock,
            transport,
            incoming,
            commands,
            store,
            commit_done,
            store_join,
            in_flight: false,
            events,
            offer_waiters: Map::default(),
            outcome_waiters: Map::default(),
            outcome_waiter_count: 0,
            outcome_sweep_at: OUTCOME_WAITERS_FLOOR,
            gate: ReplyGate::default(),
            refused_best_effort: Map::default(),
            unreleased: Unreleased::default(),
            recent: Map::default(),
            recent_order: VecDeque::new(),
            peer_ids: Map::default(),
            metrics: MetricsSnapshot::default(),
            peer_warnings: abhyasa_transport::limit::WarnLimiter::default(),
            max_batch_inputs,
            shutdown: None,
        }
    }

    /// Sends the receiver's apply requests to `applier` on their own
    /// tasks instead of answering them with the synchronous applier.
    pub(crate) fn with_async_applier(mut self, applier: Option<AsyncApplierHandle>) -> Self {
        self.apply = applier.map(AsyncApply::new);
        self
    }

    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Runs until shutdown, a store failure, or every handle is dropped.
    pub(crate) async fn run(mut self) -> Result<(), NodeError> {
        let span = tracing::info_span!("node", agent = %self.agent);
        let _enter = span.enter();
        tracing::info!(
            pending = self.core.custodian().pending_len(),
            "node started"
        );
        // A restore may have emitted records (in-doubt intents).
        self.pump();
        let result = self.main_loop().await;
        if let Err(e) = &result {
            tracing::error!(error = %e, "node stopped on error");
        }
        // Fail the waiters rather than leave them hanging.
        self.offer_waiters.clear();
        self.outcome_waiters.clear();
        self.gate.fail_all();
        let _ = self.store.send(Job::Stop);
        if let Some(j) = self.store_join.take() {
            let _ = tokio::task::spawn_blocking(move || j.join()).await;
        }
        // Close the transport and wait for its tasks, so a node reopened on
        // the same port (or the same in-memory network) right after
        // `shutdown()` returns finds it free.
        self.transport.shutdown().await;
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        result
    }

    async fn main_loop(&mut self) -> Result<(), NodeError> {
        loop {
            let timer = self.core.poll_timeout().map(|t| {
                let wait = t.saturating_duration_since(self.now());
                tokio::time::Instant::now() + wait
            });
            let deciding = self.apply.is_some();
            tokio::select! {
                biased;
                done = self.commit_done.recv() => {
                    match done {
                        Some(d) => self.on_committed(d)?,
                        None => return Err(NodeError::Stopped),
                    }
                }
                cmd = self.commands.recv() => {
                    match cmd {
                        Some(c) => {
                            if !self.on_command(c) {
                                self.drain_before_stop().await?;
                                return Ok(());
                            }
                        }
                        None => {
                            self.drain_before_stop().await?;
                            return Ok(());
                        }
                    }
                }
                inc = self.incoming.recv() => {
                    match inc {
                        Some(i) => self.on_incoming(i),
                        None => {
                            tracing::warn!("transport closed");
                            self.drain_before_stop().await?;
                            return Ok(());
                        }
                    }
                }
                decided = recv_decision(&mut self.apply), if deciding => {
                    if let Some((ticket, decision)) = decided {
                        self.on_decision(ticket, decision);
                    }
                }
                // Wakes an idle loop; the timers themselves are served
                // below, on every turn.
                _ = sleep_until(timer), if timer.is_some() => {}
            }
            // Group commit: fold whatever else is ready into this batch.
            let mut n = 0;
            while n < self.max_batch_inputs {
                if let Some((ticket, decision)) = self
                    .apply
                    .as_mut()
                    .and_then(|a| a.decisions.try_recv().ok())
                {
                    self.on_decision(ticket, decision);
                    n += 1;
                    continue;
                }
                if let Ok(i) = self.incoming.try_recv() {
                    self.on_incoming(i);
                    n += 1;
                    continue;
                }
                match self.commands.try_recv() {
                    Ok(c) => {
                        if !self.on_command(c) {
                            self.drain_before_stop().await?;
                            return Ok(());
                        }
                        n += 1;
                    }
                    Err(_) => break,
                }
            }
            // C-ND-3: due timers are served on every turn, whatever else
            // was ready, so a flood of commands, frames or commits can
            // never hold a retry or an escalation past its deadline.
            self.serve_timers();
            self.pump();
        }
    }

    /// Runs the agent's timers that are due now (the receiver's: apply
    /// requests whose deadline passed undecided), then offers the lease
    /// renewals due.
    fn serve_timers(&mut self) {
        let now = self.now();
        self.core.handle_timeout(now);
        self.renew_leases(now);
    }

    /// Hands the receiver's new apply requests to the agent: to the
    /// asynchronous applier (bounded concurrency, queued beyond it), or
    /// answered at once by the synchronous one.
    fn dispatch_requests(&mut self) {
        let now = self.now();
        let Some(apply) = self.apply.as_mut() else {
            self.core
                .receiver_mut()
                .answer_requests_with(now, self.applier.as_mut());
            return;
        };
        while let Some(req) = self.core.receiver_mut().poll_apply_request() {
            apply.queue.push_back(req);
        }
        apply.start_ready();
    }

    /// A decision (or its absence: the applier's task ended without one)
    /// comes back as an input to the receiver.
    fn on_decision(&mut self, ticket: ApplyTicket, decision: Option<ApplyDecision>) {
        let now = self.now();
        if let Some(a) = self.apply.as_mut() {
            a.running = a.running.saturating_sub(1);
            while a.tasks.try_join_next().is_some() {}
        }
        match decision {
            Some(d) => match self.core.receiver_mut().decide(now, ticket, d) {
                Ok(got) => tracing::debug!(%ticket, ?got, "decision recorded"),
                // Declined `expired` while the agent thought, or withdrawn
                // by a completion: nothing to record.
                Err(e @ CompleteError::UnknownTicket(_)) => {
                    tracing::debug!(error = %e, "late decision ignored")
                }
                Err(e) => tracing::warn!(error = %e, "decision refused"),
            },
            None => {
                tracing::warn!(%ticket, "applier gave no decision; the redelivery asks again");
                self.core.receiver_mut().abandon_request(ticket);
            }
        }
    }

    /// Waits for the commit in flight and the last batch before stopping.
    async fn drain_before_stop(&mut self) -> Result<(), NodeError> {
        for _ in 0..2 {
            self.pump();
            if self.in_flight {
                match self.commit_done.recv().await {
                    Some(d) => self.on_committed(d)?,
                    None => return Err(NodeError::Stopped),
                }
            }
        }
        self.pump();
        Ok(())
    }

    /// Starts a commit if none is in flight, then releases what is
    /// committed.
    fn pump(&mut self) {
        self.dispatch_requests();
        if !self.in_flight {
            let c = self.core.custodian_mut().poll_records();
            let r = self.core.receiver_mut().poll_records();
            if c.is_some() || r.is_some() {
                let records = c.as_ref().map_or(0, |b| b.records.len())
                    + r.as_ref().map_or(0, |b| b.records.len());
                let job = CommitJob {
                    now: self.now(),
                    custodian: c.map(|b| {
                        let t = b.token();
                        (b.records, t)
                    }),
                    receiver: r.map(|b| {
                        let t = b.token();
                        (b.records, t)
                    }),
                };
                if self.store.send(Job::Commit(job)).is_ok() {
                    self.in_flight = true;
                    self.gate.job_sent(records as u64);
                }
            }
        }
        self.release();
    }

    fn on_committed(&mut self, d: CommitDone) -> Result<(), NodeError> {
        self.in_flight = false;
        // The committed records, dropped here on the thread that made them
        // (see `CommitDone::spent`).
        drop(d.spent);
        if let Err(e) = d.result {
            // Nothing that depends on this batch was released; stop rather
            // than run without durability.
            return Err(NodeError::Store(e));
        }
        self.metrics.commits += 1;
        self.metrics.commit_batch_records.record(d.records as u64);
        self.metrics.commit_latency_us.record(d.micros);
        if let Some(t) = d.custodian {
            self.core.custodian_mut().handle_committed(t);
        }
        if let Some(t) = d.receiver {
            self.core.receiver_mut().handle_committed(t);
        }
        let replies = self.gate.job_done();
        // Release first: a held reply may report what this commit released
        // (an outcome whose event just went out).
        self.pump();
        for reply in replies {
            reply(self);
        }
        Ok(())
    }

    /// Sends `reply` once every record emitted so far is durable (C-ND-2).
    fn after_commit(&mut self, reply: Held<Driver>) {
        let uncommitted = self.core.custodian().uncommitted_records()
            + self.core.receiver().uncommitted_records();
        if let Some(now) = self.gate.hold(uncommitted, reply) {
            now(self);
        }
    }

    /// A success waits for its records; a refusal changed nothing and is
    /// answered at once.
    fn reply_after_commit<T: Send + 'static>(
        &mut self,
        reply: oneshot::Sender<Result<T, NodeError>>,
        r: Result<T, NodeError>,
    ) {
        match r {
            Ok(v) => self.after_commit(Box::new(move |_: &Driver| {
                let _ = reply.send(Ok(v));
            })),
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }
}

async fn sleep_until(t: Option<tokio::time::Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending::<()>().await,
    }
}
