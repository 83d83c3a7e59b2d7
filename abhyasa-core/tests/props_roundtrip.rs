//! C-T-5: arbitrary obligations round-trip exactly through JSON v1 and
//! protobuf (envelope and frame stream) with the same digest, or the
//! builder refuses them with a typed error naming the field; plus the
//! literal cases of issue 10 as regressions.
//!
//! Case counts are bounded for `cargo test`; set `PROPTEST_CASES` for a
//! heavier local run (e.g. `PROPTEST_CASES=20000 cargo test -p abhyasa-core
//! --test props_roundtrip --release`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use abhyasa_core::wire::{Envelope, FrameDecoder, Message};
use abhyasa_core::{AgentId, FieldProblem, Obligation, PeerError, Timestamp, MAX_ID_BYTES};
use abhyasa_testkit::props::*;
use bytes::BytesMut;
use proptest::prelude::*;
use rand::SeedableRng as _;
use serde_json::{json, Map, Value};

fn sender() -> AgentId {
    AgentId::new("custodian").unwrap()
}

/// Every exact round trip of one accepted obligation: JSON text (with and
/// without our `digest`), serde, the canonical payload text, protobuf
/// envelope. Fails (without panicking, so shrinking stays quiet) on the
/// first difference.
fn round_trips(o: &Obligation) -> Result<(), TestCaseError> {
    let canonical = o.payload().canonical_json().to_string();

    let text = o.to_json();
    let back = Obligation::from_json(text.as_bytes()).map_err(|e| {
        TestCaseError::fail(format!(
            "JSON round trip of {o:?} failed: {e}\ntext: {text}"
        ))
    })?;
    prop_assert_eq!(&back, o, "JSON round trip changed the obligation");
    prop_assert_eq!(back.digest(), o.digest());
    prop_assert_eq!(back.payload().canonical_json(), &canonical);

    // A v1 peer's JSON has no digest: we compute the same one.
    let v1 = Value::Object(o.v1_object()).to_string();
    let back = Obligation::from_json(v1.as_bytes())
        .map_err(|e| TestCaseError::fail(format!("v1 JSON of {o:?} failed: {e}\ntext: {v1}")))?;
    prop_assert_eq!(back.digest(), o.digest(), "v1 JSON digest differs");
    prop_assert_eq!(&back, o);

    // Re-reading our own canonical payload text (what the protobuf frame
    // and the stores carry) gives the same canonical text.
    let payload = abhyasa_core::Payload::from_json_bytes(canonical.as_bytes()).map_err(|e| {
        TestCaseError::fail(format!(
            "canonical payload {canonical} does not re-read: {e}"
        ))
    })?;
    prop_assert_eq!(payload.canonical_json(), &canonical);

    // What a store restores from that text and the stored digest, without
    // parsing or hashing (issue 14), is the same obligation, and its
    // fields, parsed on first read, are the original ones.
    let mut b = Obligation::builder()
        .id(o.id().as_str())
        .kind(o.kind().as_str())
        .target(o.target().as_str())
        .deadline_seconds(o.deadline_seconds() as i64)
        .max_retries(i64::from(o.max_retries()))
        .created_at(o.created_at());
    if let Some(s) = o.sequence() {
        b = b.sequence(s.0);
    }
    let stored = b
        .build_stored(canonical.clone(), o.digest())
        .map_err(|e| TestCaseError::fail(format!("stored rebuild of {o:?} failed: {e}")))?;
    prop_assert_eq!(&stored, o);
    prop_assert_eq!(stored.payload().as_map(), o.payload().as_map());
    prop_assert_eq!(stored.to_json(), o.to_json());

    let serde_text = serde_json::to_string(o).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let back: Obligation = serde_json::from_str(&serde_text)
        .map_err(|e| TestCaseError::fail(format!("serde round trip of {o:?} failed: {e}")))?;
    prop_assert_eq!(&back, o);

    let env = Envelope::new(sender(), Message::Obligation(o.clone()));
    prop_assert_eq!(
        Envelope::obligation_len(&sender(), o),
        env.encode().len(),
        "the counted frame size differs from the encoded one"
    );
    let (framed, len) = env.encode_length_delimited();
    let body = env.encode();
    let mut prefixed = Vec::new();
    prost::encoding::encode_varint(body.len() as u64, &mut prefixed);
    prefixed.extend_from_slice(&body);
    prop_assert_eq!(len, body.len());
    prop_assert_eq!(framed, prefixed, "the length-delimited frame differs");
    let decoded = Envelope::decode(&env.encode())
        .map_err(|e| TestCaseError::fail(format!("protobuf round trip of {o:?} failed: {e}")))?;
    prop_assert_eq!(&decoded, &env, "protobuf round trip changed the envelope");
    match decoded.message {
        Message::Obligation(d) => {
            prop_assert_eq!(d.digest(), o.digest());
            prop_assert_eq!(d.payload().canonical_json(), &canonical);
        }
        other => return Err(TestCaseError::fail(format!("decoded {other:?}"))),
    }
    Ok(())
}

