//! Custodian conformance: AB-1, AB-2, AB-4, declines, ack binding.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use abhyasa_core::custody::{
    AckDisposition, Custodian, CustodianEvent, CustodianSnapshot, CustodyProfile,
    DeclineDisposition, IgnoredAck, Offered, Record, StandardApplier, TerminalState,
};
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::principal::{Authorization, PrincipalWrite};
use abhyasa_core::wire::Message;
use abhyasa_core::{
    AckStatus, CustodyAck, DeclinePolicy, DeclineReason, Digest, EscalationCause,
    EscalationTrigger, GovernedKey, GuardOutcome, OfferError, RetryBackoff, Sequence, Timestamp,
};
use common::*;
use serde_json::json;

fn key(s: &str) -> GovernedKey {
    GovernedKey::new(format!("anumati.consent/receiver/scope:{s}")).unwrap()
}

// C-AB1-1: clean link: applied on attempt 1, custody discharged, nothing pending.
#[test]
fn c_ab1_1_clean_link_applies_on_first_attempt() {
    let mut d = Duo::new();
    let ob = revoke("ob-1", "email.read");
    assert!(matches!(
        d.c.offer(T0, ob.clone()),
        Ok(Offered::Custody { .. })
    ));
    let acks = d.exchange(at(0.05));
    assert_eq!(acks, vec![AckDisposition::Applied]);
    assert_eq!(d.c.pending_len(), 0);
    assert_eq!(d.c.poll_timeout(), None);
    assert_eq!(d.c.terminal(ob.id()).unwrap().state, TerminalState::Applied);
    let ev = d.custodian_events();
    assert!(ev
        .iter()
        .any(|e| matches!(e, CustodianEvent::Applied { attempts: 1, .. })));
    assert_eq!(d.c.stats().attempts_sent, 1);
}

// C-AB1-2: the obligation is durable before the first transmit.
#[test]
fn c_ab1_2_no_transmit_before_its_record_is_committed() {
    let mut d = Duo::new();
    d.c.offer(T0, revoke("ob-1", "s")).unwrap();
    // Nothing is released while the CustodyOpened record is uncommitted.
    assert!(d.c.poll_transmit().is_none());
    assert!(d.c.poll_event().is_none());
    let batch = d.c.poll_records().expect("a record to commit");
    assert!(matches!(batch.records[0], Record::CustodyOpened { .. }));
    assert!(
        d.c.poll_transmit().is_none(),
        "polling records is not committing them"
    );
    d.c.handle_committed(batch.token());
    assert!(matches!(
        d.c.poll_transmit().map(|t| t.message),
        Some(Message::Obligation(_))
    ));

    // A retry is counted durably before it is released too.
    d.c.handle_timeout(at(1.0));
    assert!(d.c.poll_transmit().is_none());
    let batch = d.c.poll_records().unwrap();
    assert!(matches!(
        batch.records[0],
        Record::AttemptMade { attempts: 2, .. }
    ));
    d.c.handle_committed(batch.token());
    assert!(d.c.poll_transmit().is_some());
}

// C-AB2-1: drops then delivery: applied on the attempt that got through.
#[test]
fn c_ab2_1_drops_then_delivery() {
    let mut d = Duo::new();
    d.c.offer(T0, revoke("ob-1", "s")).unwrap();
    assert_eq!(d.custodian_out().len(), 1); // attempt 1 lost
    for _ in 0..2 {
        let now = d.c.poll_timeout().unwrap();
        d.c.handle_timeout(now);
        assert_eq!(d.custodian_out().len(), 1); // attempts 2, 3 lost
    }
    let now = d.c.poll_timeout().unwrap();
    d.c.handle_timeout(now);
    assert_eq!(d.exchange(now), vec![AckDisposition::Applied]);
    let ev = d.custodian_events();
    assert!(
        ev.iter()
            .any(|e| matches!(e, CustodianEvent::Applied { attempts: 4, .. })),
        "{ev:?}"
    );
}

fn schedule(seed: u64, jitter: f64) -> Vec<Timestamp> {
    let mut cc = custodian_config();
    cc.seed = seed;
    cc.default_profile.backoff = RetryBackoff {
        base: Duration::from_secs(1),
        cap: Duration::from_secs(10),
        jitter,
    };
    let mut d = Duo::with(cc, Box::new(StandardApplier::default()));
    d.c.offer(
        T0,
        obligation("ob-1", "phala.belief_update", json!({"weight_delta": -0.5})),
    )
    .unwrap();
    let _ = d.custodian_out();
    let mut times = Vec::new();
    while let Some(t) = d.c.poll_timeout() {
        if d.c.pending_len() == 0 {
            break;
        }
        d.c.handle_timeout(t);
        if !d.custodian_out().is_empty() {
            times.push(t);
        }
    }
    times
}

