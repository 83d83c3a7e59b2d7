//! Receiver conformance: AB-3, receiver-side deadlines, supersession on both
//! sides, the dual-write boundary.

#![allow(clippy::unwrap_used)]

mod common;

use abhyasa_core::custody::{
    AckDisposition, ApplyContext, ApplyDecision, CustodianEvent, EffectValue, ExternalIntent,
    ExternalOutcome, LedgerOutcome, Received, Receiver, ReceiverEvent, ReceiverSnapshot, Record,
    StandardApplier, TerminalState,
};
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::principal::{Authorization, PrincipalState};
use abhyasa_core::wire::Message;
use abhyasa_core::{
    AckStatus, DeclineReason, GovernedKey, GuardOutcome, Obligation, SafeAction, SafeEffect,
    Sequence,
};
use common::*;
use serde_json::json;

fn scope_key(s: &str) -> GovernedKey {
    GovernedKey::new(format!("anumati.consent/receiver/scope:{s}")).unwrap()
}

/// The key as the receiver holds it: under the custodian that issued it
/// (C-AZ-2).
fn held(k: &GovernedKey) -> GovernedKey {
    k.issued_by(&agent("custodian"))
}

fn counting() -> (
    std::rc::Rc<std::cell::Cell<u32>>,
    Box<dyn abhyasa_core::custody::Applier>,
) {
    let n = std::rc::Rc::new(std::cell::Cell::new(0));
    let m = n.clone();
    let mut std_applier = StandardApplier::default();
    let f = move |ctx: &ApplyContext<'_>, ob: &Obligation| {
        let d = abhyasa_core::custody::Applier::decide(&mut std_applier, ctx, ob);
        if matches!(d, ApplyDecision::Apply(_)) {
            m.set(m.get() + 1);
        }
        d
    };
    (n, Box::new(f))
}

fn acks_of(out: &[abhyasa_core::custody::Transmit]) -> Vec<abhyasa_core::CustodyAck> {
    out.iter()
        .flat_map(|t| match &t.message {
            Message::Acks(a) => a.clone(),
            _ => Vec::new(),
        })
        .collect()
}

// C-AB3-1: duplicate delivery: effect applied once, both acks applied.
#[test]
fn c_ab3_1_duplicate_delivery_applies_once() {
    let (count, applier) = counting();
    let mut d = Duo::with(custodian_config(), applier);
    d.c.offer(T0, revoke("ob-1", "s")).unwrap();
    let out = d.custodian_out();
    assert_eq!(d.deliver_to_receiver(at(0.1), &out[0]), Received::Applied);
    assert_eq!(
        d.deliver_to_receiver(at(0.2), &out[0]),
        Received::Duplicate(LedgerOutcome::Applied)
    );
    assert_eq!(count.get(), 1);
    let acks = acks_of(&d.receiver_out());
    assert_eq!(acks.len(), 2);
    assert!(acks.iter().all(|a| a.status == AckStatus::Applied));
    // Both acks travel in one coalesced frame.
    assert_eq!(
        d.r.effects().get(held(&scope_key("s")).as_str()),
        Some(&EffectValue::Authorization(Authorization::Withheld))
    );
}

// C-AB3-2: ack lost after apply, redelivery: re-acked applied without reapplying.
#[test]
fn c_ab3_2_lost_ack_redelivery_reacks_without_reapplying() {
    let (count, applier) = counting();
    let mut d = Duo::with(custodian_config(), applier);
    let ob = revoke("ob-1", "s");
    d.c.offer(T0, ob.clone()).unwrap();
    let out = d.custodian_out();
    d.deliver_to_receiver(at(0.1), &out[0]);
    let _lost = d.receiver_out();
    // Retry at t = 1 s.
    d.c.handle_timeout(at(1.0));
    assert_eq!(d.exchange(at(1.0)), vec![AckDisposition::Applied]);
    assert_eq!(count.get(), 1);
    assert_eq!(d.c.terminal(ob.id()).unwrap().state, TerminalState::Applied);
}

