//! The result of a sweep (or of one shard of it): counts, invariant
//! violations, a fingerprint of every transfer's outcome, and timing.
//!
//! Everything except the timing fields is a pure function of the model,
//! seed, settings, fault and transfer range; [`SweepSummary::same_result`]
//! compares exactly that.

use std::fmt::{self, Write as _};

use abhyasa_core::custody::TerminalState;

use crate::settings::{Fault, Model, SweepSettings};
use crate::shard::Shard;

/// The `format` tag of sweep JSON.
pub const SWEEP_FORMAT: &str = "abhyasa-sim.sweep.v1";

/// At most this many violations are listed (the lowest transfer indices);
/// the `violations` count is always exact.
pub const MAX_VIOLATION_DETAILS: usize = 100;

/// One broken invariant.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct ViolationDetail {
    /// The transfer that broke it.
    pub transfer: u64,
    /// What broke.
    pub what: String,
    /// The command that replays exactly this transfer.
    #[serde(default)]
    pub replay: String,
}

/// Running totals over a set of transfers; tallies of disjoint ranges add up
/// to the tally of their union, in any order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tally {
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
    /// Obligation transmissions.
    pub total_attempts: u64,
    /// Escalated although the receiver applied.
    pub spurious_escalations: u64,
    /// Acks that arrived after escalation (recorded for reconciliation).
    pub late_acks: u64,
    /// Invariant violations (exact count).
    pub violations: u64,
    /// The violations with the lowest transfer indices.
    pub details: Vec<ViolationDetail>,
    /// Wrapping sum of [`outcome_mix`] over every transfer.
    pub digest: u64,
}

impl Tally {
    /// Adds another tally (of a disjoint range).
    pub fn add(&mut self, other: Tally) {
        self.transfers += other.transfers;
        self.applied += other.applied;
        self.declined += other.declined;
        self.escalated += other.escalated;
        self.best_effort += other.best_effort;
        self.total_attempts += other.total_attempts;
        self.spurious_escalations += other.spurious_escalations;
        self.late_acks += other.late_acks;
        self.violations += other.violations;
        self.digest = self.digest.wrapping_add(other.digest);
        self.details.extend(other.details);
        self.trim_details();
    }

    /// Records a violation.
    pub fn violation(&mut self, transfer: u64, what: String) {
        self.violations += 1;
        self.details.push(ViolationDetail {
            transfer,
            what,
            replay: String::new(),
        });
        if self.details.len() > 2 * MAX_VIOLATION_DETAILS {
            self.trim_details();
        }
    }

    /// Keeps the [`MAX_VIOLATION_DETAILS`] lowest, so the list does not
    /// depend on which thread found what first.
    fn trim_details(&mut self) {
        self.details.sort();
        self.details.truncate(MAX_VIOLATION_DETAILS);
    }

    /// Counts one terminal state.
    pub fn count(&mut self, outcome: TerminalState) {
        match outcome {
            TerminalState::Applied => self.applied += 1,
            TerminalState::Declined => self.declined += 1,
            TerminalState::Escalated => self.escalated += 1,
            TerminalState::BestEffort => self.best_effort += 1,
        }
    }
}

