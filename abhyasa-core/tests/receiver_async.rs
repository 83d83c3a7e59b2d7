//! The receiver asks the agent and takes the decision back as an input
//! (issue 11 §6, str0m style): nothing is recorded while a decision is
//! outstanding, a redelivery asks nothing again, the rules are re-checked
//! when the decision returns, outstanding requests are bounded, and a
//! crash while waiting loses nothing durable.

#![allow(clippy::unwrap_used)]

mod common;

use abhyasa_core::custody::{
    ApplyDecision, ApplyRequest, CompleteError, EffectValue, LedgerOutcome, Received, Receiver,
    ReceiverEvent, ReceiverSnapshot, StandardApplier, Transmit,
};
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::principal::Authorization;
use abhyasa_core::wire::{ErrorCode, Message};
use abhyasa_core::{AckStatus, CustodyAck, DeclineReason, GovernedKey, Obligation};
use common::*;

/// The scope's key as the receiver holds it: under the custodian that
/// issued it (C-AZ-2).
fn scope_key(s: &str) -> GovernedKey {
    GovernedKey::new(format!("anumati.consent/receiver/scope:{s}"))
        .unwrap()
        .issued_by(&agent("custodian"))
}

fn receiver() -> Receiver {
    Receiver::new(receiver_config(), PolarityRegistry::standard())
}

/// Commits whatever the receiver emitted; returns the released frames.
fn flush(r: &mut Receiver, snap: &mut ReceiverSnapshot) -> Vec<Transmit> {
    if let Some(b) = r.poll_records() {
        b.records.iter().for_each(|rec| snap.apply(rec));
        r.handle_committed(b.token());
    }
    std::iter::from_fn(|| r.poll_transmit()).collect()
}

fn acks(out: &[Transmit]) -> Vec<CustodyAck> {
    out.iter()
        .flat_map(|t| match &t.message {
            Message::Acks(a) => a.clone(),
            _ => Vec::new(),
        })
        .collect()
}

fn requests(r: &mut Receiver) -> Vec<ApplyRequest> {
    std::iter::from_fn(|| r.poll_apply_request()).collect()
}

fn standard(req: &ApplyRequest) -> ApplyDecision {
    req.answer_with(&mut StandardApplier::default())
}

fn ticket(got: &Received) -> abhyasa_core::custody::ApplyTicket {
    match got {
        Received::AwaitingDecision(t) => *t,
        other => panic!("expected a request, got {other:?}"),
    }
}

// C-AB3-1 through the asynchronous path: two redeliveries while the
// decision is outstanding ask nothing again and record nothing; the one
// decision applies once and its ack answers them.
#[test]
fn c_ab3_1_redelivery_while_waiting_asks_once_and_applies_once() {
    let mut r = receiver();
    let mut snap = ReceiverSnapshot::default();
    let cid = agent("custodian");
    let ob = revoke("ob-1", "s");
    let t = ticket(&r.receive(at(0.1), &cid, ob.clone()));
    let asked = requests(&mut r);
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].ticket, t);
    assert_eq!(asked[0].obligation, ob);
    assert_eq!(asked[0].key, Some(scope_key("s")));
    for s in [0.5, 1.0] {
        assert_eq!(
            r.receive(at(s), &cid, ob.clone()),
            Received::AwaitingDecision(t)
        );
    }
    assert!(requests(&mut r).is_empty(), "asked only once");
    assert!(r.poll_records().is_none(), "nothing durable while waiting");
    assert!(r.poll_transmit().is_none(), "nothing acked while waiting");
    assert_eq!(r.outstanding_requests(), 1);

    assert_eq!(
        r.decide(at(2.0), t, standard(&asked[0])).unwrap(),
        Received::Applied
    );
    let out = flush(&mut r, &mut snap);
    let a = acks(&out);
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].status, AckStatus::Applied);
    assert_eq!(r.applications(), 1);
    assert_eq!(r.outstanding_requests(), 0);
    assert_eq!(
        r.effects().get(scope_key("s").as_str()),
        Some(&EffectValue::Authorization(Authorization::Withheld))
    );
    // The same ticket cannot apply twice.
    assert_eq!(
        r.decide(at(2.1), t, standard(&asked[0])),
        Err(CompleteError::UnknownTicket(t))
    );
    assert_eq!(
        r.receive(at(3.0), &cid, ob),
        Received::Duplicate(LedgerOutcome::Applied)
    );
    assert_eq!(r.applications(), 1);
}

