//! The shared storage suite: every test runs against `SimStore`,
//! `SledStore` and `RedbStore`, and each disk test restarts (closes and
//! reopens) the database before it checks what survived.
#![allow(missing_docs, clippy::unwrap_used)]

use abhyasa_testkit::store_world as common;
mod sled_reopen;

use std::time::Duration;

use abhyasa_core::custody::{
    AckBinding, ApplyDecision, Custodian, CustodianSnapshot, CustodyProfile, EffectValue,
    LedgerOutcome, LedgerRecord, Received, Receiver, ReceiverSnapshot, Record, TerminalState,
};
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::principal::{PrincipalState, PrincipalWrite};
use abhyasa_core::store::{EventId, Inbox, LogEvent, Store, StoreError, DEFAULT_RETENTION};
use abhyasa_core::{
    AckStatus, CustodyAck, DeclinePolicy, DeclineReason, GovernedKey, Obligation, Sequence,
    Timestamp,
};
use abhyasa_store::FORMAT_VERSION;
use common::*;
use sled_reopen::reopen_sled;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn at(s: u64) -> Timestamp {
    EPOCH.saturating_add(secs(s))
}

/// Drains a custodian's records as if each batch were committed.
fn drain(c: &mut Custodian) -> Vec<Record> {
    let mut out = Vec::new();
    while let Some(b) = c.poll_records() {
        c.handle_committed(b.token());
        out.extend(b.records);
    }
    out
}

fn drain_r(r: &mut Receiver) -> Vec<Record> {
    let mut out = Vec::new();
    while let Some(b) = r.poll_records() {
        r.handle_committed(b.token());
        out.extend(b.records);
    }
    out
}

fn custodian() -> Custodian {
    Custodian::new(custodian_config(), PolarityRegistry::standard())
}

fn opened(ob: &Obligation) -> Record {
    let mut c = custodian();
    c.offer(EPOCH, ob.clone()).unwrap();
    drain(&mut c).remove(0)
}

fn ack(ob: &Obligation, status: AckStatus, at: Timestamp) -> CustodyAck {
    CustodyAck::new(
        ob.id().clone(),
        agent("receiver"),
        status,
        at,
        Some(ob.digest()),
    )
}

/// Records of a transfer that escalated at its deadline.
fn escalated_records(ob: &Obligation) -> Vec<Record> {
    let mut c = custodian();
    c.offer(EPOCH, ob.clone()).unwrap();
    c.handle_timeout(ob.deadline_at());
    drain(&mut c)
}

fn applied_ledger(id: &str, key: &str, seq: u64, n: u64) -> Record {
    let ob = phala(id, -0.3);
    Record::Ledger(Box::new(LedgerRecord {
        custodian: agent("custodian"),
        obligation_id: ob.id().clone(),
        digest: ob.digest(),
        kind: ob.kind().clone(),
        outcome: LedgerOutcome::Applied,
        reason: None,
        detail: None,
        effect: vec![abhyasa_core::custody::EffectWrite {
            key: counter_key(ob.id()),
            value: EffectValue::Json(serde_json::json!(n)),
        }],
        key_sequence: Some((GovernedKey::new(key).unwrap(), Sequence(seq))),
        recorded_at: EPOCH,
        deadline_at: ob.deadline_at(),
        obligation: None,
    }))
}

fn restart(b: &mut Box<dyn Backend>) {
    if b.kind() != Kind::Sim {
        b.restart();
    }
}

fn principal_of(s: &CustodianSnapshot) -> (Vec<String>, Vec<String>, Vec<String>) {
    let mut p = PrincipalState::default();
    for w in &s.principal {
        p.apply_write(w);
    }
    let mut a: Vec<String> = p
        .authorizations()
        .map(|(k, e)| format!("{k}={e:?}"))
        .collect();
    let mut w: Vec<String> = p.weights().map(|(k, v)| format!("{k}={v}")).collect();
    let mut d: Vec<String> = p.decisions().map(|d| format!("{d:?}")).collect();
    a.sort();
    w.sort();
    d.sort();
    (a, w, d)
}

