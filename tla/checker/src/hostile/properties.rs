//! What the hostile relay must never achieve (C-OR-2, C-AZ-2, and the
//! guard refusing alice's newest decision, C-OR-1), plus a
//! deliver-or-report sanity check and coverage examples.

use abhyasa_core::custody::lease::Authority;
use abhyasa_core::custody::{EffectValue, LedgerOutcome, TerminalState};
use abhyasa_core::principal::Authorization;
use abhyasa_core::{DeclineReason, GovernedKey};
use stateright::Property;

use super::model::{HState, HostileModel};

type Check = fn(&HostileModel, &HState) -> Result<(), String>;
type Predicate = fn(&HostileModel, &HState) -> bool;

/// C-OR-2, receiver side: at quiescence the edge holds no authority on a
/// key alice's latest decision, a withhold, withdrew there.
pub const REVOKE_STAYS: &str = "C-OR-2: no withdrawn authority at quiescence";
/// C-OR-2, custody side: custody never reports `applied` for a revocation
/// the edge no longer holds.
pub const CUSTODY_TRUTHFUL: &str = "C-OR-2: custody applied means withdrawn";
/// C-AZ-2: one issuer never writes a key another issuer governs.
pub const ISSUERS_APART: &str = "C-AZ-2: one issuer's grant never overrides another's revoke";
/// C-OR-1: the supersession guard never refuses alice's newest decision
/// (nothing she issued on the key is newer, and no one else governs her
/// key), whatever order the relay delivers in. This is what the
/// sequences her node assigns are for.
pub const NEWEST_HONOURED: &str = "C-OR-1: the newest decision is never superseded";
/// Deliver-or-report: at quiescence alice's revokes are applied, declined
/// or escalated.
pub const DELIVER_OR_REPORT: &str = "deliver-or-report at quiescence";

/// The invariants: (stateright name, check).
pub const INVARIANTS: [(&str, Check); 5] = [
    (REVOKE_STAYS, revoke_stays),
    (CUSTODY_TRUTHFUL, custody_truthful),
    (ISSUERS_APART, issuers_apart),
    (NEWEST_HONOURED, newest_honoured),
    (DELIVER_OR_REPORT, deliver_or_report),
];

/// Coverage examples: states a full run is expected to reach.
pub const EXAMPLES: [(&str, Predicate); 5] = [
    ("example: edge applied alice's latest decision", |m, s| {
        m.ledger(s, m.alice_latest()).map(|l| l.0) == Some(LedgerOutcome::Applied)
    }),
    ("example: a custody of alice's applied", |m, s| {
        (0..m.alice_latest() + 1).any(|i| m.terminal(s, i) == Some(TerminalState::Applied))
    }),
    ("example: a custody of alice's escalated", |m, s| {
        (0..m.alice_latest() + 1).any(|i| m.terminal(s, i) == Some(TerminalState::Escalated))
    }),
    (
        "example: an older decision of alice's declined superseded",
        |m, s| {
            (0..m.alice_latest()).any(|i| {
                m.ledger(s, i) == Some((LedgerOutcome::Declined, Some(DeclineReason::Superseded)))
            })
        },
    ),
    ("example: second issuer's grant reached the edge", |m, s| {
        m.second_grant().is_some_and(|i| m.ledger(s, i).is_some())
    }),
];

macro_rules! invariant {
    ($i:expr) => {
        Property::always(INVARIANTS[$i].0, |m, s| (INVARIANTS[$i].1)(m, s).is_ok())
    };
}

/// Every property, in a fixed order.
pub fn all() -> Vec<Property<HostileModel>> {
    let mut p = vec![
        invariant!(0),
        invariant!(1),
        invariant!(2),
        invariant!(3),
        invariant!(4),
    ];
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

/// The keys alice's latest decision withdrew at the edge on which the
/// edge now holds authority again: the key as written is granted, or the
/// scope read across every issuer (what a tool guarded by it sees) is.
fn regranted(m: &HostileModel, s: &HState) -> Vec<String> {
    let now = m.now(s);
    let edge = &s.edge.live;
    s.ghost
        .withdrawn_keys
        .iter()
        .filter(|k| {
            let written = matches!(
                edge.effects().get(k.as_str()),
                Some(EffectValue::Authorization(Authorization::Granted))
            );
            let scope = GovernedKey::new(k.as_str())
                .map(|g| g.unqualified().to_string())
                .unwrap_or_else(|_| (*k).clone());
            written || matches!(edge.authority(&scope, now), Authority::Granted { .. })
        })
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
            "the edge applied alice's latest decision, a withhold, on {keys:?} and holds \
             authority there again"
        )),
    }
}

fn custody_truthful(m: &HostileModel, s: &HState) -> Result<(), String> {
    if !m.quiescent(s) || m.terminal(s, m.alice_latest()) != Some(TerminalState::Applied) {
        return Ok(());
    }
    match regranted(m, s).as_slice() {
        [] => Ok(()),
        keys => Err(format!(
            "alice's custody reports her latest withhold applied, yet the edge holds \
             authority on {keys:?} and nothing escalated"
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

fn newest_honoured(m: &HostileModel, s: &HState) -> Result<(), String> {
    let i = m.alice_latest();
    match m.ledger(s, i) {
        Some((LedgerOutcome::Declined, Some(DeclineReason::Superseded))) => Err(format!(
            "the edge declined alice's newest decision {} superseded",
            m.label(i)
        )),
        _ => Ok(()),
    }
}

fn deliver_or_report(m: &HostileModel, s: &HState) -> Result<(), String> {
    if !m.quiescent(s) {
        return Ok(());
    }
    for i in 0..m.alice_latest() + 1 {
        if m.config().alice[i].grant || !m.offered(s, i) {
            continue;
        }
        match m.terminal(s, i) {
            Some(TerminalState::Applied | TerminalState::Declined | TerminalState::Escalated) => {}
            other => {
                return Err(format!(
                    "alice's {} ends {other:?} at quiescence",
                    m.label(i)
                ))
            }
        }
    }
    Ok(())
}