// C-AB2-2: backoff doubles from base, is capped, carries bounded jitter;
// same seed, same schedule.
#[test]
fn c_ab2_2_backoff_doubles_caps_and_jitters_reproducibly() {
    let plain = schedule(7, 0.0);
    let gaps: Vec<f64> = std::iter::once(T0)
        .chain(plain.iter().copied())
        .collect::<Vec<_>>()
        .windows(2)
        .map(|w| w[1].saturating_duration_since(w[0]).as_secs_f64())
        .collect();
    assert_eq!(&gaps[..6], &[1.0, 2.0, 4.0, 8.0, 10.0, 10.0]);
    assert!(gaps.iter().all(|g| *g <= 10.0));

    let a = schedule(7, 0.2);
    let b = schedule(7, 0.2);
    let c = schedule(8, 0.2);
    assert_eq!(a, b, "same seed, same schedule");
    assert_ne!(a, c, "another seed jitters differently");
    let jittered: Vec<f64> = std::iter::once(T0)
        .chain(a.iter().copied())
        .collect::<Vec<_>>()
        .windows(2)
        .map(|w| w[1].saturating_duration_since(w[0]).as_secs_f64())
        .collect();
    for (k, g) in jittered.iter().enumerate() {
        let nominal = gaps.get(k).copied().unwrap_or(10.0).min(10.0);
        assert!(
            *g >= nominal - 1e-6 && *g <= nominal * 1.2 + 1e-6,
            "gap {k}: {g} vs {nominal}"
        );
    }
    assert!(
        jittered
            .iter()
            .zip(&gaps)
            .any(|(j, g)| (j - g).abs() > 1e-3),
        "jitter is not zero"
    );
}

