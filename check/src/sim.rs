//! A seeded abstract lossy channel between one custodian and one receiver,
//! in virtual time, with every transfer checked by [`crate::check()`].
//!
//! This is the deliver-or-report sweep of the conformance suite (C-DOR-1..3)
//! and the engine of `abhyasa-sim sweep`'s core model. Transfer `i` of a
//! sweep with seed `s` draws everything it needs (link rates, the
//! receiver's decision, every loss and delay) from ChaCha8 stream `i` of
//! seed `s`, so transfers are independent: a sweep can be split across
//! threads or machines and merged into exactly the result of one run.
//!
//! Each transfer's ground truth — the applier's applications, the ledger
//! records the receiver committed, the custodian's close record and
//! principal state around the offer — becomes a [`Trace`], so the sweep
//! checks the same rules as netsim's drivers, the principal-side AB-4 and
//! declined ≠ applied rules included.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::Duration;

use abhyasa_core::custody::{
    Applier, ApplyContext, ApplyDecision, ClosedRecord, Custodian, CustodianConfig, CustodianEvent,
    CustodyOutcome, CustodyProfile, LedgerOutcome, Receiver, ReceiverConfig, Record, TerminalState,
    Transmit,
};
use abhyasa_core::model::{AgentId, DeclineReason, Obligation, RetryBackoff, Timestamp};
use abhyasa_core::polarity::{Admission, PolarityRegistry, PHALA_KIND};
use abhyasa_core::principal::PrincipalWrite;
use abhyasa_core::wire::Message;
use abhyasa_core::Escalation;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use crate::checker::{check, Invariant, Violation};
use crate::trace::{
    Application, AppliedByApplier, Offer, Outcome, PrincipalProbe, PrincipalSequence, Terminal,
    Trace,
};

/// Loss model of one transfer's link.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkProfile {
    /// Probability an obligation frame is lost.
    pub drop: f64,
    /// Probability a delivered obligation frame is delivered twice.
    pub duplicate: f64,
    /// Probability an ack frame is lost.
    pub ack_drop: f64,
    /// Probability a frame is held back (reordered behind later frames).
    pub reorder: f64,
    /// One-way latency.
    pub latency: Duration,
    /// Largest extra delay of a reordered frame.
    pub reorder_delay: Duration,
}

impl LinkProfile {
    /// A lossless link.
    pub fn lossless() -> Self {
        Self {
            drop: 0.0,
            duplicate: 0.0,
            ack_drop: 0.0,
            reorder: 0.0,
            latency: Duration::from_millis(20),
            reorder_delay: Duration::from_secs(5),
        }
    }

    /// A link that loses everything.
    pub fn partitioned() -> Self {
        Self {
            drop: 1.0,
            ack_drop: 1.0,
            ..Self::lossless()
        }
    }
}

/// What the simulated receiver decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimDecision {
    /// Apply.
    Apply,
    /// Decline (policy).
    Decline,
    /// Defer every time it is asked.
    Defer,
}

/// Sweep parameters.
#[derive(Clone, Debug)]
pub struct SweepConfig {
    /// Master seed.
    pub seed: u64,
    /// Deadline of every obligation, seconds.
    pub deadline_seconds: i64,
    /// `max_retries` of every obligation.
    pub max_retries: i64,
    /// Custodian backoff.
    pub backoff: RetryBackoff,
    /// Fraction of transfers that are benign (best-effort).
    pub benign_fraction: f64,
    /// Probability the receiver defers (the rest splits 2:1 apply:decline).
    pub defer_probability: f64,
    /// Fixed link instead of rates drawn uniformly in `[0, 1)` per transfer.
    pub fixed_link: Option<LinkProfile>,
}

impl Default for SweepConfig {
    fn default() -> Self {
        Self {
            seed: 20260609,
            deadline_seconds: 600,
            max_retries: 64,
            backoff: RetryBackoff {
                base: Duration::from_secs(1),
                cap: Duration::from_secs(64),
                jitter: 0.1,
            },
            benign_fraction: 0.1,
            defer_probability: 0.0,
            fixed_link: None,
        }
    }
}

/// A broken invariant, with the transfer that broke it.
#[derive(Clone, Debug, PartialEq)]
pub struct TransferViolation {
    /// Transfer index.
    pub transfer: u64,
    /// What broke, as the checker names it.
    pub violation: Violation,
}