#[test]
fn async_decline_and_defer_are_recorded_when_they_come_back() {
    let mut r = receiver();
    let mut snap = ReceiverSnapshot::default();
    let cid = agent("custodian");
    let a = revoke("ob-a", "a");
    let b = revoke("ob-b", "b");
    let ta = ticket(&r.receive(at(0.1), &cid, a.clone()));
    let tb = ticket(&r.receive(at(0.1), &cid, b.clone()));
    assert_eq!(requests(&mut r).len(), 2);
    // Decided in the other order than asked.
    let defer = ApplyDecision::Defer {
        detail: Some("asking the human".into()),
    };
    assert_eq!(r.decide(at(1.0), tb, defer).unwrap(), Received::Deferred);
    let decline = ApplyDecision::Decline {
        reason: DeclineReason::Policy,
        detail: Some("not while on call".into()),
    };
    assert_eq!(
        r.decide(at(1.5), ta, decline).unwrap(),
        Received::Declined(DeclineReason::Policy)
    );
    let got = acks(&flush(&mut r, &mut snap));
    let status = |id: &Obligation| got.iter().find(|k| &k.obligation_id == id.id()).unwrap();
    assert_eq!(status(&b).status, AckStatus::Deferred);
    assert_eq!(status(&a).status, AckStatus::Declined);
    assert_eq!(status(&a).reason, Some(DeclineReason::Policy));
    assert_eq!(
        r.ledger_outcome(&cid, a.id()),
        Some(LedgerOutcome::Declined)
    );
    assert_eq!(
        r.ledger_outcome(&cid, b.id()),
        Some(LedgerOutcome::Deferred)
    );
    assert_eq!(r.applications(), 0);
    // A redelivery of the deferred one asks again, saying so.
    let t2 = ticket(&r.receive(at(5.0), &cid, b.clone()));
    let again = requests(&mut r);
    assert_eq!(again.len(), 1);
    assert!(again[0].previously_deferred);
    assert_eq!(
        r.decide(at(6.0), t2, standard(&again[0])).unwrap(),
        Received::Applied
    );
    assert_eq!(r.applications(), 1);
    // The decline is remembered, not re-asked.
    assert_eq!(
        r.receive(at(7.0), &cid, a),
        Received::Duplicate(LedgerOutcome::Declined)
    );
    assert!(requests(&mut r).is_empty());
}

// C-DL-1: the deadline passing while the agent thinks declines `expired`
// at the timer; a decision arriving after that applies nothing.
#[test]
fn c_dl_1_deadline_passing_while_waiting_declines_expired() {
    let mut r = receiver();
    let mut snap = ReceiverSnapshot::default();
    let cid = agent("custodian");
    let ob = revoke("ob-1", "s"); // deadline T0 + 600 s, skew margin 2 s
    let t = ticket(&r.receive(at(1.0), &cid, ob.clone()));
    let asked = requests(&mut r);
    assert_eq!(r.poll_timeout(), Some(at(598.0)));
    r.handle_timeout(at(597.0));
    assert_eq!(r.outstanding_requests(), 1, "not yet due");
    r.handle_timeout(at(598.0));
    assert_eq!(r.outstanding_requests(), 0);
    assert_eq!(r.poll_timeout(), None);
    let a = acks(&flush(&mut r, &mut snap));
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].status, AckStatus::Declined);
    assert_eq!(a[0].reason, Some(DeclineReason::Expired));
    assert_eq!(
        r.decide(at(599.0), t, standard(&asked[0])),
        Err(CompleteError::UnknownTicket(t))
    );
    assert_eq!(r.applications(), 0);

    // Without the timer served, a late decision is declined all the same.
    let mut r = receiver();
    let t = ticket(&r.receive(at(1.0), &cid, ob));
    let asked = requests(&mut r);
    assert_eq!(
        r.decide(at(598.5), t, standard(&asked[0])).unwrap(),
        Received::Declined(DeclineReason::Expired)
    );
    assert_eq!(r.applications(), 0);
}