/// `round_trips` for the plain regression tests.
fn assert_round_trips(o: &Obligation) {
    if let Err(e) = round_trips(o) {
        panic!("{e}");
    }
}

/// Scalars the builder must accept (so a refusal has to be the payload's).
fn scalars_valid(s: &Spec) -> bool {
    let id_ok = |x: &str| {
        !x.is_empty()
            && x.trim() == x
            && x.len() <= MAX_ID_BYTES
            && !x.chars().any(char::is_control)
    };
    id_ok(&s.id)
        && id_ok(&s.kind)
        && id_ok(&s.target)
        && (1..=abhyasa_core::MAX_DEADLINE_SECONDS as i64).contains(&s.deadline_seconds)
        && (0..=i64::from(abhyasa_core::MAX_RETRIES_LIMIT)).contains(&s.max_retries)
        && created_at_in_range(s.created_at)
}

/// A refusal is allowed only where the rules allow one, and names the
/// field: a bad scalar, an oversize payload, or an integer literal past
/// ±(2^53-1) (doubles, and integers inside the range, are always held).
fn refusal_is_allowed(s: &Spec, e: &abhyasa_core::FieldError) -> Result<(), TestCaseError> {
    prop_assert!(!e.field.is_empty(), "refusal names no field: {}", e);
    if !scalars_valid(s) {
        return Ok(());
    }
    if e.field == "payload" && matches!(e.problem, FieldProblem::TooLong { .. }) {
        return Ok(());
    }
    let wide = wide_integer_paths(&s.payload);
    prop_assert!(
        wide.contains(&e.field),
        "refused {} but the only refusable numbers are at {:?}; payload {:?}",
        e,
        wide,
        s.payload
    );
    Ok(())
}

proptest! {
    #![proptest_config(config(256))]

    // C-T-5: JSON, serde and protobuf round trips are exact for every
    // obligation the builder accepts; every refusal is typed and allowed.
    #[test]
    fn c_t_5_arbitrary_obligations_round_trip_or_are_refused(s in spec()) {
        match s.build() {
            Ok(o) => round_trips(&o)?,
            Err(e) => refusal_is_allowed(&s, &e)?,
        }
    }

    // C-T-5: a v1 peer writing created_at in another offset form, case or
    // fractional-digit count (the same instant) gets the same digest,
    // with or without our digest field.
    #[test]
    fn c_t_5_equal_offset_forms_give_the_same_digest(
        s in spec(),
        form in rfc3339_form(),
        keep_digest in any::<bool>(),
    ) {
        let Ok(o) = s.build() else { return Ok(()) };
        let Some(written) = form.write(o.created_at()) else { return Ok(()) };
        let mut m: Map<String, Value> = match o.to_json_value() {
            Value::Object(m) => m,
            other => panic!("{other:?}"),
        };
        m.insert("created_at".into(), Value::from(written.clone()));
        if !keep_digest {
            m.remove("digest");
        }
        let text = Value::Object(m).to_string();
        let back = Obligation::from_json(text.as_bytes()).map_err(|e| {
            TestCaseError::fail(format!("created_at {written:?} refused: {e}"))
        })?;
        prop_assert_eq!(back.created_at(), o.created_at(), "{}", written);
        prop_assert_eq!(back.digest(), o.digest(), "{}", written);
    }

    // C-T-5: a stream of frames split at arbitrary points decodes to the
    // same envelopes, in order.
    #[test]
    fn c_t_5_frame_stream_reassembles_any_chunking(
        specs in prop::collection::vec(spec(), 1..6),
        cuts in prop::collection::vec(1usize..64, 0..40),
    ) {
        let sent: Vec<Envelope> = specs
            .iter()
            .filter_map(|s| s.build().ok())
            .map(|o| Envelope::new(sender(), Message::Obligation(o)))
            .collect();
        let mut stream = Vec::new();
        for e in &sent {
            e.encode_frame(&mut stream);
        }
        let mut dec = FrameDecoder::default();
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        let mut rest = &stream[..];
        let mut cuts = cuts.into_iter();
        while !rest.is_empty() {
            let n = cuts.next().unwrap_or(rest.len()).min(rest.len());
            buf.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
            while let Some(r) = dec.decode(&mut buf) {
                got.push(r.map_err(|e| TestCaseError::fail(format!("frame refused: {e}")))?);
            }
        }
        prop_assert!(buf.is_empty());
        prop_assert_eq!(got, sent);
    }
}