// max_retries counts retries: at most 1 + max_retries attempts.
#[test]
fn max_retries_bounds_total_attempts() {
    let mut cc = custodian_config();
    cc.default_profile.backoff = RetryBackoff {
        base: Duration::from_secs(1),
        cap: Duration::from_secs(1),
        jitter: 0.0,
    };
    let mut d = Duo::with(cc, Box::new(StandardApplier::default()));
    let ob = builder("ob-1", "anumati.consent", json!({"scope": "s"}))
        .deadline_seconds(10)
        .max_retries(10)
        .build()
        .unwrap();
    d.c.offer(T0, ob.clone()).unwrap();
    let sent = d.run_dead_until(at(100.0));
    // The schedule spans the deadline exactly: attempts at t = 0, 1, ..., 9
    // (the first and nine retries); the deadline at t = 10 ends custody
    // before a further retry. Exact counts, so one attempt too few (a
    // schedule that stops early) fails as surely as one too many.
    assert_eq!(sent, 10, "obligation transmits");
    let ev = d.custodian_events();
    let esc = ev
        .iter()
        .find_map(|e| match e {
            CustodianEvent::Escalated(x) => Some(x.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(esc.attempts, 10);
    assert_eq!(esc.trigger, EscalationTrigger::Deadline);

    // With the smallest coherent bound (max_retries = deadline at a 1 s
    // cap) the deadline still binds: attempts at t = 0..99, never more
    // than 1 + max_retries.
    let mut cc = custodian_config();
    cc.default_profile.backoff = RetryBackoff {
        base: Duration::from_secs(1),
        cap: Duration::from_secs(1),
        jitter: 0.0,
    };
    let mut d = Duo::with(cc, Box::new(StandardApplier::default()));
    let ob = builder("ob-2", "anumati.consent", json!({"scope": "s"}))
        .deadline_seconds(100)
        .max_retries(100)
        .build()
        .unwrap();
    d.c.offer(T0, ob).unwrap();
    assert_eq!(d.run_dead_until(at(1000.0)), 100);
    let esc = d
        .custodian_events()
        .into_iter()
        .find_map(|e| match e {
            CustodianEvent::Escalated(x) => Some(x),
            _ => None,
        })
        .unwrap();
    assert_eq!(esc.attempts, 100);
    assert_eq!(esc.trigger, EscalationTrigger::Deadline);
}

#[test]
fn c_ac_4_incoherent_retry_bound_is_refused_and_the_deadline_binds() {
    // An incoherent obligation cannot be offered (AB-2 sizing rule) ...
    let mut d = Duo::new();
    let ob = builder("ob-1", "anumati.consent", json!({"scope": "s"}))
        .deadline_seconds(86_400)
        .max_retries(6)
        .build()
        .unwrap();
    match d.c.offer(T0, ob) {
        Err(OfferError::IncoherentProfile(e)) => {
            let msg = e.to_string();
            assert!(msg.contains("max_retries >= 1356"), "{msg}");
        }
        other => panic!("expected incoherent profile, got {other:?}"),
    }
    // ... and a coherent one with spare retries hits the deadline first.
    let ob = builder("ob-2", "anumati.consent", json!({"scope": "s"}))
        .deadline_seconds(100)
        .max_retries(8)
        .build()
        .unwrap();
    d.c.offer(T0, ob).unwrap();
    let sent = d.run_dead_until(at(10_000.0));
    assert_eq!(sent, 7); // t = 0, 1, 3, 7, 15, 31, 63; the next (127) is past the deadline
    let esc = d
        .custodian_events()
        .into_iter()
        .find_map(|e| match e {
            CustodianEvent::Escalated(x) => Some(x),
            _ => None,
        })
        .unwrap();
    assert_eq!(esc.escalated_at, at(100.0));
}

// C-AB4-1: total loss: escalated at the deadline, safe(O) applied, exactly one
// escalation record with attempts and cause.
#[test]
fn c_ab4_1_total_loss_escalates_at_deadline_with_fail_safe() {
    let mut d = Duo::new();
    let ob = corrective("ob-1", -0.3);
    d.c.offer(T0, ob.clone()).unwrap();
    let mut records = Vec::new();
    let mut sent = 0;
    while let Some(t) = d.c.poll_timeout() {
        d.c.handle_timeout(t);
        if let Some(b) = d.c.poll_records() {
            records.extend(b.records.clone());
            d.c.handle_committed(b.token());
        }
        sent += std::iter::from_fn(|| d.c.poll_transmit()).count();
    }
    let escalations: Vec<_> = records
        .iter()
        .filter_map(|r| match r {
            Record::CustodyClosed(c) => c.escalation.clone(),
            _ => None,
        })
        .collect();
    assert_eq!(escalations.len(), 1);
    let e = &escalations[0];
    assert_eq!(e.escalated_at, ob.deadline_at());
    assert_eq!(e.cause, EscalationCause::Unreachable);
    assert_eq!(e.trigger, EscalationTrigger::Deadline);
    assert_eq!(e.attempts as usize, sent);
    assert_eq!(e.attempts, 15); // t = 0,1,3,...,63,127,...,575
    assert_eq!(e.guard, GuardOutcome::Applied);
    let wkey = GovernedKey::new("phala.belief_update/receiver/weight:routing.receiver.preference")
        .unwrap();
    assert!((d.c.principal().weight(&wkey) - 0.7).abs() < 1e-12);
    assert_eq!(
        d.c.terminal(ob.id()).unwrap().state,
        TerminalState::Escalated
    );
    assert_eq!(d.c.stats().escalated, 1);
}

// C-AB4-2: persistent deferred: escalated at the deadline with cause
// "responsive but deferring"; deferral did not reset backoff or extend the
// deadline.
#[test]
fn c_ab4_2_persistent_deferral_escalates_with_its_cause() {
    let defer = |_: &abhyasa_core::custody::ApplyContext<'_>, _: &abhyasa_core::Obligation| {
        abhyasa_core::custody::ApplyDecision::Defer {
            detail: Some("busy".into()),
        }
    };
    let mut d = Duo::with(custodian_config(), Box::new(defer));
    let ob = revoke("ob-1", "s");
    d.c.offer(T0, ob.clone()).unwrap();
    let mut attempt_times = vec![T0];
    assert_eq!(d.exchange(T0), vec![AckDisposition::Deferred]);
    while let Some(t) = d.c.poll_timeout() {
        d.c.handle_timeout(t);
        let acks = d.exchange(t);
        if !acks.is_empty() {
            attempt_times.push(t);
        }
    }
    // The schedule is exactly the undisturbed one: 0, 1, 3, 7, ... 575.
    let expected: Vec<Timestamp> = [
        0, 1, 3, 7, 15, 31, 63, 127, 191, 255, 319, 383, 447, 511, 575,
    ]
    .iter()
    .map(|s| at(*s as f64))
    .collect();
    assert_eq!(attempt_times, expected);
    let e = d
        .custodian_events()
        .into_iter()
        .find_map(|e| match e {
            CustodianEvent::Escalated(x) => Some(x),
            _ => None,
        })
        .unwrap();
    assert_eq!(e.cause, EscalationCause::ResponsiveButDeferring);
    assert_eq!(e.escalated_at, ob.deadline_at());
    assert!(!d.c.principal().is_authorized(&key("s")));
}

// C-AB4-4: a late applied after escalation is recorded for reconciliation;
// the terminal state is unchanged.
#[test]
fn c_ab4_4_late_applied_is_reconciled_not_reopened() {
    let mut d = Duo::new();
    let ob = revoke("ob-1", "s");
    d.c.offer(T0, ob.clone()).unwrap();
    let first = d.custodian_out();
    d.run_dead_until(at(1000.0));
    assert_eq!(
        d.c.terminal(ob.id()).unwrap().state,
        TerminalState::Escalated
    );
    // The first attempt was in fact applied, its ack delayed.
    d.deliver_to_receiver(at(0.1), &first[0]);
    let acks = d.receiver_out();
    let disp = d.deliver_to_custodian(at(700.0), &acks[0]);
    assert_eq!(disp, vec![AckDisposition::Late]);
    // Recorded once, durable.
    let b = d.c.poll_records().unwrap();
    assert!(matches!(&b.records[0], Record::LateAck(r) if r.status == AckStatus::Applied));
    d.c.handle_committed(b.token());
    assert_eq!(
        d.deliver_to_custodian(at(701.0), &acks[0]),
        vec![AckDisposition::Duplicate]
    );
    assert_eq!(
        d.c.terminal(ob.id()).unwrap().state,
        TerminalState::Escalated
    );
    assert_eq!(d.c.stats().late_acks, 1);
}

// C-DC-1: declined discharges custody with no retry and no escalation.
// C-DC-2: the default policy applies safe(O) on decline.
#[test]
fn c_dc_1_and_2_decline_discharges_and_applies_safe_by_default() {
    let decline = |_: &abhyasa_core::custody::ApplyContext<'_>, _: &abhyasa_core::Obligation| {
        abhyasa_core::custody::ApplyDecision::Decline {
            reason: DeclineReason::Policy,
            detail: Some("not mine to revoke".into()),
        }
    };
    let mut d = Duo::with(custodian_config(), Box::new(decline));
    let ob = corrective("ob-1", -0.25);
    d.c.offer(T0, ob.clone()).unwrap();
    assert_eq!(d.exchange(T0), vec![AckDisposition::Declined]);
    assert_eq!(d.c.pending_len(), 0);
    assert_eq!(d.c.poll_timeout(), None, "no retry after a decline");
    let ev = d.custodian_events();
    assert!(!ev.iter().any(|e| matches!(e, CustodianEvent::Escalated(_))));
    assert!(ev.iter().any(|e| matches!(
        e,
        CustodianEvent::Declined {
            reason: Some(DeclineReason::Policy),
            disposition: DeclineDisposition::SafeApplied {
                guard: GuardOutcome::Applied
            },
            ..
        }
    )));
    let wkey = GovernedKey::new("phala.belief_update/receiver/weight:routing.receiver.preference")
        .unwrap();
    assert!((d.c.principal().weight(&wkey) - 0.75).abs() < 1e-12);
    assert_eq!(d.c.stats().escalated, 0);
}

// C-DC-2: the "surface" policy records a decision-required item with the
// receiver's reason instead of applying safe(O).
#[test]
fn c_dc_2_surface_policy_raises_a_decision() {
    let decline = |_: &abhyasa_core::custody::ApplyContext<'_>, _: &abhyasa_core::Obligation| {
        abhyasa_core::custody::ApplyDecision::Decline {
            reason: DeclineReason::Policy,
            detail: Some("legal hold".into()),
        }
    };
    let mut cc = custodian_config();
    cc.profiles.insert(
        abhyasa_core::Kind::new("oauth.token").unwrap(),
        CustodyProfile {
            backoff: plain_backoff(),
            decline_policy: DeclinePolicy::Surface,
        },
    );
    let mut d = Duo::with(cc, Box::new(decline));
    let ob = obligation(
        "ob-1",
        "oauth.token",
        json!({"action": "revoke", "token_id": "t-9"}),
    );
    d.c.offer(T0, ob.clone()).unwrap();
    assert_eq!(d.exchange(T0), vec![AckDisposition::Declined]);
    let tkey = GovernedKey::new("oauth.token/receiver/token:t-9").unwrap();
    assert!(
        d.c.principal().is_authorized(&tkey),
        "no fail-safe under surface"
    );
    let item =
        d.c.principal()
            .decision(ob.id())
            .expect("decision item")
            .clone();
    assert_eq!(item.reason, DeclineReason::Policy);
    assert_eq!(item.detail.as_deref(), Some("legal hold"));
    assert!(d
        .custodian_events()
        .iter()
        .any(|e| matches!(e, CustodianEvent::DecisionRequired(i) if i.obligation_id == *ob.id())));
    // The principal resolves it: apply the fail-safe.
    let g =
        d.c.resolve_decision(
            at(5.0),
            ob.id(),
            abhyasa_core::principal::Resolution::ApplySafe,
        )
        .unwrap();
    assert_eq!(g, Some(GuardOutcome::Applied));
    assert!(!d.c.principal().is_authorized(&tkey));
    assert!(d.c.principal().decision(ob.id()).is_none());
}