// C-AB3-3 (core): ledger and effect are one record, so a restore from the
// committed records re-acks without reapplying.
#[test]
fn c_ab3_3_restored_receiver_reacks_without_reapplying() {
    let (count, applier) = counting();
    let mut d = Duo::with(custodian_config(), applier);
    d.c.offer(T0, revoke("ob-1", "s")).unwrap();
    let out = d.custodian_out();
    d.deliver_to_receiver(at(0.1), &out[0]);
    let batch = d.r.poll_records().unwrap();
    let ledger: Vec<_> = batch
        .records
        .iter()
        .filter(|r| matches!(r, Record::Ledger(_)))
        .collect();
    assert_eq!(ledger.len(), 1, "one atomic record");
    match ledger[0] {
        Record::Ledger(l) => {
            assert_eq!(l.outcome, LedgerOutcome::Applied);
            assert_eq!(l.effect.len(), 1, "the effect rides in the ledger record");
        }
        _ => unreachable!(),
    }
    let mut snap = ReceiverSnapshot::default();
    batch.records.iter().for_each(|r| snap.apply(r));
    // Crash before the ack left; restart from the durable state.
    let mut r2 = Receiver::restore(
        receiver_config(),
        PolarityRegistry::standard(),
        &snap,
        at(5.0),
    );
    let (count2, mut applier2) = counting();
    let got = r2.handle_obligation(
        at(5.0),
        &agent("custodian"),
        match &out[0].message {
            Message::Obligation(o) => o.clone(),
            _ => unreachable!(),
        },
        applier2.as_mut(),
    );
    assert_eq!(got, Received::Duplicate(LedgerOutcome::Applied));
    assert_eq!(count.get() + count2.get(), 1);
}

// C-AB3-4: same id, different digest: conflict, no effect, not a discharge.
#[test]
fn c_ab3_4_same_id_other_digest_is_a_conflict() {
    let (count, applier) = counting();
    let mut d = Duo::with(custodian_config(), applier);
    let cid = d.cid.clone();
    let first = revoke("x", "a");
    let second = revoke("x", "b");
    assert_eq!(
        d.r.handle_obligation(T0, &cid, first, d.applier.as_mut()),
        Received::Applied
    );
    let _ = d.receiver_out();
    assert_eq!(
        d.r.handle_obligation(at(1.0), &cid, second.clone(), d.applier.as_mut()),
        Received::Conflict
    );
    assert_eq!(count.get(), 1, "no effect for the conflicting content");
    let acks = acks_of(&d.receiver_out());
    assert_eq!(acks[0].reason, Some(DeclineReason::Conflict));
    assert_eq!(
        acks[0].digest,
        Some(second.digest()),
        "bound to the offending content"
    );
    assert_eq!(d.r.effects().get(held(&scope_key("b")).as_str()), None);
    assert!(d
        .receiver_events()
        .iter()
        .any(|e| matches!(e, ReceiverEvent::Conflict { .. })));
    // The same id from another custodian is another obligation (AB-3 key).
    let other = agent("custodian-2");
    assert_eq!(
        d.r.handle_obligation(at(2.0), &other, revoke("x", "b"), d.applier.as_mut()),
        Received::Applied
    );
}

