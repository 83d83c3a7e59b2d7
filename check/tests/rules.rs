//! The one checker, rule by rule: for each rule a hand-built trace that
//! breaks exactly that rule is reported under the right invariant (and
//! nothing else), and the clean traces pass. The checker is not vacuous.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use abhyasa_check::{
    check, Application, AppliedByApplier, AuthorityWrite, Invariant, Key, Offer, Outcome,
    PrincipalProbe, PrincipalSequence, Terminal, Trace,
};
use abhyasa_core::custody::LedgerOutcome;
use abhyasa_core::{AgentId, GovernedKey, GuardOutcome, ObligationId, Sequence, Timestamp};

fn agent(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

fn key() -> Key {
    (agent("custodian"), ObligationId::new("ob-1").unwrap())
}

fn at(s: i64) -> Timestamp {
    Timestamp::from_unix_seconds(1_000 + s)
}

const DEADLINE: i64 = 600;

fn offer() -> Offer {
    Offer {
        custodian: key().0,
        id: key().1,
        admissible: true,
        deadline_at: at(DEADLINE),
        max_retries: 64,
        sequence: None,
    }
}

fn apply_at(s: i64) -> AppliedByApplier {
    AppliedByApplier {
        receiver: agent("receiver"),
        custodian: key().0,
        id: key().1,
        at: at(s),
        deadline_at: at(DEADLINE),
    }
}

fn committed_at(s: i64) -> Application {
    Application {
        receiver: agent("receiver"),
        custodian: key().0,
        id: key().1,
        at: at(s),
        key_sequence: None,
    }
}

fn terminal(outcome: Outcome) -> Terminal {
    Terminal {
        custodian: key().0,
        id: key().1,
        outcome,
        attempts: 2,
        escalation: None,
        principal_writes: Some(0),
    }
}

/// Principal weight before 1.0; `safe(O)` takes it to 0.6.
fn probe(after: f64) -> BTreeMap<Key, PrincipalProbe> {
    BTreeMap::from([(
        key(),
        PrincipalProbe {
            before: 1.0,
            after,
            if_safe: 0.6,
        },
    )])
}

/// Applied once, in time, committed with the ledger; custody discharged
/// applied; no fail-safe on principal state.
fn applied() -> Trace {
    Trace {
        offers: vec![offer()],
        applier_applies: vec![apply_at(10)],
        applications: Some(vec![committed_at(10)]),
        ledger: Some(BTreeMap::from([(key(), LedgerOutcome::Applied)])),
        terminals: vec![terminal(Outcome::Applied)],
        probes: probe(1.0),
        ..Trace::default()
    }
}

/// Declined by the receiver; custody discharged declined; fail-safe
/// applied (declined ≠ applied).
fn declined() -> Trace {
    Trace {
        offers: vec![offer()],
        applications: Some(Vec::new()),
        ledger: Some(BTreeMap::from([(key(), LedgerOutcome::Declined)])),
        terminals: vec![Terminal {
            principal_writes: Some(1),
            ..terminal(Outcome::Declined(None))
        }],
        probes: probe(0.6),
        ..Trace::default()
    }
}

/// Unreachable receiver; escalated with the fail-safe applied and written.
fn escalated() -> Trace {
    Trace {
        offers: vec![offer()],
        applications: Some(Vec::new()),
        ledger: Some(BTreeMap::new()),
        terminals: vec![Terminal {
            attempts: 15,
            escalation: Some(GuardOutcome::Applied),
            principal_writes: Some(1),
            ..terminal(Outcome::Escalated)
        }],
        probes: probe(0.6),
        ..Trace::default()
    }
}

/// A benign obligation, sent once best-effort.
fn benign() -> Trace {
    Trace {
        offers: vec![Offer {
            admissible: false,
            ..offer()
        }],
        terminals: vec![Terminal {
            attempts: 1,
            principal_writes: None,
            ..terminal(Outcome::BestEffort)
        }],
        ..Trace::default()
    }
}

/// Set-semantic: sequence 3 escalated, its fail-safe rightly superseded
/// by sequence 5; the receiver applied sequences 4 then 5 on the key of
/// two other obligations; the principal wrote 3 then 5.
fn superseded() -> Trace {
    let gk = GovernedKey::new("anumati.consent/receiver/scope").unwrap();
    let other = |id: &str, seq: u64| Application {
        id: ObligationId::new(id).unwrap(),
        key_sequence: Some((gk.clone(), Sequence(seq))),
        ..committed_at(5)
    };
    Trace {
        offers: vec![Offer {
            sequence: Some(Sequence(3)),
            ..offer()
        }],
        applier_applies: ["ob-4", "ob-5"]
            .map(|id| AppliedByApplier {
                id: ObligationId::new(id).unwrap(),
                ..apply_at(5)
            })
            .to_vec(),
        applications: Some(vec![other("ob-4", 4), other("ob-5", 5)]),
        terminals: vec![Terminal {
            attempts: 15,
            escalation: Some(GuardOutcome::Superseded {
                newest: Sequence(5),
            }),
            ..terminal(Outcome::Escalated)
        }],
        principal_writes: vec![
            PrincipalSequence {
                custodian: key().0,
                key: gk.clone(),
                sequence: Some(Sequence(3)),
            },
            PrincipalSequence {
                custodian: key().0,
                key: gk,
                sequence: Some(Sequence(5)),
            },
        ],
        ..Trace::default()
    }
}

/// Only `want` is reported, at least once.
#[track_caller]
fn only(t: &Trace, want: Invariant, detail: &str) {
    let got = check(t);
    assert!(!got.is_empty(), "{want} not reported");
    assert!(
        got.iter().all(|v| v.invariant == want),
        "{want}: other rules fired too: {got:#?}"
    );
    assert!(
        got.iter().any(|v| v.detail.contains(detail)),
        "{want}: no violation says {detail:?}: {got:#?}"
    );
}

#[test]
fn clean_traces_pass() {
    for (name, t) in [
        ("applied", applied()),
        ("declined", declined()),
        ("escalated", escalated()),
        ("benign", benign()),
        ("superseded", superseded()),
        ("empty", Trace::default()),
    ] {
        assert_eq!(check(&t), Vec::new(), "{name}");
    }
    // Parts a driver cannot see are skipped, not guessed.
    let blind = Trace {
        applications: None,
        ledger: None,
        probes: BTreeMap::new(),
        ..applied()
    };
    assert_eq!(check(&blind), Vec::new());
}

#[test]
fn ac_1_best_effort_is_one_attempt_without_custody() {
    let mut t = benign();
    t.terminals[0].attempts = 2;
    only(&t, Invariant::Ac1, "best-effort sent 2 times");
    let mut t = benign();
    t.terminals[0].outcome = Outcome::Escalated;
    t.terminals[0].escalation = Some(GuardOutcome::Applied);
    only(&t, Invariant::Ac1, "benign obligation ended [Escalated]");
    let t = Trace {
        terminals: Vec::new(),
        ..benign()
    };
    only(&t, Invariant::Ac1, "benign obligation ended []");
    // An admissible obligation must not travel best-effort.
    let t = Trace {
        terminals: vec![Terminal {
            attempts: 1,
            ..terminal(Outcome::BestEffort)
        }],
        applier_applies: Vec::new(),
        applications: Some(Vec::new()),
        ledger: None,
        ..applied()
    };
    only(&t, Invariant::Ac1, "sent best-effort, without custody");
}

#[test]
fn ab_1_nothing_silently_lost_and_custody_closes_once() {
    // C-DOR-1's "every admissible obligation ends": no terminal at all.
    let t = Trace {
        terminals: Vec::new(),
        ..escalated()
    };
    only(&t, Invariant::Ab1, "silently lost");
    // Still pending at the end is reported once, as pending.
    let t = Trace {
        terminals: Vec::new(),
        pending_at_end: vec![key()],
        ..escalated()
    };
    only(&t, Invariant::Ab1, "still pending after its deadline");
    assert_eq!(check(&t).len(), 1);
    let mut t = escalated();
    t.terminals.push(t.terminals[0].clone());
    only(&t, Invariant::Ab1, "custody closed 2 times");
    let t = Trace {
        offers: Vec::new(),
        ..escalated()
    };
    only(&t, Invariant::Ab1, "closed without a custody open");
}

#[test]
fn ab_2_retry_bound() {
    let mut t = escalated();
    t.terminals[0].attempts = 66;
    only(
        &t,
        Invariant::Ab2,
        "66 attempts exceed 1 + max_retries = 65",
    );
    t.terminals[0].attempts = 65;
    assert_eq!(check(&t), Vec::new());
}

#[test]
fn ab_3_at_most_once_with_effect_and_ledger_in_one_commit() {
    // Applied twice (both committed): a duplicate application.
    let t = Trace {
        applier_applies: vec![apply_at(10), apply_at(20)],
        applications: Some(vec![committed_at(10), committed_at(20)]),
        ..escalated()
    };
    only(&t, Invariant::Ab3, "applied 2 times");
    assert_eq!(check(&t).len(), 1);
    // Applied twice where only the applier is seen (reference-v1).
    let t = Trace {
        applier_applies: vec![apply_at(10), apply_at(20)],
        applications: None,
        ..escalated()
    };
    only(&t, Invariant::Ab3, "applied 2 times");
    // The effect ran but no ledger record was committed with it.
    let t = Trace {
        applier_applies: vec![apply_at(10)],
        applications: Some(Vec::new()),
        ..escalated()
    };
    only(
        &t,
        Invariant::Ab3,
        "1 times but 0 applications were committed",
    );
}

#[test]
fn deadlines_bind_the_receiver() {
    let t = Trace {
        applier_applies: vec![apply_at(DEADLINE)],
        ..applied()
    };
    only(&t, Invariant::Deadline, "at or after its deadline");
    let t = Trace {
        applier_applies: vec![apply_at(DEADLINE - 1)],
        ..applied()
    };
    assert_eq!(check(&t), Vec::new());
}

#[test]
fn ab_4_escalation_carries_its_fail_safe() {
    let mut t = escalated();
    t.terminals[0].escalation = None;
    only(&t, Invariant::Ab4, "without an escalation record");
    let mut t = escalated();
    t.terminals[0].principal_writes = Some(0);
    only(&t, Invariant::Ab4, "no principal-side write was committed");
    // Principal side (the check the core's sweep lacked): the record says
    // applied, principal state shows nothing.
    let t = Trace {
        probes: probe(1.0),
        ..escalated()
    };
    only(&t, Invariant::Ab4, "principal state shows no fail-safe");
    // Superseded by an older sequence, or with no sequence to supersede.
    let mut t = superseded();
    t.terminals[0].escalation = Some(GuardOutcome::Superseded {
        newest: Sequence(2),
    });
    only(&t, Invariant::Ab4, "superseded by an older sequence 2");
    let mut t = escalated();
    t.terminals[0].escalation = Some(GuardOutcome::Superseded {
        newest: Sequence(2),
    });
    only(&t, Invariant::Ab4, "with no sequence");
    // No fail-safe when the receiver applied, and no escalation record on
    // a discharged obligation.
    let t = Trace {
        probes: probe(0.6),
        ..applied()
    };
    only(
        &t,
        Invariant::Ab4,
        "fail-safe applied although the receiver applied",
    );
    let mut t = applied();
    t.terminals[0].escalation = Some(GuardOutcome::Applied);
    only(
        &t,
        Invariant::Ab4,
        "escalation record but custody ended Applied",
    );
}

#[test]
fn declined_is_not_applied() {
    let t = Trace {
        probes: probe(1.0),
        ..declined()
    };
    only(
        &t,
        Invariant::DeclinedNotApplied,
        "declined without the fail-safe",
    );
}

#[test]
fn discharge_agrees_with_the_receiver() {
    let t = Trace {
        applier_applies: Vec::new(),
        applications: Some(Vec::new()),
        ..applied()
    };
    only(
        &t,
        Invariant::AppliedMeansApplied,
        "discharged applied but the receiver applied 0 times",
    );
    let t = Trace {
        ledger: Some(BTreeMap::from([(key(), LedgerOutcome::Declined)])),
        ..applied()
    };
    only(
        &t,
        Invariant::AppliedMeansApplied,
        "ledger Some(Some(Declined))",
    );
    let t = Trace {
        applier_applies: vec![apply_at(10)],
        applications: Some(vec![committed_at(10)]),
        ..declined()
    };
    only(
        &t,
        Invariant::AppliedMeansApplied,
        "discharged declined but the receiver applied 1 times",
    );
}

#[test]
fn supersession_never_regresses_on_either_side() {
    let mut t = superseded();
    if let Some(apps) = &mut t.applications {
        apps.swap(0, 1);
    }
    only(&t, Invariant::Supersession, "applied sequence 4 on");
    // Not newer is not enough: the same sequence twice on a key.
    let mut t = superseded();
    if let Some(apps) = &mut t.applications {
        apps[0].key_sequence = apps[1].key_sequence.clone();
    }
    only(&t, Invariant::Supersession, "applied sequence 5 on");
    let mut t = superseded();
    t.principal_writes.swap(0, 1);
    only(&t, Invariant::Supersession, "wrote sequence 3");
}

#[test]
fn violations_name_their_invariant_and_obligation() {
    let t = Trace {
        terminals: Vec::new(),
        ..escalated()
    };
    let v = &check(&t)[0];
    assert_eq!(v.invariant.name(), "AB-1");
    assert_eq!(v.obligation_name().as_deref(), Some("custodian/ob-1"));
    assert!(v.to_string().starts_with("AB-1: custodian/ob-1: "), "{v}");
}

fn write(issuer: &str, id: &str, key: &str, granted: bool) -> AuthorityWrite {
    AuthorityWrite {
        receiver: agent("receiver"),
        custodian: agent(issuer),
        id: ObligationId::new(id).unwrap(),
        key: key.into(),
        granted,
    }
}

/// Alice revokes (her latest decision), the edge applies it; the trace
/// holds whatever writes follow.
fn withdrawn(after: Vec<AuthorityWrite>) -> Trace {
    let mut writes = vec![write("alice", "grant", "@alice/s", true)];
    writes.push(write("alice", "revoke", "@alice/s", false));
    writes.extend(after);
    Trace {
        authority_writes: writes,
        latest_withholds: vec![(agent("alice"), ObligationId::new("revoke").unwrap())],
        ..Trace::default()
    }
}

// C-OR-2: a grant committed after the latest withhold on the same key at
// the same receiver (a relay delivered it late) is reported; a grant on
// another receiver's key, or the withhold written again, is not.
#[test]
fn c_or_2_withdrawn_authority_stays_withdrawn() {
    assert!(check(&withdrawn(Vec::new())).is_empty());
    let late = withdrawn(vec![write("alice", "grant", "@alice/s", true)]);
    only(
        &late,
        Invariant::WithdrawnStaysWithdrawn,
        "then alice/grant granted it again",
    );
    let mut elsewhere = write("alice", "grant", "@alice/s", true);
    elsewhere.receiver = agent("other-edge");
    assert!(check(&withdrawn(vec![elsewhere])).is_empty());
    // Not the latest decision: a grant after it is the principal's will.
    let mut not_latest = late.clone();
    not_latest.latest_withholds.clear();
    assert!(check(&not_latest).is_empty());
}

// C-AZ-2: two issuers writing one governed key at one receiver is
// reported, whatever the order; each under its own key is not.
#[test]
fn c_az_2_issuers_never_share_a_key() {
    let shared = withdrawn(vec![write("relay", "x", "@alice/s", false)]);
    only(
        &shared,
        Invariant::IssuersApart,
        "wrote governed key @alice/s",
    );
    let apart = withdrawn(vec![write("relay", "x", "@relay/s", true)]);
    assert!(check(&apart).is_empty());
    // Both rules at once: another issuer's grant undoes alice's revoke.
    let undone = withdrawn(vec![write("relay", "x", "@alice/s", true)]);
    let got = check(&undone);
    assert!(got
        .iter()
        .any(|v| v.invariant == Invariant::WithdrawnStaysWithdrawn));
    assert!(got.iter().any(|v| v.invariant.name() == "C-AZ-2"));
}

// C-OR-1: the latest decision declined `superseded` is reported; an older
// one declined so is the guard working.
#[test]
fn c_or_1_latest_decision_never_superseded() {
    let latest = (agent("alice"), ObligationId::new("grant-2").unwrap());
    let older = (agent("alice"), ObligationId::new("revoke-1").unwrap());
    let mut t = Trace {
        latest_decisions: vec![latest.clone()],
        superseded: vec![(agent("receiver"), older)],
        ..Trace::default()
    };
    assert!(check(&t).is_empty());
    t.superseded.push((agent("receiver"), latest));
    only(
        &t,
        Invariant::NewestHonoured,
        "declined this latest decision on its key superseded",
    );
}