// C-TR-2 (core): forged, misrouted or stale acks never discharge custody.
#[test]
fn c_tr_2_unbound_acks_are_counted_and_ignored() {
    let mut d = Duo::new();
    // Sequenced, so the digest the test binds is the one sent (an
    // unsequenced offer is sent with the next sequence on its key).
    let ob = revoke_seq("ob-1", "s", 1);
    d.c.offer(T0, ob.clone()).unwrap();
    let _ = d.custodian_out();
    let good = CustodyAck::new(
        ob.id().clone(),
        agent("receiver"),
        AckStatus::Applied,
        at(1.0),
        Some(ob.digest()),
    );
    let rid = agent("receiver");
    let mallory = agent("mallory");

    let wrong_digest = CustodyAck {
        digest: Some(Digest([7; 32])),
        ..good.clone()
    };
    assert_eq!(
        d.c.handle_ack(at(1.0), &rid, &wrong_digest),
        AckDisposition::Ignored(IgnoredAck::WrongDigest)
    );
    let no_digest = CustodyAck {
        digest: None,
        ..good.clone()
    };
    assert_eq!(
        d.c.handle_ack(at(1.0), &rid, &no_digest),
        AckDisposition::Ignored(IgnoredAck::MissingDigest)
    );
    // Sent by another agent, naming the right receiver.
    assert_eq!(
        d.c.handle_ack(at(1.0), &mallory, &good),
        AckDisposition::Ignored(IgnoredAck::WrongReceiver)
    );
    // Sent by the right peer, naming another receiver.
    let misrouted = CustodyAck {
        target: mallory.clone(),
        ..good.clone()
    };
    assert_eq!(
        d.c.handle_ack(at(1.0), &rid, &misrouted),
        AckDisposition::Ignored(IgnoredAck::WrongReceiver)
    );
    let unknown = CustodyAck {
        obligation_id: abhyasa_core::ObligationId::new("nope").unwrap(),
        ..good.clone()
    };
    assert_eq!(
        d.c.handle_ack(at(1.0), &rid, &unknown),
        AckDisposition::Ignored(IgnoredAck::Unknown)
    );
    let bad_reason = CustodyAck {
        reason: Some(DeclineReason::Policy),
        ..good.clone()
    };
    assert_eq!(
        d.c.handle_ack(at(1.0), &rid, &bad_reason),
        AckDisposition::Ignored(IgnoredAck::Invalid)
    );
    assert!(d.c.is_pending(ob.id()), "no unbound ack discharged custody");
    let s = d.c.stats();
    assert_eq!(
        (
            s.acks_wrong_digest,
            s.acks_missing_digest,
            s.acks_wrong_receiver,
            s.acks_unknown,
            s.acks_invalid
        ),
        (1, 1, 2, 1, 1)
    );
    // The bound ack does.
    assert_eq!(
        d.c.handle_ack(at(1.0), &rid, &good),
        AckDisposition::Applied
    );
    // A stale ack for a reused-then-finished id with another digest is ignored.
    assert_eq!(
        d.c.handle_ack(at(2.0), &rid, &wrong_digest),
        AckDisposition::Ignored(IgnoredAck::WrongDigest)
    );
}

