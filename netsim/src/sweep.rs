//! Runs a sweep on every core: the transfer index range is cut into small
//! chunks that worker threads take in turn, and their tallies are added.
//!
//! Every transfer's draws depend only on the seed and its index (a ChaCha8
//! stream per transfer in the core model; the CPython master stream, replayed
//! in index order, in reference-v1), and tallies add up in any order, so the
//! result is the same for any thread count, chunk size or shard split.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use abhyasa_check::sim::{run_sweep_range, SweepConfig};
use indicatif::ProgressBar;

use crate::reference::{MasterStream, ReferenceDriver};
use crate::settings::{Fault, Model, SettingsError, SweepSettings};
use crate::shard::Shard;
use crate::summary::{outcome_mix, SweepIdentity, SweepSummary, Tally};

/// Transfers per chunk in the core model. Each chunk gets a fresh core
/// `Pair`: the custodian's terminal table and the receiver's ledger then
/// stay small and cache-resident instead of growing for the whole run
/// (measured: 64 per chunk is ~1.8x faster than one `Pair` per 100k).
const CORE_CHUNK: u64 = 64;

/// Transfers per block in reference-v1: one lock of the master stream per
/// block.
const REFERENCE_BLOCK: u64 = 256;

/// What to run.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepPlan {
    /// Channel model.
    pub model: Model,
    /// Master seed.
    pub seed: u64,
    /// First transfer index of the whole sweep.
    pub first: u64,
    /// Transfers in the whole sweep.
    pub transfers: u64,
    /// Run only this shard of it.
    pub shard: Option<Shard>,
    /// Custody and workload settings.
    pub settings: SweepSettings,
    /// Test-only fault injection.
    pub fault: Option<Fault>,
    /// Worker threads (at least 1).
    pub threads: usize,
}

impl SweepPlan {
    /// A plan with the model's default settings, no shard, no fault and one
    /// thread per available core.
    pub fn new(model: Model, seed: u64, transfers: u64) -> Self {
        Self {
            model,
            seed,
            first: 0,
            transfers,
            shard: None,
            settings: SweepSettings::default_for(model),
            fault: None,
            threads: default_threads(),
        }
    }

    /// The transfer indices this plan runs.
    pub fn range(&self) -> Range<u64> {
        self.shard
            .unwrap_or(Shard::WHOLE)
            .range(self.first, self.transfers)
    }

    /// The sweep's identity (everything the result depends on).
    pub fn identity(&self) -> SweepIdentity {
        SweepIdentity {
            model: self.model,
            seed: self.seed,
            first: self.first,
            transfers_total: self.transfers,
            shard: self.shard,
            settings: self.settings,
            fault: self.fault,
        }
    }
}

/// One thread per available core.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Why a sweep could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SweepError {
    /// The settings are invalid.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// `first + transfers` does not fit the index space.
    #[error("--first {first} plus --transfers {transfers} overflows the transfer index space")]
    RangeOverflow {
        /// First index.
        first: u64,
        /// Count.
        transfers: u64,
    },
    /// Fault injection needs a model whose receiver netsim drives itself.
    #[error(
        "--dangerous-inject-fault needs --compat reference-v1: the core model runs \
         abhyasa_check::sim::run_sweep_range, which has no receiver hook"
    )]
    FaultNeedsReferenceModel,
    /// A worker thread panicked (a bug: the message was printed above).
    #[error("a sweep worker panicked; replay with: {replay}")]
    WorkerPanicked {
        /// The command that replays the run.
        replay: String,
    },
}

/// Runs a sweep plan. `progress`, if given, is advanced as transfers finish
/// (its length is set to the number of transfers).
pub fn run_sweep(
    plan: &SweepPlan,
    progress: Option<&ProgressBar>,
) -> Result<SweepSummary, SweepError> {
    plan.settings.validate()?;
    if plan.first.checked_add(plan.transfers).is_none() {
        return Err(SweepError::RangeOverflow {
            first: plan.first,
            transfers: plan.transfers,
        });
    }
    if plan.fault.is_some() && plan.model == Model::Core {
        return Err(SweepError::FaultNeedsReferenceModel);
    }
    let range = plan.range();
    let threads = plan.threads.max(1);
    if let Some(p) = progress {
        p.set_length(range.end - range.start);
    }
    let started = Instant::now();
    let tally = match plan.model {
        Model::Core => {
            let cfg = plan.settings.core_config(plan.seed);
            let next = AtomicU64::new(range.start);
            let work = || {
                let start = next.fetch_add(CORE_CHUNK, Ordering::Relaxed);
                (start < range.end).then(|| {
                    core_chunk(&cfg, start..start.saturating_add(CORE_CHUNK).min(range.end))
                })
            };
            execute(threads, &work, progress)
        }
        Model::ReferenceV1 => {
            let mut master = MasterStream::new(plan.seed);
            master.skip_to(range.start);
            let feed = Mutex::new(master);
            let work = || {
                let (start, params) = {
                    let mut m = feed.lock().unwrap_or_else(|e| e.into_inner());
                    let start = m.next_index();
                    if start >= range.end {
                        return None;
                    }
                    let n = REFERENCE_BLOCK.min(range.end - start);
                    (start, (0..n).map(|_| m.next_params()).collect::<Vec<_>>())
                };
                let mut driver = ReferenceDriver::new(plan.fault);
                Some(driver.run_block(start, &params))
            };
            execute(threads, &work, progress)
        }
    };
    let elapsed = started.elapsed().as_secs_f64();
    let id = plan.identity();
    let (tally, cpu_s) = tally.map_err(|()| SweepError::WorkerPanicked {
        replay: SweepSummary::from_tally(&id, range.start, range.end, Tally::default(), 0, 0.0)
            .replay_run(),
    })?;
    if let Some(p) = progress {
        p.finish_and_clear();
    }
    let mut summary =
        SweepSummary::from_tally(&id, range.start, range.end, tally, threads, elapsed);
    summary.cpu_s = cpu_s;
    summary.finish();
    Ok(summary)
}