/// The contribution of transfer `index` with `outcome` (and, where the model
/// knows it per transfer, `attempts`) to the outcome digest: a SplitMix64
/// finaliser, so any changed outcome changes the sum with overwhelming
/// probability, while shards still add up in any order.
pub fn outcome_mix(index: u64, outcome: Option<TerminalState>, attempts: u64) -> u64 {
    let code: u64 = match outcome {
        None => 0,
        Some(TerminalState::Applied) => 1,
        Some(TerminalState::Declined) => 2,
        Some(TerminalState::Escalated) => 3,
        Some(TerminalState::BestEffort) => 4,
    };
    let mut z = index
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(code << 56 | attempts.min((1 << 56) - 1));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A sweep's (or shard's) result, as printed by `abhyasa-sim sweep --json`
/// and combined by `abhyasa-sim merge`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SweepSummary {
    /// Always [`SWEEP_FORMAT`].
    pub format: String,
    /// Channel model.
    pub model: Model,
    /// Master seed.
    pub seed: u64,
    /// First transfer index of the whole sweep.
    pub first: u64,
    /// Transfers in the whole sweep (all shards).
    pub transfers_total: u64,
    /// This shard, or `None` for a whole (or merged) sweep.
    pub shard: Option<Shard>,
    /// First transfer index run here.
    pub start: u64,
    /// One past the last transfer index run here.
    pub end: u64,
    /// Transfers run here (`end - start`).
    pub transfers: u64,
    /// Ended applied.
    pub applied: u64,
    /// Ended declined.
    pub declined: u64,
    /// Ended escalated (fail-safe applied).
    pub escalated: u64,
    /// Benign obligations sent once, best-effort.
    pub best_effort: u64,
    /// Obligation transmissions (first attempts and retries).
    pub total_attempts: u64,
    /// `total_attempts / transfers`.
    pub mean_attempts: f64,
    /// Escalated although the receiver applied (over-protection: allowed,
    /// but the number researchers tune deadlines against).
    pub spurious_escalations: u64,
    /// `applied` acks that reached the custodian after escalation.
    pub late_acks: u64,
    /// Invariant violations; must be 0.
    pub violations: u64,
    /// The first violations (lowest transfer indices).
    pub violation_details: Vec<ViolationDetail>,
    /// Order-independent fingerprint of every transfer's outcome (hex).
    pub outcome_digest: String,
    /// Custody and workload settings.
    pub settings: SweepSettings,
    /// The injected fault (test-only), if any.
    pub fault: Option<Fault>,
    /// Worker threads (for a merge: the sum over shards).
    pub threads: usize,
    /// Wall-clock seconds (for a merge: the sum over shards).
    pub elapsed_s: f64,
    /// `transfers / elapsed_s`.
    pub transfers_per_second: f64,
    /// CPU seconds the worker threads used (for a merge: the sum), where
    /// the platform reports it (Linux).
    #[serde(default)]
    pub cpu_s: Option<f64>,
    /// `transfers / cpu_s`: throughput per core, independent of other load
    /// on the machine.
    #[serde(default)]
    pub transfers_per_cpu_second: Option<f64>,
    /// Shard files combined into this result (merge only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merged_shards: Option<u32>,
}

/// Identity and range of a sweep, from which a summary is finished.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SweepIdentity {
    /// Channel model.
    pub model: Model,
    /// Master seed.
    pub seed: u64,
    /// First transfer index of the whole sweep.
    pub first: u64,
    /// Transfers in the whole sweep.
    pub transfers_total: u64,
    /// The shard run, if sharded.
    pub shard: Option<Shard>,
    /// Settings.
    pub settings: SweepSettings,
    /// Injected fault.
    pub fault: Option<Fault>,
}

impl SweepSummary {
    /// Finishes a tally over `start..end` into a summary.
    pub fn from_tally(
        id: &SweepIdentity,
        start: u64,
        end: u64,
        tally: Tally,
        threads: usize,
        elapsed_s: f64,
    ) -> Self {
        let mut s = Self {
            format: SWEEP_FORMAT.to_string(),
            model: id.model,
            seed: id.seed,
            first: id.first,
            transfers_total: id.transfers_total,
            shard: id.shard,
            start,
            end,
            transfers: tally.transfers,
            applied: tally.applied,
            declined: tally.declined,
            escalated: tally.escalated,
            best_effort: tally.best_effort,
            total_attempts: tally.total_attempts,
            mean_attempts: 0.0,
            spurious_escalations: tally.spurious_escalations,
            late_acks: tally.late_acks,
            violations: tally.violations,
            violation_details: tally.details,
            outcome_digest: format!("{:016x}", tally.digest),
            settings: id.settings,
            fault: id.fault,
            threads,
            elapsed_s,
            transfers_per_second: 0.0,
            cpu_s: None,
            transfers_per_cpu_second: None,
            merged_shards: None,
        };
        s.finish();
        s
    }