impl TransferViolation {
    /// `invariant: detail`, for reports.
    pub fn what(&self) -> String {
        format!("{}: {}", self.violation.invariant, self.violation.detail)
    }
}

/// Aggregate outcome of a sweep (merge shards with [`SweepReport::merge`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SweepReport {
    /// Transfers run.
    pub transfers: u64,
    /// Ended applied.
    pub applied: u64,
    /// Ended declined.
    pub declined: u64,
    /// Ended escalated.
    pub escalated: u64,
    /// Benign, sent best-effort.
    pub best_effort: u64,
    /// Obligation transmissions, all transfers.
    pub total_attempts: u64,
    /// Escalated although the receiver applied (over-protection, allowed).
    pub spurious_escalations: u64,
    /// Late acks recorded for reconciliation.
    pub late_acks: u64,
    /// Invariant violations (must be empty).
    pub violations: Vec<TransferViolation>,
    /// Per-transfer terminal states, in transfer order (for replay checks).
    pub outcomes: Vec<TerminalState>,
}

impl SweepReport {
    /// Mean attempts per transfer.
    pub fn mean_attempts(&self) -> f64 {
        if self.transfers == 0 {
            0.0
        } else {
            self.total_attempts as f64 / self.transfers as f64
        }
    }

    /// Adds another shard's counts (shards must be merged in shard order
    /// for `outcomes` to be in transfer order).
    pub fn merge(&mut self, other: SweepReport) {
        self.transfers += other.transfers;
        self.applied += other.applied;
        self.declined += other.declined;
        self.escalated += other.escalated;
        self.best_effort += other.best_effort;
        self.total_attempts += other.total_attempts;
        self.spurious_escalations += other.spurious_escalations;
        self.late_acks += other.late_acks;
        self.violations.extend(other.violations);
        self.outcomes.extend(other.outcomes);
    }
}

/// The simulated receiver's applier: applies, declines or defers as told,
/// and logs every real application (ground truth for AB-3 and deadlines).
#[derive(Debug, Default)]
pub struct SimApplier {
    /// What to decide.
    pub decision: Option<SimDecision>,
    /// Every application since the log was last drained, in order.
    pub applied: Vec<AppliedByApplier>,
    /// The receiver this applier runs in.
    receiver: Option<AgentId>,
}

impl SimApplier {
    /// An applier for `receiver` that decides `decision`.
    pub fn new(receiver: AgentId, decision: SimDecision) -> Self {
        Self {
            decision: Some(decision),
            applied: Vec::new(),
            receiver: Some(receiver),
        }
    }
}

impl Applier for SimApplier {
    fn decide(&mut self, ctx: &ApplyContext<'_>, ob: &Obligation) -> ApplyDecision {
        match self.decision.unwrap_or(SimDecision::Apply) {
            SimDecision::Apply => {
                self.applied.push(AppliedByApplier {
                    receiver: self.receiver.clone().unwrap_or_else(|| ob.target().clone()),
                    custodian: ctx.custodian.clone(),
                    id: ob.id().clone(),
                    at: ctx.now,
                    deadline_at: ob.deadline_at(),
                });
                ApplyDecision::Apply(Vec::new())
            }
            SimDecision::Decline => ApplyDecision::Decline {
                reason: DeclineReason::Policy,
                detail: None,
            },
            SimDecision::Defer => ApplyDecision::Defer { detail: None },
        }
    }
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Hop {
    ToReceiver,
    ToCustodian,
}

/// One custodian, one receiver and the channel between them.
#[derive(Debug)]
pub struct Pair {
    /// The custodian.
    pub custodian: Custodian,
    /// The receiver.
    pub receiver: Receiver,
    /// The receiver's applier.
    pub applier: SimApplier,
    custodian_id: AgentId,
    receiver_id: AgentId,
    queue: BinaryHeap<Reverse<(Timestamp, u64, HopMsg)>>,
    seq: u64,
    /// Committed ground truth since the last transfer began.
    seen: Seen,
    /// Escalations the custodian raised since the last transfer began.
    escalations: Vec<Escalation>,
    /// Most channel and timer events one transfer may take.
    event_limit: Option<u64>,
}

/// What the pair's commits showed during one transfer.
#[derive(Debug, Default)]
struct Seen {
    /// `applied` ledger records the receiver committed.
    applications: Vec<Application>,
    /// Custody closes the custodian committed.
    closes: Vec<ClosedRecord>,
    /// Principal authorization writes the custodian committed.
    principal: Vec<PrincipalSequence>,
}

impl Seen {
    fn custodian_commit(&mut self, agent: &AgentId, records: &[Record]) {
        for r in records {
            let writes = match r {
                Record::CustodyOpened { principal, .. } => principal.as_slice(),
                Record::BestEffortSent { principal, .. } => principal.as_slice(),
                Record::CustodyClosed(c) => {
                    self.closes.push((**c).clone());
                    c.principal.as_slice()
                }
                Record::Principal { writes, .. } => writes.as_slice(),
                _ => &[],
            };
            for w in writes {
                if let PrincipalWrite::Authorization { key, entry } = w {
                    self.principal.push(PrincipalSequence {
                        custodian: agent.clone(),
                        key: key.clone(),
                        sequence: entry.sequence,
                    });
                }
            }
        }
    }

