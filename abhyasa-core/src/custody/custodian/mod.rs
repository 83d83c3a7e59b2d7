//! The custodian: holds admissible obligations under custody until they are
//! applied, declined or escalated (AB-1, AB-2, AB-4).
//!
//! # Polling contract
//!
//! The custodian never reads a clock and never does I/O. A driver:
//!
//! 1. feeds inputs: [`Custodian::offer`], [`Custodian::handle_ack`],
//!    [`Custodian::handle_error`], [`Custodian::handle_status_reply`],
//!    [`Custodian::handle_timeout`] (whenever `now >= poll_timeout()`);
//!    when a link to a receiver comes up, sends
//!    [`Custodian::status_queries`] at once;
//! 2. drains [`Custodian::poll_records`] and commits the batch durably
//!    (group commit: one flush for the whole batch), then hands its token to
//!    [`Custodian::handle_committed`];
//! 3. drains [`Custodian::poll_transmit`] and [`Custodian::poll_event`].
//!
//! A transmit or event is released only after every record emitted before
//! it is committed, so nothing is sent before the custody it depends on is
//! durable (AB-1) — the driver cannot get this wrong. Batches must be
//! committed in the order they were polled.
//!
//! # `max_retries`
//!
//! `max_retries` counts retries after the first attempt: a transfer makes at
//! most `1 + max_retries` attempts. After the last attempt the custodian
//! waits one more backoff interval for an ack; custody ends at the absolute
//! deadline (`created_at + deadline_seconds`) or when that interval runs
//! out, whichever is first (AB-4).

mod ack;
mod config;
mod event;
mod link;
mod offer;

pub use ack::{AckDisposition, IgnoredAck};
pub use config::{AckBinding, CustodianConfig, CustodyProfile};
pub use event::{CustodianEvent, CustodianStats, Offered};
pub use link::STATUS_QUERY_MAX_IDS;

use std::collections::BTreeSet;
use std::time::Duration;

use super::outbox::{CommitToken, Outbox, RecordBatch};
use super::record::{
    ClosedRecord, CustodianSnapshot, CustodyOutcome, PendingRecord, Record, TerminalSummary,
};
use super::transmit::Transmit;
use crate::model::{
    AgentId, Digest, Escalation, EscalationCause, EscalationTrigger, GovernedKey, Obligation,
    ObligationId, SafeAction, Sequence, Timestamp,
};
use crate::polarity::PolarityRegistry;
use crate::principal::{Authorization, ChangeCause, PrincipalState, PrincipalWrite, Resolution};
use crate::wire::Message;

#[derive(Debug, Clone)]
struct Pending {
    obligation: Obligation,
    safe: SafeAction,
    attempts: u32,
    next_at: Timestamp,
    due: Timestamp,
    deadline_at: Timestamp,
    deferred: bool,
    offered_at: Timestamp,
    /// Handed over by a store repair that could not prove it: escalated
    /// at the first timeout (C-SD-4).
    damaged: bool,
}

/// The custodian state machine. See the module docs for the polling
/// contract.
///
/// `Clone` lets a model checker explore alternative futures from one state;
/// a driver must never run two clones against the same store and peers.
#[derive(Debug, Clone)]
pub struct Custodian {
    config: CustodianConfig,
    registry: PolarityRegistry,
    principal: PrincipalState,
    // Boxed: a table slot is 2× its entry at most fills, and an entry
    // inline is ~170 bytes; boxed, each slot is 24.
    pending: crate::ShardedMap<ObligationId, Box<Pending>>,
    timers: BTreeSet<(Timestamp, ObligationId)>,
    terminal: crate::ShardedMap<ObligationId, TerminalSummary>,
    outbox: Outbox<Transmit, CustodianEvent>,
    stats: CustodianStats,
}

/// The `u` in `[0, 1)` that jitters attempt `attempt` of the obligation with
/// digest `digest`: a counter-based draw keyed by the config seed and the
/// digest, so the schedule is a pure function of (seed, obligation,
/// attempt) and survives restarts unchanged. Two rounds of SplitMix64's
/// finalizer (one over the seed and the digest, one adding the attempt):
/// a few nanoseconds, where seeding a ChaCha8 generator per draw cost ~1%
/// of a custody transfer's CPU.
fn jitter_draw(seed: u64, digest: &Digest, attempt: u32) -> f64 {
    use crate::splitmix::{mix, unit, GOLDEN};
    let keyed = mix((seed ^ digest.prefix_u64()).wrapping_add(GOLDEN));
    unit(mix(
        keyed.wrapping_add(u64::from(attempt).wrapping_mul(GOLDEN))
    ))
}

