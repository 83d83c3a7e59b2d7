//! `study.csv` (one row of raw counts per run) and `summary.csv` (pooled
//! rates per partition length): writing, and reading back for `merge`.

use std::fmt::Write as _;

/// The header of `study.csv`.
pub const CSV_HEADER: &str = "step,duration_ms,seed_index,seed,planned,custody,best_effort,\
offers_refused,applied,declined,escalated,pending_at_end,spurious_escalations,over_protection,\
late_acks,attempts_total,attempts_max,crashes,violations";

/// The header of `summary.csv`.
pub const SUMMARY_HEADER: &str = "step,duration_ms,duration_s,runs,custody,applied,declined,\
escalated,spurious_escalations,over_protection,late_acks,attempts_total,violations,\
escalation_rate,escalation_lo95,escalation_hi95,spurious_rate,spurious_lo95,spurious_hi95";

/// One run of a study: raw counts from its [`crate::fullstack::RunReport`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StudyRow {
    /// Grid step (0-based).
    pub step: u32,
    /// Partition length, ms.
    pub duration_ms: u64,
    /// Seed index (0-based).
    pub seed_index: u32,
    /// The run's seed.
    pub seed: u64,
    /// Obligations in the workload.
    pub planned: u64,
    /// Taken into custody.
    pub custody: u64,
    /// Sent best-effort.
    pub best_effort: u64,
    /// Offers the custodian refused.
    pub offers_refused: u64,
    /// Custody ended applied.
    pub applied: u64,
    /// Custody ended declined.
    pub declined: u64,
    /// Custody ended escalated (fail-safe applied).
    pub escalated: u64,
    /// Custody still open at the end (a violation).
    pub pending_at_end: u64,
    /// Escalated although the receiver applied.
    pub spurious_escalations: u64,
    /// Of those, the fail-safe took effect principal-side.
    pub over_protection: u64,
    /// Applied acks after escalation.
    pub late_acks: u64,
    /// Attempts over custody transfers.
    pub attempts_total: u64,
    /// Most attempts of one transfer.
    pub attempts_max: u64,
    /// Host crashes performed.
    pub crashes: u64,
    /// Broken invariants.
    pub violations: u64,
}

impl StudyRow {
    fn fields(&self) -> [u64; 19] {
        [
            u64::from(self.step),
            self.duration_ms,
            u64::from(self.seed_index),
            self.seed,
            self.planned,
            self.custody,
            self.best_effort,
            self.offers_refused,
            self.applied,
            self.declined,
            self.escalated,
            self.pending_at_end,
            self.spurious_escalations,
            self.over_protection,
            self.late_acks,
            self.attempts_total,
            self.attempts_max,
            self.crashes,
            self.violations,
        ]
    }

    /// Parses one data line of `study.csv`.
    pub fn parse(line: &str) -> Result<Self, String> {
        let v: Vec<u64> = line
            .split(',')
            .map(|f| {
                f.trim()
                    .parse::<u64>()
                    .map_err(|_| format!("{f:?} is not a count"))
            })
            .collect::<Result<_, _>>()?;
        let [step, duration_ms, seed_index, seed, planned, custody, best_effort, offers_refused, applied, declined, escalated, pending_at_end, spurious_escalations, over_protection, late_acks, attempts_total, attempts_max, crashes, violations] =
            v[..]
        else {
            return Err(format!("{} fields, expected 19", v.len()));
        };
        let small =
            |x: u64, what: &str| u32::try_from(x).map_err(|_| format!("{what} {x} too large"));
        Ok(Self {
            step: small(step, "step")?,
            duration_ms,
            seed_index: small(seed_index, "seed_index")?,
            seed,
            planned,
            custody,
            best_effort,
            offers_refused,
            applied,
            declined,
            escalated,
            pending_at_end,
            spurious_escalations,
            over_protection,
            late_acks,
            attempts_total,
            attempts_max,
            crashes,
            violations,
        })
    }
}

/// `study.csv`: the header, then one line per row in the given order.
pub(crate) fn rows_to_csv(rows: &[StudyRow]) -> String {
    let mut s = String::with_capacity(64 * (rows.len() + 1));
    s.push_str(CSV_HEADER);
    s.push('\n');
    for r in rows {
        let f = r.fields();
        for (i, x) in f.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            let _ = write!(s, "{x}");
        }
        s.push('\n');
    }
    s
}

/// Parses `study.csv`.
pub(crate) fn parse_csv(text: &str) -> Result<Vec<StudyRow>, String> {
    let mut lines = text.lines();
    match lines.next() {
        Some(h) if h.trim_end() == CSV_HEADER => {}
        Some(h) => return Err(format!("header {h:?} is not the study.csv header")),
        None => return Err("empty file".into()),
    }
    lines
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| StudyRow::parse(l).map_err(|e| format!("line {}: {e}", i + 2)))
        .collect()
}

