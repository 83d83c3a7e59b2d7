//! Frames to the budget: the status query a custodian sends when a link
//! comes up (which ids, how many a query), a coalesced message split until
//! each part fits the frame budget, and acks merged up to their per-frame
//! bound (C-ND-4).

#![allow(clippy::unwrap_used)]

mod common;

use abhyasa_core::custody::STATUS_QUERY_MAX_IDS;
use abhyasa_core::wire::shape::{fit_to_frame, items, send_in_parts, split_in_half};
use abhyasa_core::wire::{Envelope, Message, StatusReply};
use abhyasa_core::{AckStatus, CustodyAck, ObligationId};
use common::*;
use serde_json::json;

fn ids(n: usize) -> Vec<ObligationId> {
    (0..n)
        .map(|i| ObligationId::new(format!("obligation-{i:05}")).unwrap())
        .collect()
}

/// Every id under custody towards the peer whose link came up, in id
/// order, at most `STATUS_QUERY_MAX_IDS` a query; none for another peer's,
/// none once applied.
#[test]
fn link_up_queries_every_pending_id_of_the_peer_in_order_and_chunks() {
    let mut d = Duo::new();
    let n = 2 * STATUS_QUERY_MAX_IDS + 7;
    // Offered in reverse, so hash or offer order would show.
    for i in (0..n).rev() {
        d.c.offer(T0, corrective(&format!("obligation-{i:05}"), -0.3))
            .unwrap();
    }
    let other = builder(
        "to-other",
        "phala.belief_update",
        json!({"weight_delta": -0.3, "weight_key": "routing.other.preference"}),
    )
    .target("other")
    .build()
    .unwrap();
    d.c.offer(T0, other).unwrap();

    let queries = d.c.status_queries(&agent("receiver"));
    let sizes: Vec<usize> = queries.iter().map(|t| items(&t.message)).collect();
    assert_eq!(sizes, [STATUS_QUERY_MAX_IDS, STATUS_QUERY_MAX_IDS, 7]);
    let asked: Vec<ObligationId> = queries
        .iter()
        .flat_map(|t| {
            assert_eq!(t.to, agent("receiver"));
            match &t.message {
                Message::StatusQuery(ids) => ids.clone(),
                other => panic!("{other:?}"),
            }
        })
        .collect();
    assert_eq!(asked, ids(n));
    assert_eq!(d.c.status_queries(&agent("other")).len(), 1);
    assert!(d.c.status_queries(&agent("nobody")).is_empty());

    // Applied transfers are no longer asked about.
    d.exchange(at(1.0));
    assert!(d.c.status_queries(&agent("receiver")).is_empty());
}

/// A split keeps every item once, in order, in two non-empty halves; a
/// message of one item (or not coalesced) does not split.
#[test]
fn split_in_half_keeps_every_item_in_order() {
    let (a, b) = split_in_half(Message::StatusQuery(ids(5))).unwrap();
    assert_eq!(a, Message::StatusQuery(ids(5)[..2].to_vec()));
    assert_eq!(b, Message::StatusQuery(ids(5)[2..].to_vec()));

    let ack = |id: &ObligationId| {
        CustodyAck::new(id.clone(), agent("receiver"), AckStatus::Applied, T0, None)
    };
    let reply = StatusReply {
        target: agent("receiver"),
        known: ids(3).iter().map(ack).collect(),
        unknown: ids(6)[3..].to_vec(),
    };
    let (Message::StatusReply(a), Message::StatusReply(b)) =
        split_in_half(Message::StatusReply(reply.clone())).unwrap()
    else {
        panic!("not two replies");
    };
    assert_eq!((a.known.len(), a.unknown.len()), (3, 0));
    assert_eq!((b.known.len(), b.unknown.len()), (0, 3));
    assert_eq!([a.known, b.known].concat(), reply.known);
    assert_eq!([a.unknown, b.unknown].concat(), reply.unknown);

    assert!(split_in_half(Message::StatusQuery(ids(1))).is_none());
    assert!(split_in_half(Message::Acks(vec![ack(&ids(1)[0])])).is_none());
    assert!(split_in_half(Message::Obligation(corrective("c", -0.3))).is_none());
}