fn assert_custodian_eq(got: &CustodianSnapshot, want: &CustodianSnapshot, label: &str) {
    assert_eq!(got.pending, want.pending, "{label}: pending");
    assert_eq!(got.terminal, want.terminal, "{label}: terminal");
    assert_eq!(got.escalations, want.escalations, "{label}: escalations");
    assert_eq!(
        got.reconciliations, want.reconciliations,
        "{label}: reconciliations"
    );
    assert_eq!(
        principal_of(got),
        principal_of(want),
        "{label}: principal state"
    );
}

fn assert_receiver_eq(got: &ReceiverSnapshot, want: &ReceiverSnapshot, label: &str) {
    assert_eq!(got.ledger, want.ledger, "{label}: ledger");
    assert_eq!(
        got.key_sequences, want.key_sequences,
        "{label}: key sequences"
    );
    assert_eq!(got.effects, want.effects, "{label}: effects");
    assert_eq!(got.intents, want.intents, "{label}: intents");
}

// The store reproduces the core's fold of every record the real state
// machines committed (applied, declined, deferred, external, superseded,
// escalated, late ack), across a restart.
#[test]
fn load_equals_the_fold_of_committed_records() {
    for kind in ALL {
        let mut w = World::new(kind);
        w.applier.decisions.insert(oid("d"), Decision::Decline);
        w.applier
            .decisions
            .insert(oid("f"), Decision::DeferThenApply);
        w.applier.decisions.insert(oid("x"), Decision::External);
        for ob in [
            phala("a", -0.3),
            phala("d", -0.2),
            phala("f", -0.1),
            phala("x", -0.3),
        ] {
            w.offer(ob);
        }
        w.offer(revoke("r5", "mail", 5));
        w.complete_at(at(4), oid("f"));
        w.run(secs(30));
        w.offer(revoke("r3", "mail", 3));
        w.run(secs(30));
        w.partitioned = true;
        let e = phala("e", -0.3);
        w.offer(e.clone());
        w.run(secs(600));
        // C-AB4-4: a late `applied` after escalation is recorded, terminal unchanged.
        let now = w.now;
        let late = ack(&e, AckStatus::Applied, now);
        w.cust
            .as_mut()
            .unwrap()
            .handle_ack(now, &agent("receiver"), &late);
        w.pump();

        let mut want_c = CustodianSnapshot::default();
        for r in &w.committed["custodian"] {
            want_c.apply(r);
        }
        let mut want_r = ReceiverSnapshot::default();
        for r in &w.committed["receiver"] {
            want_r.apply(r);
        }
        assert_eq!(want_c.escalations.len(), 1);
        assert_eq!(want_c.reconciliations.len(), 1);
        assert!(want_c.pending.is_empty());
        restart(&mut w.cstore);
        restart(&mut w.rstore);
        let label = format!("{kind:?}");
        assert_custodian_eq(&w.cstore.load().custodian, &want_c, &label);
        assert_receiver_eq(&w.rstore.load().receiver, &want_r, &label);
        assert_eq!(
            w.cstore.load().custodian.terminal[&oid("e")].state,
            TerminalState::Escalated
        );
    }
}

// Idempotent offers: the same obligation again changes nothing (attempts
// and deadline stand, a terminal one is not reopened).
#[test]
fn reoffer_with_same_digest_is_a_no_op() {
    for kind in ALL {
        let mut b = backend(kind);
        let ob = phala("p", -0.3);
        let open = opened(&ob);
        let _ = b.commit(EPOCH, &[std::slice::from_ref(&open)]).unwrap();
        let attempt = Record::AttemptMade {
            obligation_id: ob.id().clone(),
            attempts: 3,
            next_at: at(9),
        };
        let _ = b.commit(at(5), &[&[attempt]]).unwrap();
        let _ = b.commit(at(6), &[std::slice::from_ref(&open)]).unwrap();
        restart(&mut b);
        let p = &b.load().custodian.pending[ob.id()];
        assert_eq!(
            (p.attempts, p.next_at),
            (3, at(9)),
            "{kind:?}: re-offer reset the transfer"
        );

        let done = phala("t", -0.3);
        let _ = b.commit(EPOCH, &[&escalated_records(&done)]).unwrap();
        let _ = b.commit(at(70), &[&[opened(&done)]]).unwrap();
        restart(&mut b);
        let s = b.load();
        assert!(
            !s.custodian.pending.contains_key(done.id()),
            "{kind:?}: terminal reopened"
        );
        assert_eq!(s.custodian.escalations.len(), 1);
    }
}