#[test]
fn v1_peers_without_digests_bind_when_allowed() {
    let mut cc = custodian_config();
    cc.ack_binding = abhyasa_core::custody::AckBinding::AllowMissingDigest;
    let mut d = Duo::with(cc, Box::new(StandardApplier::default()));
    let ob = revoke("ob-1", "s");
    d.c.offer(T0, ob.clone()).unwrap();
    let rid = agent("receiver");
    let v1 = CustodyAck::new(
        ob.id().clone(),
        rid.clone(),
        AckStatus::Applied,
        at(1.0),
        None,
    );
    let wrong = CustodyAck {
        digest: Some(Digest([1; 32])),
        ..v1.clone()
    };
    assert_eq!(
        d.c.handle_ack(at(1.0), &rid, &wrong),
        AckDisposition::Ignored(IgnoredAck::WrongDigest)
    );
    assert_eq!(d.c.handle_ack(at(1.0), &rid, &v1), AckDisposition::Applied);
}

#[test]
fn anumati_revocation_withholds_at_offer() {
    let mut d = Duo::new();
    d.c.offer(T0, revoke_seq("ob-1", "calendar", 3)).unwrap();
    assert!(!d.c.principal().is_authorized(&key("calendar")));
    // The withhold commits in the same record as the opening.
    let b = d.c.poll_records().unwrap();
    match &b.records[0] {
        // The withhold, and the key's issued-sequence counter (C-OR-1).
        Record::CustodyOpened { principal, .. } => {
            assert_eq!(principal.len(), 2);
            assert!(matches!(
                &principal[1],
                PrincipalWrite::Issued {
                    sequence: Sequence(3),
                    ..
                }
            ));
        }
        other => panic!("{other:?}"),
    }
    d.c.handle_committed(b.token());
    // At escalation the same obligation's fail-safe is already in effect.
    d.run_dead_until(at(1000.0));
    let e = d
        .custodian_events()
        .into_iter()
        .find_map(|e| match e {
            CustodianEvent::Escalated(x) => Some(x),
            _ => None,
        })
        .unwrap();
    assert_eq!(e.guard, GuardOutcome::AlreadyInEffect);
}

