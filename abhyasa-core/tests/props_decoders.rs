//! C-T-6: every decoder of the core answers arbitrary bytes with a value
//! or a typed error and never panics: `FrameDecoder` (any bytes, any
//! chunking, any frame limit), `Envelope::decode`, `Obligation::from_json`,
//! `CustodyAck::from_json`, `KindProfile` JSON and `Payload::from_json_bytes`.
//!
//! Inputs are random bytes, valid encodings mutated (bits flipped, bytes
//! set, inserted, removed, truncated, duplicated) so they get past the
//! first checks, and JSON objects with the schema's field names holding
//! arbitrary values. What a decoder accepts must survive its own encoder
//! again (decode ∘ encode is the identity on it). `fuzz/` has the same
//! decoders as cargo-fuzz targets.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use abhyasa_core::json::parse_object;
use abhyasa_core::wire::{Envelope, ErrorCode, FrameDecoder, Message, ProtocolError, StatusReply};
use abhyasa_core::{
    AckStatus, AgentId, CustodyAck, DeclineReason, Digest, KindProfile, Obligation, ObligationId,
    Payload, PeerError, Timestamp,
};
use abhyasa_testkit::props::*;
use bytes::BytesMut;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

fn agent(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

fn oid(s: &str) -> ObligationId {
    ObligationId::new(s).unwrap()
}

const T: Timestamp = Timestamp::from_unix_seconds(1_780_000_000);

fn sample_obligation() -> Obligation {
    Obligation::builder()
        .id("ob-1")
        .kind("phala.belief_update")
        .target("receiver")
        .payload(json!({"weight_delta": -0.25, "weight_key": "w", "n": [1, 2.5, "x", {"y": null}]}))
        .deadline_seconds(600)
        .max_retries(64)
        .created_at(T)
        .sequence(7)
        .build()
        .unwrap()
}

fn sample_ack(status: AckStatus) -> CustodyAck {
    let ob = sample_obligation();
    let mut a = CustodyAck::new(
        ob.id().clone(),
        agent("receiver"),
        status,
        T,
        Some(ob.digest()),
    );
    if status == AckStatus::Declined {
        a.reason = Some(DeclineReason::Superseded);
        a.detail = Some("newer sequence applied".into());
    }
    a.receiver_instance = Some("r-1".into());
    a
}

/// One valid envelope of every message type.
fn sample_envelopes() -> Vec<Envelope> {
    let s = agent("custodian");
    vec![
        Envelope::new(s.clone(), Message::Obligation(sample_obligation())),
        Envelope::new(
            s.clone(),
            Message::Acks(vec![
                sample_ack(AckStatus::Applied),
                sample_ack(AckStatus::Declined),
                sample_ack(AckStatus::Deferred),
            ]),
        ),
        Envelope::new(s.clone(), Message::StatusQuery(vec![oid("a"), oid("b")])),
        Envelope::new(
            s.clone(),
            Message::StatusReply(StatusReply {
                target: agent("receiver"),
                known: vec![sample_ack(AckStatus::Applied)],
                unknown: vec![oid("c")],
            }),
        ),
        Envelope::new(
            s,
            Message::Error(ProtocolError {
                code: ErrorCode::DigestMismatch,
                obligation_id: Some(oid("ob-1")),
                digest: Some(Digest([7; 32])),
                message: "bad digest".into(),
            }),
        ),
    ]
}

/// Names of five bytes for `names_stream`: valid ones, and text no id
/// may hold (padded, a control character), each the length of a valid one
/// so it can stand in for it in an encoded frame.
const NAMES: [&str; 5] = ["alice", "carol", " alic", "al\u{1}ce", "alic "];
/// Kinds of nineteen bytes, likewise.
const KINDS: [&str; 3] = [
    "phala.belief_update",
    "other.kind_nineteen",
    "phala.belief_updat ",
];

/// The frame of an obligation from `sender` to `target` of `kind` (indices
/// into `NAMES` and `KINDS`), length prefix first. A name no id may hold
/// is written over a valid one of its length in the encoded bytes.
fn named_frame(sender: usize, target: usize, kind: usize, id: usize) -> Vec<u8> {
    let valid = |i: usize, pool: &[&'static str]| if i < 2 { pool[i] } else { pool[0] };
    let ob = Obligation::builder()
        .id(format!("ob-{id}"))
        .kind(valid(kind, &KINDS))
        .target(valid(target, &NAMES))
        .payload(json!({"weight_delta": -0.5}))
        .deadline_seconds(600)
        .max_retries(64)
        .created_at(T)
        .build()
        .unwrap();
    let mut body = Envelope::new(agent(valid(sender, &NAMES)), Message::Obligation(ob)).encode();
    // Field by field in encoding order: the sender comes first, then the
    // obligation's kind and target, so each replacement finds its own.
    let mut put = |from: &str, to: &str| {
        if from != to {
            let at = body
                .windows(from.len())
                .position(|w| w == from.as_bytes())
                .unwrap();
            body[at..at + to.len()].copy_from_slice(to.as_bytes());
        }
    };
    put(valid(sender, &NAMES), NAMES[sender]);
    put(valid(kind, &KINDS), KINDS[kind]);
    put(valid(target, &NAMES), NAMES[target]);
    let mut frame = Vec::new();
    prost::encoding::encode_varint(body.len() as u64, &mut frame);
    frame.extend_from_slice(&body);
    frame
}

/// An edit to a valid encoding.
#[derive(Clone, Debug)]
enum Mutation {
    Flip(usize, u8),
    Set(usize, u8),
    Insert(usize, Vec<u8>),
    Remove(usize, usize),
    Truncate(usize),
    Duplicate(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), 0u8..8).prop_map(|(i, b)| Mutation::Flip(i, b)),
        3 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        2 => (any::<usize>(), prop::collection::vec(any::<u8>(), 1..12))
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        1 => (any::<usize>(), 1usize..16).prop_map(|(i, n)| Mutation::Remove(i, n)),
        1 => any::<usize>().prop_map(Mutation::Truncate),
        1 => (any::<usize>(), 1usize..32).prop_map(|(i, n)| Mutation::Duplicate(i, n)),
    ]
}