fn other_content(id: &str) -> Obligation {
    Obligation::builder()
        .id(id)
        .kind(abhyasa_core::polarity::PHALA_KIND)
        .target("receiver")
        .payload(serde_json::json!({"weight_delta": -0.5, "weight_key": "elsewhere"}))
        .deadline_seconds(DEADLINE_SECONDS)
        .max_retries(MAX_RETRIES)
        .created_at(EPOCH)
        .build()
        .unwrap()
}

// An offer of a held id with another digest is refused with a typed error,
// the whole group commit is refused, and nothing is overwritten.
#[test]
fn conflicting_offer_is_refused_and_nothing_written() {
    for kind in ALL {
        let mut b = backend(kind);
        let x = phala("x", -0.3);
        let _ = b.commit(EPOCH, &[&[opened(&x)]]).unwrap();
        let before = b.load().next_event;
        let y = phala("y", -0.3);
        let x2 = other_content("x");
        let err = b
            .commit(at(1), &[&[opened(&y)], &[opened(&x2)]])
            .unwrap_err();
        match err {
            StoreError::OfferConflict {
                obligation_id,
                existing,
                offered,
            } => {
                assert_eq!(obligation_id, *x.id());
                assert_eq!((existing, offered), (x.digest(), x2.digest()));
            }
            other => panic!("{kind:?}: wrong error {other}"),
        }
        restart(&mut b);
        let s = b.load();
        assert!(
            !s.custodian.pending.contains_key(y.id()),
            "{kind:?}: partial commit"
        );
        assert_eq!(
            s.custodian.pending[x.id()].obligation,
            x,
            "{kind:?}: overwritten"
        );
        assert_eq!(
            s.next_event, before,
            "{kind:?}: events appended by a refused commit"
        );

        // Against a terminal record too, and for best-effort offers.
        let t = phala("t", -0.3);
        let _ = b.commit(EPOCH, &[&escalated_records(&t)]).unwrap();
        let t2 = other_content("t");
        assert!(matches!(
            b.commit(at(2), &[&[opened(&t2)]]),
            Err(StoreError::OfferConflict { .. })
        ));
        let mut c = custodian();
        let grant = Obligation::builder()
            .id("x")
            .kind(abhyasa_core::polarity::ANUMATI_KIND)
            .target("receiver")
            .payload(serde_json::json!({"decision": "grant", "scope": "s"}))
            .deadline_seconds(60)
            .max_retries(20)
            .created_at(EPOCH)
            .build()
            .unwrap();
        c.offer(EPOCH, grant).unwrap();
        let best_effort = drain(&mut c);
        assert!(matches!(best_effort[0], Record::BestEffortSent { .. }));
        assert!(matches!(
            b.commit(at(3), &[&best_effort]),
            Err(StoreError::OfferConflict { .. })
        ));
    }
}

// Custodian atomicity: the first close applies safe(O) and stores the
// escalation; a second close of the same id changes nothing, so no
// fail-safe is applied twice and nothing escalates twice (C-AB4-1).
#[test]
fn terminal_is_final_no_second_failsafe_or_escalation() {
    for kind in ALL {
        let mut b = backend(kind);
        let ob = phala("e", -0.3);
        let recs = escalated_records(&ob);
        let _ = b.commit(EPOCH, &[&recs]).unwrap();
        let Record::CustodyClosed(first) = recs.last().unwrap().clone() else {
            panic!("no close")
        };
        let mut second = first.clone();
        for w in &mut second.principal {
            if let PrincipalWrite::Weight { value, .. } = w {
                *value = 0.4;
            }
        }
        if let Some(e) = second.escalation.as_mut() {
            e.escalated_at = at(99);
        }
        let _ = b
            .commit(at(99), &[&[Record::CustodyClosed(second)]])
            .unwrap();
        restart(&mut b);
        let s = b.load();
        assert_eq!(
            s.custodian.escalations.len(),
            1,
            "{kind:?}: escalated twice"
        );
        assert_eq!(
            s.custodian.escalations[0],
            *first.escalation.clone().unwrap()
        );
        let (_, weights, _) = principal_of(&s.custodian);
        assert_eq!(weights.len(), 1);
        assert!(
            weights[0].ends_with("=0.7"),
            "{kind:?}: second fail-safe applied: {weights:?}"
        );
    }
}