// C-SS-2: a newer sequence applied on the key while an older one waits:
// the older one's decision is declined `superseded`, never applied.
#[test]
fn c_ss_2_supersession_while_waiting_declines_the_older() {
    let mut r = receiver();
    let cid = agent("custodian");
    let old = grant_seq("ob-old", "s", 1);
    let new = revoke_seq("ob-new", "s", 2);
    let t_old = ticket(&r.receive(at(0.1), &cid, old));
    let t_new = ticket(&r.receive(at(0.2), &cid, new));
    let asked = requests(&mut r);
    assert_eq!(
        r.decide(at(1.0), t_new, standard(&asked[1])).unwrap(),
        Received::Applied
    );
    assert_eq!(
        r.decide(at(1.1), t_old, standard(&asked[0])).unwrap(),
        Received::Declined(DeclineReason::Superseded)
    );
    assert_eq!(r.applications(), 1);
    assert_eq!(
        r.effects().get(scope_key("s").as_str()),
        Some(&EffectValue::Authorization(Authorization::Withheld)),
        "the newer revocation stands"
    );
}

// C-SS-4: two corrective deltas on one key decided concurrently: the
// second decision was computed from a value that changed, so the agent is
// asked again with the new value and both deltas count (no lost update).
#[test]
fn c_ss_4_stale_additive_decision_is_asked_again() {
    let mut r = receiver();
    let cid = agent("custodian");
    let t1 = ticket(&r.receive(at(0.1), &cid, corrective("ob-1", -0.25)));
    let t2 = ticket(&r.receive(at(0.1), &cid, corrective("ob-2", -0.25)));
    let asked = requests(&mut r);
    let d1 = standard(&asked[0]);
    let d2 = standard(&asked[1]);
    assert_eq!(d1, d2, "both computed from the initial weight");
    assert_eq!(r.decide(at(1.0), t1, d1).unwrap(), Received::Applied);
    let t3 = ticket(&r.decide(at(1.1), t2, d2).unwrap());
    assert_ne!(t3, t2);
    let again = requests(&mut r);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].ticket, t3);
    assert_eq!(r.applications(), 1);
    assert_eq!(
        r.decide(at(1.2), t3, standard(&again[0])).unwrap(),
        Received::Applied
    );
    assert_eq!(r.applications(), 2);
    let key = asked[0].key.clone().unwrap();
    let initial = StandardApplier::default().weights.initial;
    assert_eq!(
        r.effects().get(key.as_str()),
        Some(&EffectValue::Weight(
            StandardApplier::default().weights.clip(initial - 0.5)
        ))
    );
}

// C-ND-5: outstanding requests are bounded; beyond the bound an
// obligation is refused `overloaded` and nothing is kept, so the
// custodian's retry is asked once a slot frees.
#[test]
fn outstanding_requests_are_bounded_and_refused_overloaded() {
    let mut cfg = receiver_config();
    cfg.max_outstanding_requests = 2;
    let mut r = Receiver::new(cfg, PolarityRegistry::standard());
    let mut snap = ReceiverSnapshot::default();
    let cid = agent("custodian");
    let t1 = ticket(&r.receive(at(0.1), &cid, revoke("ob-1", "a")));
    let _t2 = ticket(&r.receive(at(0.1), &cid, revoke("ob-2", "b")));
    let third = revoke("ob-3", "c");
    match r.receive(at(0.1), &cid, third.clone()) {
        Received::Rejected(e) => {
            assert_eq!(e.code, ErrorCode::Overloaded);
            assert!(e.message.contains("at most 2"), "{}", e.message);
        }
        other => panic!("expected overloaded, got {other:?}"),
    }
    let asked = requests(&mut r);
    assert_eq!(asked.len(), 2);
    let out = flush(&mut r, &mut snap);
    assert!(
        out.iter()
            .any(|t| matches!(&t.message, Message::Error(e) if e.code == ErrorCode::Overloaded)),
        "the custodian is told"
    );
    assert_eq!(r.ledger_len(), 0, "nothing kept");
    r.decide(at(1.0), t1, standard(&asked[0])).unwrap();
    let t3 = ticket(&r.receive(at(2.0), &cid, third));
    assert_eq!(requests(&mut r)[0].ticket, t3);
}

