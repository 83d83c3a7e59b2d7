//! Exhaustive checks of the unmutated core: the CI configuration, and the
//! larger one behind `--ignored` (its figures are in `tla/README.md`).

use abhyasa_checker::{check, CheckConfig, CheckReport, RunOptions};

fn run(config: CheckConfig) -> CheckReport {
    let report = check(config, RunOptions::default()).expect("valid configuration");
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
    let r = run(config);
    assert_holds(&r, 31_250);
}

#[test]
#[ignore = "minutes to tens of minutes; figures in tla/README.md"]
fn large_configuration_holds() {
    let r = run(CheckConfig::large());
    assert_holds(&r, 31_250);
}