// Decided receiver ledger entries are never overwritten; deferred ones
// may be decided later.
#[test]
fn decided_ledger_entries_are_final() {
    for kind in ALL {
        let mut b = backend(kind);
        let _ = b
            .commit(EPOCH, &[&[applied_ledger("a", "k", 5, 1)]])
            .unwrap();
        let Record::Ledger(mut again) = applied_ledger("a", "k", 9, 2) else {
            unreachable!()
        };
        again.outcome = LedgerOutcome::Declined;
        let _ = b
            .commit(at(1), &[&[Record::Ledger(again.clone())]])
            .unwrap();
        again.outcome = LedgerOutcome::Applied;
        let _ = b.commit(at(2), &[&[Record::Ledger(again)]]).unwrap();
        restart(&mut b);
        let s = b.load();
        let l = &s.receiver.ledger[&(agent("custodian"), oid("a"))];
        assert_eq!(l.outcome, LedgerOutcome::Applied);
        assert_eq!(
            s.receiver.effects[&counter_key(&oid("a"))],
            EffectValue::Json(serde_json::json!(1))
        );
        assert_eq!(
            s.receiver.key_sequences[&GovernedKey::new("k").unwrap()],
            (Sequence(5), oid("a"))
        );

        let Record::Ledger(mut d) = applied_ledger("d", "k2", 1, 1) else {
            unreachable!()
        };
        d.outcome = LedgerOutcome::Deferred;
        d.effect.clear();
        d.key_sequence = None;
        let _ = b.commit(at(3), &[&[Record::Ledger(d)]]).unwrap();
        let _ = b
            .commit(at(4), &[&[applied_ledger("d", "k2", 1, 1)]])
            .unwrap();
        restart(&mut b);
        assert_eq!(
            b.load().receiver.ledger[&(agent("custodian"), oid("d"))].outcome,
            LedgerOutcome::Applied
        );
    }
}

// AB-3 / C-AB3-3: effect, ledger entry and key sequence are one commit —
// all present after a restart, or (commit refused) none.
#[test]
fn receiver_effect_ledger_and_sequence_commit_together_c_ab3_3() {
    for kind in ALL {
        let mut b = backend(kind);
        let x = phala("x", -0.3);
        let _ = b.commit(EPOCH, &[&[opened(&x)]]).unwrap();
        let refused = b.commit(
            at(1),
            &[
                &[applied_ledger("z", "kz", 1, 1)],
                &[opened(&other_content("x"))],
            ],
        );
        assert!(refused.is_err());
        let _ = b
            .commit(at(2), &[&[applied_ledger("a", "ka", 3, 1)]])
            .unwrap();
        restart(&mut b);
        let s = b.load();
        assert!(
            !s.receiver
                .ledger
                .contains_key(&(agent("custodian"), oid("z"))),
            "{kind:?}"
        );
        assert!(
            !s.receiver.effects.contains_key(&counter_key(&oid("z"))),
            "{kind:?}"
        );
        assert!(
            !s.receiver
                .key_sequences
                .contains_key(&GovernedKey::new("kz").unwrap()),
            "{kind:?}"
        );
        assert!(s
            .receiver
            .ledger
            .contains_key(&(agent("custodian"), oid("a"))));
        assert!(s.receiver.effects.contains_key(&counter_key(&oid("a"))));
        assert!(s
            .receiver
            .key_sequences
            .contains_key(&GovernedKey::new("ka").unwrap()));
        // After restart the receiver re-acks a redelivery without reapplying.
        let mut r = Receiver::restore(
            receiver_config(),
            PolarityRegistry::standard(),
            &s.receiver,
            at(3),
        );
        let mut applier = ScriptApplier::default();
        let got = r.handle_obligation(at(3), &agent("custodian"), phala("a", -0.3), &mut applier);
        assert_eq!(got, Received::Duplicate(LedgerOutcome::Applied), "{kind:?}");
    }
}

