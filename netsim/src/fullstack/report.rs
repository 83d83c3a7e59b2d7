//! The report of one full-stack run: deterministic for a seed (no
//! wall-clock figures), serde round-trips.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use abhyasa_core::{AgentId, DeclineReason, GuardOutcome, ObligationId};
use serde::{Deserialize, Serialize};

use super::check::Violation;
use super::host::is_best_effort;
use super::scenario::Scenario;
use super::truth::{CloseState, Inner, Verdict};

/// How custody transfers ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcomes {
    /// Applied by the receiver, discharged by an `applied` ack.
    pub applied: u64,
    /// Declined (all reasons).
    pub declined: u64,
    /// Of which `superseded` (a newer sequence stood on the key).
    pub declined_superseded: u64,
    /// Of which `expired` (reached the receiver too late).
    pub declined_expired: u64,
    /// Escalated at the deadline or retry bound, fail-safe applied.
    pub escalated: u64,
    /// Still pending at the end (a deliver-or-report violation).
    pub pending_at_end: u64,
}

/// Latency percentiles in milliseconds (nearest rank).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// Samples.
    pub count: u64,
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest.
    pub max_ms: f64,
}

impl Percentiles {
    fn of(mut xs: Vec<Duration>) -> Self {
        xs.sort();
        let n = xs.len();
        let at = |q: f64| -> f64 {
            if n == 0 {
                return 0.0;
            }
            let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
            xs[rank - 1].as_secs_f64() * 1000.0
        };
        Self {
            count: n as u64,
            p50_ms: at(0.50),
            p90_ms: at(0.90),
            p99_ms: at(0.99),
            max_ms: at(1.0),
        }
    }
}

/// The relay's spool over a relayed run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelayReport {
    /// Most frames held at once (sampled every 100 ms of simulated time).
    pub spool_peak: u64,
    /// Most frames held at once for custodians (the edges' acks and
    /// status replies waiting to pass back).
    pub spool_peak_to_custodians: u64,
    /// Frames still held when the run ended (C-TR-6: none).
    pub spool_at_end: u64,
}

/// Frames and bytes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Count {
    /// Frames (or datagrams).
    pub frames: u64,
    /// Bytes.
    pub bytes: u64,
}

/// What custody costs on the wire, against best-effort.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Overhead {
    /// Abhyasa frames delivered to the nodes, by message type
    /// (`obligation`, `obligation_best_effort`, `acks`, `status_query`,
    /// `status_reply`, `error`), with their encoded envelope bytes.
    pub frames_delivered: BTreeMap<String, Count>,
    /// All custody frames delivered (everything but best-effort
    /// obligations) per custody transfer.
    pub custody_frames_per_obligation: f64,
    /// Their bytes per custody transfer.
    pub custody_bytes_per_obligation: f64,
    /// Best-effort: obligation frames delivered per best-effort
    /// obligation (≤ 1: one attempt, no ack).
    pub best_effort_frames_per_obligation: f64,
    /// Their bytes per best-effort obligation.
    pub best_effort_bytes_per_obligation: f64,
    /// Datagrams put on the simulated wire by all hosts (QUIC: handshakes,
    /// acks, keep-alives included; 0 over WebSocket). Their bytes are not
    /// reported: TLS handshakes carry ECDSA signatures whose length varies
    /// by a byte or two from run to run, and the report is deterministic.
    pub datagrams_sent: u64,
    /// Datagrams the seeded dropper dropped.
    pub datagrams_dropped: u64,
    /// Wire datagrams per offered obligation (custody and best-effort).
    pub datagrams_per_obligation: f64,
}

/// What the hostile transport did (scenarios with `[hostile]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostileReport {
    /// Frames (or copies) held back, so later frames overtook them.
    pub held: u64,
    /// Frames delivered twice.
    pub duplicated: u64,
    /// Earlier frames put back in flight.
    pub replayed: u64,
    /// Obligations the receivers declined `superseded` (the guard at work:
    /// a late or replayed older decision).
    pub declined_superseded: u64,
}