#[test]
fn offers_are_idempotent_by_digest_and_never_overwrite() {
    let mut d = Duo::new();
    let ob = revoke("ob-1", "s");
    d.c.offer(T0, ob.clone()).unwrap();
    assert_eq!(d.c.offer(T0, ob.clone()), Ok(Offered::AlreadyPending));
    let other = revoke("ob-1", "other-scope");
    assert!(matches!(
        d.c.offer(T0, other.clone()),
        Err(OfferError::IdConflict { .. })
    ));
    d.exchange(at(0.1));
    assert_eq!(
        d.c.offer(T0, ob),
        Ok(Offered::AlreadyTerminal(TerminalState::Applied))
    );
    assert!(matches!(
        d.c.offer(T0, other),
        Err(OfferError::IdConflict { .. })
    ));
}

#[test]
fn offer_errors_leave_no_trace() {
    let mut cc = custodian_config();
    cc.max_pending = 1;
    let mut d = Duo::with(cc, Box::new(StandardApplier::default()));
    d.c.offer(T0, revoke("ob-1", "a")).unwrap();
    let _ = d.custodian_out();
    // Backpressure: clear error, nothing half-accepted (no withhold, no record).
    let e = d.c.offer(T0, revoke("ob-2", "b")).unwrap_err();
    assert!(matches!(
        e,
        OfferError::Backpressure {
            pending: 1,
            limit: 1
        }
    ));
    assert!(e.to_string().contains("backpressure"));
    assert!(d.c.principal().is_authorized(&key("b")));
    assert!(d.c.poll_records().is_none());
    // Expired before offer.
    assert!(matches!(
        d.c.offer(at(600.0), revoke("ob-3", "c")),
        Err(OfferError::Expired { .. })
    ));
    // Invalid payload for its kind.
    let bad = obligation("ob-4", "phala.belief_update", json!({}));
    match d.c.offer(T0, bad) {
        Err(OfferError::Invalid(f)) => assert_eq!(f.field, "payload.weight_delta"),
        other => panic!("{other:?}"),
    }
    assert!(d.c.poll_records().is_none());
}

// C-AC-1 at the custodian: best-effort is one attempt, no custody, no escalation.
#[test]
fn best_effort_is_one_attempt_without_custody() {
    let mut d = Duo::new();
    let ob = obligation("ob-1", "phala.belief_update", json!({"weight_delta": 0.2}));
    assert_eq!(d.c.offer(T0, ob.clone()), Ok(Offered::BestEffort));
    assert_eq!(d.custodian_out().len(), 1);
    assert_eq!(d.c.pending_len(), 0);
    assert_eq!(d.c.poll_timeout(), None);
    assert_eq!(d.run_dead_until(at(10_000.0)), 0);
    assert_eq!(d.c.stats().escalated, 0);
    let unknown = obligation("ob-2", "acme.custom", json!({"x": 1}));
    assert_eq!(d.c.offer(T0, unknown), Ok(Offered::BestEffort));
}