// C-DL-1: declined expired past the deadline (with skew), even after an
// earlier deferral; never applied late.
#[test]
fn c_dl_1_receiver_never_applies_past_the_deadline() {
    let (count, applier) = counting();
    let mut d = Duo::with(custodian_config(), applier);
    let cid = d.cid.clone();
    // Deadline 600 s, skew margin 2 s: at 598 s it is already expired.
    let ob = revoke("ob-1", "s");
    assert_eq!(
        d.r.handle_obligation(at(598.0), &cid, ob.clone(), d.applier.as_mut()),
        Received::Declined(DeclineReason::Expired)
    );
    assert_eq!(count.get(), 0);
    // Deferred earlier, redelivered after the deadline: expired, not applied.
    let mut asked = 0;
    let mut defer_then_apply = |_: &ApplyContext<'_>, _: &Obligation| {
        asked += 1;
        if asked == 1 {
            ApplyDecision::Defer { detail: None }
        } else {
            ApplyDecision::Apply(vec![])
        }
    };
    let ob2 = revoke("ob-2", "t");
    assert_eq!(
        d.r.handle_obligation(at(1.0), &cid, ob2.clone(), &mut defer_then_apply),
        Received::Deferred
    );
    assert_eq!(
        d.r.handle_obligation(at(599.0), &cid, ob2.clone(), &mut defer_then_apply),
        Received::Declined(DeclineReason::Expired)
    );
    // Completing it late is declined too.
    let ob3 = revoke("ob-3", "u");
    assert_eq!(
        d.r.handle_obligation(
            at(1.0),
            &cid,
            ob3.clone(),
            &mut |_: &ApplyContext<'_>, _: &Obligation| ApplyDecision::Defer { detail: None }
        ),
        Received::Deferred
    );
    assert_eq!(
        d.r.complete_deferred(at(700.0), &cid, ob3.id(), ApplyDecision::Apply(vec![])),
        Ok(Received::Declined(DeclineReason::Expired))
    );
    assert_eq!(
        d.r.ledger_outcome(&cid, ob3.id()),
        Some(LedgerOutcome::Declined)
    );
}

#[test]
fn deferred_then_completed_pushes_the_final_ack() {
    let mut d = Duo::with(
        custodian_config(),
        Box::new(
            |_: &ApplyContext<'_>, _: &Obligation| ApplyDecision::Defer {
                detail: Some("queued".into()),
            },
        ),
    );
    let ob = revoke("ob-1", "s");
    d.c.offer(T0, ob.clone()).unwrap();
    assert_eq!(d.exchange(at(0.1)), vec![AckDisposition::Deferred]);
    let cid = d.cid.clone();
    let got =
        d.r.complete_deferred(at(30.0), &cid, ob.id(), ApplyDecision::Apply(vec![]));
    assert_eq!(got, Ok(Received::Applied));
    let pushed = d.receiver_out();
    assert_eq!(
        d.deliver_to_custodian(at(30.1), &pushed[0]),
        vec![AckDisposition::Applied]
    );
    assert!(d.c.poll_timeout().is_none());
    // A second completion is refused.
    assert!(d
        .r
        .complete_deferred(at(31.0), &cid, ob.id(), ApplyDecision::Apply(vec![]))
        .is_err());
}

// C-SS-2: an older sequence arriving after a newer one is declined superseded.
#[test]
fn c_ss_2_receiver_declines_older_sequences() {
    let (count, applier) = counting();
    let mut d = Duo::with(custodian_config(), applier);
    let cid = d.cid.clone();
    assert_eq!(
        d.r.handle_obligation(T0, &cid, grant_seq("g2", "s", 2), d.applier.as_mut()),
        Received::Applied
    );
    assert_eq!(
        d.r.handle_obligation(at(1.0), &cid, revoke_seq("r1", "s", 1), d.applier.as_mut()),
        Received::Declined(DeclineReason::Superseded)
    );
    // Equal sequence, other id: not newer either.
    assert_eq!(
        d.r.handle_obligation(at(1.0), &cid, revoke_seq("r2", "s", 2), d.applier.as_mut()),
        Received::Declined(DeclineReason::Superseded)
    );
    assert_eq!(count.get(), 1);
    assert_eq!(
        d.r.effects().get(held(&scope_key("s")).as_str()),
        Some(&EffectValue::Authorization(Authorization::Granted))
    );
    // A newer one applies; another key is independent.
    assert_eq!(
        d.r.handle_obligation(at(2.0), &cid, revoke_seq("r3", "s", 3), d.applier.as_mut()),
        Received::Applied
    );
    assert_eq!(
        d.r.handle_obligation(
            at(2.0),
            &cid,
            revoke_seq("r4", "other", 1),
            d.applier.as_mut()
        ),
        Received::Applied
    );
}