    fn receiver_commit(&mut self, agent: &AgentId, records: &[Record]) {
        for r in records {
            if let Record::Ledger(l) = r {
                if l.outcome == LedgerOutcome::Applied {
                    self.applications.push(Application {
                        receiver: agent.clone(),
                        custodian: l.custodian.clone(),
                        id: l.obligation_id.clone(),
                        at: l.recorded_at,
                        key_sequence: l.key_sequence.clone(),
                    });
                }
            }
        }
    }
}

#[derive(Debug)]
struct HopMsg(Hop, Message);

impl PartialEq for HopMsg {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl Eq for HopMsg {}
impl PartialOrd for HopMsg {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for HopMsg {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.cmp(&other.0)
    }
}

/// Result of one transfer.
#[derive(Clone, Debug, PartialEq)]
pub struct TransferResult {
    /// How it ended at the custodian (`None`: it did not end — a violation).
    pub outcome: Option<TerminalState>,
    /// Obligation transmissions.
    pub attempts: u64,
    /// Real applications at the receiver.
    pub applications: u32,
    /// A late ack was recorded.
    pub late_ack: bool,
    /// Ground truth of the transfer, for [`crate::check()`].
    pub trace: Trace,
    /// Why the custodian refused the offer (then `outcome` is `None`).
    pub refused: Option<String>,
    /// The transfer took more events than the pair's limit
    /// ([`Pair::with_event_limit`]) and was cut short.
    pub cut_short: bool,
    /// The escalations the custodian raised, in order.
    pub escalations: Vec<Escalation>,
    /// The virtual time of the last event.
    pub ended_at: Timestamp,
}

impl Pair {
    /// A pair with the standard registry: `custodian` and `receiver`.
    pub fn new(seed: u64, backoff: RetryBackoff) -> Self {
        let custodian_id = AgentId::new("custodian").unwrap_or_else(|_| unreachable!());
        let receiver_id = AgentId::new("receiver").unwrap_or_else(|_| unreachable!());
        Self::between(
            custodian_id,
            receiver_id,
            seed,
            CustodyProfile {
                backoff,
                ..CustodyProfile::default()
            },
        )
    }

    /// A pair with the standard registry between `custodian_id` and
    /// `receiver_id`; the custodian's jitter is seeded `seed` and its
    /// default profile is `profile`.
    pub fn between(
        custodian_id: AgentId,
        receiver_id: AgentId,
        seed: u64,
        profile: CustodyProfile,
    ) -> Self {
        let mut cc = CustodianConfig::new(custodian_id.clone());
        cc.seed = seed;
        cc.default_profile = profile;
        let mut rc = ReceiverConfig::new(receiver_id.clone());
        rc.skew_margin = Duration::from_secs(1);
        Self {
            custodian: Custodian::new(cc, PolarityRegistry::standard()),
            receiver: Receiver::new(rc, PolarityRegistry::standard()),
            applier: SimApplier::new(receiver_id.clone(), SimDecision::Apply),
            custodian_id,
            receiver_id,
            queue: BinaryHeap::new(),
            seq: 0,
            seen: Seen::default(),
            escalations: Vec::new(),
            event_limit: None,
        }
    }