// C-AB2-3 (core): a restart resumes the remaining window: same absolute
// deadline, same attempt count.
#[test]
fn c_ab2_3_restore_resumes_remaining_window() {
    let mut d = Duo::new();
    let ob = revoke("ob-1", "s");
    d.c.offer(T0, ob.clone()).unwrap();
    let mut snap = CustodianSnapshot::default();
    let commit = |c: &mut Custodian, snap: &mut CustodianSnapshot| {
        if let Some(b) = c.poll_records() {
            b.records.iter().for_each(|r| snap.apply(r));
            c.handle_committed(b.token());
        }
        while c.poll_transmit().is_some() {}
    };
    commit(&mut d.c, &mut snap);
    for _ in 0..5 {
        let t = d.c.poll_timeout().unwrap();
        d.c.handle_timeout(t);
        commit(&mut d.c, &mut snap);
    }
    assert_eq!(d.c.attempts(ob.id()), Some(6));
    // Crash at t = 40 s; restart from the durable state.
    let mut c2 = Custodian::restore(custodian_config(), PolarityRegistry::standard(), &snap);
    assert_eq!(c2.attempts(ob.id()), Some(6));
    assert!(
        !c2.principal().is_authorized(&key("s")),
        "withhold survives"
    );
    assert_eq!(
        c2.poll_timeout(),
        Some(at(63.0)),
        "next attempt as scheduled, not a fresh window"
    );
    let mut sent = 0;
    while let Some(t) = c2.poll_timeout() {
        c2.handle_timeout(t);
        if let Some(b) = c2.poll_records() {
            c2.handle_committed(b.token());
        }
        sent += std::iter::from_fn(|| c2.poll_transmit()).count();
    }
    assert_eq!(6 + sent, 15, "the same 15 attempts as without the crash");
    let e = std::iter::from_fn(|| c2.poll_event())
        .find_map(|e| match e {
            CustodianEvent::Escalated(x) => Some(x),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        e.escalated_at,
        ob.deadline_at(),
        "deadline absolute, not restarted"
    );
    assert_eq!(e.attempts, 15);
}

// C-SD-4 (core): custody a store repair could not prove is escalated at
// the first timeout after the restart, cause `store_damaged`, with its
// fail-safe applied through a committed close: never resumed, never absent.
#[test]
fn c_sd_4_custody_a_repair_could_not_prove_escalates_store_damaged() {
    let mut d = Duo::new();
    let ob = corrective("ob-1", -0.5);
    let kept = corrective("ob-2", -0.25);
    d.c.offer(T0, ob.clone()).unwrap();
    d.c.offer(T0, kept.clone()).unwrap();
    let b = d.c.poll_records().unwrap();
    let mut snap = CustodianSnapshot::default();
    b.records.iter().for_each(|r| snap.apply(r));
    snap.damaged.insert(ob.id().clone());
    // A damaged id that is not pending (already closed) changes nothing.
    snap.damaged
        .insert(abhyasa_core::ObligationId::new("ob-gone").unwrap());
    let mut c2 = Custodian::restore(custodian_config(), PolarityRegistry::standard(), &snap);
    let now = at(2.0);
    assert!(c2.poll_timeout().unwrap() <= now, "due at once");
    c2.handle_timeout(now);
    let b = c2.poll_records().expect("the close is committed first");
    let closes: Vec<_> = b
        .records
        .iter()
        .filter_map(|r| match r {
            Record::CustodyClosed(c) => Some(c.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(closes.len(), 1, "only the damaged one closes");
    let e = closes[0].escalation.clone().unwrap();
    assert_eq!(e.obligation_id, *ob.id());
    assert_eq!(e.cause, EscalationCause::StoreDamaged);
    assert_eq!(e.trigger, EscalationTrigger::StoreRepair);
    assert_eq!(e.cause.to_string(), "store_damaged");
    assert_eq!(e.guard, GuardOutcome::Applied);
    assert!(!closes[0].principal.is_empty(), "the fail-safe is written");
    c2.handle_committed(b.token());
    assert_eq!(
        c2.terminal(ob.id()).unwrap().state,
        TerminalState::Escalated
    );
    assert_eq!(c2.stats().escalated, 1);
    let wkey = GovernedKey::new("phala.belief_update/receiver/weight:routing.receiver.preference")
        .unwrap();
    assert!((c2.principal().weight(&wkey) - 0.5).abs() < 1e-12);
    assert!(c2.is_pending(kept.id()), "the proven one resumes");
}

// C-AB4-3 (core): recovery into a still-dead link escalates with the fail-safe.
#[test]
fn c_ab4_3_recovery_into_dead_link_escalates() {
    let mut d = Duo::new();
    let ob = corrective("ob-1", -0.5);
    d.c.offer(T0, ob.clone()).unwrap();
    let b = d.c.poll_records().unwrap();
    let mut snap = CustodianSnapshot::default();
    b.records.iter().for_each(|r| snap.apply(r));
    // Down for longer than the deadline; restart after it.
    let mut c2 = Custodian::restore(custodian_config(), PolarityRegistry::standard(), &snap);
    c2.handle_timeout(at(5000.0));
    let b = c2.poll_records().unwrap();
    c2.handle_committed(b.token());
    assert_eq!(
        c2.terminal(ob.id()).unwrap().state,
        TerminalState::Escalated
    );
    assert!(
        std::iter::from_fn(|| c2.poll_transmit()).next().is_none(),
        "no attempt after the deadline"
    );
    let wkey = GovernedKey::new("phala.belief_update/receiver/weight:routing.receiver.preference")
        .unwrap();
    assert!((c2.principal().weight(&wkey) - 0.5).abs() < 1e-12);
}

#[test]
fn principal_decision_is_durable_and_guarded() {
    let mut d = Duo::new();
    let k = key("s");
    assert_eq!(
        d.c.decide(
            T0,
            &k,
            Authorization::Withheld,
            Some(abhyasa_core::Sequence(5))
        ),
        GuardOutcome::Applied
    );
    assert!(matches!(
        d.c.poll_records().unwrap().records[0],
        Record::Principal { .. }
    ));
    assert_eq!(
        d.c.decide(
            T0,
            &k,
            Authorization::Granted,
            Some(abhyasa_core::Sequence(4))
        ),
        GuardOutcome::Superseded {
            newest: abhyasa_core::Sequence(5)
        }
    );
    assert!(!d.c.principal().is_authorized(&k));
    assert_eq!(
        d.c.decide(T0, &k, Authorization::Granted, None),
        GuardOutcome::Applied
    );
    assert!(d.c.principal().is_authorized(&k));
}

#[test]
fn conflict_escalates_at_once_with_that_cause() {
    // C-AB3-4 (custodian side): the receiver holds another obligation under
    // the same id; custody is not discharged, it escalates with cause conflict.
    let mut d = Duo::new();
    let first = revoke("dup-id", "a");
    let cid = d.cid.clone();
    // The receiver already applied a different obligation under this id.
    let mut applier = StandardApplier::default();
    d.r.handle_obligation(T0, &cid, first, &mut applier);
    let _ = d.receiver_out();
    let second = revoke("dup-id", "b");
    d.c.offer(T0, second.clone()).unwrap();
    assert_eq!(d.exchange(at(0.1)), vec![AckDisposition::Escalated]);
    let e = d
        .custodian_events()
        .into_iter()
        .find_map(|e| match e {
            CustodianEvent::Escalated(x) => Some(x),
            _ => None,
        })
        .unwrap();
    assert_eq!(e.cause, EscalationCause::Conflict);
    assert_eq!(e.trigger, EscalationTrigger::ProtocolError);
    assert_eq!(
        d.c.terminal(second.id()).unwrap().state,
        TerminalState::Escalated
    );
    let _ = Timestamp::EPOCH;
}

// The fold is the records' meaning: replays never reopen or rewrite a
// finished transfer (the stores keep the same rule).
#[test]
fn snapshot_fold_never_reopens_or_rewrites_terminal_transfers() {
    let mut d = Duo::new();
    let ob = revoke("ob-1", "s");
    d.c.offer(T0, ob.clone()).unwrap();
    let mut all: Vec<Record> = Vec::new();
    loop {
        if let Some(b) = d.c.poll_records() {
            all.extend(b.records.clone());
            d.c.handle_committed(b.token());
        }
        while d.c.poll_transmit().is_some() {}
        match d.c.poll_timeout() {
            Some(t) => d.c.handle_timeout(t),
            None => break,
        }
    }
    let mut snap = CustodianSnapshot::default();
    all.iter().for_each(|r| snap.apply(r));
    assert_eq!(snap.escalations.len(), 1);
    // Replay everything: nothing changes.
    all.iter().for_each(|r| snap.apply(r));
    assert_eq!(snap.escalations.len(), 1);
    assert!(
        snap.pending.is_empty(),
        "a replayed open does not reopen it"
    );
    assert_eq!(snap.terminal[ob.id()].state, TerminalState::Escalated);
}
