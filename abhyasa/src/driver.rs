//! The driver: one tokio task owns the custodian and the receiver, feeds
//! them inputs, arms one timer for the next timeout, and runs the
//! write-ahead pipeline: records go to the store thread as one group
//! commit; what depends on them is released only when it returns.

use std::collections::VecDeque;
use std::sync::Arc;

use abhyasa_core::custody::{
    AckDisposition, Applier, ApplyDecision, ApplyRequest, ApplyTicket, CompleteError, Custodian,
    CustodianEvent, ExternalOutcome, Offered, Received, Receiver, ReceiverEvent, TerminalState,
    TerminalSummary, Transmit,
};
use abhyasa_core::principal::{Authorization, Resolution};
use abhyasa_core::wire::{shape, Envelope, Message, ProtocolError};
use abhyasa_core::{
    AgentId, DeclineReason, GovernedKey, GuardOutcome, Map, Obligation, ObligationId, Sequence,
    Timestamp,
};
use abhyasa_transport::{Incoming, SendError, TransportHandle};
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::api::{CustodianState, NodeError, NodeEvent, Outcome, StatusView};
use crate::applier::AsyncApplierHandle;
use crate::clock::Clock;
use crate::gate::{Held, ReplyGate};
use crate::metrics::MetricsSnapshot;
use crate::store_thread::{CommitDone, CommitJob, Job, StoreJobs};