fn mutate(mut b: Vec<u8>, edits: &[Mutation]) -> Vec<u8> {
    for m in edits {
        let len = b.len();
        let at = |i: usize| if len == 0 { 0 } else { i % len };
        match m {
            Mutation::Flip(i, bit) if len > 0 => b[at(*i)] ^= 1 << bit,
            Mutation::Set(i, v) if len > 0 => b[at(*i)] = *v,
            Mutation::Insert(i, bytes) => {
                let p = if len == 0 { 0 } else { i % (len + 1) };
                b.splice(p..p, bytes.iter().copied());
            }
            Mutation::Remove(i, n) if len > 0 => {
                let p = at(*i);
                b.drain(p..(p + n).min(len));
            }
            Mutation::Truncate(n) => b.truncate(if len == 0 { 0 } else { n % len }),
            Mutation::Duplicate(i, n) if len > 0 => {
                let p = at(*i);
                let piece: Vec<u8> = b[p..(p + n).min(len)].to_vec();
                b.splice(p..p, piece);
            }
            _ => {}
        }
    }
    b
}

/// Valid envelope bytes (with or without the length prefix), mutated.
fn envelope_bytes() -> impl Strategy<Value = Vec<u8>> {
    let samples: Vec<Vec<u8>> = sample_envelopes().iter().map(Envelope::encode).collect();
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..256),
        4 => (prop::sample::select(samples), prop::collection::vec(mutation(), 1..6))
            .prop_map(|(b, m)| mutate(b, &m)),
    ]
}

/// A frame stream: valid frames of every type, concatenated, then mutated.
fn frame_stream() -> impl Strategy<Value = Vec<u8>> {
    let envs = sample_envelopes();
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..512),
        4 => (
            prop::collection::vec(prop::sample::select(envs), 1..6),
            prop::collection::vec(mutation(), 0..6),
        )
            .prop_map(|(es, m)| {
                let mut b = Vec::new();
                for e in &es {
                    e.encode_frame(&mut b);
                }
                mutate(b, &m)
            }),
    ]
}

/// A JSON value for a schema field: a plausible one or anything.
fn field_value(plausible: Vec<Value>) -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => prop::sample::select(plausible),
        1 => value(),
        1 => number(),
    ]
}

fn timestamps() -> Vec<Value> {
    vec![
        json!("2026-06-09T12:00:00Z"),
        json!("2026-06-09T12:00:00.123456+05:30"),
        json!("2026-06-09T12:00:00.1234567Z"),
        json!("2026-06-09T12:00:00"),
        json!("+10000-01-01T00:00:00Z"),
        json!("9999-12-31T23:59:59.999999-23:59"),
        json!("0000-01-01T00:00:00+00:01"),
        json!(""),
    ]
}