/// The report of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// The relay's spool, in relayed scenarios.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay: Option<RelayReport>,
    /// The hostile transport's work, in scenarios that have one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostile: Option<HostileReport>,
    /// Scenario name.
    pub scenario: String,
    /// Seed.
    pub seed: u64,
    /// Transport.
    pub transport: String,
    /// Simulated seconds run.
    pub simulated_seconds: f64,
    /// Obligations in the workload.
    pub planned: u64,
    /// Taken into custody (committed).
    pub custody: u64,
    /// Sent best-effort (benign, AC-1).
    pub best_effort: u64,
    /// Offers refused by the custodian (e.g. re-offered after a crash
    /// once their deadline had passed).
    pub offers_refused: u64,
    /// Terminal distribution of custody transfers.
    pub outcomes: Outcomes,
    /// Total attempts over custody transfers.
    pub attempts_total: u64,
    /// Mean attempts per custody transfer.
    pub attempts_mean: f64,
    /// Most attempts of one transfer.
    pub attempts_max: u32,
    /// Offer to discharge (custody close), every custody transfer.
    pub latency_offer_to_discharge: Percentiles,
    /// Offer to discharge, applied transfers only.
    pub latency_applied: Percentiles,
    /// Escalated although the receiver applied (ground truth).
    pub spurious_escalations: u64,
    /// Of those, the ones whose fail-safe took effect principal-side
    /// (not dropped as superseded): the principal over-protected.
    pub over_protection: u64,
    /// `applied` acks that arrived after escalation (reconciliation).
    pub late_acks: u64,
    /// Applications by the receivers' appliers (ground truth).
    pub receiver_applications: u64,
    /// Verdicts of the receivers' appliers: apply, decline, defer.
    pub receiver_verdicts: BTreeMap<String, u64>,
    /// Wire cost.
    pub overhead: Overhead,
    /// Host crashes performed.
    pub crashes: u64,
    /// Host restarts performed.
    pub restarts: u64,
    /// Number of violations.
    pub violation_count: u64,
    /// Broken invariants (first 100).
    pub violations: Vec<Violation>,
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

impl RunReport {
    pub(crate) fn build(
        s: &Scenario,
        seed: u64,
        simulated: Duration,
        planned: u64,
        t: &Inner,
        pending_at_end: u64,
        mut violations: Vec<Violation>,
    ) -> Self {
        type Key = (AgentId, ObligationId);
        let mut created = BTreeMap::new();
        let mut custody: BTreeSet<Key> = BTreeSet::new();
        for (a, o) in &t.opened {
            let k = (a.clone(), o.id().clone());
            if !is_best_effort(o) {
                custody.insert(k.clone());
            }
            created.insert(k, o.created_at());
        }
        let best_effort: BTreeSet<Key> = t.best_effort.iter().cloned().collect();
        let applied_truth: BTreeSet<Key> = t
            .applications
            .iter()
            .map(|a| (a.custodian.clone(), a.id.clone()))
            .collect();
        let mut outcomes = Outcomes {
            pending_at_end,
            ..Outcomes::default()
        };
        let mut seen = BTreeSet::new();
        let (mut attempts_total, mut attempts_max) = (0u64, 0u32);
        let (mut lat, mut lat_applied) = (Vec::new(), Vec::new());
        let (mut spurious, mut over) = (0, 0);
        for c in &t.closes {
            let k = (c.custodian.clone(), c.id.clone());
            if !seen.insert(k.clone()) {
                continue;
            }
            attempts_total += u64::from(c.attempts);
            attempts_max = attempts_max.max(c.attempts);
            let d = created
                .get(&k)
                .map(|t0| c.closed_at.saturating_duration_since(*t0))
                .unwrap_or_default();
            lat.push(d);
            match c.state {
                CloseState::Applied => {
                    outcomes.applied += 1;
                    lat_applied.push(d);
                }
                CloseState::Declined(r) => {
                    outcomes.declined += 1;
                    match r {
                        Some(DeclineReason::Superseded) => outcomes.declined_superseded += 1,
                        Some(DeclineReason::Expired) => outcomes.declined_expired += 1,
                        _ => {}
                    }
                }
                CloseState::Escalated => {
                    outcomes.escalated += 1;
                    if applied_truth.contains(&k) {
                        spurious += 1;
                        if !matches!(c.guard, Some(GuardOutcome::Superseded { .. })) {
                            over += 1;
                        }
                    }
                }
            }
        }
        let mut verdicts = BTreeMap::new();
        for d in &t.decisions {
            let name = match d.verdict {
                Verdict::Apply => "apply",
                Verdict::Decline => "decline",
                Verdict::Defer => "defer",
            };
            *verdicts.entry(name.to_string()).or_insert(0) += 1;
        }
        let frames: BTreeMap<String, Count> = t
            .frames
            .iter()
            .map(|(k, c)| {
                (
                    (*k).to_string(),
                    Count {
                        frames: c.frames,
                        bytes: c.bytes,
                    },
                )
            })
            .collect();
        let be = frames
            .get("obligation_best_effort")
            .cloned()
            .unwrap_or_default();
        let all_frames: u64 = frames.values().map(|c| c.frames).sum();
        let all_bytes: u64 = frames.values().map(|c| c.bytes).sum();
        let n_custody = custody.len() as u64;
        let n_be = best_effort.len() as u64;
        let dg: u64 = t.datagrams.values().map(|c| c.frames).sum();
        let overhead = Overhead {
            custody_frames_per_obligation: ratio(all_frames - be.frames, n_custody),
            custody_bytes_per_obligation: ratio(all_bytes - be.bytes, n_custody),
            best_effort_frames_per_obligation: ratio(be.frames, n_be),
            best_effort_bytes_per_obligation: ratio(be.bytes, n_be),
            datagrams_per_obligation: ratio(dg, n_custody + n_be),
            datagrams_sent: dg,
            datagrams_dropped: t.datagrams_dropped,
            frames_delivered: frames,
        };
        let violation_count = violations.len() as u64;
        violations.truncate(100);
        Self {
            scenario: s.name.clone(),
            seed,
            transport: format!("{:?}", s.transport).to_lowercase(),
            simulated_seconds: simulated.as_secs_f64(),
            planned,
            custody: n_custody,
            best_effort: n_be,
            offers_refused: t.offers_refused,
            outcomes,
            attempts_total,
            attempts_mean: ratio(attempts_total, seen.len() as u64),
            attempts_max,
            latency_offer_to_discharge: Percentiles::of(lat),
            latency_applied: Percentiles::of(lat_applied),
            spurious_escalations: spurious,
            over_protection: over,
            late_acks: t.late_acks,
            receiver_applications: t.applications.len() as u64,
            receiver_verdicts: verdicts,
            overhead,
            crashes: t.crashes,
            restarts: t.restarts,
            violation_count,
            violations,
            relay: None,
            hostile: s.hostile.as_ref().map(|_| HostileReport {
                held: t.hostile.held,
                duplicated: t.hostile.duplicated,
                replayed: t.hostile.replayed,
                declined_superseded: t.superseded.len() as u64,
            }),
        }
    }

