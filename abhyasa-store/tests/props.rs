//! C-T-5 for the stores: arbitrary admissible obligations offered through
//! the real `Custodian` and received by the real `Receiver` (deferring, so
//! the ledger keeps the obligation) are committed to `SimStore`, redb and
//! sled; after a restart (close and reopen for the disk stores) `load()`
//! gives every one back with the same digest and the same canonical
//! payload. An obligation the store could not hold must be refused at
//! offer, never committed and then unreadable.
//!
//! Bounded for `cargo test` (each disk case opens two databases twice);
//! `PROPTEST_CASES` raises every count for a heavier local run.
#![allow(missing_docs, clippy::unwrap_used)]

use abhyasa_testkit::store_world as common;

use std::collections::HashMap;

use abhyasa_core::custody::{
    ApplyContext, ApplyDecision, Custodian, Receiver, ReceiverConfig, Record,
};
use abhyasa_core::polarity::{PolarityRegistry, ANUMATI_KIND, OAUTH_KIND, PHALA_KIND};
use abhyasa_core::store::DurableState;
use abhyasa_core::{AgentId, Obligation, ObligationId};
use abhyasa_testkit::props::*;
use common::{backend, custodian_config, Kind, ALL};
use proptest::prelude::*;
use serde_json::Value;

/// The custodian's agent (`custodian_config`).
fn custodian_agent() -> AgentId {
    AgentId::new("custodian").unwrap()
}

/// An obligation spec its kind's polarity rule admits under custody: the
/// arbitrary payload keeps its fields, plus the ones the rule reads, and
/// `max_retries` spans the deadline under the test backoff (1 s, cap 8 s;
/// AB-2 sizing rule) so the offer is not refused as incoherent. Ids stay
/// valid and short enough for the governed key (`kind/target/name`, at
/// most 256 bytes); the core properties cover the refusals.
fn admissible_spec() -> impl Strategy<Value = Spec> {
    let short = || id_string().prop_filter("fits the governed key", |s| s.len() <= 96);
    (
        spec(),
        (id_string(), short(), short()),
        0..3usize,
        finite_f64().prop_filter("corrective", |x| *x != 0.0),
        (1u64..=700_000, 0i64..1000),
    )
        .prop_map(|(mut s, (id, target, name), k, delta, (deadline, spare))| {
            s.id = id;
            s.target = target;
            if !created_at_in_range(s.created_at) {
                s.created_at = common::EPOCH;
            }
            let least = abhyasa_core::min_retries_to_span(deadline, 1.0, 8.0) as i64;
            s.deadline_seconds = deadline as i64;
            s.max_retries = (least + spare).min(i64::from(abhyasa_core::MAX_RETRIES_LIMIT));
            let p = &mut s.payload;
            match k {
                0 => {
                    s.kind = PHALA_KIND.into();
                    p.insert("weight_delta".into(), Value::from(-delta.abs()));
                    p.insert("weight_key".into(), Value::from(name));
                }
                1 => {
                    s.kind = ANUMATI_KIND.into();
                    p.insert("decision".into(), Value::from("revoke"));
                    p.insert("scope".into(), Value::from(name));
                }
                _ => {
                    s.kind = OAUTH_KIND.into();
                    p.insert("action".into(), Value::from("revoke"));
                    p.insert("token_id".into(), Value::from(name));
                }
            }
            s
        })
}

/// Offers and delivers every buildable obligation of `specs`; returns the
/// accepted ones and the records to commit, batch by batch. Refusals
/// (builder, offer or receiver) are typed errors and leave no record.
fn records_for(specs: Vec<Spec>) -> (Vec<Obligation>, Vec<Vec<Record>>) {
    let mut custodian = Custodian::new(custodian_config(), PolarityRegistry::standard());
    let mut receivers: HashMap<AgentId, Receiver> = HashMap::new();
    let mut defer = |_: &ApplyContext<'_>, _: &Obligation| ApplyDecision::Defer { detail: None };
    let mut accepted = Vec::new();
    let mut batches = Vec::new();
    for s in distinct_by_id(specs) {
        let Ok(ob) = s.build() else { continue };
        let now = ob.created_at();
        if custodian.offer(now, ob.clone()).is_err() {
            continue;
        }
        // An obligation offered without a sequence is held and sent with
        // the next one on its key (C-OR-1): the store must give back that
        // obligation, as the custodian recorded it.
        let mut ob = ob;
        while let Some(b) = custodian.poll_records() {
            custodian.handle_committed(b.token());
            for r in &b.records {
                if let Record::CustodyOpened { pending, .. } = r {
                    if pending.obligation.id() == ob.id() {
                        ob = pending.obligation.clone();
                    }
                }
            }
            batches.push(b.records);
        }
        let receiver = receivers.entry(ob.target().clone()).or_insert_with(|| {
            Receiver::new(
                ReceiverConfig::new(ob.target().clone()),
                PolarityRegistry::standard(),
            )
        });
        let _ = receiver.handle_obligation(now, &custodian_agent(), ob.clone(), &mut defer);
        while let Some(b) = receiver.poll_records() {
            receiver.handle_committed(b.token());
            batches.push(b.records);
        }
        accepted.push(ob);
    }
    (accepted, batches)
}

/// Every accepted obligation is back, exactly, in the custodian's pending
/// set and (if the receiver kept it) in the ledger.
fn check_loaded(
    kind: Kind,
    accepted: &[Obligation],
    state: &DurableState,
) -> Result<(), TestCaseError> {
    for ob in accepted {
        let pending = state.custodian.pending.get(ob.id()).ok_or_else(|| {
            TestCaseError::fail(format!("{kind:?}: {:?} not pending after reload", ob.id()))
        })?;
        same(kind, "pending", &pending.obligation, ob)?;
        let key = (custodian_agent(), ob.id().clone());
        if let Some(l) = state.receiver.ledger.get(&key) {
            if let Some(held) = &l.obligation {
                same(kind, "ledger", held, ob)?;
            }
            prop_assert_eq!(l.digest, ob.digest());
        }
    }
    prop_assert_eq!(state.custodian.pending.len(), accepted.len());
    Ok(())
}