fn integers() -> Vec<Value> {
    vec![
        json!(0),
        json!(1),
        json!(-1),
        json!(600),
        json!(64),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(2.0),
        json!(1e300),
        json!("600"),
        json!(true),
    ]
}

fn floats() -> Vec<Value> {
    vec![
        json!(1.0),
        json!(0.5),
        json!(0),
        json!(-1.0),
        json!(5e-324),
        json!(f64::MAX),
        json!(1e-300),
        json!(u64::MAX),
        json!("1"),
    ]
}

/// An object with a random subset of `fields`, each holding a value.
fn object_with(
    fields: Vec<(&'static str, Vec<Value>)>,
) -> impl Strategy<Value = Map<String, Value>> {
    let per_field: Vec<_> = fields
        .into_iter()
        .map(|(name, plausible)| {
            (prop::bool::weighted(0.85), field_value(plausible))
                .prop_map(move |(keep, v)| keep.then(|| (name.to_string(), v)))
        })
        .collect();
    (
        per_field,
        prop::collection::btree_map(text(), value(), 0..3),
    )
        .prop_map(|(fs, extra)| {
            let mut m: Map<String, Value> = extra.into_iter().collect();
            m.extend(fs.into_iter().flatten());
            m
        })
}

fn obligation_object() -> impl Strategy<Value = Map<String, Value>> {
    let ob = sample_obligation();
    object_with(vec![
        (
            "obligation_id",
            vec![json!("ob-1"), json!(""), json!(" x"), json!("a\u{7}")],
        ),
        (
            "kind",
            vec![
                json!("phala.belief_update"),
                json!("anumati.consent"),
                json!("x"),
            ],
        ),
        ("target", vec![json!("receiver"), json!("\u{1f600}")]),
        (
            "payload",
            vec![
                json!({"weight_delta": -0.5}),
                json!({"ttl": 1e16}),
                json!({"n": 9_007_199_254_740_993u64}),
                json!([]),
                json!({}),
            ],
        ),
        ("deadline_seconds", integers()),
        ("max_retries", integers()),
        ("created_at", timestamps()),
        ("sequence", integers()),
        (
            "digest",
            vec![
                json!(ob.digest().to_hex()),
                json!("00"),
                json!("zz".repeat(32)),
            ],
        ),
    ])
}

fn ack_object() -> impl Strategy<Value = Map<String, Value>> {
    object_with(vec![
        ("obligation_id", vec![json!("ob-1"), json!("")]),
        ("target", vec![json!("receiver")]),
        (
            "status",
            vec![
                json!("applied"),
                json!("declined"),
                json!("deferred"),
                json!("Applied"),
            ],
        ),
        ("acked_at", timestamps()),
        ("digest", vec![json!("ab".repeat(32)), json!("ab")]),
        (
            "reason",
            vec![json!("expired"), json!("conflict"), json!("nope")],
        ),
        ("detail", vec![json!("why"), json!("x".repeat(5000))]),
        ("receiver_instance", vec![json!("r-1")]),
    ])
}

fn profile_object() -> impl Strategy<Value = Map<String, Value>> {
    object_with(vec![
        ("kind", vec![json!("anumati.consent"), json!("")]),
        (
            "obligation_endpoint",
            vec![json!("https://b.example/abhyasa/obligations")],
        ),
        ("deadline_seconds", integers()),
        ("max_retries", integers()),
        ("backoff", vec![json!("exponential"), json!("linear")]),
        ("backoff_base_seconds", floats()),
        ("backoff_cap_seconds", integers()),
    ])
}

/// JSON bytes: random, a valid document mutated, or a schema-shaped object
/// written out and possibly mutated.
fn json_bytes(
    valid: Vec<String>,
    shaped: impl Strategy<Value = Map<String, Value>>,
) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..128),
        2 => (prop::sample::select(valid), prop::collection::vec(mutation(), 1..4))
            .prop_map(|(s, m)| mutate(s.into_bytes(), &m)),
        4 => (shaped, prop::collection::vec(mutation(), 0..2))
            .prop_map(|(o, m)| mutate(Value::Object(o).to_string().into_bytes(), &m)),
    ]
}