    /// Cuts a transfer short after `events` channel and timer events (a
    /// deadline of years over a lossy link would otherwise run for
    /// minutes); [`TransferResult::cut_short`] says so.
    pub fn with_event_limit(mut self, events: u64) -> Self {
        self.event_limit = Some(events);
        self
    }

    /// The receiver's agent id.
    pub fn receiver_id(&self) -> &AgentId {
        &self.receiver_id
    }

    fn send(
        &mut self,
        now: Timestamp,
        t: Transmit,
        link: &LinkProfile,
        rng: &mut ChaCha8Rng,
    ) -> u64 {
        let (hop, loss) = if t.to == self.receiver_id {
            (Hop::ToReceiver, link.drop)
        } else {
            (Hop::ToCustodian, link.ack_drop)
        };
        let is_obligation = matches!(t.message, Message::Obligation(_));
        if rng.random::<f64>() < loss {
            return u64::from(is_obligation);
        }
        let copies = if hop == Hop::ToReceiver && rng.random::<f64>() < link.duplicate {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut at = now.saturating_add(link.latency);
            if rng.random::<f64>() < link.reorder {
                at = at.saturating_add(link.reorder_delay.mul_f64(rng.random::<f64>()));
            }
            self.seq += 1;
            let msg = HopMsg(
                if hop == Hop::ToReceiver {
                    Hop::ToReceiver
                } else {
                    Hop::ToCustodian
                },
                t.message.clone(),
            );
            self.queue.push(Reverse((at, self.seq, msg)));
        }
        u64::from(is_obligation)
    }

    /// Commits both sides' records (the abstract channel's store never
    /// crashes) and moves released transmits onto the channel. Returns the
    /// obligation transmissions.
    fn pump(&mut self, now: Timestamp, link: &LinkProfile, rng: &mut ChaCha8Rng) -> u64 {
        let mut sent = 0;
        loop {
            let mut moved = false;
            if let Some(b) = self.custodian.poll_records() {
                self.seen.custodian_commit(&self.custodian_id, &b.records);
                self.custodian.handle_committed(b.token());
            }
            if let Some(b) = self.receiver.poll_records() {
                self.seen.receiver_commit(&self.receiver_id, &b.records);
                self.receiver.handle_committed(b.token());
            }
            while let Some(t) = self.custodian.poll_transmit() {
                sent += self.send(now, t, link, rng);
                moved = true;
            }
            while let Some(t) = self.receiver.poll_transmit() {
                self.send(now, t, link, rng);
                moved = true;
            }
            while let Some(e) = self.custodian.poll_event() {
                if let CustodianEvent::Escalated(esc) = e {
                    self.escalations.push(*esc);
                }
            }
            while self.receiver.poll_event().is_some() {}
            if !moved {
                return sent;
            }
        }
    }