// Group commit: one call carries several batches of both machines; one
// event per record, contiguous ids, all durable together.
#[test]
fn group_commit_of_custodian_and_receiver_batches() {
    for kind in ALL {
        let mut b = backend(kind);
        let obs: Vec<Obligation> = (0..50).map(|i| phala(&format!("g{i}"), -0.3)).collect();
        let opens: Vec<Record> = obs.iter().map(opened).collect();
        let ledgers: Vec<Record> = (0..50)
            .map(|i| applied_ledger(&format!("g{i}"), &format!("k{i}"), 1, 1))
            .collect();
        let c = b
            .commit(EPOCH, &[&opens[..25], &ledgers, &opens[25..]])
            .unwrap();
        assert_eq!(c.records, 100);
        assert_eq!((c.first_event, c.end_event), (EventId(0), EventId(100)));
        restart(&mut b);
        let s = b.load();
        assert_eq!(s.custodian.pending.len(), 50, "{kind:?}");
        assert_eq!(s.receiver.ledger.len(), 50, "{kind:?}");
        assert_eq!(s.next_event, EventId(100));
        for ob in &obs {
            assert_eq!(
                &s.custodian.pending[ob.id()].obligation,
                ob,
                "{kind:?}: obligation round trip"
            );
        }
    }
}

// The event log is append-only, readable by range, and its ids are never
// reused after compaction.
#[test]
fn event_log_is_append_only_with_monotonic_ids() {
    for kind in ALL {
        let mut b = backend(kind);
        let ob = phala("a", -0.3);
        let _ = b.commit(EPOCH, &[&[opened(&ob)]]).unwrap();
        let attempt = Record::AttemptMade {
            obligation_id: ob.id().clone(),
            attempts: 2,
            next_at: at(3),
        };
        let _ = b.commit(at(1), &[&[attempt.clone(), attempt]]).unwrap();
        let all = b.store().events(EventId(0), 100).unwrap();
        assert_eq!(
            all.iter().map(|e| e.id.0).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert!(matches!(all[0].event, LogEvent::CustodyOpened { .. }));
        assert_eq!(all[2].at, at(1));
        assert_eq!(b.store().events(EventId(1), 1).unwrap()[0].id, EventId(1));
        let far = at(1)
            .saturating_add(DEFAULT_RETENTION)
            .saturating_add(secs(1));
        let removed = b.store().compact(far, DEFAULT_RETENTION).unwrap();
        assert_eq!(removed.events, 3, "{kind:?}");
        let c = b
            .commit(
                far,
                &[&[Record::DeferralSeen {
                    obligation_id: ob.id().clone(),
                }]],
            )
            .unwrap();
        assert_eq!(c.first_event, EventId(3), "{kind:?}: id reused");
        restart(&mut b);
        let left = b.store().events(EventId(0), 100).unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].id, EventId(3));
    }
}

