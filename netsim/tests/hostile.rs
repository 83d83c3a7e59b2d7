//! The hostile relay/transport through the full stack (C-OR-2, C-AZ-2,
//! C-OR-1): real nodes over QUIC, every frame to a node possibly held
//! back, duplicated or followed by a replay, alice deciding each scope with
//! her node's sequences, a second pinned peer granting the same scope in
//! its own name. The invariants hold; taking the issuer out of the
//! governed key or the default sequence out of the custodian (test-only
//! switches, `abhyasa_core::mutations`) breaks them.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use abhyasa_core::mutations::{with, Mutation};
use abhyasa_netsim::fullstack::{run_scenario, RunReport, Scenario};

fn scenario() -> Scenario {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios/hostile-relay.toml");
    Scenario::from_file(&p).unwrap()
}

/// Alice revokes, then grants again (her latest decision widens).
fn regrant() -> Scenario {
    let mut s = scenario();
    if let Some(r) = &mut s.race {
        r.alice = vec!["revoke".into(), "grant".into()];
    }
    s
}

fn run(s: &Scenario, seed: u64) -> RunReport {
    let r = run_scenario(s, seed).unwrap();
    println!("{r}");
    let h = r.hostile.expect("the scenario has a hostile transport");
    assert!(h.held > 0 && h.duplicated > 0 && h.replayed > 0, "{r}");
    r
}

fn violated(r: &RunReport, invariant: &str) -> bool {
    r.violations.iter().any(|v| v.invariant == invariant)
}

// C-OR-2, C-AZ-2, C-OR-1: over three seeds, every late or replayed older
// decision is declined superseded, the second issuer's grants stay under
// its own identity, and custody ends applied with nothing undone.
#[test]
fn c_or_2_c_az_2_hostile_relay_cannot_undo_a_revoke() {
    for seed in 1..=3 {
        let r = run(&scenario(), seed);
        assert!(r.passed(), "seed {seed}: {r}");
        assert_eq!(r.outcomes.pending_at_end, 0, "{r}");
        assert!(
            r.hostile.is_some_and(|h| h.declined_superseded > 0),
            "seed {seed}: the guard never had to act: {r}"
        );
    }
    let r = run(&regrant(), 1);
    assert!(r.passed(), "{r}");
}

// C-AZ-2 switch: with the issuer out of the governed key the second
// issuer's grants land on alice's keys and undo her revokes.
#[test]
fn c_az_2_issuer_out_of_the_key_is_caught() {
    let r = with(&[Mutation::IssuerNotInKey], || run(&scenario(), 1));
    assert!(violated(&r, "C-AZ-2"), "{r}");
    assert!(violated(&r, "C-OR-2"), "{r}");
}

// C-OR-1 switch: with no default sequence alice's unsequenced revoke
// holds her key until a sequenced withhold orders it, so her later grant,
// delivered in order or not, is refused.
#[test]
fn c_or_1_default_sequence_removed_is_caught() {
    let r = with(&[Mutation::NoDefaultSequence], || run(&regrant(), 1));
    assert!(violated(&r, "C-OR-1"), "{r}");
}