    /// True when no invariant was broken.
    pub fn passed(&self) -> bool {
        self.violation_count == 0
    }
}

fn pct(n: u64, d: u64) -> String {
    if d == 0 {
        "-".into()
    } else {
        format!("{:.1} %", 100.0 * n as f64 / d as f64)
    }
}

impl fmt::Display for RunReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.outcomes;
        let n = self.custody;
        writeln!(
            f,
            "scenario {} seed {} over {}, {:.1} simulated s, {} crashes",
            self.scenario, self.seed, self.transport, self.simulated_seconds, self.crashes
        )?;
        writeln!(
            f,
            "  offered {}: custody {}, best-effort {}, refused {}",
            self.planned, n, self.best_effort, self.offers_refused
        )?;
        writeln!(f, "  applied    {:>7}  {}", o.applied, pct(o.applied, n))?;
        writeln!(
            f,
            "  declined   {:>7}  {}  (superseded {}, expired {})",
            o.declined,
            pct(o.declined, n),
            o.declined_superseded,
            o.declined_expired
        )?;
        writeln!(
            f,
            "  escalated  {:>7}  {}",
            o.escalated,
            pct(o.escalated, n)
        )?;
        writeln!(f, "  pending    {:>7}", o.pending_at_end)?;
        writeln!(
            f,
            "  attempts   total {}, mean {:.2}, max {}",
            self.attempts_total, self.attempts_mean, self.attempts_max
        )?;
        let p = &self.latency_offer_to_discharge;
        writeln!(
            f,
            "  offer→discharge ms  p50 {:.0}  p90 {:.0}  p99 {:.0}  max {:.0}",
            p.p50_ms, p.p90_ms, p.p99_ms, p.max_ms
        )?;
        writeln!(
            f,
            "  spurious escalations {} (over-protection {}), late acks {}",
            self.spurious_escalations, self.over_protection, self.late_acks
        )?;
        let ov = &self.overhead;
        writeln!(
            f,
            "  custody overhead: {:.2} frames, {:.0} B per obligation (best-effort {:.2} frames, {:.0} B); \
             {:.1} datagrams per obligation, {} dropped",
            ov.custody_frames_per_obligation,
            ov.custody_bytes_per_obligation,
            ov.best_effort_frames_per_obligation,
            ov.best_effort_bytes_per_obligation,
            ov.datagrams_per_obligation,
            ov.datagrams_dropped
        )?;
        if let Some(r) = &self.relay {
            writeln!(
                f,
                "  relay spool: peak {} frames ({} for custodians), {} at the end",
                r.spool_peak, r.spool_peak_to_custodians, r.spool_at_end
            )?;
        }
        if let Some(h) = &self.hostile {
            writeln!(
                f,
                "  hostile transport: {} held, {} duplicated, {} replayed; {} declined superseded",
                h.held, h.duplicated, h.replayed, h.declined_superseded
            )?;
        }
        write!(f, "  violations {}", self.violation_count)?;
        for v in self.violations.iter().take(5) {
            write!(
                f,
                "\n    {} {}: {}",
                v.invariant,
                v.obligation.as_deref().unwrap_or("-"),
                v.detail
            )?;
        }
        Ok(())
    }
}
