//! The adapter from a transfer netsim drives itself (reference-v1) to the
//! one invariant checker, [`abhyasa_check::check`]: what the receiver's
//! applier really did, what its ledger says, and what principal-side state
//! shows become an [`abhyasa_check::Trace`].
//!
//! The core model and the full-stack simulator are checked by the same
//! function, so the rules (AB-1..AB-4, declined ≠ applied, deadlines,
//! supersession) hold or fail the same way in every model.

use std::collections::BTreeMap;

use abhyasa_check::{AppliedByApplier, Offer, Outcome, PrincipalProbe, Terminal, Trace};
use abhyasa_core::custody::{LedgerOutcome, TerminalState};
use abhyasa_core::model::{AgentId, Escalation, ObligationId, Timestamp};
/// Everything the checker needs to know about one finished transfer.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    /// The custodian.
    pub custodian: AgentId,
    /// The receiver.
    pub receiver: AgentId,
    /// The obligation.
    pub id: ObligationId,
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

impl Observation {
    /// The ground truth of this transfer, for the one checker. The driver
    /// counts the applier's applications (the last one timed) but does not
    /// watch the receiver's commits, so `applications` is `None`.
    pub fn trace(&self) -> Trace {
        let key = (self.custodian.clone(), self.id.clone());
        let applier_applies = (0..self.applications)
            .filter_map(|_| {
                self.last_applied_at.map(|at| AppliedByApplier {
                    receiver: self.receiver.clone(),
                    custodian: self.custodian.clone(),
                    id: self.id.clone(),
                    at,
                    deadline_at: self.deadline_at,
                })
            })
            .collect();
        let terminal = self.outcome.map(|state| Terminal {
            custodian: self.custodian.clone(),
            id: self.id.clone(),
            outcome: match state {
                TerminalState::Applied => Outcome::Applied,
                TerminalState::Declined => Outcome::Declined(None),
                TerminalState::Escalated => Outcome::Escalated,
                TerminalState::BestEffort => Outcome::BestEffort,
            },
            attempts: self.attempts,
            escalation: self.escalation.as_ref().map(|e| e.guard),
            principal_writes: None,
        });
        let mut probes = BTreeMap::new();
        if self.admissible {
            probes.insert(
                key.clone(),
                PrincipalProbe {
                    before: self.weight_before,
                    after: self.weight_after,
                    if_safe: self.weight_if_safe,
                },
            );
        }
        Trace {
            offers: vec![Offer {
                custodian: self.custodian.clone(),
                id: self.id.clone(),
                admissible: self.admissible,
                deadline_at: self.deadline_at,
                max_retries: self.max_retries,
                sequence: None,
            }],
            applier_applies,
            applications: None,
            ledger: Some(
                self.ledger
                    .map(|l: LedgerOutcome| (key, l))
                    .into_iter()
                    .collect(),
            ),
            terminals: terminal.into_iter().collect(),
            probes,
            principal_writes: Vec::new(),
            pending_at_end: Vec::new(),
            authority_writes: Vec::new(),
            latest_withholds: Vec::new(),
            latest_decisions: Vec::new(),
            superseded: Vec::new(),
        }
    }
}

/// Checks one transfer with [`abhyasa_check::check`]; returns what broke
/// as `invariant: detail` lines (empty: every invariant held).
pub fn check(o: &Observation) -> Vec<String> {
    abhyasa_check::check(&o.trace())
        .into_iter()
        .map(|v| format!("{}: {}", v.invariant, v.detail))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied() -> Observation {
        Observation {
            custodian: AgentId::new("custodian").unwrap(),
            receiver: AgentId::new("receiver").unwrap(),
            id: ObligationId::new("bu-0").unwrap(),
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

    // Each rule fires through the adapter, named by its invariant: the
    // reference-v1 driver's observations reach every rule they can break.
    #[test]
    fn every_rule_fires() {
        assert!(check(&applied()).is_empty());
        let cases: Vec<(Observation, &str)> = vec![
            (
                Observation {
                    applications: 2,
                    ..applied()
                },
                "AB-3: applied 2 times",
            ),
            (
                Observation {
                    last_applied_at: Some(Timestamp::from_unix_seconds(600)),
                    ..applied()
                },
                "deadline: applied at ",
            ),
            (
                Observation {
                    attempts: 66,
                    ..applied()
                },
                "AB-2: 66 attempts exceed 1 + max_retries",
            ),
            (
                Observation {
                    outcome: None,
                    ..applied()
                },
                "AB-1: admissible obligation neither closed nor pending: silently lost",
            ),
            (
                Observation {
                    weight_after: 0.6,
                    ..applied()
                },
                "AB-4: fail-safe applied although",
            ),
            (
                Observation {
                    outcome: Some(TerminalState::Declined),
                    applications: 0,
                    ledger: Some(LedgerOutcome::Declined),
                    ..applied()
                },
                "declined-not-applied: declined without the fail-safe",
            ),
            (
                Observation {
                    outcome: Some(TerminalState::Declined),
                    ledger: Some(LedgerOutcome::Declined),
                    weight_after: 0.6,
                    ..applied()
                },
                "applied-means-applied: custodian discharged declined but the receiver applied 1",
            ),
            (
                Observation {
                    outcome: Some(TerminalState::Escalated),
                    weight_after: 0.6,
                    ..applied()
                },
                "AB-4: escalated without an escalation record",
            ),
            (
                Observation {
                    admissible: false,
                    outcome: Some(TerminalState::Escalated),
                    ..applied()
                },
                "AC-1: benign obligation ended",
            ),
        ];
        for (o, want) in cases {
            let got = check(&o);
            assert!(got.iter().any(|s| s.contains(want)), "{want}: {got:?}");
        }
    }
}
