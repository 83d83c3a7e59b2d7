//! C-TR-5 (the destination's half): a sealed frame opens only with the
//! origin's pinned key and only at its destination. A relay that tampers
//! with any field, replays a frame under another origin or key, redirects
//! it or fabricates an ack gets a typed `SealError`, and nothing of the
//! frame reaches the node.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use abhyasa_core::wire::{Envelope, Message, SealError, Sealed};
use abhyasa_core::{AckStatus, AgentId, CustodyAck, Obligation, Timestamp};
use abhyasa_identity::{generate_identity, Identity};
use abhyasa_spool::{Opener, SealFailure, Sealer};
use serde_json::json;

const T: Timestamp = Timestamp::from_unix_seconds(1_780_000_000);

fn agent(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

struct Party {
    id: AgentId,
    identity: Identity,
}

fn party(name: &str) -> Party {
    let id = agent(name);
    Party {
        identity: generate_identity(&id).unwrap(),
        id,
    }
}

fn sealer(p: &Party) -> Sealer {
    Sealer::new(p.id.clone(), p.identity.clone(), 1 << 20)
}

fn revoke(scope: &str) -> Obligation {
    Obligation::builder()
        .id("consent-1")
        .kind("anumati.consent")
        .target("edge")
        .payload(json!({"decision": "revoke", "scope": scope}))
        .deadline_seconds(600)
        .max_retries(64)
        .created_at(T)
        .build()
        .unwrap()
}

fn obligation_frame(alice: &Party) -> (Envelope, Sealed) {
    let inner = Envelope::new(alice.id.clone(), Message::Obligation(revoke("email.read")));
    let sealed = sealer(alice)
        .seal(&agent("edge"), &inner, revoke("email.read").deadline_at())
        .unwrap();
    (inner, sealed)
}

/// The edge pins alice and mallory (a pinned but hostile peer).
fn edge_opener(alice: &Party, mallory: &Party) -> Opener {
    Opener::new(
        agent("edge"),
        [
            &alice.identity.pin(alice.id.clone()),
            &mallory.identity.pin(mallory.id.clone()),
        ],
    )
}

#[test]
fn c_tr_5_sealed_frame_opens_at_its_destination_with_the_pinned_key() {
    let (alice, mallory) = (party("alice"), party("mallory"));
    let (inner, sealed) = obligation_frame(&alice);
    assert_eq!(edge_opener(&alice, &mallory).open(&sealed).unwrap(), inner);
}

#[test]
fn c_tr_5_tampering_with_any_field_is_caught() {
    let (alice, mallory) = (party("alice"), party("mallory"));
    let opener = edge_opener(&alice, &mallory);
    let (_, sealed) = obligation_frame(&alice);

    // Another inner envelope that decodes fine (a different scope): only the
    // signature can tell.
    let mut t = sealed.clone();
    t.inner = Envelope::new(alice.id.clone(), Message::Obligation(revoke("calendar"))).encode();
    assert_eq!(
        opener.open(&t),
        Err(SealError::BadSignature(alice.id.clone()))
    );

    let mut t = sealed.clone();
    t.expires_at = Timestamp::from_unix_seconds(1_999_999_999);
    assert_eq!(
        opener.open(&t),
        Err(SealError::BadSignature(alice.id.clone()))
    );

    let mut t = sealed.clone();
    t.dedup_key = abhyasa_core::wire::DedupKey::new("k", b"other").unwrap();
    assert_eq!(
        opener.open(&t),
        Err(SealError::BadSignature(alice.id.clone()))
    );

    let mut t = sealed.clone();
    let last = t.signature.len() - 1;
    t.signature[last] ^= 1;
    assert_eq!(
        opener.open(&t),
        Err(SealError::BadSignature(alice.id.clone()))
    );

    // Swapping in another pinned certificate is a replay under another key.
    let mut t = sealed;
    t.origin_cert = mallory.identity.cert_der.to_vec();
    assert_eq!(
        opener.open(&t),
        Err(SealError::CertificateNotPinned(alice.id.clone()))
    );
}

#[test]
fn c_tr_5_replay_under_another_origin_or_destination_is_caught() {
    let (alice, mallory) = (party("alice"), party("mallory"));
    let opener = edge_opener(&alice, &mallory);
    let (_, sealed) = obligation_frame(&alice);

    // Re-labelled as mallory's: alice's certificate is not mallory's pin.
    let mut t = sealed.clone();
    t.origin = mallory.id.clone();
    assert_eq!(
        opener.open(&t),
        Err(SealError::CertificateNotPinned(mallory.id.clone()))
    );

    // Re-signed by mallory under its own name: the inner envelope is still
    // alice's, so it would be keyed on the wrong custodian.
    let mut t = sealed.clone();
    t.origin = mallory.id.clone();
    t.origin_cert = mallory.identity.cert_der.to_vec();
    t.signature = mallory.identity.sign(&t.signing_input()).unwrap();
    assert!(matches!(
        opener.open(&t),
        Err(SealError::InnerSender { .. })
    ));

    // Redirected to another destination: it is not for that node...
    let bob = Opener::new(agent("bob"), [&alice.identity.pin(alice.id.clone())]);
    assert!(matches!(
        bob.open(&sealed),
        Err(SealError::WrongDestination { .. })
    ));
    // ... and rewriting the destination breaks the signature.
    let mut t = sealed;
    t.destination = agent("bob");
    assert_eq!(bob.open(&t), Err(SealError::BadSignature(alice.id.clone())));
}

#[test]
fn c_tr_5_relay_cannot_fabricate_an_ack() {
    let (alice, relay) = (party("alice"), party("relay-1"));
    let edge = party("edge");
    // Alice pins the edge and the relay (a pinned peer, but not the edge).
    let opener = Opener::new(
        alice.id.clone(),
        [
            &edge.identity.pin(edge.id.clone()),
            &relay.identity.pin(relay.id.clone()),
        ],
    );
    let ob = revoke("email.read");
    let ack = CustodyAck::new(
        ob.id().clone(),
        edge.id.clone(),
        AckStatus::Applied,
        T,
        Some(ob.digest()),
    );
    let fake = Envelope::new(edge.id.clone(), Message::Acks(vec![ack.clone()]));
    let bytes = fake.encode();
    // Claiming to be the edge with the relay's key.
    let mut s = Sealed {
        origin: edge.id.clone(),
        destination: alice.id.clone(),
        expires_at: ob.deadline_at(),
        dedup_key: abhyasa_core::wire::DedupKey::for_message(&fake.message, &bytes),
        inner: bytes,
        origin_cert: relay.identity.cert_der.to_vec(),
        signature: Vec::new(),
    };
    s.signature = relay.identity.sign(&s.signing_input()).unwrap();
    assert_eq!(
        opener.open(&s),
        Err(SealError::CertificateNotPinned(edge.id.clone()))
    );
    // Signing as itself, it can only wrap an envelope from itself, which
    // the custodian's bound-ack rule ignores (not the target); wrapping the
    // edge's envelope is refused outright.
    s.origin = relay.id.clone();
    s.signature = relay.identity.sign(&s.signing_input()).unwrap();
    assert!(matches!(
        opener.open(&s),
        Err(SealError::InnerSender { .. })
    ));
    // The genuine ack from the edge opens.
    let real = sealer(&edge)
        .seal(&alice.id, &fake, ob.deadline_at())
        .unwrap();
    assert_eq!(
        opener.open(&real).unwrap().message,
        Message::Acks(vec![ack])
    );
}

#[test]
fn c_tr_5_unknown_origin_is_refused() {
    let (alice, mallory) = (party("alice"), party("mallory"));
    let (_, sealed) = obligation_frame(&alice);
    let opener = Opener::new(agent("edge"), [&mallory.identity.pin(mallory.id.clone())]);
    assert_eq!(
        opener.open(&sealed),
        Err(SealError::UnknownOrigin(alice.id.clone()))
    );
}

#[test]
fn sealing_refuses_a_foreign_sender_and_an_inner_over_budget() {
    let alice = party("alice");
    let inner = Envelope::new(agent("bob"), Message::Obligation(revoke("x")));
    assert!(matches!(
        sealer(&alice).seal(&agent("edge"), &inner, T),
        Err(SealFailure::ForeignSender { .. })
    ));
    let small = Sealer::new(alice.id.clone(), alice.identity.clone(), 3100);
    let inner = Envelope::new(alice.id.clone(), Message::Obligation(revoke("x")));
    assert!(matches!(
        small.seal(&agent("edge"), &inner, T),
        Err(SealFailure::TooLarge { .. })
    ));
}