fn withhold(id: &str, key: &GovernedKey, seq: u64) -> SafeAction {
    SafeAction {
        obligation_id: abhyasa_core::ObligationId::new(id).unwrap(),
        target: agent("receiver"),
        effect: SafeEffect::FailClosed,
        key: key.clone(),
        sequence: Some(Sequence(seq)),
        rationale: "test".into(),
    }
}

// C-SS-1: principal side: a fail-safe or decision older than the newest on
// its key applies nothing; the escalation still fires.
#[test]
fn c_ss_1_principal_guard_drops_stale_actions_but_escalation_fires() {
    let mut p = PrincipalState::default();
    let k = scope_key("s");
    assert_eq!(
        p.decide(&k, Authorization::Granted, Some(Sequence(5))).0,
        GuardOutcome::Applied
    );
    let (g, w) = p.apply_safe(&withhold("old", &k, 4));
    assert_eq!(
        g,
        GuardOutcome::Superseded {
            newest: Sequence(5)
        }
    );
    assert!(w.is_none());
    assert!(p.is_authorized(&k));
    assert_eq!(
        p.decide(&k, Authorization::Withheld, Some(Sequence(5))).0,
        GuardOutcome::Superseded {
            newest: Sequence(5)
        }
    );
    assert_eq!(
        p.apply_safe(&withhold("new", &k, 6)).0,
        GuardOutcome::Applied
    );
    assert!(!p.is_authorized(&k));

    // Through the custodian: revoke(seq 1) escalates after the principal
    // granted seq 2; the escalation fires with the fail-safe dropped.
    let mut d = Duo::new();
    d.c.offer(T0, revoke_seq("r1", "s", 1)).unwrap();
    assert!(!d.c.principal().is_authorized(&k));
    d.c.decide(at(5.0), &k, Authorization::Granted, Some(Sequence(2)));
    d.run_dead_until(at(1000.0));
    let e = d
        .custodian_events()
        .into_iter()
        .find_map(|e| match e {
            CustodianEvent::Escalated(x) => Some(x),
            _ => None,
        })
        .expect("the escalation still fires");
    assert_eq!(
        e.guard,
        GuardOutcome::Superseded {
            newest: Sequence(2)
        }
    );
    assert!(
        d.c.principal().is_authorized(&k),
        "no regression of the newer grant"
    );
}

// C-SS-3: both guards compose: stale obligation declined, its safe(O)
// dropped, no regression on either side.
#[test]
fn c_ss_3_guards_compose() {
    let mut d = Duo::new();
    let k = scope_key("s");
    // revoke seq 1 is delayed; grant seq 2 overtakes it.
    d.c.offer(T0, revoke_seq("r1", "s", 1)).unwrap();
    let delayed = d.custodian_out();
    d.c.offer(at(1.0), grant_seq("g2", "s", 2)).unwrap();
    let grant = d.custodian_out();
    d.deliver_to_receiver(at(1.1), &grant[0]);
    let _ = d.receiver_out();
    assert!(d.c.principal().is_authorized(&k));
    // The stale revoke arrives: declined superseded at the receiver ...
    assert_eq!(
        d.deliver_to_receiver(at(1.2), &delayed[0]),
        Received::Declined(DeclineReason::Superseded)
    );
    let acks = d.receiver_out();
    assert_eq!(
        d.deliver_to_custodian(at(1.3), &acks[0]),
        vec![AckDisposition::Declined]
    );
    // ... and its safe(O) is dropped by the principal guard.
    let ev = d.custodian_events();
    assert!(
        ev.iter().any(|e| matches!(
            e,
            CustodianEvent::Declined {
                reason: Some(DeclineReason::Superseded),
                disposition: abhyasa_core::custody::DeclineDisposition::SafeApplied {
                    guard: GuardOutcome::Superseded {
                        newest: Sequence(2)
                    }
                },
                ..
            }
        )),
        "{ev:?}"
    );
    assert!(
        d.c.principal().is_authorized(&k),
        "principal side did not regress"
    );
    assert_eq!(
        d.r.effects().get(held(&k).as_str()),
        Some(&EffectValue::Authorization(Authorization::Granted)),
        "receiver side did not regress"
    );
}

