//! What the hostile relay must never achieve (C-OR-2, C-AZ-2), plus a
//! deliver-or-report sanity check and coverage examples.

use abhyasa_core::custody::lease::Authority;
use abhyasa_core::custody::{LedgerOutcome, TerminalState};
use abhyasa_core::DeclineReason;
use stateright::Property;

use super::model::{HState, HostileModel, ALICE_GRANT, ALICE_REVOKE, SECOND_GRANT};

type Check = fn(&HostileModel, &HState) -> Result<(), String>;
type Predicate = fn(&HostileModel, &HState) -> bool;

/// C-OR-2, receiver side: at quiescence the edge holds no authority on a
/// key alice's revoke (her latest decision) withdrew there.
pub const REVOKE_STAYS: &str = "C-OR-2: no withdrawn authority at quiescence";
/// C-OR-2, custody side: custody never reports `applied` for a revocation
/// the edge no longer holds.
pub const CUSTODY_TRUTHFUL: &str = "C-OR-2: custody applied means withdrawn";
/// C-AZ-2: one issuer never writes a key another issuer governs.
pub const ISSUERS_APART: &str = "C-AZ-2: one issuer's grant never overrides another's revoke";
/// Deliver-or-report: at quiescence alice's revoke is applied, declined or
/// escalated.
pub const DELIVER_OR_REPORT: &str = "deliver-or-report at quiescence";

/// The invariants: (stateright name, check).
pub const INVARIANTS: [(&str, Check); 4] = [
    (REVOKE_STAYS, revoke_stays),
    (CUSTODY_TRUTHFUL, custody_truthful),
    (ISSUERS_APART, issuers_apart),
    (DELIVER_OR_REPORT, deliver_or_report),
];

/// Coverage examples: states a full run is expected to reach.
pub const EXAMPLES: [(&str, Predicate); 5] = [
    ("example: edge applied alice's revoke", |m, s| {
        m.ledger(s, ALICE_REVOKE).map(|l| l.0) == Some(LedgerOutcome::Applied)
    }),
    ("example: alice's revoke custody applied", |m, s| {
        m.revoke_terminal(s) == Some(TerminalState::Applied)
    }),
    ("example: alice's revoke escalated", |m, s| {
        m.revoke_terminal(s) == Some(TerminalState::Escalated)
    }),
    ("example: alice's grant declined superseded", |m, s| {
        m.ledger(s, ALICE_GRANT) == Some((LedgerOutcome::Declined, Some(DeclineReason::Superseded)))
    }),
    ("example: second issuer's grant reached the edge", |m, s| {
        m.obligation_count() > SECOND_GRANT && m.ledger(s, SECOND_GRANT).is_some()
    }),
];

macro_rules! invariant {
    ($i:expr) => {
        Property::always(INVARIANTS[$i].0, |m, s| (INVARIANTS[$i].1)(m, s).is_ok())
    };
}

/// Every property, in a fixed order.
pub fn all() -> Vec<Property<HostileModel>> {
    let mut p = vec![invariant!(0), invariant!(1), invariant!(2), invariant!(3)];
    for (name, f) in EXAMPLES {
        p.push(Property::sometimes(name, f));
    }
    p
}

/// Every broken invariant of a state, with the reason.
pub fn broken(m: &HostileModel, s: &HState) -> Vec<(&'static str, String)> {
    INVARIANTS
        .iter()
        .filter_map(|(name, f)| f(m, s).err().map(|why| (*name, why)))
        .collect()
}

/// The keys alice's revoke withdrew at the edge on which the edge now
/// holds authority again.
fn regranted(m: &HostileModel, s: &HState) -> Vec<String> {
    let now = m.now(s);
    s.ghost
        .revoke_keys
        .iter()
        .filter(|k| matches!(s.edge.live.authority(k, now), Authority::Granted { .. }))
        .cloned()
        .collect()
}

fn revoke_stays(m: &HostileModel, s: &HState) -> Result<(), String> {
    if !m.quiescent(s) {
        return Ok(());
    }
    match regranted(m, s).as_slice() {
        [] => Ok(()),
        keys => Err(format!(
            "the edge applied alice's revoke on {keys:?}, her latest decision, and holds \
             authority there again"
        )),
    }
}

fn custody_truthful(m: &HostileModel, s: &HState) -> Result<(), String> {
    if !m.quiescent(s) || m.revoke_terminal(s) != Some(TerminalState::Applied) {
        return Ok(());
    }
    match regranted(m, s).as_slice() {
        [] => Ok(()),
        keys => Err(format!(
            "alice's custody reports her revoke applied, yet the edge holds authority on \
             {keys:?} and nothing escalated"
        )),
    }
}

fn issuers_apart(_: &HostileModel, s: &HState) -> Result<(), String> {
    let mut by_key: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for (issuer, key) in &s.ghost.writes {
        by_key.entry(key).or_default().push(issuer);
    }
    match by_key.iter().find(|(_, who)| who.len() > 1) {
        None => Ok(()),
        Some((key, who)) => Err(format!(
            "issuers {who:?} both wrote governed key {key} at the edge"
        )),
    }
}

fn deliver_or_report(m: &HostileModel, s: &HState) -> Result<(), String> {
    if !m.quiescent(s) || !m.offered(s, ALICE_REVOKE) {
        return Ok(());
    }
    match m.revoke_terminal(s) {
        Some(TerminalState::Applied | TerminalState::Declined | TerminalState::Escalated) => Ok(()),
        other => Err(format!("alice's revoke ends {other:?} at quiescence")),
    }
}