// Inbox counters are derived at read time from the stored records.
#[test]
fn inbox_counters_are_derived_from_stored_records() {
    for kind in ALL {
        let mut b = backend(kind);
        let mut cfg = custodian_config();
        cfg.ack_binding = AckBinding::RequireDigest;
        cfg.default_profile = CustodyProfile {
            backoff: backoff(),
            decline_policy: DeclinePolicy::Surface,
        };
        let mut c = Custodian::new(cfg, PolarityRegistry::standard());
        let (p1, p2, d, e) = (
            phala("p1", -0.1),
            phala("p2", -0.1),
            phala("d", -0.1),
            phala("e", -0.1),
        );
        for ob in [&p1, &p2, &d, &e] {
            c.offer(EPOCH, ob.clone()).unwrap();
        }
        let from = agent("receiver");
        c.handle_ack(at(1), &from, &ack(&p2, AckStatus::Deferred, at(1)));
        let mut decline = ack(&d, AckStatus::Declined, at(1));
        decline.reason = Some(DeclineReason::Policy);
        c.handle_ack(at(1), &from, &decline);
        c.handle_error(
            at(1),
            &from,
            &abhyasa_core::wire::ProtocolError {
                code: abhyasa_core::wire::ErrorCode::InvalidObligation,
                obligation_id: Some(e.id().clone()),
                digest: Some(e.digest()),
                message: "no".into(),
            },
        );
        c.handle_ack(at(2), &from, &ack(&e, AckStatus::Applied, at(2)));
        let _ = b.commit(at(2), &[&drain(&mut c)]).unwrap();

        let mut r = Receiver::new(receiver_config(), PolarityRegistry::standard());
        let mut applier = ScriptApplier::default();
        applier
            .decisions
            .insert(oid("rd"), Decision::DeferThenApply);
        applier.decisions.insert(oid("rx"), Decision::External);
        let _ = r.handle_obligation(at(2), &agent("custodian"), phala("rd", -0.1), &mut applier);
        let _ = r.handle_obligation(at(2), &agent("custodian"), phala("rx", -0.1), &mut applier);
        let _ = b.commit(at(2), &[&drain_r(&mut r)]).unwrap();
        // The receiver restarts with the external effect in doubt.
        let s = b.load();
        let mut r = Receiver::restore(
            receiver_config(),
            PolarityRegistry::standard(),
            &s.receiver,
            at(3),
        );
        let _ = b.commit(at(3), &[&drain_r(&mut r)]).unwrap();
        restart(&mut b);

        let early = b.store().inbox(at(10)).unwrap();
        assert_eq!(
            early,
            Inbox {
                pending: 2,
                decision_required: 1,
                escalated: 1,
                deferred_overdue: 0,
                late_applied: 1,
                outcome_unknown: 1,
            },
            "{kind:?}"
        );
        // Past the deadline: the receiver's deferral and the custodian's
        // deferred transfer are overdue.
        let late = b.store().inbox(at(61)).unwrap();
        assert_eq!(late.deferred_overdue, 2, "{kind:?}");
        // C-ND-5: the indexed counters equal the fold of the records.
        assert_indexes_match(b.store(), at(10), &format!("{kind:?}"));
        assert_indexes_match(b.store(), at(61), &format!("{kind:?}"));
        assert_eq!(b.load().decisions()[0].obligation_id, oid("d"));
    }
}

// Retention: terminal and decided ledger entries live until `retention`
// past their deadline; inside the window a redelivery is re-acked from
// the ledger, after it the receiver declines it `expired` (C-DL-1) and
// never applies it again.
#[test]
fn compaction_keeps_the_retention_window_then_receiver_declines_expired() {
    for kind in ALL {
        let mut w = World::new(kind);
        let ob = phala("a", -0.3);
        w.offer(ob.clone());
        w.run(secs(30));
        let deadline = ob.deadline_at();
        let inside = deadline.saturating_add(DEFAULT_RETENTION);
        let c = w.cstore.store().compact(inside, DEFAULT_RETENTION).unwrap();
        let r = w.rstore.store().compact(inside, DEFAULT_RETENTION).unwrap();
        assert_eq!(
            (c.terminal, r.ledger),
            (0, 0),
            "{kind:?}: compacted inside the window"
        );
        let rs = w.rstore.load();
        let mut recv = Receiver::restore(
            receiver_config(),
            PolarityRegistry::standard(),
            &rs.receiver,
            inside,
        );
        let mut applier = ScriptApplier::default();
        let got = recv.handle_obligation(inside, &agent("custodian"), ob.clone(), &mut applier);
        assert_eq!(got, Received::Duplicate(LedgerOutcome::Applied));

        let past = inside.saturating_add(secs(1));
        let c = w.cstore.store().compact(past, DEFAULT_RETENTION).unwrap();
        let r = w.rstore.store().compact(past, DEFAULT_RETENTION).unwrap();
        assert_eq!((c.terminal, r.ledger), (1, 1), "{kind:?}");
        restart(&mut w.cstore);
        restart(&mut w.rstore);
        assert!(w.cstore.load().custodian.terminal.is_empty());
        let rs = w.rstore.load();
        assert!(rs.receiver.ledger.is_empty());
        // Effect state and key sequences are never compacted.
        assert!(rs.receiver.effects.contains_key(&counter_key(ob.id())));
        let mut recv = Receiver::restore(
            receiver_config(),
            PolarityRegistry::standard(),
            &rs.receiver,
            past,
        );
        let got = recv.handle_obligation(past, &agent("custodian"), ob.clone(), &mut applier);
        assert_eq!(got, Received::Declined(DeclineReason::Expired), "{kind:?}");
        let decided = recv.complete_deferred(
            past,
            &agent("custodian"),
            ob.id(),
            ApplyDecision::Apply(vec![]),
        );
        assert!(decided.is_err());
    }
}