    /// Runs one obligation to the end of custody and drains the channel.
    pub fn run_transfer(
        &mut self,
        start: Timestamp,
        ob: Obligation,
        link: &LinkProfile,
        decision: SimDecision,
        rng: &mut ChaCha8Rng,
    ) -> TransferResult {
        self.applier.decision = Some(decision);
        self.applier.applied.clear();
        self.seen = Seen::default();
        self.escalations.clear();
        let id = ob.id().clone();
        let offer = Offer {
            custodian: self.custodian_id.clone(),
            id: id.clone(),
            admissible: matches!(
                self.custodian.registry().classify(&ob).map(|c| c.admission),
                Ok(Admission::Custody { .. })
            ),
            deadline_at: ob.deadline_at(),
            max_retries: u64::from(ob.max_retries()),
            sequence: ob.sequence(),
        };
        let late_before = self.custodian.stats().late_acks;
        let mut now = start;
        let mut attempts = 0;
        if let Err(e) = self.custodian.offer(now, ob) {
            // Refused: no terminal, so the checker reports the loss (AB-1).
            return TransferResult {
                outcome: None,
                attempts: 0,
                applications: 0,
                late_ack: false,
                trace: Trace {
                    offers: vec![offer],
                    ..Trace::default()
                },
                refused: Some(e.to_string()),
                cut_short: false,
                escalations: Vec::new(),
                ended_at: now,
            };
        }
        attempts += self.pump(now, link, rng);
        let mut events = 0u64;
        let mut cut_short = false;
        loop {
            let next_msg = self.queue.peek().map(|Reverse((t, _, _))| *t);
            let next_timer = self.custodian.poll_timeout();
            let next = match (next_msg, next_timer) {
                (None, None) => break,
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) => a,
                (None, Some(b)) => b,
            };
            events += 1;
            if self.event_limit.is_some_and(|limit| events > limit) {
                cut_short = true;
                break;
            }
            now = now.max(next);
            if next_msg.is_some_and(|t| t <= now) {
                if let Some(Reverse((_, _, HopMsg(hop, msg)))) = self.queue.pop() {
                    self.deliver(now, hop, msg);
                }
            } else {
                self.custodian.handle_timeout(now);
            }
            attempts += self.pump(now, link, rng);
        }
        let outcome = self.custodian.terminal(&id).map(|t| t.state);
        let seen = std::mem::take(&mut self.seen);
        let applier_applies = std::mem::take(&mut self.applier.applied);
        let applications = applier_applies.iter().filter(|a| a.id == id).count();
        let close = seen.closes.iter().find(|c| c.obligation_id == id);
        let terminal = outcome.map(|state| Terminal {
            custodian: self.custodian_id.clone(),
            id: id.clone(),
            outcome: match (state, close.map(|c| &c.outcome)) {
                (TerminalState::Applied, _) => Outcome::Applied,
                (TerminalState::Declined, Some(CustodyOutcome::Declined { reason, .. })) => {
                    Outcome::Declined(*reason)
                }
                (TerminalState::Declined, _) => Outcome::Declined(None),
                (TerminalState::Escalated, _) => Outcome::Escalated,
                (TerminalState::BestEffort, _) => Outcome::BestEffort,
            },
            attempts,
            escalation: close.and_then(|c| c.escalation.as_ref().map(|e| e.guard)),
            principal_writes: close.map(|c| c.principal.len()),
        });
        let ledger = self
            .receiver
            .ledger_outcome(&self.custodian_id, &id)
            .map(|l| ((self.custodian_id.clone(), id.clone()), l));
        let trace = Trace {
            offers: vec![offer],
            applier_applies,
            applications: Some(seen.applications),
            ledger: Some(ledger.into_iter().collect::<BTreeMap<_, _>>()),
            terminals: terminal.into_iter().collect(),
            probes: BTreeMap::new(),
            principal_writes: seen.principal,
            pending_at_end: Vec::new(),
            authority_writes: Vec::new(),
            latest_withholds: Vec::new(),
            latest_decisions: Vec::new(),
            superseded: Vec::new(),
        };
        TransferResult {
            outcome,
            attempts,
            applications: u32::try_from(applications).unwrap_or(u32::MAX),
            late_ack: self.custodian.stats().late_acks > late_before,
            trace,
            refused: None,
            cut_short,
            escalations: std::mem::take(&mut self.escalations),
            ended_at: now,
        }
    }

    fn deliver(&mut self, now: Timestamp, hop: Hop, msg: Message) {
        match (hop, msg) {
            (Hop::ToReceiver, Message::Obligation(o)) => {
                let from = self.custodian_id.clone();
                let _ = self
                    .receiver
                    .handle_obligation(now, &from, o, &mut self.applier);
            }
            (Hop::ToCustodian, Message::Acks(acks)) => {
                let from = self.receiver_id.clone();
                for a in &acks {
                    let _ = self.custodian.handle_ack(now, &from, a);
                }
            }
            (Hop::ToReceiver, Message::StatusQuery(ids)) => {
                let from = self.custodian_id.clone();
                self.receiver.handle_status_query(now, &from, &ids);
            }
            (Hop::ToCustodian, Message::Error(e)) => {
                let from = self.receiver_id.clone();
                self.custodian.handle_error(now, &from, &e);
            }
            (Hop::ToCustodian, Message::StatusReply(r)) => {
                let from = self.receiver_id.clone();
                self.custodian.handle_status_reply(now, &from, &r);
            }
            _ => {}
        }
    }