fn phala(delta: Value) -> Obligation {
    Obligation::builder()
        .id("issue-10")
        .kind("phala.belief_update")
        .target("receiver")
        .payload(json!({"weight_delta": delta, "weight_key": "w"}))
        .deadline_seconds(600)
        .max_retries(64)
        .created_at(Timestamp::from_unix_seconds(1_780_000_000))
        .build()
        .unwrap_or_else(|e| panic!("weight_delta {delta} refused: {e}"))
}

/// A v1 JSON obligation with `payload_text` verbatim (the number literal
/// exactly as a peer would write it).
fn v1_text(payload_text: &str) -> String {
    format!(
        r#"{{"obligation_id":"issue-10","kind":"phala.belief_update","target":"receiver","payload":{payload_text},"deadline_seconds":600,"max_retries":64,"created_at":"2026-05-28T20:26:40Z"}}"#
    )
}

// C-T-5 regression (issue 10 §1): ordinary payload floats that failed
// their own JSON and protobuf round trip with DigestMismatch.
#[test]
fn c_t_5_issue_10_floats_round_trip() {
    for (x, canonical) in [
        (-0.962_504_341_558_015_1, "-0.9625043415580151"),
        (-0.930_144_576_425_381_1, "-0.9301445764253811"),
        (-0.422_897_051_382_501_33, "-0.42289705138250133"),
        (-0.019_825_152_507_417_898, "-0.019825152507417898"),
        (9_007_199_254_740_991.0, "9007199254740991"),
        (123_456_789_012_345_680_000.0, "123456789012345680000"),
    ] {
        let o = phala(json!(x));
        assert_eq!(
            o.payload().canonical_json(),
            format!(r#"{{"weight_delta":{canonical},"weight_key":"w"}}"#)
        );
        assert_round_trips(&o);
    }
}

// C-T-5 regression (issue 10 §1): payload doubles at or past 2^53, whose
// canonical form is an integer literal outside ±(2^53-1), were accepted
// at offer and then undecodable.
#[test]
fn c_t_5_issue_10_doubles_past_2_pow_53_round_trip() {
    for (x, canonical) in [
        (1e16, "10000000000000000"),
        (9_007_199_254_740_992.0, "9007199254740992"),
        (-1e16, "-10000000000000000"),
    ] {
        let o = Obligation::builder()
            .id("issue-10")
            .kind("custom.kind")
            .target("receiver")
            .payload(json!({ "ttl": x }))
            .deadline_seconds(600)
            .max_retries(64)
            .created_at(Timestamp::from_unix_seconds(1_780_000_000))
            .build()
            .unwrap_or_else(|e| panic!("ttl {x} refused: {e}"));
        assert_eq!(
            o.payload().canonical_json(),
            format!(r#"{{"ttl":{canonical}}}"#)
        );
        assert_round_trips(&o);
    }
}

// C-T-5 regression: the same literals written by a peer as JSON text (in
// exponent, fraction and integer form) parse, and round-trip.
#[test]
fn c_t_5_issue_10_literals_from_json_text_round_trip() {
    for lit in [
        "-0.9625043415580151",
        "-0.9301445764253811",
        "-0.42289705138250133",
        "-0.019825152507417898",
        "9007199254740991.0",
        "123456789012345680000.0",
        "1e16",
        "9007199254740992.0",
        "-1e16",
        "10000000000000000",
    ] {
        let text = v1_text(&format!(r#"{{"weight_delta":{lit},"weight_key":"w"}}"#));
        let o =
            Obligation::from_json(text.as_bytes()).unwrap_or_else(|e| panic!("{lit} refused: {e}"));
        let want: f64 = lit.parse().unwrap();
        assert_eq!(
            o.payload().get("weight_delta").and_then(Value::as_f64),
            Some(want),
            "{lit} read back as another number"
        );
        assert_round_trips(&o);
    }
}

// C-T-5: an integer literal past ±(2^53-1) that no double holds exactly is
// refused when built, naming its field path; it is never accepted and
// then undecodable.
#[test]
fn c_t_5_inexact_wide_integers_are_refused_naming_the_path() {
    for n in [
        json!(9_007_199_254_740_993u64),
        json!(-9_007_199_254_740_993i64),
        json!(u64::MAX),
        json!(i64::MAX),
    ] {
        let e = Obligation::builder()
            .id("issue-10")
            .kind("custom.kind")
            .target("receiver")
            .payload(json!({ "a": { "b": [0, n] } }))
            .deadline_seconds(600)
            .max_retries(64)
            .created_at(Timestamp::from_unix_seconds(1_780_000_000))
            .build()
            .expect_err("an inexact wide integer must be refused");
        assert_eq!(e.field, "payload.a.b[1]", "{e}");
        assert!(matches!(e.problem, FieldProblem::OutOfRange { .. }), "{e}");
        // The same through the peer-facing JSON parser.
        let text = v1_text(&format!(r#"{{"ttl":{n}}}"#));
        match Obligation::from_json(text.as_bytes()) {
            Err(PeerError::Field(e)) => assert_eq!(e.field, "payload.ttl"),
            other => panic!("{n}: {other:?}"),
        }
    }
}

// C-T-5 regression: one payload of 2,100 random doubles (the issue's
// sample had 267 read back one ulp off) round-trips exactly.
#[test]
fn c_t_5_issue_10_many_random_floats_in_one_payload() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(10);
    let mut m = Map::new();
    for i in 0..2100 {
        let x: f64 = rng.random_range(-1.0..1.0) * 10f64.powi(rng.random_range(-30..30));
        m.insert(format!("k{i:04}"), json!(x));
    }
    let o = Obligation::builder()
        .id("issue-10")
        .kind("custom.kind")
        .target("receiver")
        .payload(Value::Object(m))
        .deadline_seconds(600)
        .max_retries(64)
        .created_at(Timestamp::from_unix_seconds(1_780_000_000))
        .build()
        .unwrap();
    assert_round_trips(&o);
}

// The properties above are not vacuous: most generated specs build (a
// generator that the builder always refused would pass them trivially).
#[test]
fn c_t_5_most_generated_obligations_are_accepted() {
    use proptest::strategy::ValueTree as _;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = spec();
    let (mut built, total) = (0, 400);
    for _ in 0..total {
        let s = strategy.new_tree(&mut runner).unwrap().current();
        built += usize::from(s.build().is_ok());
    }
    assert!(built * 2 > total, "only {built} of {total} specs built");
}

// C-T-5 (found by `c_t_5_arbitrary_obligations_round_trip_or_are_refused`):
// a double in [2^53, 2^64) whose shortest form ends in zeros it does not
// hold exactly. 2^60 is written `1152921504606847000` (RFC 8785), an
// integer literal no double equals (2^60 = 1152921504606846976); the
// builder accepts the double, so reading that literal back must give the
// same double, not a refusal ("only if exactly a double").
#[test]
fn c_t_5_doubles_written_as_inexact_integer_literals_round_trip() {
    for (x, canonical) in [
        (2f64.powi(60), "1152921504606847000"),
        (-(2f64.powi(60)), "-1152921504606847000"),
        (2f64.powi(63), "9223372036854776000"),
        (-(2f64.powi(62)), "-4611686018427388000"),
    ] {
        let o = Obligation::builder()
            .id("issue-10")
            .kind("custom.kind")
            .target("receiver")
            .payload(json!({ "x": x }))
            .deadline_seconds(600)
            .max_retries(64)
            .created_at(Timestamp::from_unix_seconds(1_780_000_000))
            .build()
            .unwrap_or_else(|e| panic!("{x} refused: {e}"));
        assert_eq!(
            o.payload().canonical_json(),
            format!(r#"{{"x":{canonical}}}"#)
        );
        assert_round_trips(&o);
    }
}