/// Full outcomes kept for callers that ask after the transfer ended.
const RECENT_OUTCOMES: usize = 65_536;
/// Most peer ids `Driver::own_peer_id` keeps copies of.
const PEER_IDS_MAX: usize = 4096;
/// Outcome waiters tolerated before the first sweep of abandoned ones.
const OUTCOME_WAITERS_FLOOR: usize = 1024;

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
    Metrics {
        reply: oneshot::Sender<MetricsSnapshot>,
    },
    /// C-ND-5: compaction is an input (see `compaction.rs`).
    Compact {
        retention: std::time::Duration,
        reply: oneshot::Sender<crate::compaction::Started>,
    },
    Shutdown {
        reply: oneshot::Sender<()>,
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

pub(crate) struct Driver {
    agent: AgentId,
    custodian: Custodian,
    receiver: Receiver,
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
    /// Principal-side lease renewals: a timer source served
    /// every turn like the custodian's and the receiver's.
    renewals: abhyasa_core::custody::renewal::Renewals,
    shutdown: Option<oneshot::Sender<()>>,
}

impl Driver {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        agent: AgentId,
        custodian: Custodian,
        receiver: Receiver,
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
        let renewals = abhyasa_core::custody::renewal::Renewals::new(
            custodian.config().seed,
            std::time::Duration::ZERO,
            None,
        );
        Self {
            agent,
            custodian,
            receiver,
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
            renewals,
            shutdown: None,
        }
    }

    /// Uses `renewals` as the lease renewal scheduler (built from the
    /// node's options: seed, skew margin, revocation deadline).
    pub(crate) fn with_renewals(
        mut self,
        renewals: abhyasa_core::custody::renewal::Renewals,
    ) -> Self {
        self.renewals = renewals;
        self
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
        tracing::info!(pending = self.custodian.pending_len(), "node started");
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
            let next = [
                self.custodian.poll_timeout(),
                self.receiver.poll_timeout(),
                self.renewals.poll_timeout(),
            ]
            .into_iter()
            .flatten()
            .min();
            let timer = next.map(|t| {
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

    /// Runs the custodian's and the receiver's timers that are due now
    /// (the receiver's: apply requests whose deadline passed undecided).
    fn serve_timers(&mut self) {
        let now = self.now();
        if self.custodian.poll_timeout().is_some_and(|t| t <= now) {
            self.custodian.handle_timeout(now);
        }
        if self.receiver.poll_timeout().is_some_and(|t| t <= now) {
            self.receiver.handle_timeout(now);
        }
        if self.renewals.poll_timeout().is_some_and(|t| t <= now) {
            self.renew_leases(now);
        }
    }

    /// Offers the lease renewals due now. Each is a grant
    /// offered like any other: best-effort, and released only after the
    /// record of its sequence commits (write-ahead).
    fn renew_leases(&mut self, now: Timestamp) {
        for (key, renewal) in self.renewals.poll_renewals(now, self.custodian.principal()) {
            let bytes = match self.admit_bytes(&renewal) {
                Ok(n) => n,
                Err(e) => {
                    tracing::debug!(%key, error = %e, "lease renewal deferred");
                    self.renewals.skipped(now, key, true);
                    continue;
                }
            };
            let id = renewal.id().clone();
            let target = renewal.target().clone();
            match self.custodian.offer(now, renewal.clone()) {
                Ok(Offered::BestEffort | Offered::Custody { .. }) => {
                    tracing::debug!(%key, %id, sequence = ?renewal.sequence(), "lease renewed");
                    self.unreleased.add(id, target, bytes);
                    self.renewals.renewed(key, renewal);
                }
                other => {
                    tracing::warn!(%key, %id, result = ?other, "lease renewal refused; renewals stopped");
                    self.renewals.skipped(now, key, false);
                }
            }
        }
    }

    /// Hands the receiver's new apply requests to the agent: to the
    /// asynchronous applier (bounded concurrency, queued beyond it), or
    /// answered at once by the synchronous one.
    fn dispatch_requests(&mut self) {
        let now = self.now();
        let Some(apply) = self.apply.as_mut() else {
            self.receiver
                .answer_requests_with(now, self.applier.as_mut());
            return;
        };
        while let Some(req) = self.receiver.poll_apply_request() {
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
            Some(d) => match self.receiver.decide(now, ticket, d) {
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
                self.receiver.abandon_request(ticket);
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
            let c = self.custodian.poll_records();
            let r = self.receiver.poll_records();
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
            self.custodian.handle_committed(t);
        }
        if let Some(t) = d.receiver {
            self.receiver.handle_committed(t);
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

    /// Hands a frame to the transport. A frame it refuses was not sent
    /// (C-ND-4): a custody attempt is counted as refused (the schedule
    /// retries it), a best-effort obligation's offer is told so.
    fn send(&mut self, t: Transmit) {
        let obligation = match &t.message {
            Message::Obligation(o) => Some(o.id().clone()),
            _ => None,
        };
        if let Some(id) = &obligation {
            self.unreleased.release(id);
        }
        let Err(e) = self.send_split(&t.to, t.message) else {
            return;
        };
        self.metrics.frames_unsent += 1;
        match &e {
            SendError::QueueFull(_) => self.metrics.send_queue_full += 1,
            SendError::FrameTooLarge { .. } => self.metrics.send_too_large += 1,
            _ => self.metrics.send_not_connected += 1,
        }
        tracing::debug!(peer = %t.to, error = %e, "frame not sent");
        let Some(id) = obligation else {
            return;
        };
        if self.custodian.is_pending(&id) {
            self.custodian.handle_send_failed(&id);
        } else if self
            .custodian
            .terminal(&id)
            .is_some_and(|t| t.state == TerminalState::BestEffort)
        {
            self.refused_best_effort.insert(id, e);
        }
    }

    /// Sends `message`, splitting a coalesced frame the transport finds
    /// too large into halves until each fits (C-ND-4).
    fn send_split(&mut self, to: &AgentId, message: Message) -> Result<(), SendError> {
        let (transport, metrics) = (&self.transport, &mut self.metrics);
        let mut splits = 0;
        let sent = shape::send_in_parts(
            &self.agent,
            message,
            &mut |env: &Envelope| {
                transport.send(to, env)?;
                metrics.frames_out += 1;
                Ok(())
            },
            &|e: &SendError| matches!(e, SendError::FrameTooLarge { .. }),
            &mut splits,
        );
        self.metrics.frames_split += splits;
        sent
    }

    fn release(&mut self) {
        while let Some(t) = self.custodian.poll_transmit() {
            self.send(t);
        }
        while let Some(t) = self.receiver.poll_transmit() {
            self.send(t);
        }
        // Whether anyone listens, asked once per batch: a send takes the
        // channel's lock even with no receiver (~1% of a best-effort
        // obligation's CPU). A subscriber that joins during the
        // batch misses only events it could as well have missed by
        // subscribing a moment later; anything it does after subscribing
        // reaches this driver as a command, so its events come in a later
        // batch, which sees it.
        let listening = self.events.receiver_count() > 0;
        while let Some(e) = self.custodian.poll_event() {
            self.on_custodian_event(&e);
            if listening {
                let _ = self.events.send(NodeEvent::Custodian(e));
            }
        }
        while let Some(e) = self.receiver.poll_event() {
            match &e {
                ReceiverEvent::Applied { .. } => self.metrics.receiver_applied += 1,
                ReceiverEvent::Declined { reason, .. } => {
                    self.metrics.receiver_declined += 1;
                    if *reason == DeclineReason::Unauthorized {
                        self.metrics.receiver_unauthorized += 1;
                    }
                }
                _ => {}
            }
            tracing::debug!(event = ?e, "receiver");
            if listening {
                let _ = self.events.send(NodeEvent::Receiver(e));
            }
        }
    }

    fn on_custodian_event(&mut self, e: &CustodianEvent) {
        let done = |id: &ObligationId, state, attempts, reason, escalation| Outcome {
            obligation_id: id.clone(),
            state,
            attempts,
            reason,
            escalation,
        };
        let (id, outcome) = match e {
            CustodianEvent::Opened {
                obligation_id,
                deadline_at,
            } => {
                tracing::info!(id = %obligation_id, %deadline_at, "custody opened");
                self.answer_offer(
                    obligation_id,
                    Offered::Custody {
                        deadline_at: *deadline_at,
                    },
                );
                return;
            }
            CustodianEvent::BestEffortSent { obligation_id, .. } => {
                // The one send happened just before this event: if the
                // transport refused it, nothing left and the caller is told.
                let attempts = match self.refused_best_effort.remove(obligation_id) {
                    Some(reason) => {
                        self.metrics.best_effort_refused += 1;
                        tracing::info!(id = %obligation_id, %reason, "best-effort obligation not sent");
                        self.answer_offer_with(obligation_id, || {
                            Err(NodeError::NotSent {
                                obligation_id: obligation_id.clone(),
                                reason: reason.clone(),
                            })
                        });
                        0
                    }
                    None => {
                        self.answer_offer(obligation_id, Offered::BestEffort);
                        1
                    }
                };
                (
                    obligation_id.clone(),
                    done(
                        obligation_id,
                        TerminalState::BestEffort,
                        Some(attempts),
                        None,
                        None,
                    ),
                )
            }
            CustodianEvent::Applied {
                obligation_id,
                attempts,
                latency,
                ..
            } => {
                tracing::info!(id = %obligation_id, attempts, "applied");
                self.metrics.record_ack_latency(*latency);
                (
                    obligation_id.clone(),
                    done(
                        obligation_id,
                        TerminalState::Applied,
                        Some(*attempts),
                        None,
                        None,
                    ),
                )
            }
            CustodianEvent::Declined {
                obligation_id,
                reason,
                ..
            } => {
                tracing::info!(id = %obligation_id, ?reason, "declined");
                (
                    obligation_id.clone(),
                    done(obligation_id, TerminalState::Declined, None, *reason, None),
                )
            }
            CustodianEvent::Escalated(esc) => {
                tracing::warn!(id = %esc.obligation_id, cause = %esc.cause, attempts = esc.attempts, "escalated; fail-safe applied");
                (
                    esc.obligation_id.clone(),
                    done(
                        &esc.obligation_id,
                        TerminalState::Escalated,
                        Some(esc.attempts),
                        None,
                        Some(esc.clone()),
                    ),
                )
            }
            other => {
                tracing::debug!(event = ?other, "custodian");
                return;
            }
        };
        if let Some(ws) = self.outcome_waiters.remove(&id) {
            self.outcome_waiter_count = self.outcome_waiter_count.saturating_sub(ws.len());
            for w in ws {
                let _ = w.send(Ok(outcome.clone()));
            }
        }
        // A caller may ask after the transfer ended (on a fast link, even
        // before `offer` returned to it): keep the full outcome a while —
        // unless the terminal summary already says all of it (an applied
        // transfer, a best-effort send that went out), which `WaitOutcome`
        // reads instead: no insert and eviction per obligation, and the
        // same answer after the cache would have let it go or a restart.
        if self
            .custodian
            .terminal(&id)
            .is_some_and(|t| summary_tells(t, &outcome))
        {
            return;
        }
        if self.recent.insert(id.clone(), outcome).is_none() {
            self.recent_order.push_back(id);
            if self.recent_order.len() > RECENT_OUTCOMES {
                if let Some(old) = self.recent_order.pop_front() {
                    self.recent.remove(&old);
                }
            }
        }
    }

    /// This driver's own copy of `peer`, the id its link gave a frame.
    /// The link's copy is shared with the link's reader and writer
    /// threads, and a frame's handling clones its sender's id into ledger
    /// keys, records, acks and events: every clone and drop of a shared
    /// copy is an atomic write to a cache line those threads use too
    ///. The copies are few (one per peer that sent a frame)
    /// and dropped all at once past `PEER_IDS_MAX`.
    fn own_peer_id(&mut self, peer: AgentId) -> AgentId {
        if let Some(own) = self.peer_ids.get(&peer) {
            return own.clone();
        }
        if self.peer_ids.len() >= PEER_IDS_MAX {
            self.peer_ids.clear();
        }
        // A fresh copy of text already validated.
        let Ok(own) = AgentId::new(peer.as_str()) else {
            return peer;
        };
        self.peer_ids.insert(own.clone(), own.clone());
        own
    }

    fn answer_offer(&mut self, id: &ObligationId, offered: Offered) {
        self.answer_offer_with(id, || Ok(offered.clone()));
    }

    fn answer_offer_with(
        &mut self,
        id: &ObligationId,
        answer: impl Fn() -> Result<Offered, NodeError>,
    ) {
        if let Some(ws) = self.offer_waiters.remove(id) {
            for w in ws {
                let _ = w.send(answer());
            }
        }
    }

    fn on_incoming(&mut self, i: Incoming) {
        let now = self.now();
        match i {
            Incoming::Frame { peer, envelope } => {
                self.metrics.frames_in += 1;
                let peer = self.own_peer_id(peer);
                self.on_message(now, &peer, envelope.message);
            }
            Incoming::Malformed { peer, error } => {
                self.metrics.frames_bad += 1;
                if let Some(held) = self.peer_warnings.allow() {
                    tracing::warn!(%peer, %error, held_back = held, "malformed frame");
                }
                let reply = ProtocolError::from_peer_error(&error);
                self.send(Transmit {
                    to: peer.clone(),
                    message: Message::Error(reply),
                });
                let _ = self.events.send(NodeEvent::PeerMisbehaved {
                    peer,
                    what: error.to_string(),
                });
            }
            Incoming::Unauthorized { peer, claimed } => {
                self.metrics.frames_bad += 1;
                if let Some(held) = self.peer_warnings.allow() {
                    tracing::warn!(%peer, %claimed, held_back = held, "frame with a foreign sender dropped");
                }
                let _ = self.events.send(NodeEvent::PeerMisbehaved {
                    peer,
                    what: format!("claimed to be {claimed}"),
                });
            }
            Incoming::Connected(peer) => {
                tracing::info!(%peer, "peer up");
                // Ask at once what became of what we hold for it, so a
                // healed partition discharges without waiting for backoff.
                for t in self.custodian.status_queries(&peer) {
                    self.send(t);
                }
                let _ = self.events.send(NodeEvent::PeerUp(peer));
            }
            Incoming::Disconnected(peer) => {
                tracing::info!(%peer, "peer down");
                let _ = self.events.send(NodeEvent::PeerDown(peer));
            }
            Incoming::RelayRefused {
                peer,
                destination,
                obligation_id,
                code,
                retry_after_seconds,
                ..
            } => {
                // Hop acceptance only: surfaced, never handed to the
                // custodian, which keeps its schedule (spec §7).
                self.metrics.relay_refused += 1;
                let _ = self.events.send(NodeEvent::RelayRefused {
                    relay: peer,
                    destination,
                    obligation_id,
                    code,
                    retry_after_seconds,
                });
            }
            other => tracing::debug!(?other, "transport"),
        }
    }

    fn on_message(&mut self, now: Timestamp, peer: &AgentId, m: Message) {
        match m {
            Message::Obligation(o) => {
                let got = if self.apply.is_some() {
                    // Asked in `pump`, answered later as an input.
                    self.receiver.receive(now, peer, o)
                } else {
                    self.receiver
                        .handle_obligation(now, peer, o, self.applier.as_mut())
                };
                tracing::debug!(%peer, ?got, "obligation received");
            }
            Message::Acks(acks) => {
                for a in &acks {
                    let d = self.custodian.handle_ack(now, peer, a);
                    if let AckDisposition::Ignored(why) = d {
                        if let Some(held) = self.peer_warnings.allow() {
                            tracing::warn!(%peer, id = %a.obligation_id, ?why, held_back = held, "ack ignored");
                        }
                    }
                }
            }
            Message::StatusQuery(ids) => self.receiver.handle_status_query(now, peer, &ids),
            Message::StatusReply(r) => self.custodian.handle_status_reply(now, peer, &r),
            Message::Error(e) => {
                if let Some(held) = self.peer_warnings.allow() {
                    tracing::warn!(%peer, code = ?e.code, message = %e.message, held_back = held, "peer reported an error");
                }
                self.custodian.handle_error(now, peer, &e);
            }
            // A relayed link (abhyasa-spool) consumes relay messages before
            // they reach the driver; one that gets here came over a plain
            // link and is answered as a peer without relay support would.
            Message::Relay(_) => {
                self.metrics.frames_bad += 1;
                self.send(Transmit {
                    to: peer.clone(),
                    message: Message::Error(ProtocolError::from_peer_error(
                        &abhyasa_core::PeerError::UnknownMessageType,
                    )),
                });
            }
        }
    }

    /// Returns false on shutdown.
    fn on_command(&mut self, c: Command) -> bool {
        let now = self.now();
        match c {
            Command::Offer { obligation, reply } => {
                let id = obligation.id().clone();
                let target = obligation.target().clone();
                let bytes = match self.admit_bytes(&obligation) {
                    Ok(n) => n,
                    Err(e) => {
                        // Nothing was accepted (C-ND-4).
                        let _ = reply.send(Err(e));
                        return true;
                    }
                };
                // An offer the custodian already knows is an
                // idempotent repeat and concerns no renewal chain. (Asked
                // only when it might concern one: two lookups the offer
                // itself repeats.)
                let known =
                    || self.custodian.is_pending(&id) || self.custodian.terminal(&id).is_some();
                let admitted = if !self.renewals.may_concern(&obligation) || known() {
                    abhyasa_core::custody::renewal::Admitted::none()
                } else {
                    match self.renewals.admit(self.custodian.registry(), &obligation) {
                        Ok(a) => a,
                        Err(e) => {
                            tracing::info!(%id, error = %e, "offer refused");
                            let _ = reply.send(Err(e.into()));
                            return true;
                        }
                    }
                };
                let copy = admitted.concerns_renewals().then(|| obligation.clone());
                match self.custodian.offer(now, obligation) {
                    Ok(Offered::Custody { .. } | Offered::BestEffort) => {
                        if let Some(ob) = copy {
                            self.renewals
                                .accepted(admitted, &ob, self.custodian.principal());
                            while let Some(w) = self.renewals.poll_warning() {
                                tracing::warn!(key = %w.key, id = %w.obligation_id, "{}", w.message);
                            }
                        }
                        self.unreleased.add(id.clone(), target, bytes);
                        // Answered once the record is durable.
                        self.offer_waiters.entry(id).or_default().push(reply);
                    }
                    Ok(Offered::AlreadyPending) if self.offer_waiters.contains_key(&id) => {
                        // The first offer's record is still in flight: a
                        // retrying caller gets the first offer's answer,
                        // when (and only if) it commits (C-ND-2).
                        self.offer_waiters.entry(id).or_default().push(reply);
                    }
                    Ok(other) => {
                        // Pending (durable: its first answer went out) or
                        // terminal (its close may still be in flight).
                        self.after_commit(Box::new(move |_: &Driver| {
                            let _ = reply.send(Ok(other));
                        }));
                    }
                    Err(e) => {
                        tracing::info!(%id, error = %e, "offer refused");
                        let _ = reply.send(Err(NodeError::Offer(e)));
                    }
                }
            }
            Command::WaitOutcome { id, reply } => {
                if let Some(o) = self.recent.get(&id) {
                    let _ = reply.send(Ok(o.clone()));
                } else if self.custodian.is_pending(&id) || self.offer_waiters.contains_key(&id) {
                    self.add_outcome_waiter(id, reply);
                } else if let Some(t) = self.custodian.terminal(&id) {
                    let o = summary_outcome(t);
                    // Only a durable terminal state is reported (C-ND-2),
                    // in full if its close was the commit waited for.
                    self.after_commit(Box::new(move |d: &Driver| {
                        let full = d.recent.get(&o.obligation_id).cloned();
                        let _ = reply.send(Ok(full.unwrap_or(o)));
                    }));
                } else {
                    let _ = reply.send(Err(NodeError::UnknownObligation(id)));
                }
            }
            Command::Status { id, reply } => {
                let custodian = if self.custodian.is_pending(&id) {
                    Some(CustodianState::Pending)
                } else {
                    self.custodian
                        .terminal(&id)
                        .map(|t| CustodianState::from(t.state))
                };
                let mut receiver = Vec::new();
                let mut declines = Vec::new();
                for peer in self.transport.known_peers() {
                    if let Some(o) = self.receiver.ledger_outcome(&peer, &id) {
                        if let Some((reason, detail)) = self.receiver.ledger_decline(&peer, &id) {
                            declines.push((peer.clone(), reason, detail));
                        }
                        receiver.push((peer, o));
                    }
                }
                let view = StatusView {
                    obligation_id: id.clone(),
                    custodian,
                    attempts: self.custodian.attempts(&id).or_else(|| {
                        self.custodian
                            .terminal(&id)
                            .and_then(TerminalSummary::known_attempts)
                    }),
                    deadline_at: self.custodian.pending_deadline(&id),
                    receiver,
                    declines,
                };
                // What the view says is durable before it is shown (C-ND-2).
                self.after_commit(Box::new(move |_: &Driver| {
                    let _ = reply.send(view);
                }));
            }
            Command::Decide {
                key,
                state,
                sequence,
                reply,
            } => {
                let g = self.custodian.decide(now, &key, state, sequence);
                // C-ND-2: answered once its `Record::Principal` commits.
                self.after_commit(Box::new(move |_: &Driver| {
                    let _ = reply.send(g);
                }));
            }
            Command::Resolve {
                id,
                resolution,
                reply,
            } => {
                let r = self
                    .custodian
                    .resolve_decision(now, &id, resolution)
                    .ok_or(NodeError::UnknownDecisionItem(id));
                self.reply_after_commit(reply, r);
            }
            Command::Complete {
                custodian,
                id,
                decision,
                reply,
            } => {
                let r = self
                    .receiver
                    .complete_deferred(now, &custodian, &id, decision)
                    .map_err(NodeError::from);
                self.reply_after_commit(reply, r);
            }
            Command::External {
                custodian,
                id,
                outcome,
                reply,
            } => {
                let r = self
                    .receiver
                    .handle_external_outcome(now, &custodian, &id, outcome)
                    .map_err(NodeError::from);
                self.reply_after_commit(reply, r);
            }
            Command::Metrics { reply } => {
                self.metrics
                    .absorb_custodian(self.custodian.stats(), self.custodian.pending_len());
                self.metrics.outcome_waiters = self.outcome_waiter_count as u64;
                self.metrics.replies_held = self.gate.held() as u64;
                let _ = reply.send(self.metrics.clone());
            }
            Command::Compact { retention, reply } => {
                let (c, r) = (&mut self.custodian, &mut self.receiver);
                let _ = reply.send(crate::compaction::start(now, retention, c, r, &self.store));
            }
            Command::Authorized { key, reply } => {
                // Read after what is in flight commits (C-ND-2): a grant
                // is never reported that a crash could still undo.
                self.after_commit(Box::new(move |d: &Driver| {
                    let _ = reply.send(d.receiver.authority(&key, d.now()));
                }));
            }
            Command::Leases { reply } => {
                self.after_commit(Box::new(move |d: &Driver| {
                    let views = d
                        .receiver
                        .leases(d.now())
                        .into_iter()
                        .map(|(k, until, a)| crate::leases::LeaseView::new(k, until, a))
                        .collect();
                    let _ = reply.send(views);
                }));
            }
            Command::Renewals { reply } => {
                // The latest renewal shown is durable (C-ND-2).
                self.after_commit(Box::new(move |d: &Driver| {
                    let _ = reply.send(d.renewals.views());
                }));
            }
            Command::LeaseWarnings { reply } => {
                let _ = reply.send(self.renewals.warnings());
            }
            Command::Shutdown { reply } => {
                self.shutdown = Some(reply);
                return false;
            }
        }
        true
    }
}

impl Driver {
    /// The encoded size of `ob`'s first attempt, or `Backpressure` when the
    /// send queue towards its target (queued plus accepted and not yet
    /// released) would pass three quarters of its byte budget: the rest is
    /// headroom for retries and acks, so the queue refuses nothing an
    /// accepted offer depends on (C-ND-4). An empty queue takes any frame.
    fn admit_bytes(&self, ob: &Obligation) -> Result<usize, NodeError> {
        let size = Envelope::obligation_len(&self.agent, ob);
        let peer = ob.target();
        let queued = self.transport.queued_bytes(peer) + self.unreleased.to(peer);
        let limit = self.transport.send_queue_budget() / 4 * 3;
        if queued > 0 && queued.saturating_add(size) > limit {
            return Err(NodeError::Backpressure {
                peer: peer.clone(),
                queued_bytes: queued,
                limit,
            });
        }
        Ok(size)
    }

    /// Sends `reply` once every record emitted so far is durable (C-ND-2).
    fn after_commit(&mut self, reply: Held<Driver>) {
        let uncommitted =
            self.custodian.uncommitted_records() + self.receiver.uncommitted_records();
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

    /// Registers an outcome waiter. A caller that gives up drops its
    /// receiver; abandoned senders are swept whenever the count doubles
    /// past the last sweep, so they cost amortised O(1) and never pile up
    /// (C-ND-5).
    fn add_outcome_waiter(
        &mut self,
        id: ObligationId,
        reply: oneshot::Sender<Result<Outcome, NodeError>>,
    ) {
        self.outcome_waiters.entry(id).or_default().push(reply);
        self.outcome_waiter_count += 1;
        if self.outcome_waiter_count > self.outcome_sweep_at {
            self.outcome_waiters.retain(|_, ws| {
                ws.retain(|w| !w.is_closed());
                !ws.is_empty()
            });
            self.outcome_waiter_count = self.outcome_waiters.values().map(Vec::len).sum();
            self.outcome_sweep_at = (2 * self.outcome_waiter_count).max(OUTCOME_WAITERS_FLOOR);
        }
    }
}

/// Bytes of first attempts accepted by `offer` and not yet handed to the
/// transport, per target.
#[derive(Debug, Default)]
struct Unreleased {
    by_id: Map<ObligationId, (AgentId, usize)>,
    by_peer: Map<AgentId, usize>,
}

impl Unreleased {
    fn add(&mut self, id: ObligationId, peer: AgentId, bytes: usize) {
        *self.by_peer.entry(peer.clone()).or_default() += bytes;
        self.by_id.insert(id, (peer, bytes));
    }

    fn release(&mut self, id: &ObligationId) {
        if let Some((peer, bytes)) = self.by_id.remove(id) {
            if let Some(n) = self.by_peer.get_mut(&peer) {
                *n = n.saturating_sub(bytes);
                if *n == 0 {
                    self.by_peer.remove(&peer);
                }
            }
        }
    }

    fn to(&self, peer: &AgentId) -> usize {
        self.by_peer.get(peer).copied().unwrap_or(0)
    }
}

/// The asynchronous apply path: requests waiting for a slot, tasks
/// running, and the channel their decisions come back on.
struct AsyncApply {
    applier: AsyncApplierHandle,
    queue: VecDeque<ApplyRequest>,
    running: usize,
    /// Dropped with the driver, which aborts decisions still running:
    /// nothing durable was written for them.
    tasks: tokio::task::JoinSet<()>,
    decided: mpsc::UnboundedSender<(ApplyTicket, Option<ApplyDecision>)>,
    decisions: mpsc::UnboundedReceiver<(ApplyTicket, Option<ApplyDecision>)>,
}

impl AsyncApply {
    fn new(applier: AsyncApplierHandle) -> Self {
        let (decided, decisions) = mpsc::unbounded_channel();
        Self {
            applier,
            queue: VecDeque::new(),
            running: 0,
            tasks: tokio::task::JoinSet::new(),
            decided,
            decisions,
        }
    }

    /// Starts queued requests while fewer than the concurrency run. The
    /// queue is bounded by the receiver's outstanding-request quota.
    fn start_ready(&mut self) {
        while self.running < self.applier.concurrency() {
            let Some(req) = self.queue.pop_front() else {
                return;
            };
            let answer = Answer {
                ticket: req.ticket,
                to: Some(self.decided.clone()),
            };
            let fut = self.applier.start(req);
            self.running += 1;
            self.tasks.spawn(async move {
                let decision = fut.await;
                answer.send(decision);
            });
        }
    }
}

/// Sends the decision back; if the task ends without one (the applier
/// panicked), says so, so the slot and the request are released.
struct Answer {
    ticket: ApplyTicket,
    to: Option<mpsc::UnboundedSender<(ApplyTicket, Option<ApplyDecision>)>>,
}

impl Answer {
    fn send(mut self, decision: ApplyDecision) {
        if let Some(to) = self.to.take() {
            let _ = to.send((self.ticket, Some(decision)));
        }
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if let Some(to) = self.to.take() {
            let _ = to.send((self.ticket, None));
        }
    }
}

async fn recv_decision(
    apply: &mut Option<AsyncApply>,
) -> Option<(ApplyTicket, Option<ApplyDecision>)> {
    match apply {
        Some(a) => a.decisions.recv().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(t: Option<tokio::time::Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending::<()>().await,
    }
}

/// The outcome a terminal summary tells on its own: the state and the
/// attempts (an applied transfer, a best-effort send). What an event adds
/// to it (a decline's reason, an escalation, a best-effort send the
/// transport refused) is kept in `Driver::recent` for a while.
fn summary_outcome(t: &TerminalSummary) -> Outcome {
    Outcome {
        obligation_id: t.obligation_id.clone(),
        state: t.state,
        attempts: t.known_attempts(),
        reason: None,
        escalation: None,
    }
}

/// Whether `summary_outcome(t)` is `o`, without building it: building
/// it would bump the count of an id the store thread is reading (the
/// close record in flight holds the same one).
fn summary_tells(t: &TerminalSummary, o: &Outcome) -> bool {
    o.reason.is_none()
        && o.escalation.is_none()
        && o.state == t.state
        && o.attempts == t.known_attempts()
        && o.obligation_id == t.obligation_id
}