impl Custodian {
    /// A custodian with no history.
    pub fn new(config: CustodianConfig, registry: PolarityRegistry) -> Self {
        let principal = PrincipalState::new(config.weight_range);
        Self {
            config,
            registry,
            principal,
            pending: crate::ShardedMap::new(),
            timers: BTreeSet::new(),
            terminal: crate::ShardedMap::new(),
            outbox: Outbox::default(),
            stats: CustodianStats::default(),
        }
    }

    /// Rebuilds a custodian from its durable state after a restart. Every
    /// pending transfer resumes its *remaining* window: the deadline is
    /// absolute and the attempt count is the stored one (AB-2). Copies
    /// what it keeps; [`Custodian::restore_owned`] moves it instead.
    pub fn restore(
        config: CustodianConfig,
        registry: PolarityRegistry,
        snapshot: &CustodianSnapshot,
    ) -> Self {
        Self::restore_owned(config, registry, snapshot.clone())
    }

    /// [`Custodian::restore`] from a snapshot it takes: each pending
    /// transfer, terminal summary and `safe(O)` moves into the custodian
    /// instead of being copied, so a restart holds one copy of a million
    /// pending transfers at a time, not two.
    pub fn restore_owned(
        config: CustodianConfig,
        registry: PolarityRegistry,
        snapshot: CustodianSnapshot,
    ) -> Self {
        let mut c = Self::new(config, registry);
        for w in &snapshot.principal {
            c.principal.apply_write(w);
        }
        c.terminal = snapshot.terminal.into_iter().collect();
        c.pending.reserve(snapshot.pending.len());
        // Collected, then built in one sorted pass: a million inserts in
        // hash order cost several times more.
        let mut timers = Vec::with_capacity(snapshot.pending.len());
        for (id, p) in snapshot.pending {
            let deadline_at = p.obligation.deadline_at();
            #[cfg(feature = "mutations")]
            let deadline_at = crate::mutations::deadline_on_recovery(
                deadline_at,
                p.next_at,
                p.obligation.deadline_seconds(),
            );
            let damaged = snapshot.damaged.contains(&id);
            let due = if damaged {
                // Due at once: the first `handle_timeout` escalates it.
                Timestamp::EPOCH
            } else {
                p.next_at.min(deadline_at)
            };
            timers.push((due, id.clone()));
            c.pending.insert(
                id,
                Box::new(Pending {
                    obligation: p.obligation,
                    safe: p.safe,
                    attempts: p.attempts,
                    next_at: p.next_at,
                    due,
                    deadline_at,
                    deferred: p.deferred,
                    offered_at: p.offered_at,
                    damaged,
                }),
            );
        }
        c.timers = timers.into_iter().collect();
        c
    }

    /// The configuration.
    pub fn config(&self) -> &CustodianConfig {
        &self.config
    }

    /// The polarity registry.
    pub fn registry(&self) -> &PolarityRegistry {
        &self.registry
    }

    /// Principal-side state.
    pub fn principal(&self) -> &PrincipalState {
        &self.principal
    }

    /// Counters.
    pub fn stats(&self) -> CustodianStats {
        self.stats
    }

    /// Number of obligations under custody.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// True when the id is under custody.
    pub fn is_pending(&self, id: &ObligationId) -> bool {
        self.pending.contains_key(id)
    }

    /// Attempts made for a pending obligation.
    pub fn attempts(&self, id: &ObligationId) -> Option<u32> {
        self.pending.get(id).map(|p| p.attempts)
    }

    /// The absolute deadline of a pending obligation.
    pub fn pending_deadline(&self, id: &ObligationId) -> Option<Timestamp> {
        self.pending.get(id).map(|p| p.deadline_at)
    }

    /// Ids under custody towards `target` (for a status query after a
    /// session is re-established).
    pub fn pending_for(&self, target: &AgentId) -> Vec<ObligationId> {
        self.pending
            .values()
            .filter(|p| p.obligation.target() == target)
            .map(|p| p.obligation.id().clone())
            .collect()
    }

    /// How a finished transfer ended.
    pub fn terminal(&self, id: &ObligationId) -> Option<&TerminalSummary> {
        self.terminal.get(id)
    }

    /// The backoff interval after attempt `attempt` of `ob`, with jitter.
    pub fn interval(&self, ob: &Obligation, attempt: u32) -> Duration {
        let b = &self.config.profile(ob.kind()).backoff;
        if b.jitter <= 0.0 {
            return b.nominal(attempt);
        }
        b.jittered(
            attempt,
            jitter_draw(self.config.seed, &ob.digest(), attempt),
        )
    }

