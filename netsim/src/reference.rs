//! `--compat reference-v1`: the public Python reference harness
//! (`tests/test_fuzz_deliver_or_report.py` of the v1 reference), draw for
//! draw, with every outcome decided by the real `abhyasa_core` custodian
//! and receiver.
//!
//! The harness's random stream:
//!
//! * master `random.Random(seed)` (CPython MT19937, [`PyRandom`]); per
//!   transfer, in order: `random()` drop, `random()` duplicate, `random()`
//!   ack-drop, `choice([applied, applied, declined])` (`_randbelow(3)`), and
//!   `randint(0, 2**31 - 1)`, the seed of that transfer's channel
//!   generator ([`MasterStream`]);
//! * each round trip on the channel: `random() < drop` loses the
//!   obligation (one draw); otherwise the receiver gets it,
//!   `random() < duplicate` delivers it again, and `random() < ack_drop`
//!   loses the ack (three draws);
//! * Phala corrective obligation, deadline 600 s, `max_retries` 64,
//!   backoff base 1 s, cap 64 s, no jitter, zero-latency round trips.
//!
//! Each transfer is also run through [`oracle`], a plain re-statement of
//! the harness's loop on the same draws; a transfer whose core outcome or
//! attempt count differs from it is reported as a violation, so every
//! compat run proves itself draw for draw.

use abhyasa_check::sim::SIM_EPOCH;
use abhyasa_core::custody::{
    Applier, ApplyContext, ApplyDecision, Custodian, CustodianConfig, CustodianEvent,
    CustodyProfile, Receiver, ReceiverConfig, TerminalState, Transmit,
};
use abhyasa_core::model::{AgentId, DeclineReason, Escalation, Obligation, Timestamp};
use abhyasa_core::polarity::{PolarityRegistry, PHALA_KIND};
use abhyasa_core::principal::WeightRange;
use abhyasa_core::wire::Message;
use serde_json::json;

use crate::check::{check, Observation};
use crate::pyrandom::PyRandom;
use crate::settings::{Fault, SweepSettings};
use crate::summary::{outcome_mix, Tally};

/// The master seed of the published reference run.
pub const REFERENCE_SEED: u64 = 20_260_609;

/// `weight_delta` of every (corrective) obligation.
const WEIGHT_DELTA: f64 = -0.4;

/// The receiver's decision, `choice([applied, applied, declined])`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Apply.
    Applied,
    /// Decline.
    Declined,
}

/// Everything the master stream draws for one transfer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TransferParams {
    /// Probability the obligation is lost.
    pub drop: f64,
    /// Probability a delivered obligation is delivered again.
    pub duplicate: f64,
    /// Probability the ack is lost.
    pub ack_drop: f64,
    /// What the receiver decides.
    pub decision: Decision,
    /// Seed of the transfer's channel generator.
    pub channel_seed: u64,
}

/// The harness's master generator, positioned at a transfer index.
#[derive(Clone, Debug)]
pub struct MasterStream {
    rng: PyRandom,
    next: u64,
}

impl MasterStream {
    /// `random.Random(seed)`, at transfer 0.
    pub fn new(seed: u64) -> Self {
        Self {
            rng: PyRandom::new(seed),
            next: 0,
        }
    }

    /// The index of the transfer [`MasterStream::next_params`] draws next.
    pub fn next_index(&self) -> u64 {
        self.next
    }

    /// Draws the next transfer's parameters, in the harness's order.
    pub fn next_params(&mut self) -> TransferParams {
        let drop = self.rng.random();
        let duplicate = self.rng.random();
        let ack_drop = self.rng.random();
        let decision =
            [Decision::Applied, Decision::Applied, Decision::Declined][self.rng.choice_index(3)];
        let channel_seed = self.rng.randbelow(1 << 31);
        self.next += 1;
        TransferParams {
            drop,
            duplicate,
            ack_drop,
            decision,
            channel_seed,
        }
    }

    /// Advances to transfer `index` (draws do not depend on where a shard
    /// starts, so a shard replays the stream up to its first transfer:
    /// about 50 ns per skipped transfer).
    pub fn skip_to(&mut self, index: u64) {
        while self.next < index {
            let _ = self.next_params();
        }
    }
}

