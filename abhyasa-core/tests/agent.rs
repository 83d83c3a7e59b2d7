//! Two agents driven through `Agent` alone: frames routed to the right
//! machine, the status query on link-up, the renewal schedule as a timer
//! source, and the one message a plain link refuses.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use abhyasa_core::agent::{Agent, Handled, Refused};
use abhyasa_core::custody::renewal::Renewals;
use abhyasa_core::custody::{
    Custodian, CustodianEvent, Offered, Received, Receiver, StandardApplier, Transmit,
};
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::wire::{ErrorCode, Message};
use abhyasa_core::{AgentId, Obligation, Sequence, Timestamp};
use common::*;
use serde_json::json;

/// `name`'s agent (custodian, receiver, renewals seeded with 7).
fn agent_named(name: &str) -> Agent {
    let mut cc = custodian_config();
    cc.agent = agent(name);
    let mut rc = receiver_config();
    rc.agent = agent(name);
    Agent::new(
        Custodian::new(cc, PolarityRegistry::standard()),
        Receiver::new(rc, PolarityRegistry::standard()),
        Renewals::new(7, Duration::ZERO, None),
    )
}

/// Commits both machines' records (a store that never fails) and returns
/// the released frames.
fn flush(a: &mut Agent) -> Vec<Transmit> {
    if let Some(b) = a.custodian_mut().poll_records() {
        a.custodian_mut().handle_committed(b.token());
    }
    if let Some(b) = a.receiver_mut().poll_records() {
        a.receiver_mut().handle_committed(b.token());
    }
    std::iter::from_fn(|| a.poll_transmit()).collect()
}

/// Delivers `frames` from `from` to `to`, each answered by the standard
/// applier.
fn deliver(now: Timestamp, from: &AgentId, to: &mut Agent, frames: Vec<Transmit>) -> Vec<Handled> {
    frames
        .into_iter()
        .map(|t| to.handle_message(now, from, t.message, Some(&mut StandardApplier::default())))
        .collect()
}

fn leased(id: &str, seq: u64) -> Obligation {
    builder(
        id,
        "anumati.consent",
        json!({"decision": "grant", "scope": "email.read", "lease_seconds": 100}),
    )
    .sequence(seq)
    .build()
    .unwrap()
}

/// A custody transfer between two agents, every frame through
/// `handle_message`: the obligation reaches the receiver, the ack the
/// custodian, and the transfer ends applied (AB-1).
#[test]
fn frames_route_to_receiver_and_custodian_until_applied() {
    let (mut a, mut b) = (agent_named("custodian"), agent_named("receiver"));
    let (aid, bid) = (agent("custodian"), agent("receiver"));
    assert!(matches!(
        a.offer(T0, corrective("ob-1", -0.3)),
        Ok(Offered::Custody { .. })
    ));
    let out = flush(&mut a);
    assert_eq!(out.len(), 1);
    assert_eq!(
        deliver(at(0.1), &aid, &mut b, out),
        [Handled::Obligation(Received::Applied)]
    );
    let acks = flush(&mut b);
    assert!(matches!(&acks[0].message, Message::Acks(_)));
    // The same acks from another agent bind to nothing and are reported
    // ignored (C-TR-2); the transfer stays pending.
    let Handled::Acks(ignored) =
        deliver(at(0.2), &agent("mallory"), &mut a, acks.clone()).remove(0)
    else {
        panic!("not acks");
    };
    assert_eq!(ignored.len(), 1);
    assert_eq!(ignored[0].0.as_str(), "ob-1");
    assert_eq!(a.custodian().pending_len(), 1);
    assert_eq!(
        deliver(at(0.2), &bid, &mut a, acks),
        [Handled::Acks(vec![])]
    );
    flush(&mut a);
    let events: Vec<_> = std::iter::from_fn(|| a.custodian_mut().poll_event()).collect();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, CustodianEvent::Applied { .. })),
        "{events:?}"
    );
}