/// One partition length of a study, pooled over its seeds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DurationSummary {
    /// Grid step.
    pub step: u32,
    /// Partition length, ms.
    pub duration_ms: u64,
    /// Runs (seeds) pooled.
    pub runs: u64,
    /// Custody transfers.
    pub custody: u64,
    /// Applied.
    pub applied: u64,
    /// Declined.
    pub declined: u64,
    /// Escalated.
    pub escalated: u64,
    /// Spurious escalations.
    pub spurious_escalations: u64,
    /// Over-protection.
    pub over_protection: u64,
    /// Late acks.
    pub late_acks: u64,
    /// Attempts.
    pub attempts_total: u64,
    /// Violations.
    pub violations: u64,
}

/// Wilson score interval (95 %) for `x` successes in `n` trials:
/// (estimate, low, high); all 0 when `n` is 0.
pub(crate) fn wilson(x: u64, n: u64) -> (f64, f64, f64) {
    if n == 0 {
        return (0.0, 0.0, 0.0);
    }
    let z = 1.959_963_984_540_054_f64;
    let (x, n) = (x as f64, n as f64);
    let p = x / n;
    let z2n = z * z / n;
    let centre = (p + z2n / 2.0) / (1.0 + z2n);
    let half = z * (p * (1.0 - p) / n + z2n / (4.0 * n)).sqrt() / (1.0 + z2n);
    (p, (centre - half).max(0.0), (centre + half).min(1.0))
}

impl DurationSummary {
    pub(crate) fn new(step: u32, duration_ms: u64) -> Self {
        Self {
            step,
            duration_ms,
            ..Self::default()
        }
    }

    pub(crate) fn add(&mut self, r: &StudyRow) {
        self.runs += 1;
        self.custody += r.custody;
        self.applied += r.applied;
        self.declined += r.declined;
        self.escalated += r.escalated;
        self.spurious_escalations += r.spurious_escalations;
        self.over_protection += r.over_protection;
        self.late_acks += r.late_acks;
        self.attempts_total += r.attempts_total;
        self.violations += r.violations;
    }

    /// Escalated / custody, with its Wilson 95 % interval.
    pub fn escalation_rate(&self) -> (f64, f64, f64) {
        wilson(self.escalated, self.custody)
    }

    /// Spurious escalations / custody, with its Wilson 95 % interval.
    pub fn spurious_rate(&self) -> (f64, f64, f64) {
        wilson(self.spurious_escalations, self.custody)
    }
}

/// `summary.csv`: one line per partition length; rates to 6 decimals.
pub(crate) fn summary_to_csv(rows: &[DurationSummary]) -> String {
    let mut s = String::from(SUMMARY_HEADER);
    s.push('\n');
    for r in rows {
        let (e, elo, ehi) = r.escalation_rate();
        let (p, plo, phi) = r.spurious_rate();
        let _ = writeln!(
            s,
            "{},{},{:.3},{},{},{},{},{},{},{},{},{},{},{e:.6},{elo:.6},{ehi:.6},{p:.6},{plo:.6},{phi:.6}",
            r.step,
            r.duration_ms,
            r.duration_ms as f64 / 1000.0,
            r.runs,
            r.custody,
            r.applied,
            r.declined,
            r.escalated,
            r.spurious_escalations,
            r.over_protection,
            r.late_acks,
            r.attempts_total,
            r.violations,
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip() {
        let r = StudyRow {
            step: 2,
            duration_ms: 45_000,
            seed_index: 1,
            seed: 20_260_610,
            planned: 10,
            custody: 9,
            best_effort: 1,
            offers_refused: 0,
            applied: 5,
            declined: 1,
            escalated: 3,
            pending_at_end: 0,
            spurious_escalations: 1,
            over_protection: 1,
            late_acks: 1,
            attempts_total: 30,
            attempts_max: 7,
            crashes: 0,
            violations: 0,
        };
        let text = rows_to_csv(std::slice::from_ref(&r));
        assert_eq!(parse_csv(&text).unwrap(), vec![r]);
        assert!(parse_csv("a,b\n").is_err());
        assert!(parse_csv(&format!("{CSV_HEADER}\n1,2\n")).is_err());
    }

    #[test]
    fn wilson_is_sane() {
        assert_eq!(wilson(0, 0), (0.0, 0.0, 0.0));
        let (p, lo, hi) = wilson(50, 100);
        assert!((p - 0.5).abs() < 1e-12);
        assert!((lo - 0.4038).abs() < 1e-3 && (hi - 0.5962).abs() < 1e-3);
        let (_, lo, hi) = wilson(0, 20);
        assert_eq!(lo, 0.0);
        assert!(hi > 0.1 && hi < 0.2);
    }
}