/// The harness's transfer loop, restated on its own (no core types): the
/// independent oracle every compat transfer is compared with.
pub mod oracle {
    use super::{Decision, TransferParams};
    use crate::pyrandom::PyRandom;

    /// How a reference transfer ended.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Terminal {
        /// Applied.
        Applied,
        /// Declined.
        Declined,
        /// Escalated.
        Escalated,
    }

    /// Runs one transfer exactly as the harness does, drawing from `rng`
    /// (`random.Random(p.channel_seed)`); returns the terminal state and
    /// the attempt count.
    pub fn transfer(p: &TransferParams, mut rng: PyRandom) -> (Terminal, u64) {
        let mut applied = false;
        let mut deliver = || -> Terminal {
            if applied {
                return Terminal::Applied;
            }
            match p.decision {
                Decision::Applied => {
                    applied = true;
                    Terminal::Applied
                }
                // The harness's receiver keeps no record of a decline.
                Decision::Declined => Terminal::Declined,
            }
        };
        let (deadline, max_retries, base, cap) = (600.0_f64, 64_u64, 1.0_f64, 64.0_f64);
        let mut now = 0.0_f64;
        let mut attempt = 0_u64;
        while now < deadline && attempt <= max_retries {
            attempt += 1;
            if rng.random() >= p.drop {
                let mut ack = deliver();
                if rng.random() < p.duplicate {
                    ack = deliver();
                }
                if rng.random() >= p.ack_drop {
                    return (ack, attempt);
                }
            }
            // attempt <= 65, so the exponent is small.
            now += cap.min(base * 2f64.powi(i32::try_from(attempt - 1).unwrap_or(i32::MAX)));
        }
        (Terminal::Escalated, attempt)
    }
}

/// The receiver's applier: decides as the master stream said and counts
/// real applications (ground truth for effectively-once).
#[derive(Debug)]
struct CountingApplier {
    decision: Decision,
    applications: u32,
    last_applied_at: Option<Timestamp>,
}

impl Applier for CountingApplier {
    fn decide(&mut self, ctx: &ApplyContext<'_>, _ob: &Obligation) -> ApplyDecision {
        match self.decision {
            Decision::Applied => {
                self.applications += 1;
                self.last_applied_at = Some(ctx.now);
                ApplyDecision::Apply(Vec::new())
            }
            Decision::Declined => ApplyDecision::Decline {
                reason: DeclineReason::Policy,
                detail: None,
            },
        }
    }
}

/// What one compat transfer did.
#[derive(Clone, Debug, PartialEq)]
pub struct TransferRecord {
    /// Transfer index.
    pub index: u64,
    /// How custody ended at the core custodian.
    pub outcome: Option<TerminalState>,
    /// Obligation transmissions.
    pub attempts: u64,
    /// Real applications at the core receiver.
    pub applications: u32,
    /// What the harness's own loop says ([`oracle`]).
    pub reference: (oracle::Terminal, u64),
    /// Broken invariants and divergences from the harness.
    pub violations: Vec<String>,
}

/// A core custodian and receiver joined by the harness's channel.
#[derive(Debug)]
pub struct ReferenceDriver {
    custodian: Custodian,
    receiver: Receiver,
    receiver_config: ReceiverConfig,
    custodian_id: AgentId,
    receiver_id: AgentId,
    applier: CountingApplier,
    in_flight: Vec<Transmit>,
    fault: Option<Fault>,
    settings: SweepSettings,
}

impl ReferenceDriver {
    /// A fresh pair; `fault` breaks the receiver (test-only).
    pub fn new(fault: Option<Fault>) -> Self {
        let custodian_id = AgentId::new("custodian").unwrap_or_else(|_| unreachable!());
        let receiver_id = AgentId::new("receiver").unwrap_or_else(|_| unreachable!());
        let settings = SweepSettings::reference_v1();
        let mut cc = CustodianConfig::new(custodian_id.clone());
        cc.default_profile = CustodyProfile {
            backoff: settings.backoff(),
            ..CustodyProfile::default()
        };
        let receiver_config = ReceiverConfig::new(receiver_id.clone());
        Self {
            custodian: Custodian::new(cc, PolarityRegistry::standard()),
            receiver: Receiver::new(receiver_config.clone(), PolarityRegistry::standard()),
            receiver_config,
            custodian_id,
            receiver_id,
            applier: CountingApplier {
                decision: Decision::Applied,
                applications: 0,
                last_applied_at: None,
            },
            in_flight: Vec::new(),
            fault,
            settings,
        }
    }

