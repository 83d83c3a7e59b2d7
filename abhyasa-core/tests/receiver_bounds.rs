//! C-ND-5 at the receiver: what a peer can make it hold is bounded. A
//! future `created_at` or an absurd deadline is declined and nothing is
//! kept; beyond the per-custodian ledger quota a new obligation gets an
//! `overloaded` error frame and nothing is kept, while the custodian keeps
//! custody and retries; compaction frees quota.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use abhyasa_core::custody::{Received, Receiver, ReceiverEvent, StandardApplier, Transmit};
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::wire::{ErrorCode, Message};
use abhyasa_core::{AckStatus, DeclineReason, Obligation};
use common::*;
use serde_json::json;

fn revoke_at(id: &str, created_secs: f64, deadline: i64) -> Obligation {
    builder(
        id,
        "anumati.consent",
        json!({"decision": "revoke", "scope": id}),
    )
    .created_at(at(created_secs))
    .deadline_seconds(deadline)
    .build()
    .unwrap()
}

fn one_ack(out: &[Transmit]) -> abhyasa_core::CustodyAck {
    match out {
        [Transmit {
            message: Message::Acks(a),
            ..
        }] if a.len() == 1 => a[0].clone(),
        other => panic!("expected one ack, got {other:?}"),
    }
}

fn drain(r: &mut Receiver) -> (usize, Vec<Transmit>) {
    let mut records = 0;
    while let Some(b) = r.poll_records() {
        records += b.records.len();
        r.handle_committed(b.token());
    }
    (records, std::iter::from_fn(|| r.poll_transmit()).collect())
}

// C-ND-5: created_at further ahead than the configured skew is declined
// `policy` with the reason in the text, and nothing is kept; within the
// skew it is applied.
#[test]
fn c_nd_5_future_created_at_is_declined_and_nothing_kept() {
    let mut cfg = receiver_config();
    cfg.max_created_at_skew = Duration::from_secs(60);
    let mut r = Receiver::new(cfg, PolarityRegistry::standard());
    let mut applier = StandardApplier::default();
    let cid = agent("custodian");
    let now = at(0.0);

    let far = revoke_at("far", 3600.0, 600);
    assert_eq!(
        r.handle_obligation(now, &cid, far.clone(), &mut applier),
        Received::Declined(DeclineReason::Policy)
    );
    let (records, out) = drain(&mut r);
    assert_eq!(records, 0, "a bound decline commits nothing");
    assert_eq!(r.ledger_len(), 0, "and holds nothing");
    let ack = one_ack(&out);
    assert_eq!(ack.status, AckStatus::Declined);
    assert_eq!(ack.reason, Some(DeclineReason::Policy));
    assert_eq!(ack.digest, Some(far.digest()));
    let text = ack.detail.unwrap_or_default();
    assert!(
        text.contains("created_at") && text.contains("ahead"),
        "{text}"
    );
    assert!(matches!(
        r.poll_event(),
        Some(ReceiverEvent::Declined {
            reason: DeclineReason::Policy,
            ..
        })
    ));
    // A redelivery gets the same answer (the check is stateless).
    assert_eq!(
        r.handle_obligation(now, &cid, far, &mut applier),
        Received::Declined(DeclineReason::Policy)
    );
    assert_eq!(r.ledger_len(), 0);

    let near = revoke_at("near", 30.0, 600);
    assert_eq!(
        r.handle_obligation(now, &cid, near, &mut applier),
        Received::Applied
    );
    assert_eq!(r.ledger_len(), 1);
}

// C-ND-5: a deadline beyond the configured maximum is declined `policy`,
// reason in the text, nothing kept; at the maximum it is applied.
#[test]
fn c_nd_5_absurd_deadline_is_declined_and_nothing_kept() {
    let mut cfg = receiver_config();
    cfg.max_deadline = Duration::from_secs(86_400);
    let mut r = Receiver::new(cfg, PolarityRegistry::standard());
    let mut applier = StandardApplier::default();
    let cid = agent("custodian");
    let absurd = revoke_at("absurd", 0.0, 10 * 365 * 86_400);
    assert_eq!(
        r.handle_obligation(at(1.0), &cid, absurd, &mut applier),
        Received::Declined(DeclineReason::Policy)
    );
    let (records, out) = drain(&mut r);
    assert_eq!((records, r.ledger_len()), (0, 0));
    let text = one_ack(&out).detail.unwrap_or_default();
    assert!(text.contains("exceeds") && text.contains("86400"), "{text}");

    let ok = revoke_at("ok", 0.0, 86_400);
    assert_eq!(
        r.handle_obligation(at(1.0), &cid, ok, &mut applier),
        Received::Applied
    );
}

