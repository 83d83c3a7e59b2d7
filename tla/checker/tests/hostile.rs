//! The hostile relay (C-OR-2, C-AZ-2) over the real core: a relay that
//! holds, reorders, loses, duplicates and replays frames, and a second
//! pinned peer that grants alice's scope in its own name.

use abhyasa_checker::hostile::{check, properties, HostileConfig};
use abhyasa_checker::{CheckReport, RunOptions};

fn run(config: HostileConfig) -> CheckReport {
    let report = check(config, RunOptions::default()).expect("valid configuration");
    println!("{report}");
    report
}

fn assert_caught(r: &CheckReport, property: &str) {
    let c = r
        .counterexamples
        .iter()
        .find(|c| c.property == property)
        .unwrap_or_else(|| panic!("no counterexample to {property:?}:\n{r}"));
    assert!(
        c.trace.contains("BROKEN"),
        "trace names no broken invariant"
    );
}

// C-OR-2: alice's grant held by the relay and delivered after her revoke.
// Alice's node assigns no sequence to either (what `abhyasa send` does), so
// the late grant passes the supersession guard: the edge ends authorized
// while alice's custody says the revoke was applied.
#[test]
fn c_or_2_late_grant_undoes_an_applied_revoke() {
    let r = run(HostileConfig::alice_only());
    assert_caught(&r, properties::REVOKE_STAYS);
    assert_caught(&r, properties::CUSTODY_TRUTHFUL);
}

// C-OR-2 with a sequenced grant and an unsequenced revoke (a leased
// grant's chain): the revoke carries nothing the guard can compare.
#[test]
fn c_or_2_sequenced_grant_unsequenced_revoke() {
    let mut c = HostileConfig::alice_only();
    c.set("alice=grant@1,revoke").expect("known key");
    let r = run(c);
    assert_caught(&r, properties::CUSTODY_TRUTHFUL);
}

// C-AZ-2: the second pinned peer's grant, in its own name, lands on alice's
// governed key.
#[test]
fn c_az_2_second_issuer_overrides_alices_revoke() {
    let r = run(HostileConfig::two_issuers());
    assert_caught(&r, properties::ISSUERS_APART);
    assert_caught(&r, properties::CUSTODY_TRUTHFUL);
}

// C-AZ-2 and C-OR-2 with alice only revoking: the authority the edge ends
// with after her applied revoke can only be the second issuer's grant.
#[test]
fn c_az_2_second_issuers_grant_after_alices_revoke() {
    let mut c = HostileConfig::two_issuers();
    c.set("alice=revoke").expect("known key");
    let r = run(c);
    assert_caught(&r, properties::ISSUERS_APART);
    assert_caught(&r, properties::REVOKE_STAYS);
    assert_caught(&r, properties::CUSTODY_TRUTHFUL);
}
