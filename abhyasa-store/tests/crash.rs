//! Crash-point enumeration (C-AB2-3, C-AB3-3, C-AB3-5, C-AB4-3).
//!
//! Each scripted transfer runs once without crashes to count the commits of
//! each side; then, for every commit point of either side and both crash
//! timings (batch lost / batch durable but unacknowledged), it runs again
//! with that one crash, restarts the node from its store after a downtime
//! (`Custodian::restore` / `Receiver::restore` from `Store::load`), finishes
//! the run and checks: nothing lost, nothing applied twice, no second
//! escalation or fail-safe, deadlines and retry budgets not restarted.
//!
//! On `SimStore` the crash is the store's own hook and the restart its
//! `crash()`; on sled and redb the database is closed and reopened.
#![allow(missing_docs, clippy::unwrap_used)]

use abhyasa_testkit::store_world as common;

use std::time::Duration;

use abhyasa_core::custody::{LedgerOutcome, TerminalState};
use abhyasa_core::store::CrashTiming;
use abhyasa_core::{EscalationCause, Obligation, Sequence};
use common::*;
use serde_json::json;

struct Expect {
    ob: Obligation,
    state: TerminalState,
    /// Applications the receiver-owned counter must show.
    applications: u64,
    cause: Option<EscalationCause>,
    /// The principal weight its fail-safe leaves (Phala only).
    weight: Option<f64>,
    external: bool,
}

struct Scenario {
    name: &'static str,
    setup: fn(&mut World),
    act: fn(&mut World),
    expect: fn() -> Vec<Expect>,
}

const RUN: Duration = Duration::from_secs(600);

fn applied() -> Scenario {
    Scenario {
        name: "applied",
        setup: |_| {},
        act: |w| {
            w.offer(phala("ap", -0.3));
            w.run(RUN);
        },
        expect: || {
            vec![Expect {
                ob: phala("ap", -0.3),
                state: TerminalState::Applied,
                applications: 1,
                cause: None,
                weight: None,
                external: false,
            }]
        },
    }
}

fn declined() -> Scenario {
    Scenario {
        name: "declined",
        setup: |w| {
            w.applier.decisions.insert(oid("dc"), Decision::Decline);
        },
        act: |w| {
            w.offer(phala("dc", -0.3));
            w.run(RUN);
        },
        expect: || {
            vec![Expect {
                ob: phala("dc", -0.3),
                state: TerminalState::Declined,
                applications: 0,
                cause: None,
                weight: Some(0.7),
                external: false,
            }]
        },
    }
}

fn deferred_then_applied() -> Scenario {
    Scenario {
        name: "deferred-then-applied",
        setup: |w| {
            w.applier
                .decisions
                .insert(oid("df"), Decision::DeferThenApply);
        },
        act: |w| {
            w.offer(phala("df", -0.3));
            w.complete_at(EPOCH.saturating_add(Duration::from_secs(5)), oid("df"));
            w.run(RUN);
        },
        expect: || {
            vec![Expect {
                ob: phala("df", -0.3),
                state: TerminalState::Applied,
                applications: 1,
                cause: None,
                weight: None,
                external: false,
            }]
        },
    }
}

fn escalated() -> Scenario {
    Scenario {
        name: "escalated",
        setup: |w| w.partitioned = true,
        act: |w| {
            w.offer(phala("es", -0.3));
            w.run(RUN);
        },
        expect: || {
            vec![Expect {
                ob: phala("es", -0.3),
                state: TerminalState::Escalated,
                applications: 0,
                cause: Some(EscalationCause::Unreachable),
                weight: Some(0.7),
                external: false,
            }]
        },
    }
}

fn superseded() -> Scenario {
    Scenario {
        name: "superseded",
        setup: |_| {},
        act: |w| {
            w.offer(revoke("new", "email", 5));
            w.run(RUN);
            w.offer(revoke("old", "email", 3));
            w.run(RUN);
        },
        expect: || {
            vec![
                Expect {
                    ob: revoke("new", "email", 5),
                    state: TerminalState::Applied,
                    applications: 1,
                    cause: None,
                    weight: None,
                    external: false,
                },
                Expect {
                    ob: revoke("old", "email", 3),
                    state: TerminalState::Declined,
                    applications: 0,
                    cause: None,
                    weight: None,
                    external: false,
                },
            ]
        },
    }
}