// C-ND-5: beyond the per-custodian ledger quota a new obligation gets an
// `overloaded` error frame and nothing is kept; redeliveries of held
// entries still answer; another custodian has its own quota; the
// custodian keeps custody, retries on its schedule, and is applied once
// compaction has freed the quota.
#[test]
fn c_nd_5_ledger_quota_refuses_new_entries_and_the_custodian_retries() {
    let mut d = Duo::new();
    let mut cfg = receiver_config();
    cfg.ledger_quota = 3;
    d.r = Receiver::new(cfg, PolarityRegistry::standard());
    // Three obligations with a 10 s deadline fill the quota.
    for i in 0..3 {
        let ob = revoke_at(&format!("q{i}"), 0.0, 10);
        d.c.offer(at(0.0), ob).unwrap();
    }
    d.exchange(at(0.1));
    assert_eq!(d.r.ledger_held(&d.cid), 3);
    assert_eq!(d.c.pending_len(), 0);

    // The fourth is refused with a typed error, nothing kept.
    let fourth = revoke_at("q3", 0.0, 600);
    d.c.offer(at(1.0), fourth.clone()).unwrap();
    let out = d.custodian_out();
    assert_eq!(out.len(), 1);
    match d.deliver_to_receiver(at(1.0), &out[0]) {
        Received::Rejected(e) => {
            assert_eq!(e.code, ErrorCode::Overloaded);
            assert!(e.message.contains("quota"), "{}", e.message);
        }
        other => panic!("expected a quota refusal, got {other:?}"),
    }
    let (records, back) = drain(&mut d.r);
    assert_eq!(records, 0, "nothing kept beyond the quota");
    assert_eq!(d.r.ledger_held(&d.cid), 3);
    let err = match &back[..] {
        [Transmit {
            message: Message::Error(e),
            to,
        }] if *to == d.cid => e.clone(),
        other => panic!("expected one error frame, got {other:?}"),
    };
    assert_eq!(err.obligation_id.as_ref(), Some(fourth.id()));
    // Bound to the obligation as sent (with the sequence the custodian
    // assigned on its key).
    let sent = match &out[0].message {
        Message::Obligation(o) => o.digest(),
        other => panic!("{other:?}"),
    };
    assert_eq!(err.digest, Some(sent));
    // The custodian keeps custody: still pending, nothing escalated.
    d.c.handle_error(at(1.0), &d.rid, &err);
    assert!(d.c.is_pending(fourth.id()));

    // A redelivery of a held entry is still answered (no quota charge).
    let cid = d.cid.clone();
    assert!(matches!(
        d.r.handle_obligation(
            at(1.5),
            &cid,
            // As sent: the first on its key, sequence 1 (C-OR-1).
            revoke_at("q0", 0.0, 10).with_sequence(Some(abhyasa_core::Sequence(1))),
            d.applier.as_mut()
        ),
        Received::Duplicate(_)
    ));
    let _ = drain(&mut d.r);
    // Another custodian has a quota of its own.
    let other = agent("other");
    assert_eq!(
        d.r.handle_obligation(
            at(1.5),
            &other,
            revoke_at("o0", 0.0, 600),
            d.applier.as_mut()
        ),
        Received::Applied
    );
    let _ = drain(&mut d.r);

    // Compaction past the first three's deadline frees the quota; the
    // custodian's next scheduled retry is applied.
    assert_eq!(d.r.compact(at(20.0)), 3);
    assert_eq!(d.r.ledger_held(&d.cid), 0);
    let mut applied = false;
    while let Some(t) = d.c.poll_timeout() {
        if t > at(300.0) {
            break;
        }
        d.c.handle_timeout(t);
        if t >= at(20.0) {
            d.exchange(t);
        } else {
            let _ = d.custodian_out();
        }
        if !d.c.is_pending(fourth.id()) {
            applied = true;
            break;
        }
    }
    assert!(applied, "the retry after compaction discharged custody");
    assert_eq!(d.r.ledger_held(&d.cid), 1);
}