// Disk stores record the format version and refuse a newer one with a
// typed error instead of misreading it.
#[test]
fn newer_format_version_is_refused() {
    for kind in DISK {
        let dir = tempfile::tempdir().unwrap();
        let path = disk_path(kind, dir.path());
        {
            let s = open_disk(kind, &path).unwrap();
            assert_eq!(s.format_version(), FORMAT_VERSION);
        }
        let newer = (FORMAT_VERSION + 1).to_be_bytes();
        match kind {
            Kind::Log => log_inject(&path, "meta", b"format_version", Some(&newer)),
            Kind::Fjall => fjall_inject(&path, "meta", b"format_version", Some(&newer)),
            Kind::Sled => {
                let db = reopen_sled(&path);
                db.open_tree("meta")
                    .unwrap()
                    .insert("format_version", &newer)
                    .unwrap();
                db.flush().unwrap();
            }
            _ => {
                let db = redb::Database::create(&path).unwrap();
                let tx = db.begin_write().unwrap();
                {
                    let def: redb::TableDefinition<&[u8], &[u8]> =
                        redb::TableDefinition::new("meta");
                    let mut t = tx.open_table(def).unwrap();
                    t.insert(&b"format_version"[..], &newer[..]).unwrap();
                }
                tx.commit().unwrap();
            }
        }
        match open_disk(kind, &path) {
            Err(StoreError::NewerFormat { found, supported }) => {
                assert_eq!((found, supported), (FORMAT_VERSION + 1, FORMAT_VERSION));
            }
            other => panic!(
                "{kind:?}: expected NewerFormat, got {:?}",
                other.map(|_| ())
            ),
        }
    }
}

// Damaged rows are typed errors naming the table, never a panic.
#[test]
fn corrupt_rows_are_typed_errors() {
    for kind in DISK {
        let dir = tempfile::tempdir().unwrap();
        let path = disk_path(kind, dir.path());
        {
            let mut s = open_disk(kind, &path).unwrap();
            let _ = s.commit(EPOCH, &[&[opened(&phala("a", -0.3))]]).unwrap();
        }
        match kind {
            Kind::Log => log_inject(&path, "custody_pending", b"a", Some(&[0xff, 0xff, 0x01])),
            Kind::Fjall => fjall_inject(&path, "custody_pending", b"a", Some(&[0xff, 0xff, 0x01])),
            Kind::Sled => {
                let db = reopen_sled(&path);
                db.open_tree("custody_pending")
                    .unwrap()
                    .insert("a", &[0xff, 0xff, 0x01][..])
                    .unwrap();
                db.flush().unwrap();
            }
            _ => {
                let db = redb::Database::create(&path).unwrap();
                let tx = db.begin_write().unwrap();
                {
                    let def: redb::TableDefinition<&[u8], &[u8]> =
                        redb::TableDefinition::new("custody_pending");
                    tx.open_table(def)
                        .unwrap()
                        .insert(&b"a"[..], &[0xff, 0xff, 0x01][..])
                        .unwrap();
                }
                tx.commit().unwrap();
            }
        }
        let s = open_disk(kind, &path).unwrap();
        match s.load() {
            Err(StoreError::Corrupt { table, key, .. }) => {
                assert_eq!((table, key.as_str()), ("custody_pending", "a"))
            }
            other => panic!("{kind:?}: expected Corrupt, got {:?}", other.map(|_| ())),
        }
    }
}

// Unknown backend names in the node config are a typed error.
#[test]
fn store_kind_parses_config_values() {
    use abhyasa_store::StoreKind;
    assert_eq!("sled".parse::<StoreKind>().unwrap(), StoreKind::Sled);
    assert_eq!("redb".parse::<StoreKind>().unwrap(), StoreKind::Redb);
    assert_eq!("log".parse::<StoreKind>().unwrap(), StoreKind::Log);
    assert_eq!("fjall".parse::<StoreKind>().unwrap(), StoreKind::Fjall);
    assert!("rocksdb".parse::<StoreKind>().is_err());
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(StoreKind::default(), StoreKind::Log, "the default store");
    let mut s = StoreKind::default()
        .open(dir.path().join("n.log"), &Default::default())
        .unwrap();
    assert_eq!(s.backend(), "log");
    let _ = s.commit(EPOCH, &[&[opened(&phala("a", -0.3))]]).unwrap();
    assert_eq!(s.load().unwrap().custodian.pending.len(), 1);
}