    /// The earliest instant at which [`Custodian::handle_timeout`] has work.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        self.timers.first().map(|(t, _)| *t)
    }

    /// Runs every timer due at `now`: retries (AB-2) and escalations at the
    /// deadline or on retry exhaustion (AB-4).
    pub fn handle_timeout(&mut self, now: Timestamp) {
        while let Some((due, _)) = self.timers.first() {
            if *due > now {
                break;
            }
            let Some((_, id)) = self.timers.pop_first() else {
                break;
            };
            let Some(p) = self.pending.get(&id) else {
                continue;
            };
            if p.damaged {
                self.escalate(
                    now,
                    &id,
                    EscalationTrigger::StoreRepair,
                    Some(EscalationCause::StoreDamaged),
                );
            } else if now >= p.deadline_at {
                self.escalate(now, &id, EscalationTrigger::Deadline, None);
            } else if p.attempts > p.obligation.max_retries() {
                self.escalate(now, &id, EscalationTrigger::RetriesExhausted, None);
            } else {
                self.retry(now, &id);
            }
        }
    }

    fn retry(&mut self, now: Timestamp, id: &ObligationId) {
        let Some(p) = self.pending.get(id) else {
            return;
        };
        let attempt = p.attempts + 1;
        let ob = p.obligation.clone();
        let next_at = now.saturating_add(self.interval(&ob, attempt));
        let Some(p) = self.pending.get_mut(id) else {
            return;
        };
        p.attempts = attempt;
        p.next_at = next_at;
        p.due = next_at.min(p.deadline_at);
        self.timers.insert((p.due, id.clone()));
        // The attempt is counted durably before it is released, so a crash
        // can never grant more than 1 + max_retries attempts.
        self.outbox.record(Record::AttemptMade {
            obligation_id: id.clone(),
            attempts: attempt,
            next_at,
        });
        self.stats.attempts_sent += 1;
        self.outbox.event(CustodianEvent::Retrying {
            obligation_id: id.clone(),
            attempt,
        });
        self.outbox.transmit(Transmit {
            to: ob.target().clone(),
            message: Message::Obligation(ob),
        });
    }

    fn take_pending(&mut self, id: &ObligationId) -> Option<Box<Pending>> {
        let p = self.pending.remove(id)?;
        self.timers.remove(&(p.due, id.clone()));
        Some(p)
    }

    fn escalate(
        &mut self,
        now: Timestamp,
        id: &ObligationId,
        trigger: EscalationTrigger,
        cause: Option<EscalationCause>,
    ) {
        let Some(p) = self.take_pending(id) else {
            return;
        };
        let cause = cause.unwrap_or(if p.deferred {
            EscalationCause::ResponsiveButDeferring
        } else {
            EscalationCause::Unreachable
        });
        let (guard, write) =
            self.principal
                .apply_safe_at(&p.safe, ChangeCause::FailSafeEscalation, now);
        let escalation = Escalation {
            event_type: crate::model::ESCALATION_EVENT_TYPE.to_string(),
            obligation_id: id.clone(),
            kind: p.obligation.kind().clone(),
            target: p.obligation.target().clone(),
            digest: p.obligation.digest(),
            attempts: p.attempts,
            cause,
            trigger,
            last_error: cause.describe().to_string(),
            safe_action: p.safe.clone(),
            guard,
            escalated_at: now,
            deadline_at: p.deadline_at,
        };
        self.close(
            now,
            &p,
            CustodyOutcome::Escalated,
            write.into_iter().collect(),
            Some(Box::new(escalation.clone())),
        );
        self.stats.escalated += 1;
        self.outbox
            .event(CustodianEvent::Escalated(Box::new(escalation)));
    }

    fn close(
        &mut self,
        now: Timestamp,
        p: &Pending,
        outcome: CustodyOutcome,
        principal: Vec<PrincipalWrite>,
        escalation: Option<Box<Escalation>>,
    ) {
        let id = p.obligation.id().clone();
        let closed = ClosedRecord {
            obligation_id: id.clone(),
            digest: p.obligation.digest(),
            kind: p.obligation.kind().clone(),
            target: p.obligation.target().clone(),
            outcome,
            attempts: p.attempts,
            closed_at: now,
            deadline_at: p.deadline_at,
            principal,
            escalation,
        };
        self.terminal.insert(id, closed.summary());
        self.outbox.record(Record::CustodyClosed(Box::new(closed)));
    }

    /// The transport could not queue an attempt of `id` (peer down, queue
    /// full, frame too large): nothing left this node, so it is not counted
    /// as sent (C-ND-4). Custody is unchanged: the schedule retries at the
    /// next backoff, and the deadline still binds (AB-2, AB-4). The attempt
    /// number stays spent, so a crash can never grant more than
    /// `1 + max_retries` transmissions.
    pub fn handle_send_failed(&mut self, id: &ObligationId) {
        if self.pending.contains_key(id) {
            self.stats.attempts_sent = self.stats.attempts_sent.saturating_sub(1);
            self.stats.attempts_refused += 1;
        }
    }

    /// The principal's own decision on a governed key (guarded).
    pub fn decide(
        &mut self,
        now: Timestamp,
        key: &GovernedKey,
        state: Authorization,
        sequence: Option<Sequence>,
    ) -> crate::model::GuardOutcome {
        let (guard, write) = self.principal.decide_at(key, state, sequence, now);
        if let Some(w) = write {
            self.outbox.record(Record::Principal {
                writes: vec![w],
                at: now,
            });
        }
        guard
    }

    /// Resolves a decision-required item. Returns `None` if there is no
    /// such item.
    pub fn resolve_decision(
        &mut self,
        now: Timestamp,
        id: &ObligationId,
        resolution: Resolution,
    ) -> Option<Option<crate::model::GuardOutcome>> {
        let item = self.principal.decision(id)?.clone();
        let mut writes = Vec::new();
        let guard = match resolution {
            Resolution::ApplySafe => {
                let (g, w) = self.principal.apply_safe_at(
                    &item.safe_action,
                    ChangeCause::FailSafeDecline,
                    now,
                );
                writes.extend(w);
                Some(g)
            }
            Resolution::Dismiss => None,
        };
        let close = PrincipalWrite::DecisionClosed {
            obligation_id: id.clone(),
        };
        self.principal.apply_write(&close);
        writes.push(close);
        self.outbox.record(Record::Principal { writes, at: now });
        Some(guard)
    }

    /// Drops terminal summaries whose deadline is older than `before`
    /// (retention). Re-offers and acks of compacted ids are then unknown.
    pub fn compact(&mut self, before: Timestamp) -> usize {
        let n = self.terminal.len();
        self.terminal.retain(|_, t| t.deadline_at >= before);
        n - self.terminal.len()
    }

    /// The records to commit before anything that depends on them is
    /// released.
    #[must_use]
    pub fn poll_records(&mut self) -> Option<RecordBatch> {
        self.outbox.poll_records()
    }

    /// Marks a polled batch durable, releasing what waits behind it.
    pub fn handle_committed(&mut self, token: CommitToken) {
        self.outbox.committed(token);
    }

    /// The next frame to send, if its records are committed.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.outbox.poll_transmit()
    }

    /// The next event, if its records are committed.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<CustodianEvent> {
        self.outbox.poll_event()
    }

    /// Records emitted but not yet committed.
    pub fn uncommitted_records(&self) -> u64 {
        self.outbox.uncommitted()
    }

    /// Transmits waiting (behind a commit or to be polled).
    pub fn queued_transmits(&self) -> usize {
        self.outbox.held_transmits()
    }
}

