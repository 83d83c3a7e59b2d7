//! Full-stack scenarios under turmoil: each shipped scenario in a short
//! form with zero violations, same seed → identical report (C-DOR-3), and
//! a deliberately broken receiver caught by the checker.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use abhyasa_netsim::fullstack::{run_scenario, RunReport, Scenario};

fn scenario(name: &str) -> Scenario {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(format!("{name}.toml"));
    Scenario::from_file(&p).unwrap()
}

/// The shipped scenario with at most `n` obligations per custodian (the
/// fault schedule is unchanged).
fn short(name: &str, n: u32) -> Scenario {
    let mut s = scenario(name);
    s.workload.obligations = s.workload.obligations.min(n);
    s
}

fn run(s: &Scenario, seed: u64) -> RunReport {
    let r = run_scenario(s, seed).unwrap();
    assert!(r.passed(), "{r}\n{:#?}", r.violations);
    assert_eq!(r.outcomes.pending_at_end, 0, "{r}");
    // Deliver-or-report: every custody transfer ended one of three ways.
    let o = &r.outcomes;
    assert_eq!(o.applied + o.declined + o.escalated, r.custody, "{r}");
    r
}

// C-AB1-1 through the full stack: a clean LAN applies everything on the
// first attempt.
#[test]
fn clean_lan_applies_everything_on_the_first_attempt() {
    let r = run(&short("clean-lan", 60), 1);
    assert!(r.custody > 0);
    assert_eq!(r.outcomes.applied, r.custody, "{r}");
    assert_eq!(r.attempts_total, r.custody, "{r}");
    assert_eq!(
        r.receiver_applications,
        r.custody + r.overhead.frames_delivered["obligation_best_effort"].frames
    );
    assert_eq!(r.spurious_escalations, 0);
}

// C-AB4-1 / C-DOR-2 through the full stack: what the partition outlasts
// escalates with the fail-safe; what comes after it is applied.
#[test]
fn long_partition_escalates_what_it_outlasts_and_recovers() {
    let r = run(&short("long-partition", 120), 2);
    assert!(r.outcomes.escalated > 0, "{r}");
    assert!(r.outcomes.applied > 0, "{r}");
    assert!(r.latency_offer_to_discharge.max_ms >= 30_000.0, "{r}");
}

// C-DOR-3: same seed, same report.
#[test]
fn same_seed_same_report() {
    let s = short("long-partition", 60);
    let a = run(&s, 7);
    let b = run(&s, 7);
    assert_eq!(a, b);
    let json = serde_json::to_string(&a).unwrap();
    let back: RunReport = serde_json::from_str(&json).unwrap();
    assert_eq!(back, a);
}