    /// Recomputes the derived fields (means, rates, replay commands).
    pub fn finish(&mut self) {
        self.mean_attempts = if self.transfers == 0 {
            0.0
        } else {
            self.total_attempts as f64 / self.transfers as f64
        };
        self.transfers_per_second = if self.elapsed_s > 0.0 {
            self.transfers as f64 / self.elapsed_s
        } else {
            0.0
        };
        self.transfers_per_cpu_second = self
            .cpu_s
            .filter(|c| *c > 0.0)
            .map(|c| self.transfers as f64 / c);
        let replays: Vec<String> = self
            .violation_details
            .iter()
            .map(|v| self.replay_transfer(v.transfer))
            .collect();
        for (v, r) in self.violation_details.iter_mut().zip(replays) {
            v.replay = r;
        }
    }

    /// The sweep identity of this summary.
    pub fn identity(&self) -> SweepIdentity {
        SweepIdentity {
            model: self.model,
            seed: self.seed,
            first: self.first,
            transfers_total: self.transfers_total,
            shard: self.shard,
            settings: self.settings,
            fault: self.fault,
        }
    }

    /// True when both describe the same transfers with the same outcomes:
    /// every field but timing, CPU time, thread count and merge provenance.
    pub fn same_result(&self, other: &SweepSummary) -> bool {
        let strip = |s: &SweepSummary| SweepSummary {
            threads: 0,
            elapsed_s: 0.0,
            transfers_per_second: 0.0,
            cpu_s: None,
            transfers_per_cpu_second: None,
            merged_shards: None,
            ..s.clone()
        };
        strip(self) == strip(other)
    }

    fn base_command(&self) -> String {
        let mut c = format!("abhyasa-sim sweep --seed {}", self.seed);
        if self.model == Model::ReferenceV1 {
            c.push_str(" --compat reference-v1");
        }
        for f in self.settings.flags(self.model) {
            c.push(' ');
            c.push_str(&f);
        }
        if let Some(f) = self.fault {
            let _ = write!(c, " --dangerous-inject-fault {}", f.as_str());
        }
        c
    }

    /// The command that replays exactly transfer `index` (every draw of a
    /// transfer depends only on the seed and its index).
    pub fn replay_transfer(&self, index: u64) -> String {
        format!("{} --first {index} --transfers 1", self.base_command())
    }

    /// The command that replays this whole run (or shard).
    pub fn replay_run(&self) -> String {
        let mut c = format!(
            "{} --first {} --transfers {}",
            self.base_command(),
            self.first,
            self.transfers_total
        );
        if let Some(s) = self.shard {
            let _ = write!(c, " --shard {s}");
        }
        c
    }

    /// The violation report for stderr: seed, failing transfers and the
    /// exact commands that replay them (STYLE 7).
    pub fn violation_report(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "INVARIANT VIOLATED: {} violation(s) in model {}, seed {}",
            self.violations,
            self.model.as_str(),
            self.seed
        );
        if let Some(f) = self.fault {
            let _ = writeln!(
                out,
                "  (test-only fault injected: {}; this run is not a result)",
                f.as_str()
            );
        }
        // One entry per failing transfer, all its broken rules together.
        let mut shown = 0;
        let mut i = 0;
        while i < self.violation_details.len() && shown < 10 {
            let t = self.violation_details[i].transfer;
            let mut whats = Vec::new();
            while i < self.violation_details.len() && self.violation_details[i].transfer == t {
                whats.push(self.violation_details[i].what.as_str());
                i += 1;
            }
            let _ = writeln!(out, "  transfer {t}: {}", whats.join("; "));
            let _ = writeln!(out, "    replay: {}", self.replay_transfer(t));
            shown += whats.len();
        }
        if self.violations > shown as u64 {
            let _ = writeln!(
                out,
                "  ... {} more (the JSON output lists up to {MAX_VIOLATION_DETAILS})",
                self.violations - shown as u64
            );
        }
        let _ = writeln!(out, "  replay the run: {}", self.replay_run());
        out
    }
}

fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