fn same(kind: Kind, table: &str, got: &Obligation, want: &Obligation) -> Result<(), TestCaseError> {
    prop_assert_eq!(
        got.digest(),
        want.digest(),
        "{:?} {}: digest of {:?} changed",
        kind,
        table,
        want.id()
    );
    prop_assert_eq!(
        got.payload().canonical_json(),
        want.payload().canonical_json(),
        "{:?} {}",
        kind,
        table
    );
    prop_assert_eq!(got, want, "{:?} {}", kind, table);
    Ok(())
}

/// Commits the batches to a fresh store of `kind`, restarts it and checks
/// what `load()` gives back.
fn round_trip(
    kind: Kind,
    accepted: &[Obligation],
    batches: &[Vec<Record>],
) -> Result<(), TestCaseError> {
    let mut b = backend(kind);
    let now = accepted
        .iter()
        .map(Obligation::created_at)
        .max()
        .unwrap_or_default();
    for batch in batches {
        let _receipt = b.commit(now, &[batch.as_slice()]).map_err(|e| {
            TestCaseError::fail(format!(
                "{kind:?} refused to commit an offered obligation: {e}"
            ))
        })?;
    }
    if kind != Kind::Sim {
        b.restart();
    }
    let state = b
        .store()
        .load()
        .map_err(|e| TestCaseError::fail(format!("{kind:?} load failed: {e}")))?;
    check_loaded(kind, accepted, &state)
}

proptest! {
    #![proptest_config(config(128))]

    // C-T-5: SimStore (the same records the disk stores get; cheap, so
    // many cases).
    #[test]
    fn c_t_5_sim_store_round_trips_arbitrary_obligations(
        specs in prop::collection::vec(admissible_spec(), 1..8),
    ) {
        let (accepted, batches) = records_for(specs);
        round_trip(Kind::Sim, &accepted, &batches)?;
    }
}

proptest! {
    #![proptest_config(config(12))]

    // C-T-5: redb and sled, each opened twice per case (commit, close,
    // reopen, load), with a batch of obligations per case to keep the
    // fsync count low.
    #[test]
    fn c_t_5_disk_stores_round_trip_arbitrary_obligations(
        specs in prop::collection::vec(admissible_spec(), 4..24),
    ) {
        let (accepted, batches) = records_for(specs);
        for kind in ALL {
            if kind != Kind::Sim {
                round_trip(kind, &accepted, &batches)?;
            }
        }
    }
}

// The store properties are not vacuous: most admissible specs are taken
// under custody (so most cases commit something).
#[test]
fn c_t_5_most_admissible_specs_reach_the_store() {
    use proptest::strategy::ValueTree as _;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = prop::collection::vec(admissible_spec(), 50);
    let specs = strategy.new_tree(&mut runner).unwrap().current();
    let (accepted, batches) = records_for(specs);
    assert!(
        accepted.len() > 35,
        "only {} of 50 accepted",
        accepted.len()
    );
    let ids: Vec<&ObligationId> = accepted.iter().map(Obligation::id).collect();
    assert!(!batches.is_empty() && !ids.is_empty());
}

// C-T-6 / C-T-5: a late `applied` ack (after escalation) is kept as a
// reconciliation item with the receiver's `acked_at`. A peer controls that
// time (protobuf carries raw microseconds), so an instant RFC 3339 cannot
// write must be refused when the ack is decoded; accepted, it made the
// reconciliation row unreadable and the store refuse to load.
#[test]
fn c_t_6_late_ack_with_any_acked_at_never_bricks_a_store() {
    use abhyasa_core::wire::{Envelope, Message};
    use abhyasa_core::{AckStatus, CustodyAck};
    let ob = common::phala("late", -0.5);
    for micros in [
        i64::MAX,
        i64::MIN,
        RFC3339_MAX_MICROS + 1,
        RFC3339_MIN_MICROS - 1,
        0,
    ] {
        let ack = CustodyAck::new(
            ob.id().clone(),
            AgentId::new("receiver").unwrap(),
            AckStatus::Applied,
            abhyasa_core::Timestamp::from_unix_micros(micros),
            Some(ob.digest()),
        );
        // What the ack looks like after the wire: refused, or kept.
        let wire = Envelope::new(ack.target.clone(), Message::Acks(vec![ack]));
        let Ok(Envelope {
            message: Message::Acks(acks),
            ..
        }) = Envelope::decode(&wire.encode())
        else {
            continue;
        };
        for kind in ALL {
            let mut custodian = Custodian::new(custodian_config(), PolarityRegistry::standard());
            custodian.offer(common::EPOCH, ob.clone()).unwrap();
            custodian.handle_timeout(ob.deadline_at());
            let _ = custodian.handle_ack(ob.deadline_at(), &acks[0].target, &acks[0]);
            let mut b = backend(kind);
            while let Some(batch) = custodian.poll_records() {
                let _receipt = b
                    .commit(ob.deadline_at(), &[batch.records.as_slice()])
                    .unwrap_or_else(|e| panic!("{kind:?} acked_at {micros}: {e}"));
                custodian.handle_committed(batch.token());
            }
            if kind != Kind::Sim {
                b.restart();
            }
            let state = b
                .store()
                .load()
                .unwrap_or_else(|e| panic!("{kind:?} acked_at {micros}: {e}"));
            assert!(state.custodian.terminal.contains_key(ob.id()));
        }
    }
}