fn conflict_obligation() -> Obligation {
    Obligation::builder()
        .id("cf")
        .kind(abhyasa_core::polarity::PHALA_KIND)
        .target("receiver")
        .payload(json!({"weight_delta": -0.3, "weight_key": "w-cf"}))
        .deadline_seconds(DEADLINE_SECONDS)
        .max_retries(MAX_RETRIES)
        .created_at(EPOCH)
        .build()
        .unwrap()
}

fn conflict() -> Scenario {
    Scenario {
        name: "conflict",
        // The receiver already applied another obligation under id "cf"
        // from this custodian (e.g. one the custodian has compacted).
        setup: |w| {
            let other = Obligation::builder()
                .id("cf")
                .kind(abhyasa_core::polarity::PHALA_KIND)
                .target("receiver")
                .payload(json!({"weight_delta": -0.9, "weight_key": "w-cf"}))
                .deadline_seconds(DEADLINE_SECONDS)
                .max_retries(MAX_RETRIES)
                .created_at(EPOCH)
                .build()
                .unwrap();
            let now = w.now;
            let r = w.recv.as_mut().unwrap();
            let _ = r.handle_obligation(now, &agent("custodian"), other, &mut w.applier);
            w.pump();
        },
        act: |w| {
            w.offer(conflict_obligation());
            w.run(RUN);
        },
        expect: || {
            vec![Expect {
                ob: conflict_obligation(),
                state: TerminalState::Escalated,
                // The earlier obligation's application, never a second.
                applications: 1,
                cause: Some(EscalationCause::Conflict),
                weight: Some(0.7),
                external: false,
            }]
        },
    }
}

fn external() -> Scenario {
    Scenario {
        name: "external-intent",
        setup: |w| {
            w.applier.decisions.insert(oid("ex"), Decision::External);
        },
        act: |w| {
            w.offer(phala("ex", -0.3));
            w.run(RUN);
        },
        expect: || {
            vec![Expect {
                ob: phala("ex", -0.3),
                state: TerminalState::Applied,
                applications: 1,
                cause: None,
                weight: None,
                external: true,
            }]
        },
    }
}

fn scenarios() -> Vec<Scenario> {
    vec![
        applied(),
        declined(),
        deferred_then_applied(),
        escalated(),
        superseded(),
        conflict(),
        external(),
    ]
}