impl fmt::Display for SweepSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pct = |n: u64| {
            if self.transfers == 0 {
                0.0
            } else {
                100.0 * n as f64 / self.transfers as f64
            }
        };
        write!(
            f,
            "abhyasa-sim sweep: model {}, seed {}, transfers {}..{}",
            self.model.as_str(),
            self.seed,
            self.start,
            self.end
        )?;
        match (self.shard, self.merged_shards) {
            (Some(s), _) => write!(f, " (shard {s} of {})", group(self.transfers_total))?,
            (None, Some(n)) => write!(f, " (merged from {n} shards)")?,
            (None, None) => {}
        }
        writeln!(f)?;
        if let Some(fault) = self.fault {
            writeln!(
                f,
                "  TEST-ONLY FAULT INJECTED: {} (not a result)",
                fault.as_str()
            )?;
        }
        let row = |f: &mut fmt::Formatter<'_>, name: &str, n: u64, what: &str| {
            writeln!(f, "  {name:<22}{:>14}  {:>5.1}%  {what}", group(n), pct(n))
        };
        writeln!(f, "  {:<22}{:>14}", "transfers", group(self.transfers))?;
        row(
            f,
            "applied",
            self.applied,
            "receiver applied, custody discharged",
        )?;
        row(f, "declined", self.declined, "receiver refused accountably")?;
        row(
            f,
            "escalated",
            self.escalated,
            "fail-safe applied, principal told",
        )?;
        row(
            f,
            "best-effort",
            self.best_effort,
            "benign: one attempt, no custody",
        )?;
        writeln!(
            f,
            "  {:<22}{:>14}  (mean {:.4} per transfer)",
            "total attempts",
            group(self.total_attempts),
            self.mean_attempts
        )?;
        row(
            f,
            "spurious escalations",
            self.spurious_escalations,
            "escalated although the receiver applied",
        )?;
        writeln!(
            f,
            "  {:<22}{:>14}  late applied acks recorded for reconciliation",
            "late acks",
            group(self.late_acks)
        )?;
        writeln!(
            f,
            "  {:<22}{:>14}  {}",
            "violations",
            group(self.violations),
            if self.violations == 0 {
                "every invariant held on every transfer"
            } else {
                "INVARIANT VIOLATED"
            }
        )?;
        writeln!(
            f,
            "  {:<22}{:>14.3} s  ({} thread{})",
            "elapsed",
            self.elapsed_s,
            self.threads,
            if self.threads == 1 { "" } else { "s" }
        )?;
        writeln!(
            f,
            "  {:<22}{:>14}  transfers/s  ({:.2} M transfers/min)",
            "throughput",
            group(self.transfers_per_second.round() as u64),
            self.transfers_per_second * 60.0 / 1e6
        )?;
        if let (Some(cpu), Some(rate)) = (self.cpu_s, self.transfers_per_cpu_second) {
            writeln!(
                f,
                "  {:<22}{:>14.2} s  ({} transfers per CPU-second)",
                "cpu",
                cpu,
                group(rate.round() as u64)
            )?;
        }
        write!(f, "  {:<22}{:>16}", "outcome digest", self.outcome_digest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tallies_add_in_any_order_and_keep_lowest_details() {
        let mut a = Tally::default();
        let mut b = Tally::default();
        for i in 0..150 {
            a.violation(1000 + i, "x".into());
            b.violation(i, "y".into());
        }
        a.digest = 5;
        b.digest = u64::MAX;
        let mut ab = a.clone();
        ab.add(b.clone());
        let mut ba = b;
        ba.add(a);
        assert_eq!(ab, ba);
        assert_eq!(ab.violations, 300);
        assert_eq!(ab.details.len(), MAX_VIOLATION_DETAILS);
        assert_eq!(ab.details[0].transfer, 0);
        assert_eq!(ab.digest, 4);
    }

    #[test]
    fn outcome_mix_separates_index_outcome_and_attempts() {
        let a = outcome_mix(1, Some(TerminalState::Applied), 3);
        assert_ne!(a, outcome_mix(2, Some(TerminalState::Applied), 3));
        assert_ne!(a, outcome_mix(1, Some(TerminalState::Declined), 3));
        assert_ne!(a, outcome_mix(1, Some(TerminalState::Applied), 4));
        assert_ne!(a, outcome_mix(1, None, 3));
    }

    #[test]
    fn groups_thousands() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1000), "1,000");
        assert_eq!(group(10_000_000), "10,000,000");
    }
}