// C-SS-4: Phala deltas are unguarded, commute, and stay within the clip
// range under repeated fail-safes.
#[test]
fn c_ss_4_phala_deltas_commute_and_clip() {
    let k = GovernedKey::new("phala.belief_update/receiver/weight:w").unwrap();
    let action = |id: &str, m: f64, seq: u64| SafeAction {
        obligation_id: abhyasa_core::ObligationId::new(id).unwrap(),
        target: agent("receiver"),
        effect: SafeEffect::DownWeight { magnitude: m },
        key: k.clone(),
        sequence: Some(Sequence(seq)),
        rationale: "t".into(),
    };
    let mut a = PrincipalState::default();
    let mut b = PrincipalState::default();
    a.apply_safe(&action("x", 0.1, 2));
    a.apply_safe(&action("y", 0.25, 1));
    b.apply_safe(&action("y", 0.25, 1));
    b.apply_safe(&action("x", 0.1, 2));
    assert!(
        (a.weight(&k) - 0.65).abs() < 1e-12,
        "older sequence still applies: unguarded"
    );
    assert!((a.weight(&k) - b.weight(&k)).abs() < 1e-12, "commutes");
    for i in 0..50 {
        let (g, _) = a.apply_safe(&action(&format!("z{i}"), 0.3, 0));
        assert_eq!(g, GuardOutcome::Applied);
    }
    assert_eq!(a.weight(&k), 0.0, "clipped at the floor");
    // Receiver side: additive too, clipped by the standard applier.
    let mut d = Duo::new();
    let cid = d.cid.clone();
    for i in 0..5 {
        let ob = builder(
            &format!("p{i}"),
            "phala.belief_update",
            json!({"weight_delta": -0.3, "weight_key": "w"}),
        )
        .sequence(5 - i)
        .build()
        .unwrap();
        assert_eq!(
            d.r.handle_obligation(T0, &cid, ob, d.applier.as_mut()),
            Received::Applied
        );
    }
    assert_eq!(
        d.r.effects().get(held(&k).as_str()),
        Some(&EffectValue::Weight(0.0))
    );
}

