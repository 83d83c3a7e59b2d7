//! Relay frames (spec/protocol.md §7): `Sealed`, relay receipts, `Pull`,
//! `PullDone`, `Delivered`.
//!
//! C-T-6: arbitrary relay messages round-trip through the envelope codec
//! unchanged; the decoder answers arbitrary and mutated bytes with a value
//! or a typed error and never panics; what it accepts re-encodes to itself.
//! Also: the wrapper fits the frame budget (`SEAL_OVERHEAD`), the signing
//! input covers every field but the signature, and `Sealed::open` refuses a
//! misrouted frame, a foreign inner sender and nesting with typed errors.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use abhyasa_core::wire::relay::{
    max_inner, MAX_DEDUP_KEY, MAX_KEYS, MAX_ORIGIN_CERT, MAX_SIGNATURE, SEAL_OVERHEAD,
};
use abhyasa_core::wire::{
    DedupKey, Envelope, FrameDecoder, FrameKey, Message, Refusal, RefusalCode, RelayMessage,
    RelayReceipt, SealError, Sealed, DEFAULT_MAX_FRAME,
};
use abhyasa_core::{AgentId, Obligation, PeerError, Timestamp, MAX_ID_BYTES};
use abhyasa_testkit::props::*;
use bytes::BytesMut;
use proptest::prelude::*;
use serde_json::json;

fn agent(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

const T: Timestamp = Timestamp::from_unix_seconds(1_780_000_000);

fn obligation(target: &str) -> Obligation {
    Obligation::builder()
        .id("ob-1")
        .kind("anumati.consent")
        .target(target)
        .payload(json!({"decision": "revoke", "scope": "email.read"}))
        .deadline_seconds(600)
        .max_retries(64)
        .created_at(T)
        .build()
        .unwrap()
}

fn sealed_for(origin: &str, destination: &str) -> Sealed {
    let inner = Envelope::new(agent(origin), Message::Obligation(obligation(destination)));
    let bytes = inner.encode();
    Sealed {
        origin: agent(origin),
        destination: agent(destination),
        expires_at: T,
        dedup_key: DedupKey::for_message(&inner.message, &bytes),
        inner: bytes,
        origin_cert: vec![0x30; 300],
        signature: vec![0x30; 70],
    }
}

/// An agent id other than `a`.
fn other(a: &AgentId) -> AgentId {
    agent(if a.as_str() == "zz-other" {
        "zz-other-2"
    } else {
        "zz-other"
    })
}

fn code() -> impl Strategy<Value = RefusalCode> {
    prop::sample::select(vec![
        RefusalCode::DestinationQuota,
        RefusalCode::OriginQuota,
        RefusalCode::SpoolFull,
        RefusalCode::Expired,
        RefusalCode::UnknownDestination,
        RefusalCode::TooLarge,
        RefusalCode::Unauthorized,
    ])
}

fn frame_key() -> impl Strategy<Value = FrameKey> {
    any::<[u8; 32]>().prop_map(FrameKey)
}

fn bytes(min: usize, max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), min..=max)
}

fn sealed() -> impl Strategy<Value = Sealed> {
    (
        id_string(),
        id_string(),
        any::<i64>(),
        bytes(1, MAX_DEDUP_KEY),
        bytes(1, 512),
        bytes(1, MAX_ORIGIN_CERT),
        bytes(1, MAX_SIGNATURE),
    )
        .prop_map(|(o, d, t, k, inner, cert, sig)| Sealed {
            origin: agent(&o),
            destination: agent(&d),
            expires_at: Timestamp::from_unix_micros(t),
            dedup_key: DedupKey::new("k", &k).unwrap(),
            inner,
            origin_cert: cert,
            signature: sig,
        })
}

fn relay_message() -> impl Strategy<Value = RelayMessage> {
    prop_oneof![
        sealed().prop_map(|s| RelayMessage::Sealed(Box::new(s))),
        (
            prop::collection::vec(frame_key(), 0..8),
            prop::collection::vec(
                (frame_key(), code(), any::<u32>()).prop_map(|(key, code, r)| Refusal {
                    key,
                    code,
                    retry_after_seconds: r,
                }),
                0..8
            ),
        )
            .prop_map(|(accepted, refused)| RelayMessage::Receipt(RelayReceipt {
                accepted,
                refused
            })),
        (1u32.., any::<u64>()).prop_map(|(max_frames, max_bytes)| RelayMessage::Pull {
            max_frames,
            max_bytes
        }),
        any::<u64>().prop_map(|remaining| RelayMessage::PullDone { remaining }),
        prop::collection::vec(frame_key(), 1..8).prop_map(RelayMessage::Delivered),
    ]
}