// C-AB3-3 with a decision outstanding: a crash loses only the request;
// the restored receiver asks again on the custodian's redelivery and
// applies once.
#[test]
fn c_ab3_3_crash_while_waiting_asks_again_and_applies_once() {
    let mut r = receiver();
    let mut snap = ReceiverSnapshot::default();
    let cid = agent("custodian");
    let done = revoke("ob-done", "a");
    let waiting = revoke("ob-wait", "b");
    let t = ticket(&r.receive(at(0.1), &cid, done.clone()));
    let asked = requests(&mut r);
    r.decide(at(0.2), t, standard(&asked[0])).unwrap();
    let _ = flush(&mut r, &mut snap);
    let _ = ticket(&r.receive(at(0.3), &cid, waiting.clone()));
    let _lost = requests(&mut r);
    assert!(r.poll_records().is_none());
    // Crash: only the committed snapshot survives.
    drop(r);
    let mut r2 = Receiver::restore(
        receiver_config(),
        PolarityRegistry::standard(),
        &snap,
        at(5.0),
    );
    assert_eq!(r2.outstanding_requests(), 0);
    assert_eq!(
        r2.receive(at(5.0), &cid, done),
        Received::Duplicate(LedgerOutcome::Applied)
    );
    let t2 = ticket(&r2.receive(at(5.0), &cid, waiting.clone()));
    let again = requests(&mut r2);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].obligation, waiting);
    assert_eq!(
        r2.decide(at(5.5), t2, standard(&again[0])).unwrap(),
        Received::Applied
    );
    assert_eq!(r2.applications(), 1);
    let events: Vec<_> = {
        let _ = flush(&mut r2, &mut snap);
        std::iter::from_fn(|| r2.poll_event()).collect()
    };
    assert!(events.iter().any(|e| matches!(
        e,
        ReceiverEvent::Applied { obligation_id, .. } if obligation_id == waiting.id()
    )));
}

// A request the agent could not answer is abandoned without a trace; the
// redelivery asks again. A completion of a deferred obligation withdraws
// a re-ask still outstanding, so it never applies twice.
#[test]
fn abandoned_and_withdrawn_requests_never_apply() {
    let mut r = receiver();
    let cid = agent("custodian");
    let ob = revoke("ob-1", "s");
    let t = ticket(&r.receive(at(0.1), &cid, ob.clone()));
    assert!(r.abandon_request(t));
    assert!(!r.abandon_request(t));
    assert_eq!(r.outstanding_requests(), 0);
    assert!(
        r.poll_apply_request().is_none(),
        "the queued request went too"
    );
    let t = ticket(&r.receive(at(1.0), &cid, ob.clone()));
    let asked = requests(&mut r);
    r.decide(at(1.1), t, ApplyDecision::Defer { detail: None })
        .unwrap();
    let t_re = ticket(&r.receive(at(2.0), &cid, ob.clone()));
    let re = requests(&mut r);
    assert_eq!(
        r.complete_deferred(at(2.5), &cid, ob.id(), standard(&asked[0]))
            .unwrap(),
        Received::Applied
    );
    assert_eq!(
        r.decide(at(3.0), t_re, standard(&re[0])),
        Err(CompleteError::UnknownTicket(t_re))
    );
    assert_eq!(r.applications(), 1);
}