/// A message over the frame budget goes out in parts that each fit, with
/// every item once and in order; one that fits goes out whole.
#[test]
fn a_message_over_the_budget_splits_into_parts_that_each_fit() {
    let sender = agent("custodian");
    let budget = 2_000;
    let whole = Message::StatusQuery(ids(1_000));
    assert!(Envelope::new(sender.clone(), whole.clone()).encode().len() > budget);
    let parts = fit_to_frame(&sender, whole, budget);
    assert!(parts.len() > 1);
    let mut back = Vec::new();
    for p in &parts {
        assert!(Envelope::new(sender.clone(), p.clone()).encode().len() <= budget);
        let Message::StatusQuery(ids) = p else {
            panic!("{p:?}")
        };
        back.extend(ids.iter().cloned());
    }
    assert_eq!(back, ids(1_000));

    let small = Message::StatusQuery(ids(3));
    assert_eq!(fit_to_frame(&sender, small.clone(), budget), [small]);
}

/// `send_in_parts` as a driver uses it: splits only on a too-large
/// refusal, counts the splits, and reports a part of one item that still
/// does not fit (or any other refusal) without losing the other parts.
#[test]
fn send_in_parts_splits_only_on_too_large_and_reports_what_cannot_fit() {
    let sender = agent("custodian");
    #[derive(Debug, PartialEq)]
    enum Refused {
        TooLarge,
        Closed,
    }
    let mut sent = Vec::new();
    let mut splits = 0;
    // Refuses any query of more than 3 ids, and any holding `obligation-00005`.
    let r = send_in_parts(
        &sender,
        Message::StatusQuery(ids(8)),
        &mut |env: &Envelope| match &env.message {
            Message::StatusQuery(q) if q.len() > 3 => Err(Refused::TooLarge),
            Message::StatusQuery(q) if q.iter().any(|id| id.as_str() == "obligation-00005") => {
                Err(Refused::TooLarge)
            }
            m => {
                sent.push(m.clone());
                Ok(())
            }
        },
        &|e: &Refused| *e == Refused::TooLarge,
        &mut splits,
    );
    assert_eq!(r, Err(Refused::TooLarge));
    let got: Vec<ObligationId> = sent
        .iter()
        .flat_map(|m| match m {
            Message::StatusQuery(q) => q.clone(),
            _ => unreachable!(),
        })
        .collect();
    let mut want = ids(8);
    want.remove(5);
    assert_eq!(got, want);
    assert_eq!(splits, 4, "8 -> 4+4, each 4 -> 2+2, then (4, 5) -> (4)+(5)");

    // Another refusal is not a reason to split.
    let mut splits = 0;
    let r = send_in_parts(
        &sender,
        Message::StatusQuery(ids(8)),
        &mut |_: &Envelope| Err(Refused::Closed),
        &|e: &Refused| *e == Refused::TooLarge,
        &mut splits,
    );
    assert_eq!((r, splits), (Err(Refused::Closed), 0));
}

/// Acks to one custodian are merged into one frame up to the per-frame
/// bound (512), never beyond: 600 applied obligations are acked in two
/// frames, 512 then 88, every id once, in order.
#[test]
fn acks_merge_up_to_the_per_frame_bound() {
    let mut d = Duo::new();
    for i in 0..600 {
        d.c.offer(T0, corrective(&format!("obligation-{i:05}"), -0.3))
            .unwrap();
    }
    for t in d.custodian_out() {
        d.deliver_to_receiver(at(0.5), &t);
    }
    let frames = d.receiver_out();
    let sizes: Vec<usize> = frames.iter().map(|t| items(&t.message)).collect();
    assert_eq!(sizes, [512, 88]);
}
