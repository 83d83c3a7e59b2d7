//! The hostile relay/transport through the full stack (C-OR-2, C-AZ-2):
//! real nodes over QUIC, every frame to a node possibly held back,
//! duplicated or followed by a replay, alice granting then revoking each
//! scope with her node's sequences, a second pinned peer granting the same
//! scope in its own name.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use abhyasa_netsim::fullstack::{run_scenario, RunReport, Scenario};

fn scenario() -> Scenario {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios/hostile-relay.toml");
    Scenario::from_file(&p).unwrap()
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

// C-OR-2 and C-AZ-2 on today's node: a late grant undoes an applied
// revoke, and the second issuer's grant lands on alice's key.
#[test]
fn c_or_2_c_az_2_hostile_relay_breaks_revocation() {
    let r = run(&scenario(), 1);
    assert!(violated(&r, "C-OR-2"), "{r}");
    assert!(violated(&r, "C-AZ-2"), "{r}");
}