/// Feeds `stream` to a decoder in `cuts`-sized chunks; checks every answer
/// consumed input (so a driver loop always ends) and that what decodes
/// re-encodes to an equal envelope.
fn run_frames(
    stream: &[u8],
    cuts: &[usize],
    max_frame: usize,
) -> Result<Vec<Result<Envelope, PeerError>>, TestCaseError> {
    let mut dec = FrameDecoder::new(max_frame);
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut rest = stream;
    let mut cuts = cuts.iter().copied();
    while !rest.is_empty() {
        let n = cuts.next().unwrap_or(rest.len()).clamp(1, rest.len());
        buf.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
        loop {
            let before = buf.len();
            let Some(r) = dec.decode(&mut buf) else { break };
            prop_assert!(
                buf.len() < before,
                "an answer consumed nothing: the caller's loop would spin"
            );
            if let Ok(env) = &r {
                prop_assert_eq!(&Envelope::decode(&env.encode()).unwrap(), env);
            }
            out.push(r);
        }
    }
    Ok(out)
}

proptest! {
    #![proptest_config(config(256))]

    // C-T-6: envelope decoding never panics; what it accepts re-encodes to
    // the same envelope.
    #[test]
    fn c_t_6_envelope_decode_never_panics(bytes in envelope_bytes()) {
        if let Ok(env) = Envelope::decode(&bytes) {
            let again = Envelope::decode(&env.encode())
                .map_err(|e| TestCaseError::fail(format!("accepted {env:?} but not its re-encoding: {e}")))?;
            prop_assert_eq!(again, env);
        }
    }

    // C-T-6: the frame decoder never panics nor spins, whatever the bytes,
    // the chunking and the frame limit.
    #[test]
    fn c_t_6_frame_decoder_never_panics_on_any_chunking(
        stream in frame_stream(),
        cuts in prop::collection::vec(1usize..48, 0..64),
        max_frame in prop_oneof![Just(abhyasa_core::wire::DEFAULT_MAX_FRAME), 0usize..400],
    ) {
        run_frames(&stream, &cuts, max_frame)?;
    }

    // C-T-6: a valid stream split anywhere decodes the same as whole.
    #[test]
    fn c_t_6_frame_decoder_is_chunking_independent(
        envs in prop::collection::vec(prop::sample::select(sample_envelopes()), 1..6),
        cuts in prop::collection::vec(1usize..48, 0..64),
    ) {
        let mut stream = Vec::new();
        for e in &envs {
            e.encode_frame(&mut stream);
        }
        let whole = run_frames(&stream, &[], abhyasa_core::wire::DEFAULT_MAX_FRAME)?;
        let split = run_frames(&stream, &cuts, abhyasa_core::wire::DEFAULT_MAX_FRAME)?;
        prop_assert_eq!(&whole, &split);
        let ok: Vec<Envelope> = whole.into_iter().map(Result::unwrap).collect();
        prop_assert_eq!(ok, envs);
    }

    // A stream's decoder reuses the names its frames repeat (issue 14):
    // every frame still decodes to exactly what it decodes to alone —
    // the same envelope or the same error — whatever names came before
    // it, valid or not.
    #[test]
    fn c_t_6_frame_decoder_names_reused_decode_as_alone(
        frames in prop::collection::vec((0..NAMES.len(), 0..NAMES.len(), 0..KINDS.len()), 1..12),
    ) {
        let frames: Vec<Vec<u8>> = frames
            .iter()
            .enumerate()
            .map(|(i, &(s, t, k))| named_frame(s, t, k, i))
            .collect();
        let alone: Vec<Result<Envelope, PeerError>> = frames
            .iter()
            .map(|f| {
                let mut body = &f[..];
                let n = prost::encoding::decode_varint(&mut body).unwrap();
                prop_assert_eq!(n as usize, body.len());
                Ok(Envelope::decode(body))
            })
            .collect::<Result<_, TestCaseError>>()?;
        let stream = frames.concat();
        let together = run_frames(&stream, &[], abhyasa_core::wire::DEFAULT_MAX_FRAME)?;
        prop_assert_eq!(together, alone);
    }

    // C-T-6: JSON obligations: typed error or an obligation that
    // round-trips.
    #[test]
    fn c_t_6_obligation_json_never_panics(
        bytes in json_bytes(vec![sample_obligation().to_json()], obligation_object()),
    ) {
        if let Ok(o) = Obligation::from_json(&bytes) {
            let back = Obligation::from_json(o.to_json().as_bytes())
                .map_err(|e| TestCaseError::fail(format!("accepted {o:?}, not its JSON: {e}")))?;
            prop_assert_eq!(back, o);
        }
        let _ = serde_json::from_slice::<Obligation>(&bytes);
    }

    // C-T-6: JSON custody acks.
    #[test]
    fn c_t_6_custody_ack_json_never_panics(
        bytes in json_bytes(
            vec![
                sample_ack(AckStatus::Applied).to_json(),
                sample_ack(AckStatus::Declined).to_json(),
            ],
            ack_object(),
        ),
    ) {
        if let Ok(a) = CustodyAck::from_json(&bytes) {
            prop_assert_eq!(CustodyAck::from_json(a.to_json().as_bytes()).unwrap(), a);
        }
        let _ = serde_json::from_slice::<CustodyAck>(&bytes);
    }

    // C-T-6: JSON kind profiles (AgentCard params), including the AB-2
    // sizing rule on absurd numbers.
    #[test]
    fn c_t_6_kind_profile_json_never_panics(
        bytes in json_bytes(
            vec![json!({
                "kind": "anumati.consent",
                "obligation_endpoint": "https://b.example/abhyasa/obligations",
                "deadline_seconds": 600,
                "max_retries": 64,
                "backoff": "exponential",
                "backoff_base_seconds": 1.0,
                "backoff_cap_seconds": 64
            })
            .to_string()],
            profile_object(),
        ),
    ) {
        if let Ok(m) = parse_object(&bytes) {
            if let Ok(p) = KindProfile::from_json_map(&m) {
                let again = p.to_json_value();
                let back = KindProfile::from_json_map(again.as_object().unwrap())
                    .map_err(|e| TestCaseError::fail(format!("accepted {p:?}, not its JSON: {e}")))?;
                prop_assert_eq!(back, p);
            }
        }
        let _ = serde_json::from_slice::<KindProfile>(&bytes);
    }

    // C-T-6: payload JSON as carried in a protobuf frame.
    #[test]
    fn c_t_6_payload_json_never_panics(
        bytes in json_bytes(
            vec![sample_obligation().payload().canonical_json().to_string()],
            payload(),
        ),
    ) {
        if let Ok(p) = Payload::from_json_bytes(&bytes) {
            let back = Payload::from_json_bytes(p.canonical_json().as_bytes())
                .map_err(|e| TestCaseError::fail(format!("accepted {p:?}, not its canonical form: {e}")))?;
            prop_assert_eq!(back, p);
        }
    }
}