/// A link coming up asks the peer about every pending transfer towards
/// it; a status query is answered by the receiver and the reply taken by
/// the custodian.
#[test]
fn link_up_queries_the_peer_and_the_answer_closes_the_transfer() {
    let (mut a, mut b) = (agent_named("custodian"), agent_named("receiver"));
    let (aid, bid) = (agent("custodian"), agent("receiver"));
    a.offer(T0, corrective("ob-1", -0.3)).unwrap();
    // The first attempt reaches the receiver; its ack is lost.
    let out = flush(&mut a);
    let _ = deliver(at(0.1), &aid, &mut b, out);
    let _lost = flush(&mut b);

    let queries = a.handle_link_up(&bid);
    assert_eq!(queries.len(), 1);
    assert!(matches!(&queries[0].message, Message::StatusQuery(ids) if ids.len() == 1));
    assert!(a.handle_link_up(&agent("nobody")).is_empty());
    assert_eq!(deliver(at(1.0), &aid, &mut b, queries), [Handled::Status]);
    let reply = flush(&mut b);
    assert!(matches!(&reply[0].message, Message::StatusReply(_)));
    assert_eq!(deliver(at(1.1), &bid, &mut a, reply), [Handled::Status]);
    flush(&mut a);
    assert_eq!(a.custodian().pending_len(), 0);
    assert!(a.handle_link_up(&bid).is_empty());
}

/// The renewals are a timer source of the agent: `poll_timeout` is the
/// earliest of the three, the renewal due is offered through the agent
/// with the next sequence, and an offer behind it is refused.
#[test]
fn renewals_are_an_agent_timer_and_guard_later_offers() {
    let mut a = agent_named("custodian");
    assert_eq!(a.poll_timeout(), None);
    a.offer(T0, leased("g", 1)).unwrap();
    flush(&mut a);
    // The grant is best-effort... or custody: either way the earliest
    // timer is at most the renewal's.
    let renew_at = a.renewals().poll_timeout().unwrap();
    assert!(a.poll_timeout().unwrap() <= renew_at);
    let early = Timestamp::from_unix_micros(renew_at.unix_micros() - 1);
    assert!(a.poll_renewals(early).is_empty());

    a.handle_timeout(renew_at);
    let due = a.poll_renewals(renew_at);
    assert_eq!(due.len(), 1);
    let (key, renewal) = due.into_iter().next().unwrap();
    assert_eq!(renewal.sequence(), Some(Sequence(2)));
    assert!(matches!(
        a.offer_renewal(renew_at, key, renewal),
        Ok(Offered::BestEffort | Offered::Custody { .. })
    ));
    assert_eq!(a.renewals().views()[0].renewals, 1);

    let behind = revoke_seq("r", "email.read", 2);
    assert!(matches!(
        a.offer(renew_at, behind),
        Err(Refused::SupersededByRenewal(_))
    ));
    assert!(a.offer(renew_at, revoke_seq("r", "email.read", 3)).is_ok());
    assert!(
        a.renewals().views().is_empty(),
        "the revocation ends the chain"
    );
}

/// A deferred renewal is tried again an interval later.
#[test]
fn a_deferred_renewal_comes_back_later() {
    let mut a = agent_named("custodian");
    a.offer(T0, leased("g", 1)).unwrap();
    let at1 = a.renewals().poll_timeout().unwrap();
    let (key, _) = a.poll_renewals(at1).remove(0);
    a.defer_renewal(at1, key);
    let at2 = a.renewals().poll_timeout().unwrap();
    assert!(at2.saturating_duration_since(at1) >= Duration::from_secs(35));
    assert_eq!(a.poll_renewals(at2).len(), 1);
}

/// A relay message over a plain link is answered with an
/// unknown-message-type error and changes nothing.
#[test]
fn a_relay_message_on_a_plain_link_is_refused() {
    let mut a = agent_named("custodian");
    let m = Message::Relay(abhyasa_core::wire::RelayMessage::PullDone { remaining: 0 });
    let Handled::Unsupported(t) = a.handle_message(T0, &agent("x"), m, None) else {
        panic!("not refused");
    };
    assert_eq!(t.to, agent("x"));
    assert!(matches!(t.message, Message::Error(e) if e.code == ErrorCode::UnknownMessageType));
    assert_eq!(a.poll_timeout(), None);
}
