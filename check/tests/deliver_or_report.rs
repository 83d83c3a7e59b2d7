//! Deliver-or-report across a seeded sweep (C-DOR-1..3).

#![allow(clippy::unwrap_used)]

use abhyasa_check::sim::{run_sweep_range, LinkProfile, SweepConfig};
use abhyasa_core::custody::TerminalState;

// C-DOR-1: every admissible obligation ends applied/declined/escalated,
// applications <= 1, all three outcomes occur, over 100,000 transfers with
// drop, duplicate, ack-drop and reorder rates each drawn in [0, 1).
#[test]
fn c_dor_1_sweep_of_100k_transfers_holds_every_invariant() {
    let cfg = SweepConfig::default();
    let r = run_sweep_range(&cfg, 0..100_000);
    println!(
        "C-DOR-1 sweep seed {}: transfers {} applied {} declined {} escalated {} best-effort {} \
         mean attempts {:.3} spurious escalations {} late acks {} violations {}",
        cfg.seed,
        r.transfers,
        r.applied,
        r.declined,
        r.escalated,
        r.best_effort,
        r.mean_attempts(),
        r.spurious_escalations,
        r.late_acks,
        r.violations.len()
    );
    assert!(
        r.violations.is_empty(),
        "violations: {:?}",
        &r.violations[..r.violations.len().min(5)]
    );
    assert_eq!(r.transfers, 100_000);
    assert_eq!(
        r.applied + r.declined + r.escalated + r.best_effort,
        r.transfers
    );
    assert!(r.applied > 0 && r.declined > 0 && r.escalated > 0 && r.best_effort > 0);
    // Apply is twice as likely as decline among delivered decisions.
    let ratio = r.applied as f64 / r.declined as f64;
    assert!((1.6..2.4).contains(&ratio), "applied:declined = {ratio}");
}

// The sweep also holds with receivers that defer.
#[test]
fn c_dor_1_sweep_with_deferrals() {
    let cfg = SweepConfig {
        seed: 7,
        defer_probability: 0.2,
        ..SweepConfig::default()
    };
    let r = run_sweep_range(&cfg, 0..5_000);
    assert!(
        r.violations.is_empty(),
        "{:?}",
        &r.violations[..r.violations.len().min(5)]
    );
    assert!(r.escalated > 0);
}

// C-DOR-2: total partition always escalates; a lossless link always applies.
#[test]
fn c_dor_2_partition_escalates_and_lossless_applies() {
    let mut cfg = SweepConfig {
        fixed_link: Some(LinkProfile::partitioned()),
        benign_fraction: 0.0,
        ..SweepConfig::default()
    };
    let r = run_sweep_range(&cfg, 0..500);
    assert!(r.violations.is_empty());
    assert_eq!(r.escalated, 500);
    // Jitter only lengthens intervals: at most the 15 un-jittered attempts.
    assert!(
        (13.0..=15.0).contains(&r.mean_attempts()),
        "{}",
        r.mean_attempts()
    );
    cfg.backoff.jitter = 0.0;
    let r = run_sweep_range(&cfg, 0..500);
    assert_eq!(r.escalated, 500);
    assert_eq!(
        r.mean_attempts(),
        15.0,
        "t = 0, 1, 3, ..., 575: the schedule spans the deadline"
    );

    let cfg = SweepConfig {
        fixed_link: Some(LinkProfile::lossless()),
        benign_fraction: 0.0,
        ..SweepConfig::default()
    };
    let r = run_sweep_range(&cfg, 0..3_000);
    assert!(r.violations.is_empty());
    assert_eq!(r.escalated, 0);
    assert_eq!(r.applied + r.declined, 3_000);
    assert_eq!(
        r.total_attempts, 3_000,
        "one attempt each on a lossless link"
    );
}

// C-DOR-3: same seed, identical outcome list; shards merge into the one-run
// result; another seed differs.
#[test]
fn c_dor_3_same_seed_same_outcomes() {
    let cfg = SweepConfig {
        seed: 99,
        ..SweepConfig::default()
    };
    let a = run_sweep_range(&cfg, 0..4_000);
    let b = run_sweep_range(&cfg, 0..4_000);
    assert_eq!(a, b);
    let mut merged = run_sweep_range(&cfg, 0..1_500);
    merged.merge(run_sweep_range(&cfg, 1_500..4_000));
    assert_eq!(merged, a);
    let c = run_sweep_range(&SweepConfig { seed: 100, ..cfg }, 0..4_000);
    assert_ne!(c.outcomes, a.outcomes);
    assert!(a.outcomes.contains(&TerminalState::Escalated));
}