    /// Runs consecutive transfers `start..` with their drawn parameters.
    pub fn run_block(&mut self, start: u64, params: &[TransferParams]) -> Tally {
        let mut t = Tally::default();
        for (index, p) in (start..).zip(params) {
            let r = self.run_transfer(index, p);
            t.transfers += 1;
            t.total_attempts += r.attempts;
            if let Some(o) = r.outcome {
                t.count(o);
            }
            if r.outcome == Some(TerminalState::Escalated) && r.applications > 0 {
                t.spurious_escalations += 1;
            }
            t.digest = t
                .digest
                .wrapping_add(outcome_mix(index, r.outcome, r.attempts));
            for what in r.violations {
                t.violation(index, what);
            }
        }
        t
    }

    /// Runs transfer `index` to the end of custody.
    pub fn run_transfer(&mut self, index: u64, p: &TransferParams) -> TransferRecord {
        let mut channel = PyRandom::new(p.channel_seed);
        // Seeding costs ~30x a copy: the oracle gets a copy of the fresh
        // generator.
        let reference = oracle::transfer(p, channel.clone());
        let mut record = TransferRecord {
            index,
            outcome: None,
            attempts: 0,
            applications: 0,
            reference,
            violations: Vec::new(),
        };
        let ob = match self.obligation(index) {
            Ok(ob) => ob,
            Err(e) => {
                record
                    .violations
                    .push(format!("could not build the obligation: {e}"));
                return record;
            }
        };
        let id = ob.id().clone();
        let deadline_at = ob.deadline_at();
        let key = match self.custodian.registry().classify(&ob).map(|c| c.key) {
            Ok(Some(k)) => k,
            other => {
                record
                    .violations
                    .push(format!("the Phala rule named no governed key: {other:?}"));
                return record;
            }
        };
        let range = self.custodian.principal().weight_range();
        let weight_before = self.custodian.principal().weight(&key);
        self.applier = CountingApplier {
            decision: p.decision,
            applications: 0,
            last_applied_at: None,
        };
        let mut escalation: Option<Escalation> = None;
        let mut now = SIM_EPOCH;
        if let Err(e) = self.custodian.offer(now, ob) {
            record.violations.push(format!("offer refused: {e}"));
            return record;
        }
        loop {
            commit_custodian(&mut self.custodian);
            while let Some(t) = self.custodian.poll_transmit() {
                if let Message::Obligation(o) = t.message {
                    record.attempts += 1;
                    self.round_trip(now, o, &mut channel, p);
                    commit_custodian(&mut self.custodian);
                }
            }
            while let Some(e) = self.custodian.poll_event() {
                if let CustodianEvent::Escalated(e) = e {
                    escalation = Some(*e);
                }
            }
            // Zero-latency round trips: the only thing left is a timer.
            match self.custodian.poll_timeout() {
                Some(t) => {
                    now = now.max(t);
                    self.custodian.handle_timeout(now);
                }
                None => break,
            }
        }
        record.outcome = self.custodian.terminal(&id).map(|t| t.state);
        record.applications = self.applier.applications;
        let observation = Observation {
            custodian: self.custodian_id.clone(),
            receiver: self.receiver_id.clone(),
            id: id.clone(),
            index,
            admissible: true,
            outcome: record.outcome,
            attempts: record.attempts,
            max_retries: self.settings.max_retries,
            applications: self.applier.applications,
            last_applied_at: self.applier.last_applied_at,
            deadline_at,
            ledger: self.receiver.ledger_outcome(&self.custodian_id, &id),
            escalation,
            weight_before,
            weight_after: self.custodian.principal().weight(&key),
            weight_if_safe: safe_weight(range, weight_before),
        };
        record.violations = check(&observation);
        let core = match record.outcome {
            Some(TerminalState::Applied) => Some(oracle::Terminal::Applied),
            Some(TerminalState::Declined) => Some(oracle::Terminal::Declined),
            Some(TerminalState::Escalated) => Some(oracle::Terminal::Escalated),
            _ => None,
        };
        if core != Some(reference.0) || record.attempts != reference.1 {
            record.violations.push(format!(
                "diverges from the reference harness: core {:?} after {} attempts, \
                 harness {:?} after {}",
                record.outcome, record.attempts, reference.0, reference.1
            ));
        }
        record
    }

