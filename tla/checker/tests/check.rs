//! Exhaustive checks of the unmutated core: the CI configuration, and the
//! larger one behind `--ignored` (its figures are in `tla/README.md`).

use std::time::Duration;

use abhyasa_checker::{check, CheckConfig, CheckReport, RunOptions, Search};

/// Runs a configuration and prints its report: distinct states, depth,
/// time, the examples reached and any counterexample.
fn run(config: CheckConfig, opts: RunOptions) -> CheckReport {
    let report = check(config, opts).expect("valid configuration");
    println!("{report}");
    report
}

/// The examples every full configuration must reach: without them a green
/// run could be vacuous (e.g. a model that never crashes or never applies).
const MUST_REACH: [&str; 7] = [
    "example: applied",
    "example: declined",
    "example: escalated",
    "example: receiver declined superseded",
    "example: receiver declined expired",
    "example: custody resumed after a custodian crash",
    "example: receiver restarted after applying",
];

fn assert_holds(r: &CheckReport, min_states: usize) {
    assert!(r.counterexamples.is_empty(), "counterexample found:\n{r}");
    assert!(r.complete, "exploration did not finish:\n{r}");
    assert!(
        r.distinct_states >= min_states,
        "only {} distinct states (want >= {min_states})",
        r.distinct_states
    );
    for e in MUST_REACH {
        assert!(r.examples_found.contains(&e), "never reached {e:?}:\n{r}");
    }
}

// C-DOR-1, C-AB2-3, C-AB3-1..3, C-AB4-1, C-DL-1, C-SS-1..3, C-DC-1 as
// model-checked properties: every invariant holds in every reachable state
// of the CI bounds, crashes included.
#[test]
fn default_configuration_holds_with_crashes() {
    let config = CheckConfig::default_ci();
    assert!(config.custodian_crashes > 0 && config.receiver_crashes > 0);
    assert!(config.total_crashes > 0);
    let r = run(config, RunOptions::default());
    assert_holds(&r, 31_250);
}

/// Distinct states of the default configuration (see `tla/README.md`); the
/// large one must explore more.
const DEFAULT_STATES: usize = 362_454;

// Depth-first: the same exhaustive exploration with a small memory
// footprint (the breadth-first frontier of this configuration would need
// many gigabytes). Progress goes to stderr every 30 s (`--nocapture`).
#[test]
#[ignore = "minutes in release (depth-first); figures in tla/README.md"]
fn large_configuration_holds() {
    let opts = RunOptions {
        search: Search::DepthFirst,
        progress: Some(Duration::from_secs(30)),
        ..RunOptions::default()
    };
    let r = run(CheckConfig::large(), opts);
    assert_holds(&r, DEFAULT_STATES + 1);
}