fn samples() -> Vec<Vec<u8>> {
    let s = agent("relay-1");
    let out = [
        Envelope::new(
            s.clone(),
            Message::Relay(RelayMessage::Sealed(Box::new(sealed_for("alice", "edge")))),
        ),
        Envelope::new(
            s.clone(),
            Message::Relay(RelayMessage::Receipt(RelayReceipt {
                accepted: vec![FrameKey([1; 32])],
                refused: vec![Refusal {
                    key: FrameKey([2; 32]),
                    code: RefusalCode::SpoolFull,
                    retry_after_seconds: 30,
                }],
            })),
        ),
        Envelope::new(
            s.clone(),
            Message::Relay(RelayMessage::Pull {
                max_frames: 10,
                max_bytes: 1 << 20,
            }),
        ),
        Envelope::new(
            s.clone(),
            Message::Relay(RelayMessage::PullDone { remaining: 3 }),
        ),
        Envelope::new(
            s,
            Message::Relay(RelayMessage::Delivered(vec![FrameKey([3; 32])])),
        ),
    ];
    out.iter().map(Envelope::encode).collect()
}

fn mutated(b: Vec<u8>, edits: Vec<(usize, u8, u8)>) -> Vec<u8> {
    let mut b = b;
    for (i, op, v) in edits {
        if b.is_empty() {
            b.push(v);
            continue;
        }
        let at = i % b.len();
        match op % 4 {
            0 => b[at] ^= 1 << (v % 8),
            1 => b[at] = v,
            2 => b.insert(at, v),
            _ => {
                b.remove(at);
            }
        }
    }
    b
}

fn relay_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => bytes(0, 256),
        4 => (
            prop::sample::select(samples()),
            prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..6)
        )
            .prop_map(|(b, m)| mutated(b, m)),
    ]
}