fn pending_record(p: &Pending) -> PendingRecord {
    PendingRecord {
        obligation: p.obligation.clone(),
        safe: p.safe.clone(),
        attempts: p.attempts,
        next_at: p.next_at,
        deferred: p.deferred,
        offered_at: p.offered_at,
    }
}

#[cfg(test)]
mod jitter_tests {
    use super::*;

    /// The draws spread over `[0, 1)`: evenly across ten bins, for many
    /// obligations and for the attempts of one, and a draw is a function
    /// of (seed, digest, attempt) alone.
    #[test]
    fn jitter_draws_are_uniform_and_reproducible() {
        let digest = |i: u64| {
            let mut d = [0u8; 32];
            d[..8].copy_from_slice(&i.wrapping_mul(0x2545_F491_4F6C_DD1D).to_be_bytes());
            Digest(d)
        };
        let mut by_obligation = [0u32; 10];
        let mut by_attempt = [0u32; 10];
        for i in 0..20_000u64 {
            let u = jitter_draw(7, &digest(i), 1);
            let v = jitter_draw(7, &digest(1), i as u32);
            assert!((0.0..1.0).contains(&u) && (0.0..1.0).contains(&v));
            by_obligation[(u * 10.0) as usize] += 1;
            by_attempt[(v * 10.0) as usize] += 1;
        }
        // 2,000 expected per bin; a binomial spread stays well inside.
        for bins in [by_obligation, by_attempt] {
            assert!(
                bins.iter().all(|&n| (1_800..2_200).contains(&n)),
                "{bins:?}"
            );
        }
        assert_eq!(jitter_draw(7, &digest(3), 2), jitter_draw(7, &digest(3), 2));
        assert_ne!(jitter_draw(7, &digest(3), 2), jitter_draw(8, &digest(3), 2));
    }
}