/// Runs `work` on `threads` threads until it returns `None`, adding the
/// tallies. The calling thread only reports progress.
fn execute<W>(
    threads: usize,
    work: &W,
    progress: Option<&ProgressBar>,
) -> Result<(Tally, Option<f64>), ()>
where
    W: Fn() -> Option<Tally> + Sync,
{
    let done = AtomicU64::new(0);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let cpu_at_start = thread_cpu_seconds();
                    let mut acc = Tally::default();
                    while let Some(t) = work() {
                        done.fetch_add(t.transfers, Ordering::Relaxed);
                        acc.add(t);
                    }
                    let cpu = thread_cpu_seconds().zip(cpu_at_start).map(|(b, a)| b - a);
                    (acc, cpu)
                })
            })
            .collect();
        if let Some(p) = progress {
            while !handles.iter().all(|h| h.is_finished()) {
                p.set_position(done.load(Ordering::Relaxed));
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let mut total = Tally::default();
        let mut cpu = Some(0.0);
        let mut panicked = false;
        for h in handles {
            match h.join() {
                Ok((t, c)) => {
                    total.add(t);
                    cpu = cpu.zip(c).map(|(a, b)| a + b);
                }
                Err(_) => panicked = true,
            }
        }
        if panicked {
            Err(())
        } else {
            Ok((total, cpu))
        }
    })
}

/// CPU time (user + system) of the calling thread, from
/// `/proc/thread-self/stat` (Linux; `None` elsewhere). On a shared machine
/// this, not wall-clock time, says what the simulator costs.
fn thread_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields of the line, in USER_HZ (100 on Linux) ticks.
    let rest = stat.rsplit_once(')')?.1;
    let mut f = rest.split_whitespace().skip(11);
    let utime: u64 = f.next()?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    Some((utime + stime) as f64 / 100.0)
}

/// One chunk of the core model: the abstract sweep and the one checker
/// (`abhyasa_check::sim::run_sweep_range`), on a fresh `Pair`.
fn core_chunk(cfg: &SweepConfig, range: Range<u64>) -> Tally {
    let r = run_sweep_range(cfg, range.clone());
    let mut t = Tally {
        transfers: r.transfers,
        applied: r.applied,
        declined: r.declined,
        escalated: r.escalated,
        best_effort: r.best_effort,
        total_attempts: r.total_attempts,
        spurious_escalations: r.spurious_escalations,
        late_acks: r.late_acks,
        ..Tally::default()
    };
    for v in r.violations {
        t.violation(v.transfer, v.what());
    }
    // The core pushes one outcome per transfer that ended; with no
    // violation they line up with the indices.
    for (i, o) in range.clone().zip(&r.outcomes) {
        t.digest = t.digest.wrapping_add(outcome_mix(i, Some(*o), 0));
    }
    let ended = t.applied + t.declined + t.escalated + t.best_effort;
    if t.violations == 0 && (ended != t.transfers || t.transfers != range.end - range.start) {
        t.violation(
            range.start,
            format!(
                "outcome counts do not add up in transfers {}..{}: {} ran, {} ended",
                range.start, range.end, t.transfers, ended
            ),
        );
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_model_result_does_not_depend_on_threads_or_chunking() {
        let mut plan = SweepPlan::new(Model::Core, 3, 1_000);
        plan.threads = 1;
        let one = run_sweep(&plan, None).unwrap();
        plan.threads = 3;
        let three = run_sweep(&plan, None).unwrap();
        assert!(one.same_result(&three));
        assert_eq!(one.violations, 0);
        // The core engine over the whole range in one call agrees.
        let r = run_sweep_range(&plan.settings.core_config(3), 0..1_000);
        assert_eq!(
            (
                r.applied,
                r.declined,
                r.escalated,
                r.best_effort,
                r.total_attempts
            ),
            (
                one.applied,
                one.declined,
                one.escalated,
                one.best_effort,
                one.total_attempts
            )
        );
    }

    #[test]
    fn refuses_fault_on_core_model_and_overflow() {
        let mut plan = SweepPlan::new(Model::Core, 3, 10);
        plan.fault = Some(Fault::LedgerDisabled);
        assert!(matches!(
            run_sweep(&plan, None),
            Err(SweepError::FaultNeedsReferenceModel)
        ));
        let mut plan = SweepPlan::new(Model::Core, 3, 10);
        plan.first = u64::MAX;
        assert!(matches!(
            run_sweep(&plan, None),
            Err(SweepError::RangeOverflow { .. })
        ));
    }
}
