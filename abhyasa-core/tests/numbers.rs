//! Issue 10 regressions (C-T-5): numbers round-trip exactly through JSON
//! and protobuf, and the one rule for payload numbers is applied when an
//! obligation is built, so nothing accepted can later fail to decode.
#![allow(missing_docs, clippy::unwrap_used)]

use abhyasa_core::wire::{Envelope, Message};
use abhyasa_core::{payload_number, AgentId, FieldProblem, Obligation, Timestamp};
use serde_json::{json, Number, Value};

fn phala(payload: Value) -> Result<Obligation, abhyasa_core::FieldError> {
    Obligation::builder()
        .id("ob-num")
        .kind("phala.belief_update")
        .target("bob")
        .payload(payload)
        .deadline_seconds(600)
        .max_retries(64)
        .created_at(Timestamp::from_unix_seconds(1_780_000_000))
        .build()
}

fn assert_round_trips(ob: &Obligation) {
    let back = Obligation::from_json(ob.to_json().as_bytes())
        .unwrap_or_else(|e| panic!("JSON round trip of {}: {e}", ob.to_json()));
    assert_eq!(back.digest(), ob.digest());
    assert_eq!(back, *ob);
    let env = Envelope::new(
        AgentId::new("alice").unwrap(),
        Message::Obligation(ob.clone()),
    );
    let decoded = Envelope::decode(&env.encode())
        .unwrap_or_else(|e| panic!("protobuf round trip of {ob:?}: {e}"));
    assert_eq!(decoded, env);
    // The canonical text parses back to the very payload it was made from.
    let reparsed: Value = serde_json::from_str(ob.payload().canonical_json()).unwrap();
    assert_eq!(
        phala(reparsed).unwrap().payload().canonical_json(),
        ob.payload().canonical_json()
    );
}

// C-T-5: the Phala deltas the adversarial suite found failed their own
// round trip with `DigestMismatch` (serde_json without float_roundtrip).
#[test]
fn c_t_5_phala_deltas_from_the_issue_round_trip() {
    for d in [
        -0.9625043415580151,
        -0.9301445764253811,
        -0.42289705138250133,
        -0.019825152507417898,
    ] {
        let ob = phala(json!({"weight_delta": d, "weight_key": "w"})).unwrap();
        assert_round_trips(&ob);
        let back = Obligation::from_json(ob.to_json().as_bytes()).unwrap();
        assert_eq!(back.payload().get("weight_delta"), Some(&json!(d)));
    }
}

// C-T-5: floats serde_json used to misread, and integral doubles at or
// above 2^53, whose canonical form is an integer beyond the safe range,
// are accepted and round-trip (before, protobuf decode and store loads
// failed with "payload.ttl out of range").
#[test]
fn c_t_5_large_and_integral_doubles_round_trip() {
    for x in [
        9007199254740991.0,
        123456789012345680000.0,
        1e16,
        9007199254740992.0,
        -1e16,
        1e21,
        -1.7976931348623157e308,
        5e-324,
        -0.0,
    ] {
        let ob = phala(json!({"weight_delta": -0.5, "weight_key": "w", "ttl": x})).unwrap();
        assert_round_trips(&ob);
    }
    // Integer and double spellings of one value are one payload.
    let a = phala(json!({"weight_delta": -0.5, "weight_key": "w", "ttl": 1e16})).unwrap();
    let b =
        phala(json!({"weight_delta": -0.5, "weight_key": "w", "ttl": 10_000_000_000_000_000u64}))
            .unwrap();
    assert_eq!(a.digest(), b.digest());
    assert_eq!(a.payload().canonical_json(), b.payload().canonical_json());
}

// The one rule: finite doubles; an integer beyond ±(2^53-1) only if it is
// exactly a double. Anything else is refused when the obligation is built,
// with a typed error naming the field.
#[test]
fn c_t_5_inexact_integers_are_refused_at_build_naming_the_field() {
    for n in [
        json!(9_007_199_254_740_993u64),
        json!(u64::MAX),
        json!(-9_007_199_254_740_993i64),
        json!(i64::MAX),
    ] {
        let e = phala(json!({"weight_delta": -0.5, "weight_key": "w", "nested": [{"n": n}]}))
            .unwrap_err();
        assert_eq!(e.field, "payload.nested[0].n", "{n}");
        assert!(matches!(e.problem, FieldProblem::OutOfRange { .. }), "{n}");
    }
    // The canonical (shortest) spelling of 2^60, as JCS writes it, names
    // that double too (found by the C-T-6 payload property test: the
    // canonical text of 2^60 used to be refused when read back).
    let two_60 = Number::from_f64((1u64 << 60) as f64);
    assert_eq!(
        payload_number(&Number::from(1_152_921_504_606_847_000u64)),
        two_60
    );
    let ob = phala(json!({"weight_delta": -0.5, "weight_key": "w", "big": (1u64 << 60) as f64}))
        .unwrap();
    assert_eq!(
        ob.payload().canonical_json(),
        r#"{"big":1152921504606847000,"weight_delta":-0.5,"weight_key":"w"}"#
    );
    assert_round_trips(&ob);
    // An exact one is held as the double it is.
    assert_eq!(
        payload_number(&Number::from(1u64 << 60)),
        Number::from_f64((1u64 << 60) as f64)
    );
    assert_eq!(
        payload_number(&Number::from(i64::MIN)),
        Number::from_f64(i64::MIN as f64)
    );
    assert_eq!(
        payload_number(&Number::from_f64(2.0).unwrap()),
        Some(Number::from(2))
    );
    assert_eq!(
        payload_number(&Number::from_f64(-0.0).unwrap()),
        Some(Number::from(0))
    );
}

// A JSON peer's text with a big integer literal that is exactly a double
// parses to the same obligation as ours.
#[test]
fn c_t_5_a_peer_integer_literal_beyond_2_pow_53_parses_exactly() {
    let ob = phala(json!({"weight_delta": -0.5, "weight_key": "w", "ttl": 1e16})).unwrap();
    let text = ob.to_json().replace("1e+16", "10000000000000000");
    assert!(text.contains("\"ttl\":10000000000000000"), "{text}");
    let back = Obligation::from_json(text.as_bytes()).unwrap();
    assert_eq!(back.digest(), ob.digest());
}

// Timestamps are numbers too: one that RFC 3339 cannot write (or whose
// deadline it cannot) is refused at build, not accepted and then
// unreadable from JSON.
#[test]
fn c_t_5_created_at_stays_within_rfc3339() {
    for us in [i64::MAX, i64::MIN, Timestamp::RFC3339_MAX.unix_micros()] {
        let e = Obligation::builder()
            .id("t")
            .kind("anumati.consent")
            .target("bob")
            .deadline_seconds(60)
            .max_retries(10)
            .created_at(Timestamp::from_unix_micros(us))
            .build()
            .unwrap_err();
        assert_eq!(e.field, "created_at");
    }
    let ob = Obligation::builder()
        .id("t")
        .kind("anumati.consent")
        .target("bob")
        .deadline_seconds(60)
        .max_retries(10)
        .created_at(Timestamp::RFC3339_MIN)
        .build()
        .unwrap();
    assert_round_trips_any(&ob);
}

fn assert_round_trips_any(ob: &Obligation) {
    let back = Obligation::from_json(ob.to_json().as_bytes()).unwrap();
    assert_eq!(back, *ob);
    let env = Envelope::new(
        AgentId::new("alice").unwrap(),
        Message::Obligation(ob.clone()),
    );
    assert_eq!(Envelope::decode(&env.encode()).unwrap(), env);
}
