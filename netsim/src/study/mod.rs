//! Parameter studies over full-stack scenarios (`abhyasa-sim study`).
//!
//! The partition-duration study ([`PartitionDurationStudy`]) sweeps the
//! length of every `[[partition]]` of a scenario over `steps` evenly
//! spaced durations from `from` to `to` (both included), runs `seeds`
//! seeds of the full-stack simulation ([`run_scenario`]) at each length,
//! and writes:
//!
//! * `study.csv` — one row of raw counts per run (length, seed), sorted by
//!   (step, seed index): shards merge exactly by concatenation and sort;
//! * `study.json` — the study's identity (scenario fingerprint, grid,
//!   base seed, shard): what `abhyasa-sim merge` checks before combining;
//! * `summary.csv` and `study.svg` — per length, the escalation and
//!   spurious-escalation rates (pooled sums over seeds, Wilson 95 %
//!   intervals) and their plot with the deadline marked; written only for
//!   a whole study (unsharded, or merged).
//!
//! Run `r` of the grid is step `r / seeds`, seed index `r % seeds`, seed
//! `base_seed + seed_index` (the same seeds at every length: common random
//! numbers, so lengths are compared on the same workloads). Shard `I/N`
//! runs the `r` with `r % N == I`: long partitions (long simulations) are
//! spread over every shard. Every output is a function of the scenario,
//! the grid and the base seed, never of the thread count or the sharding.

mod csv;
mod merge;
mod plot;
pub mod window;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};

use crate::fullstack::{run_scenario, RunReport, Scenario};
use crate::shard::Shard;

pub use csv::{DurationSummary, StudyRow, CSV_HEADER, SUMMARY_HEADER};
pub(crate) use merge::is_study_input;
pub use merge::merge_study;
pub use plot::render_svg;

/// Format tag of `study.json`.
pub const STUDY_FORMAT: &str = "abhyasa-sim/study/partition-duration/v1";

/// Why a study could not be run, written or merged (exit status 2).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StudyError {
    /// The grid is empty or inverted.
    #[error("{0}")]
    Grid(String),
    /// The scenario has nothing to sweep, or is invalid at some length.
    #[error("scenario {scenario}: {problem}")]
    Scenario {
        /// Scenario name.
        scenario: String,
        /// What is wrong.
        problem: String,
    },
    /// A run could not be carried out (not a violation).
    #[error("scenario {scenario}, partition {duration}, seed {seed}: {message}")]
    Run {
        /// Scenario name.
        scenario: String,
        /// Partition length, formatted.
        duration: String,
        /// Seed.
        seed: u64,
        /// The run error.
        message: String,
    },
    /// A worker thread panicked (a bug; the message was printed above).
    #[error("a study worker panicked")]
    WorkerPanicked,
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// An input file is not study output, or contradicts itself.
    #[error("{path}: {problem}")]
    Input {
        /// The file.
        path: String,
        /// What is wrong.
        problem: String,
    },
    /// Inputs that are not shards of one study.
    #[error("{0}")]
    Merge(String),
    /// The plot could not be drawn.
    #[error("plot: {0}")]
    Plot(String),
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> StudyError + '_ {
    move |source| StudyError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Everything a study's result depends on (`study.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StudyIdentity {
    /// [`STUDY_FORMAT`].
    pub format: String,
    /// Scenario name.
    pub scenario: String,
    /// The scenario file as given on the command line (replay commands).
    pub scenario_file: String,
    /// Fingerprint of the parsed scenario (FNV-1a 64 of its JSON form):
    /// shards of one study ran the same scenario, wherever its file was.
    pub scenario_digest: String,
    /// The scenario's custody deadline, ms.
    pub deadline_ms: u64,
    /// Shortest partition, ms.
    pub from_ms: u64,
    /// Longest partition, ms.
    pub to_ms: u64,
    /// Partition lengths (points, both ends included).
    pub steps: u32,
    /// Seeds per length.
    pub seeds: u32,
    /// Seed of seed index 0; seed index `j` runs seed `base_seed + j`.
    pub base_seed: u64,
    /// The shard this output covers (`None`: the whole study).
    pub shard: Option<Shard>,
}

