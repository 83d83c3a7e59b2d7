//! Mutation check: with a known defect switched on in the core, the checker
//! must find a counterexample, printed as a readable trace.
//!
//! The defects live behind abhyasa-core's test-only `mutations` feature
//! (enabled for this crate's tests through its dev-dependency) and are
//! switched on only inside the model's steps, on the checker's threads.

use abhyasa_checker::{check, CheckConfig, CheckReport, RunOptions, Scope};
use abhyasa_core::mutations::{active, with, Mutation};

fn ledger_split(step: &mut dyn FnMut()) {
    with(&[Mutation::LedgerNotCommittedWithEffect], step);
}

fn decline_as_applied(step: &mut dyn FnMut()) {
    with(&[Mutation::DeclineAsApplied], step);
}

fn deadline_restart(step: &mut dyn FnMut()) {
    with(&[Mutation::DeadlineRestartedOnRecovery], step);
}

fn guard_off(step: &mut dyn FnMut()) {
    with(&[Mutation::SupersessionGuardOff], step);
}

fn mutated(name: &str, scope: Scope) -> CheckReport {
    let config = CheckConfig::large().with_scope(name, scope);
    let opts = RunOptions {
        stop_at_first_failure: true,
        ..RunOptions::default()
    };
    let report = check(config, opts).expect("valid configuration");
    println!("{report}");
    report
}

fn assert_caught(r: &CheckReport, property: &str) {
    assert!(
        r.counterexamples.iter().any(|c| c.property == property),
        "no counterexample to {property:?}:\n{r}"
    );
    let c = r
        .counterexamples
        .iter()
        .find(|c| c.property == property)
        .expect("checked above");
    assert!(
        c.trace.contains("BROKEN"),
        "trace names no broken invariant"
    );
}

#[test]
fn switches_are_off_unless_a_test_turns_them_on() {
    for m in Mutation::ALL {
        assert!(!active(m));
        with(&[m], || assert!(active(m)));
        assert!(!active(m));
    }
}

// AB-3: the ledger entry (with the effect) must be committed before the
// `applied` ack is released.
#[test]
fn ledger_not_committed_with_effect_is_caught() {
    let r = mutated("ledger-split", ledger_split);
    assert_caught(&r, "custodian agrees with receiver ledger");
}

// Declined ≠ applied: a decline must not discharge custody as applied.
#[test]
fn decline_treated_as_applied_is_caught() {
    let r = mutated("decline-as-applied", decline_as_applied);
    assert_caught(&r, "custodian agrees with receiver ledger");
}

// AB-2: recovery resumes the remaining window; it never restarts it.
#[test]
fn deadline_restarted_on_recovery_is_caught() {
    let r = mutated("deadline-restart", deadline_restart);
    assert_caught(&r, "deadline never moves");
}

// Supersession guard (receiver side): an older sequence arriving after a
// newer one must be declined `superseded`.
#[test]
fn supersession_guard_off_is_caught() {
    let r = mutated("guard-off", guard_off);
    assert_caught(&r, "supersession never regresses");
}