// C-T-6: the samples the mutations start from are valid, so the mutated
// inputs start past the decoders' first checks.
#[test]
fn c_t_6_mutation_seeds_are_valid() {
    for e in sample_envelopes() {
        assert_eq!(Envelope::decode(&e.encode()).unwrap(), e);
    }
    assert!(Obligation::from_json(sample_obligation().to_json().as_bytes()).is_ok());
    assert!(CustodyAck::from_json(sample_ack(AckStatus::Declined).to_json().as_bytes()).is_ok());
}

// C-T-6 regression (found by `c_t_6_custody_ack_json_never_panics`): an
// ack whose `acked_at` RFC 3339 cannot write (a JSON offset that moves it
// before year 0000, or raw protobuf microseconds) is refused naming the
// field, in JSON and in protobuf; accepted, it could not be written back
// (nor kept in a store's reconciliation row).
#[test]
fn c_t_6_ack_times_rfc3339_cannot_write_are_refused() {
    let mut m = sample_ack(AckStatus::Applied).to_json_value();
    m["acked_at"] = json!("0000-01-01T00:00:00+00:01");
    match CustodyAck::from_json(m.to_string().as_bytes()) {
        Err(PeerError::Field(e)) => assert_eq!(e.field, "acked_at"),
        other => panic!("{other:?}"),
    }
    for micros in [
        i64::MAX,
        i64::MIN,
        RFC3339_MAX_MICROS + 1,
        RFC3339_MIN_MICROS - 1,
    ] {
        let mut a = sample_ack(AckStatus::Applied);
        a.acked_at = Timestamp::from_unix_micros(micros);
        let env = Envelope::new(agent("receiver"), Message::Acks(vec![a]));
        match Envelope::decode(&env.encode()) {
            Err(PeerError::Field(e)) => assert_eq!(e.field, "acked_at", "{micros}"),
            other => panic!("{micros}: {other:?}"),
        }
    }
    for micros in [RFC3339_MIN_MICROS, RFC3339_MAX_MICROS] {
        let mut a = sample_ack(AckStatus::Applied);
        a.acked_at = Timestamp::from_unix_micros(micros);
        assert_eq!(CustodyAck::from_json(a.to_json().as_bytes()).unwrap(), a);
    }
}