impl StudyIdentity {
    /// Runs in the whole grid.
    pub fn total_runs(&self) -> u64 {
        u64::from(self.steps) * u64::from(self.seeds)
    }

    /// Partition length of step `i`, ms: `from + (to - from) * i / (steps - 1)`,
    /// rounded down to the millisecond (`from` alone when `steps` is 1).
    pub fn duration_ms(&self, step: u32) -> u64 {
        if self.steps <= 1 {
            return self.from_ms;
        }
        let span = u128::from(self.to_ms.saturating_sub(self.from_ms));
        let off = span * u128::from(step) / u128::from(self.steps - 1);
        self.from_ms + u64::try_from(off).unwrap_or(u64::MAX - self.from_ms)
    }

    /// The seed of seed index `j`.
    pub fn seed(&self, seed_index: u32) -> u64 {
        self.base_seed.wrapping_add(u64::from(seed_index))
    }

    /// True when `run` (grid index `step * seeds + seed_index`) belongs to
    /// `shard` (round robin: `run % N == I`).
    pub fn in_shard(run: u64, shard: Option<Shard>) -> bool {
        shard.is_none_or(|s| run % u64::from(s.count()) == u64::from(s.index()))
    }
}

/// The replay command of one run of a study.
pub fn replay_command(scenario_file: &str, seed: u64, duration_ms: u64) -> String {
    format!(
        "abhyasa-sim run {scenario_file} --seed {seed} --partition-duration {}",
        format_ms(duration_ms)
    )
}

