//! Running a check and reporting it.

use std::fmt;
use std::time::{Duration, Instant};

use stateright::{Checker, Expectation, HasDiscoveries, Model};

use crate::config::CheckConfig;
use crate::model::AbhyasaModel;
use crate::trace;

/// Order of exploration. Both visit every reachable state once (they
/// deduplicate on the same fingerprint) and check every property in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Search {
    /// Breadth-first: counterexamples are shortest, and `max_depth` is the
    /// largest distance (in steps) of a reachable state from the initial
    /// one. Holds the whole frontier of full states in memory, which limits
    /// it to a few million states.
    #[default]
    BreadthFirst,
    /// Depth-first: keeps only the fingerprints of visited states and one
    /// path's worth of full states, so its memory stays small; the
    /// `max_depth` it reports is the longest depth-first path, which can
    /// exceed the breadth-first figure.
    DepthFirst,
}

impl fmt::Display for Search {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Search::BreadthFirst => "breadth-first",
            Search::DepthFirst => "depth-first",
        })
    }
}

impl std::str::FromStr for Search {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "bfs" | "breadth-first" => Ok(Search::BreadthFirst),
            "dfs" | "depth-first" => Ok(Search::DepthFirst),
            other => Err(format!("unknown search {other:?}: expected bfs | dfs")),
        }
    }
}

/// How to run.
#[derive(Clone, Copy, Debug)]
pub struct RunOptions {
    /// Worker threads.
    pub threads: usize,
    /// Stop at the first counterexample (mutation runs) instead of
    /// exploring everything.
    pub stop_at_first_failure: bool,
    /// Safety cap on generated states (counting repeats); a run that hits
    /// it reports itself incomplete.
    pub max_states: Option<usize>,
    /// Print distinct states, generated states and depth to stderr at this
    /// interval while the run goes on (long runs).
    pub progress: Option<Duration>,
    /// Order of exploration.
    pub search: Search,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            stop_at_first_failure: false,
            max_states: None,
            progress: None,
            search: Search::BreadthFirst,
        }
    }
}

/// A broken property with its trace.
#[derive(Clone, Debug)]
pub struct Counterexample {
    /// The property.
    pub property: &'static str,
    /// Steps in the trace.
    pub steps: usize,
    /// The readable trace.
    pub trace: String,
}

/// The outcome of one run.
#[derive(Clone, Debug)]
pub struct CheckReport {
    /// The configuration, in words.
    pub config: String,
    /// Distinct states explored.
    pub distinct_states: usize,
    /// States generated, counting repeats.
    pub generated_states: usize,
    /// Longest path explored, in states.
    pub max_depth: usize,
    /// Wall-clock time.
    pub elapsed: Duration,
    /// Order of exploration (what `max_depth` means depends on it).
    pub search: Search,
    /// Worker threads.
    pub threads: usize,
    /// Whether the whole bounded state space was explored.
    pub complete: bool,
    /// Broken invariants / liveness, with traces.
    pub counterexamples: Vec<Counterexample>,
    /// Coverage examples reached.
    pub examples_found: Vec<&'static str>,
    /// Coverage examples not reached.
    pub examples_missing: Vec<&'static str>,
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "configuration {}", self.config)?;
        writeln!(
            f,
            "distinct states {}, generated {}, max depth {}, {:.1}s, {}, {} thread(s), {}",
            self.distinct_states,
            self.generated_states,
            self.max_depth,
            self.elapsed.as_secs_f64(),
            self.search,
            self.threads,
            if self.complete {
                "complete"
            } else {
                "stopped early"
            }
        )?;
        writeln!(f, "examples reached: {}", self.examples_found.join("; "))?;
        if !self.examples_missing.is_empty() {
            writeln!(
                f,
                "examples NOT reached: {}",
                self.examples_missing.join("; ")
            )?;
        }
        if self.counterexamples.is_empty() {
            writeln!(
                f,
                "no counterexample: every invariant and the liveness check hold"
            )?;
        }
        for c in &self.counterexamples {
            writeln!(
                f,
                "\nCOUNTEREXAMPLE to \"{}\" ({} steps):\n{}",
                c.property, c.steps, c.trace
            )?;
        }
        Ok(())
    }
}

/// Explores the configuration's whole bounded state space (or stops early
/// as `opts` says) and reports what it found.
pub fn check(config: CheckConfig, opts: RunOptions) -> Result<CheckReport, String> {
    let described = format!("{config:?}");
    let model = AbhyasaModel::new(config)?;
    let start = Instant::now();
    let mut builder = model.checker().threads(opts.threads.max(1));
    if opts.stop_at_first_failure {
        builder = builder.finish_when(HasDiscoveries::AnyFailures);
    }
    if let Some(n) = opts.max_states {
        builder = builder.target_state_count(n);
    }
    Ok(match opts.search {
        Search::BreadthFirst => summarize(
            wait(builder.spawn_bfs(), &opts, start),
            described,
            start,
            &opts,
        ),
        Search::DepthFirst => summarize(
            wait(builder.spawn_dfs(), &opts, start),
            described,
            start,
            &opts,
        ),
    })
}

/// Waits for the checker, printing a progress line to stderr every
/// `opts.progress` (polling, so the run ends as soon as the search does).
pub(crate) fn wait<M: Model, C: Checker<M>>(checker: C, opts: &RunOptions, start: Instant) -> C {
    if let Some(every) = opts.progress.filter(|d| !d.is_zero()) {
        let mut next = every;
        while !checker.is_done() {
            std::thread::sleep(Duration::from_millis(100));
            if start.elapsed() >= next {
                next += every;
                eprintln!(
                    "progress: distinct states {}, generated {}, max depth {}, {:.0}s",
                    checker.unique_state_count(),
                    checker.state_count(),
                    checker.max_depth(),
                    start.elapsed().as_secs_f64()
                );
            }
        }
    }
    checker.join()
}

fn summarize<C: Checker<AbhyasaModel>>(
    checker: C,
    described: String,
    start: Instant,
    opts: &RunOptions,
) -> CheckReport {
    let elapsed = start.elapsed();
    let discoveries = checker.discoveries();
    let model = checker.model();
    let mut counterexamples = Vec::new();
    let mut examples_found = Vec::new();
    let mut examples_missing = Vec::new();
    for p in &model.properties() {
        let found = discoveries.get(p.name);
        match (&p.expectation, found) {
            (Expectation::Sometimes, Some(_)) => examples_found.push(p.name),
            (Expectation::Sometimes, None) => examples_missing.push(p.name),
            (_, Some(path)) => counterexamples.push(Counterexample {
                property: p.name,
                steps: path.clone().into_actions().len(),
                trace: trace::render(model, path),
            }),
            (_, None) => {}
        }
    }
    counterexamples.sort_by_key(|c| c.steps);
    CheckReport {
        config: described,
        distinct_states: checker.unique_state_count(),
        generated_states: checker.state_count(),
        max_depth: checker.max_depth(),
        elapsed,
        search: opts.search,
        threads: opts.threads.max(1),
        complete: (!opts.stop_at_first_failure || counterexamples.is_empty())
            && opts.max_states.is_none_or(|n| checker.state_count() < n),
        counterexamples,
        examples_found,
        examples_missing,
    }
}