    /// One harness round trip of obligation `ob` at `now`.
    fn round_trip(
        &mut self,
        now: Timestamp,
        ob: Obligation,
        channel: &mut PyRandom,
        p: &TransferParams,
    ) {
        if channel.random() < p.drop {
            return;
        }
        self.deliver(now, ob.clone());
        if channel.random() < p.duplicate {
            self.deliver(now, ob);
        }
        // The harness returns one ack (the last delivery's); the core
        // receiver coalesces both acks into one frame, whose second member
        // the custodian counts as a duplicate. One draw decides the frame.
        let lost = channel.random() < p.ack_drop;
        for t in std::mem::take(&mut self.in_flight) {
            if lost {
                continue;
            }
            match t.message {
                Message::Acks(acks) => {
                    for a in &acks {
                        let _ = self.custodian.handle_ack(now, &self.receiver_id, a);
                    }
                }
                Message::Error(e) => self.custodian.handle_error(now, &self.receiver_id, &e),
                _ => {}
            }
        }
    }

    /// Hands `ob` to the receiver, commits its records and takes its acks.
    fn deliver(&mut self, now: Timestamp, ob: Obligation) {
        if self.fault == Some(Fault::LedgerDisabled) {
            // Test-only: a receiver whose ledger never survives, so each
            // delivery is decided (and applied) afresh.
            self.receiver =
                Receiver::new(self.receiver_config.clone(), PolarityRegistry::standard());
        }
        let _ = self
            .receiver
            .handle_obligation(now, &self.custodian_id, ob, &mut self.applier);
        if let Some(b) = self.receiver.poll_records() {
            self.receiver.handle_committed(b.token());
        }
        while let Some(t) = self.receiver.poll_transmit() {
            self.in_flight.push(t);
        }
        while self.receiver.poll_event().is_some() {}
    }

    fn obligation(&self, index: u64) -> Result<Obligation, abhyasa_core::FieldError> {
        Obligation::builder()
            .id(format!("bu-{index}"))
            .kind(PHALA_KIND)
            .target(self.receiver_id.as_str())
            .payload(json!({"weight_delta": WEIGHT_DELTA, "weight_key": format!("w{index}")}))
            .deadline_seconds(i64::try_from(self.settings.deadline_seconds).unwrap_or(600))
            .max_retries(i64::try_from(self.settings.max_retries).unwrap_or(64))
            .created_at(SIM_EPOCH)
            .build()
    }
}

/// The principal weight after `safe(O)` (a Phala down-weight by
/// `abs(WEIGHT_DELTA)`, clipped) from `before`.
fn safe_weight(range: WeightRange, before: f64) -> f64 {
    range.clip(before - WEIGHT_DELTA.abs())
}

/// Commits the custodian's pending records (the abstract channel's store
/// never crashes), releasing what waits behind them.
fn commit_custodian(c: &mut Custodian) {
    if let Some(b) = c.poll_records() {
        c.handle_committed(b.token());
    }
}

/// Runs transfers `range` of a reference-v1 sweep on this thread and returns
/// every transfer's record (for tests and replays of a few transfers;
/// [`crate::sweep::run_sweep`] uses every core and bounded memory).
pub fn run_range(
    seed: u64,
    range: std::ops::Range<u64>,
    fault: Option<Fault>,
) -> Vec<TransferRecord> {
    let mut master = MasterStream::new(seed);
    master.skip_to(range.start);
    let mut driver = ReferenceDriver::new(fault);
    range
        .map(|i| {
            let p = master.next_params();
            driver.run_transfer(i, &p)
        })
        .collect()
}