// C-AB3-5: external effect with an intent record: a crash in doubt is
// surfaced outcome_unknown and settled by query, never re-executed blindly.
#[test]
fn c_ab3_5_external_effect_in_doubt_is_surfaced_not_reexecuted() {
    // The effect runs exactly when a receiver releases `Execute`; count those
    // across both incarnations and every drain, so an extra `Execute` (on
    // restore, on redelivery, on settling) fails the test.
    fn executes(evs: &[ReceiverEvent]) -> usize {
        evs.iter()
            .filter(|e| matches!(e, ReceiverEvent::Execute { .. }))
            .count()
    }
    fn drain(r: &mut Receiver) -> Vec<ReceiverEvent> {
        while let Some(b) = r.poll_records() {
            r.handle_committed(b.token());
        }
        while r.poll_transmit().is_some() {}
        std::iter::from_fn(|| r.poll_event()).collect()
    }
    let external = move |_: &ApplyContext<'_>, ob: &Obligation| {
        ApplyDecision::External(ExternalIntent {
            idempotency_key: ob.id().clone(),
            action: "revoke-in-idp".into(),
            data: json!({"scope": ob.payload().get("scope")}),
        })
    };
    let mut d = Duo::with(custodian_config(), Box::new(external));
    // Sequenced: the redelivery below is the obligation as sent.
    let ob = revoke_seq("ob-1", "s", 1);
    d.c.offer(T0, ob.clone()).unwrap();
    let out = d.custodian_out();
    assert_eq!(
        d.deliver_to_receiver(at(0.1), &out[0]),
        Received::IntentRecorded
    );
    // The intent is durable before the Execute event is released.
    assert!(d.r.poll_event().is_none());
    let batch = d.r.poll_records().unwrap();
    assert!(matches!(batch.records[0], Record::Intent(_)));
    let mut snap = ReceiverSnapshot::default();
    batch.records.iter().for_each(|r| snap.apply(r));
    d.r.handle_committed(batch.token());
    let first = drain(&mut d.r);
    match &first[..] {
        [ReceiverEvent::Execute { intent, .. }] => {
            assert_eq!(intent.idempotency_key, *ob.id());
        }
        other => panic!("{other:?}"),
    }
    let mut executions = executes(&first); // ... the effect runs, and the process dies.
                                           // Restart: the effect is in doubt.
    let mut r2 = Receiver::restore(
        receiver_config(),
        PolarityRegistry::standard(),
        &snap,
        at(10.0),
    );
    let b = r2.poll_records().unwrap();
    assert!(
        matches!(&b.records[0], Record::Ledger(l) if l.outcome == LedgerOutcome::OutcomeUnknown)
    );
    r2.handle_committed(b.token());
    let ev = drain(&mut r2);
    executions += executes(&ev);
    assert!(
        matches!(&ev[..], [ReceiverEvent::OutcomeUnknown { .. }]),
        "{ev:?}"
    );
    // A redelivery does not execute it again; it is re-acked deferred.
    let cid = agent("custodian");
    let mut never =
        |_: &ApplyContext<'_>, _: &Obligation| -> ApplyDecision { panic!("re-executed blindly") };
    assert_eq!(
        r2.handle_obligation(at(11.0), &cid, ob.clone(), &mut never),
        Received::Duplicate(LedgerOutcome::OutcomeUnknown)
    );
    executions += executes(&drain(&mut r2));
    // Settled by querying the external system: it did take effect.
    assert_eq!(
        r2.handle_external_outcome(at(12.0), &cid, ob.id(), ExternalOutcome::Applied(vec![])),
        Ok(Received::Applied)
    );
    let settled = drain(&mut r2);
    executions += executes(&settled);
    assert!(
        settled
            .iter()
            .any(|e| matches!(e, ReceiverEvent::Applied { .. })),
        "{settled:?}"
    );
    // And a redelivery after settling is a duplicate, not an execution.
    assert_eq!(
        r2.handle_obligation(at(13.0), &cid, ob.clone(), &mut never),
        Received::Duplicate(LedgerOutcome::Applied)
    );
    executions += executes(&drain(&mut r2));
    assert_eq!(
        r2.ledger_outcome(&cid, ob.id()),
        Some(LedgerOutcome::Applied)
    );
    assert_eq!(executions, 1, "the external effect ran once");
}

#[test]
fn misrouted_and_invalid_obligations_are_rejected_with_typed_errors() {
    let mut d = Duo::new();
    let cid = d.cid.clone();
    let wrong_target = builder("ob-1", "anumati.consent", json!({"scope": "s"}))
        .target("someone-else")
        .build()
        .unwrap();
    assert!(matches!(
        d.r.handle_obligation(T0, &cid, wrong_target, d.applier.as_mut()),
        Received::Rejected(_)
    ));
    let bad = obligation(
        "ob-2",
        "oauth.token",
        json!({"action": "explode", "token_id": "t"}),
    );
    match d.r.handle_obligation(T0, &cid, bad, d.applier.as_mut()) {
        Received::Rejected(e) => assert!(e.message.contains("payload.action"), "{}", e.message),
        other => panic!("{other:?}"),
    }
    assert_eq!(d.r.ledger_len(), 0, "nothing accepted");
    let unknown = obligation("ob-3", "acme.custom", json!({}));
    assert_eq!(
        d.r.handle_obligation(T0, &cid, unknown, d.applier.as_mut()),
        Received::Declined(DeclineReason::UnsupportedKind)
    );
}