/// `90s`, `1500ms`: a form `abhyasa-sim` parses back exactly.
pub fn format_ms(ms: u64) -> String {
    if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// FNV-1a 64 of `bytes`, hex.
fn fnv1a_hex(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The partition-duration study: what to run.
#[derive(Clone, Debug)]
pub struct PartitionDurationStudy {
    /// The scenario whose partitions are swept.
    pub scenario: Scenario,
    /// Its file as given (for replay commands).
    pub scenario_file: String,
    /// Shortest partition.
    pub from: Duration,
    /// Longest partition.
    pub to: Duration,
    /// Partition lengths, both ends included (points, not intervals).
    pub steps: u32,
    /// Seeds per length.
    pub seeds: u32,
    /// Seed of seed index 0.
    pub base_seed: u64,
    /// Run only this shard of the grid.
    pub shard: Option<Shard>,
    /// Worker threads (at least 1; the result does not depend on it).
    pub threads: usize,
}

/// The result of a study, a shard of one, or a merge.
#[derive(Clone, Debug, PartialEq)]
pub struct StudyResult {
    /// What was run.
    pub identity: StudyIdentity,
    /// One row per run, sorted by (step, seed index).
    pub rows: Vec<StudyRow>,
}

impl PartitionDurationStudy {
    /// The study's identity; checks the grid and the scenario at every
    /// length before anything runs.
    pub fn identity(&self) -> Result<StudyIdentity, StudyError> {
        if self.steps == 0 {
            return Err(StudyError::Grid("--steps must be at least 1".into()));
        }
        if self.seeds == 0 {
            return Err(StudyError::Grid("--seeds must be at least 1".into()));
        }
        if self.from > self.to {
            return Err(StudyError::Grid(
                "--from must not be longer than --to".into(),
            ));
        }
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let s = &self.scenario;
        let bad = |problem: String| StudyError::Scenario {
            scenario: s.name.clone(),
            problem,
        };
        if s.partitions.is_empty() {
            return Err(bad(
                "has no [[partition]] whose length could be swept".into()
            ));
        }
        let json = serde_json::to_vec(s).map_err(|e| bad(e.to_string()))?;
        let id = StudyIdentity {
            format: STUDY_FORMAT.to_string(),
            scenario: s.name.clone(),
            scenario_file: self.scenario_file.clone(),
            scenario_digest: fnv1a_hex(&json),
            deadline_ms: ms(s.workload.deadline.0),
            from_ms: ms(self.from),
            to_ms: ms(self.to),
            steps: self.steps,
            seeds: self.seeds,
            base_seed: self.base_seed,
            shard: self.shard,
        };
        for step in 0..self.steps {
            let d = id.duration_ms(step);
            s.with_partition_duration(Duration::from_millis(d))
                .validate()
                .map_err(|e| bad(format!("with partitions of {}: {e}", format_ms(d))))?;
        }
        Ok(id)
    }

    /// Runs this study (or its shard). `bar`, if any, gets its length set
    /// and advances by one per run.
    pub fn run(&self, bar: Option<&ProgressBar>) -> Result<StudyResult, StudyError> {
        let id = self.identity()?;
        let runs: Vec<u64> = (0..id.total_runs())
            .filter(|r| StudyIdentity::in_shard(*r, id.shard))
            .collect();
        if let Some(b) = bar {
            b.set_length(runs.len() as u64);
        }
        let scenarios: Vec<Scenario> = (0..id.steps)
            .map(|st| {
                self.scenario
                    .with_partition_duration(Duration::from_millis(id.duration_ms(st)))
            })
            .collect();
        let seeds = u64::from(id.seeds);
        let next = AtomicUsize::new(0);
        let results: Mutex<Vec<Option<Result<StudyRow, StudyError>>>> =
            Mutex::new((0..runs.len()).map(|_| None).collect());
        let threads = self.threads.clamp(1, runs.len().max(1));
        let work = || loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(&r) = runs.get(i) else { break };
            // r < steps * seeds, so both fit a u32.
            let step = u32::try_from(r / seeds).unwrap_or(u32::MAX);
            let seed_index = u32::try_from(r % seeds).unwrap_or(u32::MAX);
            let row = one_run(&id, &scenarios, step, seed_index);
            if let Ok(mut v) = results.lock() {
                v[i] = Some(row);
            }
            if let Some(b) = bar {
                b.inc(1);
            }
        };
        // One thread: on the caller's (thread-local test hooks apply).
        let panicked = if threads == 1 {
            work();
            false
        } else {
            std::thread::scope(|sc| {
                let handles: Vec<_> = (0..threads).map(|_| sc.spawn(work)).collect();
                handles.into_iter().any(|h| h.join().is_err())
            })
        };
        if panicked {
            return Err(StudyError::WorkerPanicked);
        }
        let results = results
            .into_inner()
            .map_err(|_| StudyError::WorkerPanicked)?;
        let mut rows = Vec::with_capacity(results.len());
        for r in results {
            rows.push(r.ok_or(StudyError::WorkerPanicked)??);
        }
        rows.sort_by_key(|r| (r.step, r.seed_index));
        Ok(StudyResult { identity: id, rows })
    }
}

fn one_run(
    id: &StudyIdentity,
    scenarios: &[Scenario],
    step: u32,
    seed_index: u32,
) -> Result<StudyRow, StudyError> {
    let seed = id.seed(seed_index);
    let duration_ms = id.duration_ms(step);
    let scenario = scenarios
        .get(step as usize)
        .ok_or(StudyError::WorkerPanicked)?;
    let report = run_scenario(scenario, seed).map_err(|e| StudyError::Run {
        scenario: id.scenario.clone(),
        duration: format_ms(duration_ms),
        seed,
        message: e.to_string(),
    })?;
    Ok(StudyRow::from_report(
        step,
        duration_ms,
        seed_index,
        &report,
    ))
}

impl StudyRow {
    /// The row of one run.
    pub fn from_report(step: u32, duration_ms: u64, seed_index: u32, r: &RunReport) -> Self {
        Self {
            step,
            duration_ms,
            seed_index,
            seed: r.seed,
            planned: r.planned,
            custody: r.custody,
            best_effort: r.best_effort,
            offers_refused: r.offers_refused,
            applied: r.outcomes.applied,
            declined: r.outcomes.declined,
            escalated: r.outcomes.escalated,
            pending_at_end: r.outcomes.pending_at_end,
            spurious_escalations: r.spurious_escalations,
            over_protection: r.over_protection,
            late_acks: r.late_acks,
            attempts_total: r.attempts_total,
            attempts_max: u64::from(r.attempts_max),
            crashes: r.crashes,
            violations: r.violation_count,
        }
    }
}

impl StudyResult {
    /// True when every run of the grid is here (unsharded or merged).
    pub fn is_complete(&self) -> bool {
        self.identity.shard.is_none() && self.rows.len() as u64 == self.identity.total_runs()
    }

    /// Runs that broke an invariant.
    pub fn violating(&self) -> impl Iterator<Item = &StudyRow> {
        self.rows.iter().filter(|r| r.violations > 0)
    }

    /// Per partition length: pooled counts and rates.
    pub fn summary(&self) -> Vec<DurationSummary> {
        let mut out: Vec<DurationSummary> = Vec::new();
        for r in &self.rows {
            match out.last_mut() {
                Some(s) if s.step == r.step => s.add(r),
                _ => {
                    let mut s = DurationSummary::new(r.step, r.duration_ms);
                    s.add(r);
                    out.push(s);
                }
            }
        }
        out
    }

    /// Writes `study.csv` and `study.json` into `dir` (created if
    /// missing) and, for a whole study, `summary.csv` and `study.svg`.
    /// Returns the files written.
    pub fn write(&self, dir: &Path) -> Result<Vec<std::path::PathBuf>, StudyError> {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let mut files = Vec::new();
        let mut put = |name: &str, text: String| -> Result<(), StudyError> {
            let p = dir.join(name);
            std::fs::write(&p, text).map_err(io_err(&p))?;
            files.push(p);
            Ok(())
        };
        put("study.csv", csv::rows_to_csv(&self.rows))?;
        let json = serde_json::to_string_pretty(&self.identity)
            .map_err(|e| StudyError::Plot(e.to_string()))?;
        put("study.json", json + "\n")?;
        if self.is_complete() {
            let summary = self.summary();
            put("summary.csv", csv::summary_to_csv(&summary))?;
            put("study.svg", render_svg(&self.identity, &summary)?)?;
        }
        Ok(files)
    }

    /// A table of the per-length rates, for the terminal.
    pub fn table(&self) -> String {
        use std::fmt::Write as _;
        let id = &self.identity;
        let mut t = format!(
            "study partition-duration: scenario {}, deadline {}, {} lengths x {} seeds (seeds {}..={}){}\n",
            id.scenario,
            format_ms(id.deadline_ms),
            id.steps,
            id.seeds,
            id.base_seed,
            id.seed(id.seeds.saturating_sub(1)),
            id.shard.map_or(String::new(), |s| format!(", shard {s}")),
        );
        t.push_str("  partition   custody  escalated  rate (95% CI)           spurious  rate (95% CI)           over-prot  violations\n");
        for s in self.summary() {
            let (e, elo, ehi) = s.escalation_rate();
            let (p, plo, phi) = s.spurious_rate();
            let _ = writeln!(
                t,
                "  {:>9}  {:>8}  {:>9}  {:>6.2}% [{:>6.2}, {:>6.2}]  {:>8}  {:>6.2}% [{:>6.2}, {:>6.2}]  {:>9}  {:>10}",
                format_ms(s.duration_ms),
                s.custody,
                s.escalated,
                100.0 * e,
                100.0 * elo,
                100.0 * ehi,
                s.spurious_escalations,
                100.0 * p,
                100.0 * plo,
                100.0 * phi,
                s.over_protection,
                s.violations,
            );
        }
        t
    }

    /// The violation report (stderr): seed, scenario, length and replay
    /// command of every run that broke an invariant.
    pub fn violation_report(&self) -> String {
        use std::fmt::Write as _;
        let id = &self.identity;
        let bad: Vec<&StudyRow> = self.violating().collect();
        let total: u64 = bad.iter().map(|r| r.violations).sum();
        let mut t = format!(
            "INVARIANT VIOLATED: {total} violation(s) in {} run(s) of study partition-duration, scenario {}\n",
            bad.len(),
            id.scenario
        );
        for r in bad {
            let _ = writeln!(
                t,
                "  scenario {}, partition {}, seed {}: {} violation(s)\n    replay: {}",
                id.scenario,
                format_ms(r.duration_ms),
                r.seed,
                r.violations,
                replay_command(&id.scenario_file, r.seed, r.duration_ms)
            );
        }
        t
    }
}