fn check(w: &mut World, sc: &Scenario, label: &str) {
    assert!(
        w.cust.is_some() && w.recv.is_some(),
        "{label}: a node never came back"
    );
    // C-ND-5 / issue 11 §5: whatever crashed, the indexes equal the records.
    let now = w.now;
    assert_indexes_match(w.cstore.store(), now, &format!("{label}: custodian"));
    assert_indexes_match(w.rstore.store(), now, &format!("{label}: receiver"));
    let cs = w.cstore.load();
    let rs = w.rstore.load();
    assert!(
        cs.custodian.pending.is_empty(),
        "{label}: still pending: {:?}",
        cs.custodian.pending.keys()
    );
    let principal = w.principal();
    for e in (sc.expect)() {
        let id = e.ob.id();
        // Nothing lost: every offer ended, durably, as scripted.
        let t = cs
            .custodian
            .terminal
            .get(id)
            .unwrap_or_else(|| panic!("{label}: {id} lost"));
        assert_eq!(t.state, e.state, "{label}: {id} ended wrong");
        let live = w.cust.as_ref().unwrap().terminal(id).map(|t| t.state);
        assert_eq!(
            live,
            Some(e.state),
            "{label}: live custodian disagrees on {id}"
        );
        // Nothing applied twice (C-AB3-3): the receiver-owned counter.
        let count = match rs.receiver.effects.get(&counter_key(id)) {
            Some(abhyasa_core::custody::EffectValue::Json(v)) => v.as_u64().unwrap(),
            None => 0,
            Some(other) => panic!("{label}: unexpected effect {other:?}"),
        };
        assert_eq!(count, e.applications, "{label}: {id} applied {count} times");
        if e.state == TerminalState::Applied {
            let l = rs
                .receiver
                .ledger
                .get(&(agent("custodian"), id.clone()))
                .unwrap();
            assert_eq!(l.outcome, LedgerOutcome::Applied, "{label}: {id} ledger");
        }
        // No second escalation (C-AB4-3), deadline not restarted (C-AB2-3).
        let escs: Vec<_> = cs
            .custodian
            .escalations
            .iter()
            .filter(|x| &x.obligation_id == id)
            .collect();
        let want = usize::from(e.state == TerminalState::Escalated);
        assert_eq!(escs.len(), want, "{label}: {id} escalations");
        let released = w
            .escalation_events
            .iter()
            .filter(|x| &x.obligation_id == id)
            .count();
        assert!(
            released <= 1,
            "{label}: {id} escalation released {released} times"
        );
        if let Some(esc) = escs.first() {
            assert_eq!(Some(esc.cause), e.cause, "{label}: cause");
            assert_eq!(
                esc.deadline_at,
                e.ob.deadline_at(),
                "{label}: deadline moved"
            );
            assert!(
                esc.escalated_at <= e.ob.deadline_at().saturating_add(DOWNTIME),
                "{label}: escalated at {} past deadline {} (window restarted?)",
                esc.escalated_at,
                e.ob.deadline_at()
            );
            assert!(
                esc.attempts <= 1 + MAX_RETRIES as u32,
                "{label}: retry budget restarted"
            );
        }
        let sends = w.sends.get(id).copied().unwrap_or(0);
        assert!(
            sends <= 1 + MAX_RETRIES as u32,
            "{label}: {id} sent {sends} times"
        );
        // One fail-safe at most: the down-weight is additive.
        let key_suffix = format!("weight:w-{id}");
        let weight = principal
            .weights()
            .find(|(k, _)| k.as_str().ends_with(&key_suffix))
            .map(|(_, v)| v);
        match e.weight {
            Some(wt) => {
                let got = weight.unwrap_or_else(|| panic!("{label}: no fail-safe on {id}"));
                assert!(
                    (got - wt).abs() < 1e-9,
                    "{label}: weight {got}, want {wt} (fail-safe twice?)"
                );
            }
            None if e.ob.kind().as_str() == abhyasa_core::polarity::PHALA_KIND => {
                assert_eq!(weight, None, "{label}: unexpected fail-safe on {id}");
            }
            None => {}
        }
        if e.external {
            // C-AB3-5: executed exactly once, never blindly re-executed.
            assert_eq!(
                w.external.calls.get(id).copied(),
                Some(1),
                "{label}: external calls"
            );
        }
    }
    if sc.name == "superseded" {
        let seq = rs.receiver.key_sequences.values().next().unwrap();
        assert_eq!(
            seq,
            &(Sequence(5), oid("new")),
            "{label}: receiver key sequence regressed"
        );
        let old = rs
            .receiver
            .ledger
            .get(&(agent("custodian"), oid("old")))
            .unwrap();
        assert_eq!(
            old.reason,
            Some(abhyasa_core::DeclineReason::Superseded),
            "{label}"
        );
    }
}

/// Runs `sc` once per crash point; returns (crash points, in-doubt settles).
fn enumerate(kind: Kind, sc: &Scenario, timings: &[CrashTiming]) -> (usize, u32) {
    let mut w = World::new(kind);
    (sc.setup)(&mut w);
    let before = w.commits;
    (sc.act)(&mut w);
    check(&mut w, sc, &format!("{kind:?}/{}/no crash", sc.name));
    let counts = [w.commits[0] - before[0], w.commits[1] - before[1]];
    assert!(
        counts[0] > 0,
        "{}: no custodian commits to crash at",
        sc.name
    );
    let mut points = 0;
    let mut settled = 0;
    for (side, n) in [(Side::Custodian, counts[0]), (Side::Receiver, counts[1])] {
        for k in 1..=n {
            for &timing in timings {
                let label = format!("{kind:?}/{}/{side:?} commit {k}/{n} {timing:?}", sc.name);
                let mut w = World::new(kind);
                (sc.setup)(&mut w);
                w.plan(CrashPlan {
                    side,
                    commit: k,
                    timing,
                });
                (sc.act)(&mut w);
                assert_eq!(w.crashes, 1, "{label}: the crash point was not reached");
                check(&mut w, sc, &label);
                settled += w.outcome_unknown_events;
                points += 1;
            }
        }
    }
    (points, settled)
}