#[test]
fn status_query_answers_from_the_ledger() {
    let mut d = Duo::new();
    let cid = d.cid.clone();
    let ob = revoke("ob-1", "s");
    d.r.handle_obligation(T0, &cid, ob.clone(), d.applier.as_mut());
    let _ = d.receiver_out();
    let unknown = abhyasa_core::ObligationId::new("ob-9").unwrap();
    d.r.handle_status_query(at(1.0), &cid, &[ob.id().clone(), unknown.clone()]);
    let out = d.receiver_out();
    match &out[0].message {
        Message::StatusReply(r) => {
            assert_eq!(r.known.len(), 1);
            assert_eq!(r.known[0].status, AckStatus::Applied);
            assert_eq!(r.known[0].digest, Some(ob.digest()));
            assert_eq!(r.unknown, vec![unknown]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn compaction_keeps_redelivery_safe() {
    let (count, applier) = counting();
    let mut d = Duo::with(custodian_config(), applier);
    let cid = d.cid.clone();
    let ob = revoke("ob-1", "s");
    d.r.handle_obligation(T0, &cid, ob.clone(), d.applier.as_mut());
    assert_eq!(d.r.compact(at(100.0)), 0, "inside the retention window");
    assert_eq!(d.r.compact(at(10_000.0)), 1);
    // After compaction a redelivery is past its deadline: declined expired.
    assert_eq!(
        d.r.handle_obligation(at(10_001.0), &cid, ob, d.applier.as_mut()),
        Received::Declined(DeclineReason::Expired)
    );
    assert_eq!(count.get(), 1);
}

// C-SD-4 (receiver): after a repair that read around damage, ledger entries
// may be gone; an obligation the receiver does not hold that was created
// at or before the repair is declined (`policy`, "store_damaged"), never
// applied a second time; one created after it is applied as usual.
#[test]
fn c_sd_4_after_a_repair_an_unheld_older_obligation_is_declined_not_reapplied() {
    let restored = |damaged_before| {
        let snap = ReceiverSnapshot {
            damaged_before: Some(damaged_before),
            ..ReceiverSnapshot::default()
        };
        Receiver::restore(receiver_config(), PolarityRegistry::standard(), &snap, T0)
    };
    let cid = agent("custodian");
    let (count, mut applier) = counting();
    let mut r = restored(T0);
    let got = r.handle_obligation(at(1.0), &cid, revoke("ob-1", "s"), applier.as_mut());
    assert_eq!(got, Received::Declined(DeclineReason::Policy));
    assert_eq!(count.get(), 0, "never applied");
    let ack = std::iter::from_fn(|| r.poll_transmit())
        .find_map(|t| match t.message {
            Message::Acks(a) => a.into_iter().next(),
            _ => None,
        })
        .expect("a decline is sent");
    assert_eq!(ack.status, AckStatus::Declined);
    assert!(
        ack.detail
            .as_deref()
            .unwrap_or("")
            .contains("store_damaged"),
        "{ack:?}"
    );

    // Repaired before the obligation was created: nothing to rule out.
    let mut r = restored(abhyasa_core::Timestamp::from_unix_seconds(1_779_999_990));
    r.handle_obligation(at(1.0), &cid, revoke("ob-1", "s"), applier.as_mut());
    assert_eq!(count.get(), 1, "applied once");
}
