//! A tour of the sans-IO core: one custodian, one receiver, frames moved by
//! hand, time passed in. Run with
//! `cargo run -p abhyasa-core --example custody_tour`.

use std::time::Duration;

use abhyasa_core::custody::{
    Custodian, CustodianConfig, CustodianEvent, Receiver, ReceiverConfig, StandardApplier,
};
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::wire::Message;
use abhyasa_core::{AgentId, Obligation, Timestamp};
use serde_json::json;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let t0 = Timestamp::from_unix_seconds(1_780_000_000);
    let at = |s: u64| t0.saturating_add(Duration::from_secs(s));
    let (alice, bob) = (AgentId::new("alice")?, AgentId::new("bob")?);
    let mut custodian = Custodian::new(
        CustodianConfig::new(alice.clone()),
        PolarityRegistry::standard(),
    );
    let mut receiver = Receiver::new(
        ReceiverConfig::new(bob.clone()),
        PolarityRegistry::standard(),
    );
    let mut applier = StandardApplier::default();

    let revoke = Obligation::builder()
        .id("consent-42")
        .kind("anumati.consent")
        .target("bob")
        .payload(json!({"decision": "revoke", "scope": "email.read"}))
        .deadline_seconds(3600)
        .max_retries(100)
        .created_at(t0)
        .build()?;
    let id = revoke.id().clone();
    println!("offer {id} -> {:?}", custodian.offer(t0, revoke)?);

    // The first attempt is lost: commit, then drop what is released.
    let batch = custodian.poll_records().ok_or("no record")?;
    println!("commit {} record(s) before sending", batch.records.len());
    custodian.handle_committed(batch.token());
    while custodian.poll_transmit().is_some() {}

    // The retry gets through; the receiver applies and acks after its commit.
    let retry_at = custodian.poll_timeout().ok_or("no timer")?;
    custodian.handle_timeout(retry_at);
    let batch = custodian.poll_records().ok_or("no record")?;
    custodian.handle_committed(batch.token());
    while let Some(t) = custodian.poll_transmit() {
        if let Message::Obligation(o) = t.message {
            println!(
                "receiver got attempt at {retry_at}: {:?}",
                receiver.handle_obligation(retry_at, &alice, o, &mut applier)
            );
        }
    }
    let batch = receiver.poll_records().ok_or("no ledger record")?;
    receiver.handle_committed(batch.token());
    while let Some(t) = receiver.poll_transmit() {
        if let Message::Acks(acks) = t.message {
            for a in &acks {
                println!(
                    "custodian got ack {}: {:?}",
                    a.status,
                    custodian.handle_ack(at(2), &bob, a)
                );
            }
        }
    }
    if let Some(batch) = custodian.poll_records() {
        custodian.handle_committed(batch.token());
    }
    while let Some(e) = custodian.poll_event() {
        if let CustodianEvent::Applied {
            obligation_id,
            attempts,
            ..
        } = e
        {
            println!(
                "{obligation_id} applied after {attempts} attempts; nothing pending: {}",
                custodian.pending_len() == 0
            );
        }
    }

    // A corrective update into a dead link escalates at its deadline with the
    // fail-safe applied principal-side.
    let correct = Obligation::builder()
        .id("belief-7")
        .kind("phala.belief_update")
        .target("bob")
        .payload(json!({"weight_delta": -0.3}))
        .deadline_seconds(600)
        .max_retries(64)
        .created_at(t0)
        .build()?;
    custodian.offer(t0, correct)?;
    while let Some(t) = custodian.poll_timeout() {
        custodian.handle_timeout(t);
        if let Some(b) = custodian.poll_records() {
            custodian.handle_committed(b.token());
        }
        while custodian.poll_transmit().is_some() {}
    }
    while let Some(e) = custodian.poll_event() {
        if let CustodianEvent::Escalated(esc) = e {
            println!(
                "{} escalated at {} after {} attempts ({}); fail-safe {:?}",
                esc.obligation_id, esc.escalated_at, esc.attempts, esc.cause, esc.guard
            );
            println!(
                "principal routing weight now {}",
                custodian.principal().weight(&esc.safe_action.key)
            );
        }
    }
    Ok(())
}