const BOTH: [CrashTiming; 2] = [CrashTiming::BeforeDurable, CrashTiming::AfterDurable];

// C-AB2-3, C-AB3-3, C-AB3-5, C-AB4-3 on the simulated store: every commit
// point of either side, both timings.
#[test]
fn sim_crash_at_every_commit_point_c_ab2_3_c_ab3_3_c_ab3_5_c_ab4_3() {
    let mut total = 0;
    for sc in scenarios() {
        let (points, settled) = enumerate(Kind::Sim, &sc, &BOTH);
        if sc.name == "external-intent" {
            // C-AB3-5: some crash points leave the effect in doubt.
            assert!(
                settled > 0,
                "no crash point left an external effect in doubt"
            );
        }
        total += points;
    }
    eprintln!("{total} crash points enumerated");
    assert!(total > 60, "only {total} crash points enumerated");
}

// The same scenarios on sled, closing and reopening the database at each
// crash (C-AB2-3, C-AB3-3, C-AB3-5, C-AB4-3).
#[test]
fn sled_crash_and_reopen_every_commit_point_c_ab2_3_c_ab3_3_c_ab3_5_c_ab4_3() {
    for sc in scenarios() {
        enumerate(Kind::Sled, &sc, &BOTH);
    }
}

// The same on redb.
#[test]
fn redb_crash_and_reopen_every_commit_point_c_ab2_3_c_ab3_3_c_ab3_5_c_ab4_3() {
    for sc in scenarios() {
        enumerate(Kind::Redb, &sc, &BOTH);
    }
}

// The same on the log store.
#[test]
fn log_crash_and_reopen_every_commit_point_c_ab2_3_c_ab3_3_c_ab3_5_c_ab4_3() {
    for sc in scenarios() {
        enumerate(Kind::Log, &sc, &BOTH);
    }
}

// The same on fjall.
#[test]
fn fjall_crash_and_reopen_every_commit_point_c_ab2_3_c_ab3_3_c_ab3_5_c_ab4_3() {
    for sc in scenarios() {
        enumerate(Kind::Fjall, &sc, &BOTH);
    }
}

// C-AB4-3: recovery into a still-dead link escalates, with the fail-safe
// applied, at the original deadline; C-AB2-3: the restored transfer keeps
// its absolute deadline and attempt count.
#[test]
fn recovery_into_dead_link_resumes_remaining_window_c_ab2_3_c_ab4_3() {
    for kind in ALL {
        let mut w = World::new(kind);
        w.partitioned = true;
        let ob = phala("dead", -0.3);
        w.offer(ob.clone());
        w.run(Duration::from_secs(20));
        let attempts = w.cust.as_ref().unwrap().attempts(ob.id()).unwrap();
        assert!(attempts > 1, "{kind:?}: no retries before the crash");
        // Crash now (nothing in flight), restart from the store.
        w.cust = None;
        w.cstore.restart();
        let s = w.cstore.load();
        let p = &s.custodian.pending[ob.id()];
        assert_eq!(
            p.attempts, attempts,
            "{kind:?}: attempt count not recovered"
        );
        assert_eq!(p.offered_at, EPOCH, "{kind:?}: offer time moved");
        w.cust = Some(abhyasa_core::custody::Custodian::restore(
            custodian_config(),
            abhyasa_core::polarity::PolarityRegistry::standard(),
            &s.custodian,
        ));
        w.run(RUN);
        let cs = w.cstore.load();
        let esc = &cs.custodian.escalations[0];
        assert_eq!(cs.custodian.escalations.len(), 1);
        assert_eq!(
            esc.escalated_at,
            ob.deadline_at(),
            "{kind:?}: window restarted"
        );
        assert!(esc.attempts >= attempts);
    }
}