/// An unsequenced Anumati grant of `scope` (best-effort: terminal at once,
/// so compaction can drop its record).
fn unsequenced_grant(id: &str, scope: &str, created_at: Timestamp) -> Obligation {
    Obligation::builder()
        .id(id)
        .kind("anumati.consent")
        .target("receiver")
        .payload(serde_json::json!({"decision": "grant", "scope": scope}))
        .deadline_seconds(60)
        .max_retries(8)
        .created_at(created_at)
        .build()
        .unwrap()
}

// C-OR-1: the sequences a node assigns on a governed key are durable: the
// counter row commits with each offer, survives a restart and the
// compaction of every terminal record, and the next offer continues it.
#[test]
fn c_or_1_issued_sequences_survive_restart_and_compaction() {
    for kind in ALL {
        let mut b = backend(kind);
        let mut c = custodian();
        let mut sent = Vec::new();
        for (i, scope) in ["s", "s", "t", "s"].iter().enumerate() {
            c.offer(EPOCH, unsequenced_grant(&format!("g{i}"), scope, EPOCH))
                .unwrap();
            let _durable = b.commit(EPOCH, &[&drain(&mut c)]).unwrap();
            while let Some(t) = c.poll_transmit() {
                if let abhyasa_core::wire::Message::Obligation(o) = t.message {
                    sent.push((o.id().to_string(), o.sequence().map(|s| s.0)));
                }
            }
        }
        let want: Vec<(String, Option<u64>)> = [("g0", 1), ("g1", 2), ("g2", 1), ("g3", 3)]
            .iter()
            .map(|(i, s)| (i.to_string(), Some(*s)))
            .collect();
        assert_eq!(sent, want, "{kind:?}: per-key monotonic from 1");
        let past = EPOCH
            .saturating_add(secs(60))
            .saturating_add(DEFAULT_RETENTION);
        let compacted = b
            .store()
            .compact(past.saturating_add(secs(1)), DEFAULT_RETENTION);
        assert_eq!(
            compacted.unwrap().terminal,
            4,
            "{kind:?}: every record compacted"
        );
        restart(&mut b);
        let state = b.load();
        assert!(state.custodian.terminal.is_empty(), "{kind:?}");
        let mut c = Custodian::restore(
            custodian_config(),
            PolarityRegistry::standard(),
            &state.custodian,
        );
        c.offer(past, unsequenced_grant("g4", "s", past)).unwrap();
        let _ = drain(&mut c);
        let next = std::iter::from_fn(|| c.poll_transmit()).find_map(|t| match t.message {
            abhyasa_core::wire::Message::Obligation(o) => o.sequence(),
            _ => None,
        });
        assert_eq!(next, Some(Sequence(4)), "{kind:?}: continues after restart");
        // An OAuth revocation sets no principal decision at offer: only the
        // counter row orders its key across a restart.
        let oauth = |id: &str| {
            Obligation::builder()
                .id(id)
                .kind("oauth.token")
                .target("receiver")
                .payload(serde_json::json!({"action": "revoke", "token_id": "t"}))
                .deadline_seconds(60)
                .max_retries(12)
                .created_at(past)
                .build()
                .unwrap()
        };
        c.offer(past, oauth("o1")).unwrap();
        let _durable = b.commit(past, &[&drain(&mut c)]).unwrap();
        restart(&mut b);
        let state = b.load();
        let mut c = Custodian::restore(
            custodian_config(),
            PolarityRegistry::standard(),
            &state.custodian,
        );
        c.offer(past, oauth("o2")).unwrap();
        let _ = drain(&mut c);
        let next = std::iter::from_fn(|| c.poll_transmit()).find_map(|t| match t.message {
            abhyasa_core::wire::Message::Obligation(o) if o.id().as_str() == "o2" => o.sequence(),
            _ => None,
        });
        assert_eq!(
            next,
            Some(Sequence(2)),
            "{kind:?}: the counter row survived"
        );
    }
}