proptest! {
    #![proptest_config(config(256))]

    // C-T-6: every relay message survives encode → decode unchanged.
    #[test]
    fn c_t_6_relay_messages_round_trip(sender in id_string(), m in relay_message()) {
        let env = Envelope::new(agent(&sender), Message::Relay(m));
        let back = Envelope::decode(&env.encode()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(back, env);
    }

    // C-T-6: relay decoding never panics on arbitrary or mutated bytes, and
    // what it accepts re-encodes to itself.
    #[test]
    fn c_t_6_relay_decode_never_panics(b in relay_bytes()) {
        if let Ok(env) = Envelope::decode(&b) {
            prop_assert_eq!(Envelope::decode(&env.encode()).unwrap(), env);
        }
        let mut buf = BytesMut::new();
        prost::encoding::encode_varint(b.len() as u64, &mut buf);
        buf.extend_from_slice(&b);
        let _ = FrameDecoder::new(DEFAULT_MAX_FRAME).decode(&mut buf);
    }

    // Any change to any signed field changes the signing input; the frame
    // key changes with its routing fields and not with the payload.
    #[test]
    fn signing_input_covers_every_field(s in sealed(), which in 0usize..6, salt in 1u8..) {
        let mut t = s.clone();
        match which {
            0 => t.origin = other(&s.origin),
            1 => t.destination = other(&s.destination),
            2 => t.expires_at = Timestamp::from_unix_micros(s.expires_at.unix_micros().wrapping_add(i64::from(salt))),
            3 => { let mut k = s.dedup_key.as_bytes().to_vec(); k[0] ^= salt; t.dedup_key = DedupKey::new("k", &k).unwrap(); }
            4 => t.inner[0] ^= salt,
            _ => t.origin_cert[0] ^= salt,
        }
        prop_assert_ne!(s.signing_input(), t.signing_input());
        prop_assert_eq!(s.key() == t.key(), which == 2 || which == 4 || which == 5);
        // The signature is not covered (it is what covers the rest).
        let mut u = s.clone();
        u.signature.push(salt);
        prop_assert_eq!(s.signing_input(), u.signing_input());
    }
}

/// The wrapper never pushes a frame over the limit: the worst-case sealed
/// envelope around an inner of `max_inner(limit)` bytes fits `limit`.
#[test]
fn sealed_overhead_fits_the_frame_budget() {
    let long = "\u{1f600}".repeat(MAX_ID_BYTES / 4);
    for limit in [SEAL_OVERHEAD + 1, 64 << 10, DEFAULT_MAX_FRAME] {
        let s = Sealed {
            origin: agent(&long),
            destination: agent(&long),
            expires_at: Timestamp::from_unix_micros(i64::MIN),
            dedup_key: DedupKey::new("k", &[0xff; MAX_DEDUP_KEY]).unwrap(),
            inner: vec![0xff; max_inner(limit)],
            origin_cert: vec![0xff; MAX_ORIGIN_CERT],
            signature: vec![0xff; MAX_SIGNATURE],
        };
        let env = Envelope::new(
            agent(&long),
            Message::Relay(RelayMessage::Sealed(Box::new(s))),
        );
        let n = env.encode().len();
        assert!(
            n <= limit,
            "sealed frame of {n} bytes over the {limit}-byte limit"
        );
    }
}

/// Out-of-bounds fields are typed errors naming the field.
#[test]
fn relay_field_bounds_are_typed_errors() {
    let enc = |m: RelayMessage| Envelope::new(agent("r"), Message::Relay(m)).encode();
    let field_of = |b: Vec<u8>| match Envelope::decode(&b) {
        Err(PeerError::Field(f)) => f.field,
        other => panic!("expected a field error, got {other:?}"),
    };
    let mut s = sealed_for("alice", "edge");
    s.signature = vec![1; MAX_SIGNATURE + 1];
    assert_eq!(
        field_of(enc(RelayMessage::Sealed(Box::new(s)))),
        "sealed.signature"
    );
    let mut s = sealed_for("alice", "edge");
    s.origin_cert = vec![1; MAX_ORIGIN_CERT + 1];
    assert_eq!(
        field_of(enc(RelayMessage::Sealed(Box::new(s)))),
        "sealed.origin_cert"
    );
    let mut s = sealed_for("alice", "edge");
    s.signature.clear();
    assert_eq!(
        field_of(enc(RelayMessage::Sealed(Box::new(s)))),
        "sealed.signature"
    );
    let mut s = sealed_for("alice", "edge");
    s.inner.clear();
    assert_eq!(
        field_of(enc(RelayMessage::Sealed(Box::new(s)))),
        "sealed.inner"
    );
    assert_eq!(
        field_of(enc(RelayMessage::Delivered(vec![
            FrameKey([0; 32]);
            MAX_KEYS + 1
        ]))),
        "delivered.keys"
    );
    assert_eq!(
        field_of(enc(RelayMessage::Delivered(vec![]))),
        "delivered.keys"
    );
    assert_eq!(
        field_of(enc(RelayMessage::Pull {
            max_frames: 0,
            max_bytes: 1
        })),
        "pull.max_frames"
    );
    assert!(DedupKey::new("k", &[0; MAX_DEDUP_KEY + 1]).is_err());
    assert!(DedupKey::new("k", &[]).is_err());
}

/// `open` checks what needs no key: the destination, the inner sender, no
/// nesting, an inner that decodes (C-TR-5, the key-free half).
#[test]
fn c_tr_5_open_refuses_misrouted_foreign_and_nested() {
    let s = sealed_for("alice", "edge");
    let inner = s.open(&agent("edge")).unwrap();
    assert_eq!(inner.sender, agent("alice"));
    assert!(matches!(
        s.open(&agent("other")),
        Err(SealError::WrongDestination { .. })
    ));

    let mut forged = s.clone();
    forged.origin = agent("mallory");
    assert!(matches!(
        forged.open(&agent("edge")),
        Err(SealError::InnerSender { .. })
    ));

    let mut nested = s.clone();
    nested.inner = Envelope::new(
        agent("alice"),
        Message::Relay(RelayMessage::Sealed(Box::new(s.clone()))),
    )
    .encode();
    assert!(matches!(
        nested.open(&agent("edge")),
        Err(SealError::Nested(_))
    ));

    let mut garbage = s;
    garbage.inner = vec![0xff; 7];
    assert!(matches!(
        garbage.open(&agent("edge")),
        Err(SealError::Inner { .. })
    ));
}

/// Retransmissions of one obligation share a dedup key; another content
/// (digest) or id does not; every status query shares one (newest wins).
#[test]
fn dedup_keys_collapse_retries_only() {
    let a = Message::Obligation(obligation("edge"));
    let b = Message::Obligation(
        Obligation::builder()
            .id("ob-1")
            .kind("anumati.consent")
            .target("edge")
            .payload(json!({"decision": "revoke", "scope": "other"}))
            .deadline_seconds(600)
            .max_retries(64)
            .created_at(T)
            .build()
            .unwrap(),
    );
    assert_eq!(
        DedupKey::for_message(&a, b"x"),
        DedupKey::for_message(&a, b"y")
    );
    assert_ne!(
        DedupKey::for_message(&a, b"x"),
        DedupKey::for_message(&b, b"x")
    );
    let q1 = Message::StatusQuery(vec![]);
    assert_eq!(
        DedupKey::for_message(&q1, b"1"),
        DedupKey::for_message(&q1, b"2")
    );
    let e = Message::Acks(vec![]);
    assert_ne!(
        DedupKey::for_message(&e, b"1"),
        DedupKey::for_message(&e, b"2")
    );
}

/// An old peer (without relay support) reads a relay frame's body as absent
/// and answers `unknown_message_type`; the frame is consumed whole. Shown by
/// cutting the body's field numbers (20..=24) back to an unknown one.
#[test]
fn c_t_4_old_peer_reads_relay_as_unknown_message_type() {
    // An Envelope with version 1, a sender and only an unknown field 25
    // (what a relay frame looks like to a decoder that predates 20..=24).
    let mut b = Vec::new();
    prost::encoding::uint32::encode(1, &1, &mut b);
    prost::encoding::string::encode(2, &"relay-1".to_string(), &mut b);
    prost::encoding::bytes::encode(25, &vec![1u8, 2, 3], &mut b);
    assert_eq!(Envelope::decode(&b), Err(PeerError::UnknownMessageType));
}