    /// Drains custodian events (for tests that inspect escalations).
    pub fn custodian_events(&mut self) -> Vec<CustodianEvent> {
        std::iter::from_fn(|| self.custodian.poll_event()).collect()
    }
}

/// The rng of transfer `index` of a sweep seeded `seed`.
pub fn transfer_rng(seed: u64, index: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(index);
    rng
}

/// Start instant of every transfer (virtual time).
pub const SIM_EPOCH: Timestamp = Timestamp::from_unix_seconds(1_780_000_000);

/// `weight_delta` of every admissible (corrective) sweep obligation; a
/// benign (reinforcing) one carries [`BENIGN_DELTA`].
const CORRECTIVE_DELTA: f64 = -0.4;
/// `weight_delta` of every benign sweep obligation.
const BENIGN_DELTA: f64 = 0.25;

/// Runs transfers `range` of a sweep; the union of disjoint ranges equals
/// one run over their union.
pub fn run_sweep_range(cfg: &SweepConfig, range: std::ops::Range<u64>) -> SweepReport {
    let mut pair = Pair::new(cfg.seed, cfg.backoff);
    let mut report = SweepReport::default();
    for i in range {
        let mut rng = transfer_rng(cfg.seed, i);
        let link = cfg.fixed_link.unwrap_or_else(|| LinkProfile {
            drop: rng.random(),
            duplicate: rng.random(),
            ack_drop: rng.random(),
            reorder: rng.random(),
            ..LinkProfile::lossless()
        });
        let benign = rng.random::<f64>() < cfg.benign_fraction;
        let decision = if rng.random::<f64>() < cfg.defer_probability {
            SimDecision::Defer
        } else if rng.random_range(0..3) < 2 {
            SimDecision::Apply
        } else {
            SimDecision::Decline
        };
        let ob = match sweep_obligation(cfg, i, benign) {
            Ok(ob) => ob,
            Err(e) => {
                report.violations.push(TransferViolation {
                    transfer: i,
                    violation: Violation {
                        invariant: Invariant::Harness,
                        obligation: None,
                        detail: format!("could not build the obligation: {e}"),
                    },
                });
                continue;
            }
        };
        // Principal state around the offer: the fail-safe of a corrective
        // Phala update is a down-weight by |delta|, clipped (AB-4, and
        // declined ≠ applied).
        let key = pair
            .custodian
            .registry()
            .classify(&ob)
            .ok()
            .and_then(|c| c.key);
        let before = key.as_ref().map(|k| pair.custodian.principal().weight(k));
        let key_of = (pair.custodian_id.clone(), ob.id().clone());
        let r = pair.run_transfer(SIM_EPOCH, ob, &link, decision, &mut rng);
        report.transfers += 1;
        report.total_attempts += r.attempts;
        report.late_acks += u64::from(r.late_ack);
        let mut trace = r.trace;
        // AC-1 from the sweep's own intent, not the registry's verdict.
        for o in &mut trace.offers {
            o.admissible = !benign;
        }
        if let (false, Some(k), Some(before)) = (benign, &key, before) {
            let range = pair.custodian.principal().weight_range();
            trace.probes.insert(
                key_of,
                PrincipalProbe {
                    before,
                    after: pair.custodian.principal().weight(k),
                    if_safe: range.clip(before - CORRECTIVE_DELTA.abs()),
                },
            );
        }
        report.violations.extend(
            check(&trace)
                .into_iter()
                .map(|violation| TransferViolation {
                    transfer: i,
                    violation,
                }),
        );
        match r.outcome {
            Some(TerminalState::BestEffort) if benign => report.best_effort += 1,
            Some(TerminalState::Applied) if !benign => report.applied += 1,
            Some(TerminalState::Declined) if !benign => report.declined += 1,
            Some(TerminalState::Escalated) if !benign => {
                if r.applications == 1 {
                    report.spurious_escalations += 1;
                }
                report.escalated += 1;
            }
            _ => {}
        }
        if let Some(o) = r.outcome {
            report.outcomes.push(o);
        }
    }
    report
}

fn sweep_obligation(
    cfg: &SweepConfig,
    i: u64,
    benign: bool,
) -> Result<Obligation, abhyasa_core::FieldError> {
    let delta = if benign {
        BENIGN_DELTA
    } else {
        CORRECTIVE_DELTA
    };
    Obligation::builder()
        .id(format!("bu-{i}"))
        .kind(PHALA_KIND)
        .target("receiver")
        .payload(json!({"weight_delta": delta, "weight_key": format!("w{i}")}))
        .deadline_seconds(cfg.deadline_seconds)
        .max_retries(cfg.max_retries)
        .created_at(SIM_EPOCH)
        .build()
}
