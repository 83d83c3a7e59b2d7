//! The invariant checker for transfers that netsim drives itself
//! (reference-v1), over ground truth: what the receiver's applier really
//! did, what its ledger says, and what principal-side state shows.
//!
//! The core model is checked by the core's own checker inside
//! `abhyasa_core::sim::run_sweep_range`; this one covers the same rules and
//! adds AB-4 and "Declined ≠ applied" on principal state.

use abhyasa_core::custody::{LedgerOutcome, TerminalState};
use abhyasa_core::model::{Escalation, GuardOutcome, Timestamp};

/// Everything the checker needs to know about one finished transfer.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    /// Transfer index.
    pub index: u64,
    /// Admissible (under custody) rather than benign.
    pub admissible: bool,
    /// How custody ended at the custodian (`None`: it did not end).
    pub outcome: Option<TerminalState>,
    /// Obligation transmissions.
    pub attempts: u64,
    /// The obligation's `max_retries`.
    pub max_retries: u64,
    /// Real applications by the receiver's applier.
    pub applications: u32,
    /// Instant of the last real application.
    pub last_applied_at: Option<Timestamp>,
    /// The obligation's absolute deadline.
    pub deadline_at: Timestamp,
    /// The receiver's ledger entry at the end.
    pub ledger: Option<LedgerOutcome>,
    /// The escalation the custodian emitted, if any.
    pub escalation: Option<Escalation>,
    /// Principal-side weight on the governed key before the offer.
    pub weight_before: f64,
    /// Principal-side weight after custody ended.
    pub weight_after: f64,
    /// The weight `safe(O)` yields from `weight_before`.
    pub weight_if_safe: f64,
}

/// Checks one transfer; returns what broke (empty: every invariant held).
pub fn check(o: &Observation) -> Vec<String> {
    let mut v = Vec::new();
    // Effectively-once (AB-3).
    if o.applications > 1 {
        v.push(format!(
            "applied {} times (AB-3: at most once)",
            o.applications
        ));
    }
    // Deadlines bind both sides.
    if let Some(at) = o.last_applied_at {
        if at >= o.deadline_at {
            v.push(format!(
                "applied at {at}, at or after the deadline {}",
                o.deadline_at
            ));
        }
    }
    // AB-2: the retry bound.
    if o.admissible && o.attempts > 1 + o.max_retries {
        v.push(format!(
            "{} attempts exceed 1 + max_retries = {}",
            o.attempts,
            1 + o.max_retries
        ));
    }
    let safe_applied = o.weight_after == o.weight_if_safe && o.weight_if_safe != o.weight_before;
    match (o.admissible, o.outcome) {
        (false, Some(TerminalState::BestEffort)) => {
            if o.attempts != 1 {
                v.push(format!("best-effort sent {} times", o.attempts));
            }
        }
        (false, other) => v.push(format!("benign obligation ended {other:?}")),
        (true, Some(TerminalState::Applied)) => {
            if o.applications != 1 || o.ledger != Some(LedgerOutcome::Applied) {
                v.push(format!(
                    "custodian discharged applied but the receiver applied {} times (ledger {:?})",
                    o.applications, o.ledger
                ));
            }
            if o.weight_after != o.weight_before {
                v.push("fail-safe applied although the receiver applied".into());
            }
        }
        (true, Some(TerminalState::Declined)) => {
            if o.applications != 0 || o.ledger != Some(LedgerOutcome::Declined) {
                v.push(format!(
                    "custodian discharged declined but the receiver applied {} times (ledger {:?})",
                    o.applications, o.ledger
                ));
            }
            if !safe_applied {
                v.push("declined without the fail-safe (declined is not applied)".into());
            }
        }
        (true, Some(TerminalState::Escalated)) => match &o.escalation {
            None => v.push("escalated without an escalation event".into()),
            Some(e) => {
                if !matches!(
                    e.guard,
                    GuardOutcome::Applied | GuardOutcome::AlreadyInEffect
                ) {
                    v.push(format!(
                        "escalated but the fail-safe was not applied ({:?})",
                        e.guard
                    ));
                }
                if !safe_applied {
                    v.push("escalated but principal state shows no fail-safe (AB-4)".into());
                }
            }
        },
        (true, other) => v.push(format!(
            "admissible obligation ended {other:?} (silent loss: deliver-or-report)"
        )),
    }
    if o.escalation.is_some() && o.outcome != Some(TerminalState::Escalated) {
        v.push(format!(
            "escalation event but custody ended {:?}",
            o.outcome
        ));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied() -> Observation {
        Observation {
            index: 0,
            admissible: true,
            outcome: Some(TerminalState::Applied),
            attempts: 2,
            max_retries: 64,
            applications: 1,
            last_applied_at: Some(Timestamp::from_unix_seconds(10)),
            deadline_at: Timestamp::from_unix_seconds(600),
            ledger: Some(LedgerOutcome::Applied),
            escalation: None,
            weight_before: 1.0,
            weight_after: 1.0,
            weight_if_safe: 0.6,
        }
    }

    // Each rule fires on its own: the checker is not vacuous.
    #[test]
    fn every_rule_fires() {
        assert!(check(&applied()).is_empty());
        let cases: Vec<(Observation, &str)> = vec![
            (
                Observation {
                    applications: 2,
                    ..applied()
                },
                "applied 2 times",
            ),
            (
                Observation {
                    last_applied_at: Some(Timestamp::from_unix_seconds(600)),
                    ..applied()
                },
                "after the deadline",
            ),
            (
                Observation {
                    attempts: 66,
                    ..applied()
                },
                "exceed 1 + max_retries",
            ),
            (
                Observation {
                    outcome: None,
                    ..applied()
                },
                "silent loss",
            ),
            (
                Observation {
                    weight_after: 0.6,
                    ..applied()
                },
                "fail-safe applied although",
            ),
            (
                Observation {
                    outcome: Some(TerminalState::Declined),
                    applications: 0,
                    ledger: Some(LedgerOutcome::Declined),
                    ..applied()
                },
                "declined without the fail-safe",
            ),
            (
                Observation {
                    outcome: Some(TerminalState::Declined),
                    ledger: Some(LedgerOutcome::Declined),
                    weight_after: 0.6,
                    ..applied()
                },
                "discharged declined but the receiver applied 1",
            ),
            (
                Observation {
                    outcome: Some(TerminalState::Escalated),
                    weight_after: 0.6,
                    ..applied()
                },
                "without an escalation event",
            ),
            (
                Observation {
                    admissible: false,
                    outcome: Some(TerminalState::Escalated),
                    ..applied()
                },
                "benign obligation ended",
            ),
        ];
        for (o, want) in cases {
            let got = check(&o);
            assert!(got.iter().any(|s| s.contains(want)), "{want}: {got:?}");
        }
    }
}
