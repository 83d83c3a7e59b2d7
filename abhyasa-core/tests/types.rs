//! Types and input: round-trips, digest vectors, strict parsing, v1 interop,
//! typed errors for bad frames (C-T-1..4).

#![allow(clippy::unwrap_used)]

mod common;

use abhyasa_core::wire::{Envelope, ErrorCode, FrameDecoder, Message, ProtocolError, StatusReply};
use abhyasa_core::{
    AckStatus, AgentId, CustodyAck, DeclineReason, FieldProblem, KindProfile, Obligation,
    ObligationId, PeerError, ProfileError, Timestamp,
};
use bytes::BytesMut;
use common::*;
use serde_json::{json, Value};

fn vectors() -> Vec<Value> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../spec/vectors/digests.json"
    ))
    .expect("spec/vectors/digests.json");
    let v: Value = serde_json::from_str(&text).expect("vector file is JSON");
    v["vectors"].as_array().expect("vectors array").clone()
}

// C-T-1: digests are stable: the Python-generated vectors match.
#[test]
fn c_t_1_digest_vectors_match() {
    let vs = vectors();
    assert!(vs.len() >= 6);
    for v in vs {
        let ob = Obligation::from_json(v["obligation"].to_string().as_bytes())
            .unwrap_or_else(|e| panic!("{}: {e}", v["name"]));
        let mut canon = String::new();
        abhyasa_core::canonical::write_object(&ob.v1_object(), &mut canon);
        assert_eq!(canon, v["canonical"].as_str().unwrap(), "{}", v["name"]);
        assert_eq!(
            ob.digest().to_hex(),
            v["digest"].as_str().unwrap(),
            "{}",
            v["name"]
        );
    }
}

// C-T-1: Obligation round-trips through protobuf and JSON unchanged.
#[test]
fn c_t_1_obligation_round_trips_json_and_protobuf() {
    for v in vectors() {
        let ob = Obligation::from_json(v["obligation"].to_string().as_bytes()).unwrap();
        let json = ob.to_json();
        let back = Obligation::from_json(json.as_bytes()).unwrap();
        assert_eq!(back, ob);
        assert_eq!(back.digest(), ob.digest());
        let env = Envelope::new(agent("custodian"), Message::Obligation(ob.clone()));
        let decoded = Envelope::decode(&env.encode()).unwrap();
        assert_eq!(decoded, env);
        // serde goes through the same strict path.
        let via_serde: Obligation =
            serde_json::from_str(&serde_json::to_string(&ob).unwrap()).unwrap();
        assert_eq!(via_serde, ob);
    }
}

#[test]
fn c_t_1_acks_and_other_messages_round_trip() {
    let id = ObligationId::new("ob-1").unwrap();
    let ob = revoke("ob-1", "s");
    let mut a1 = CustodyAck::new(
        id.clone(),
        agent("receiver"),
        AckStatus::Applied,
        at(1.0),
        Some(ob.digest()),
    );
    a1.receiver_instance = Some("r-1".into());
    let mut a2 = CustodyAck::declined(
        ObligationId::new("ob-2").unwrap(),
        agent("receiver"),
        at(2.0),
        Some(ob.digest()),
        DeclineReason::Superseded,
        Some("newer".into()),
    );
    a2.receiver_instance = Some("r-1".into());
    for m in [
        Message::Acks(vec![a1.clone(), a2.clone()]),
        Message::StatusQuery(vec![id.clone()]),
        Message::StatusReply(StatusReply {
            target: agent("receiver"),
            known: vec![a1.clone()],
            unknown: vec![id.clone()],
        }),
        Message::Error(ProtocolError {
            code: ErrorCode::InvalidObligation,
            obligation_id: Some(id.clone()),
            digest: Some(ob.digest()),
            message: "no".into(),
        }),
    ] {
        let env = Envelope::new(agent("receiver"), m);
        assert_eq!(Envelope::decode(&env.encode()).unwrap(), env);
    }
    for a in [a1, a2] {
        assert_eq!(CustodyAck::from_json(a.to_json().as_bytes()).unwrap(), a);
    }
}

fn base_json() -> Value {
    json!({
        "obligation_id": "ob-1", "kind": "anumati.consent", "target": "agent-b",
        "payload": {"decision": "revoke", "scope": "email.read"},
        "deadline_seconds": 600, "max_retries": 64, "created_at": "2026-06-09T12:00:00Z"
    })
}

fn field_error(v: Value) -> (String, FieldProblem) {
    match Obligation::from_json(v.to_string().as_bytes()) {
        Err(PeerError::Field(f)) => (f.field, f.problem),
        other => panic!("expected a field error for {v}, got {other:?}"),
    }
}

// C-T-2: strict parsing: each bad input is a typed error naming the field.
#[test]
fn c_t_2_strict_json_names_the_field() {
    let cases: Vec<(&str, Value, &str)> = vec![
        ("deadline_seconds", json!("600"), "deadline_seconds"),
        ("deadline_seconds", json!(true), "deadline_seconds"),
        ("deadline_seconds", json!(0), "deadline_seconds"),
        ("deadline_seconds", json!(-1), "deadline_seconds"),
        ("deadline_seconds", json!(600.5), "deadline_seconds"),
        ("max_retries", json!(2.0), "max_retries"),
        ("max_retries", json!(-3), "max_retries"),
        ("max_retries", json!(1_000_000_000u64), "max_retries"),
        ("created_at", json!("2026-06-09T12:00:00"), "created_at"),
        ("created_at", json!(1717934400), "created_at"),
        ("obligation_id", json!(""), "obligation_id"),
        ("obligation_id", json!(" ob-1"), "obligation_id"),
        ("obligation_id", json!("ob-1 "), "obligation_id"),
        ("target", json!(""), "target"),
        ("kind", json!(7), "kind"),
        ("payload", json!([1, 2]), "payload"),
        ("sequence", json!(-1), "sequence"),
        ("sequence", json!("3"), "sequence"),
    ];
    for (field, value, named) in cases {
        let mut v = base_json();
        v[field] = value.clone();
        let (f, p) = field_error(v);
        assert_eq!(f, named, "{field} = {value}: {p}");
    }
    for missing in [
        "obligation_id",
        "kind",
        "target",
        "deadline_seconds",
        "max_retries",
        "created_at",
    ] {
        let mut v = base_json();
        v.as_object_mut().unwrap().remove(missing);
        assert_eq!(field_error(v), (missing.to_string(), FieldProblem::Missing));
    }
    // Oversize payload.
    let mut v = base_json();
    v["payload"]["blob"] = json!("x".repeat(70_000));
    assert!(matches!(field_error(v).1, FieldProblem::TooLong { .. }));
    // Malformed JSON and oversize documents.
    assert!(matches!(
        Obligation::from_json(b"{\"obligation_id\": "),
        Err(PeerError::Malformed { format: "json", .. })
    ));
    assert!(matches!(
        Obligation::from_json(&vec![b' '; 300_000]),
        Err(PeerError::FrameTooLarge { .. })
    ));
    // A digest that does not match the content.
    let mut v = base_json();
    v["digest"] = json!("00".repeat(32));
    assert!(matches!(
        Obligation::from_json(v.to_string().as_bytes()),
        Err(PeerError::DigestMismatch { .. })
    ));
    // Error messages name the field.
    let mut v = base_json();
    v["deadline_seconds"] = json!("600");
    let msg = Obligation::from_json(v.to_string().as_bytes())
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("deadline_seconds") && msg.contains("expected integer, found string"),
        "{msg}"
    );
}

#[test]
fn c_t_2_strict_ack_json() {
    let ok = json!({"obligation_id": "ob-1", "target": "agent-b", "status": "applied", "acked_at": "2026-06-09T12:00:01Z"});
    assert!(CustodyAck::from_json(ok.to_string().as_bytes()).is_ok());
    let bad = |k: &str, v: Value| {
        let mut j = ok.clone();
        j[k] = v;
        match CustodyAck::from_json(j.to_string().as_bytes()) {
            Err(PeerError::Field(f)) => f.field,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(bad("status", json!("APPLIED")), "status");
    assert_eq!(bad("status", json!("received")), "status");
    assert_eq!(bad("acked_at", json!("2026-06-09 12:00:01")), "acked_at");
    assert_eq!(bad("reason", json!("because")), "reason");
    assert_eq!(bad("reason", json!("policy")), "reason"); // reason with status applied
    assert_eq!(bad("digest", json!("abc")), "digest");
    assert_eq!(bad("target", json!("  ")), "target");
}

// C-T-3: JSON produced by a v1 peer (extra fields ignored) parses; our JSON
// parses under the v1 schema.
#[test]
fn c_t_3_v1_peer_json_parses_and_ours_satisfies_v1() {
    // As the v1 reference emits it (pydantic model_dump_json): Python
    // isoformat timestamps, null sequence, extra fields from a newer peer.
    let peer = r#"{"obligation_id":"bu-17","kind":"phala.belief_update","target":"agent-b",
        "payload":{"weight_delta":-0.4,"update_id":"bu-17"},"deadline_seconds":600,
        "max_retries":64,"created_at":"2026-06-09T12:00:00.123456+00:00","sequence":null,
        "x_vendor_trace":"abc","priority":3}"#;
    let ob = Obligation::from_json(peer.as_bytes()).unwrap();
    assert_eq!(ob.id().as_str(), "bu-17");
    assert_eq!(ob.sequence(), None);
    let ack = r#"{"obligation_id":"bu-17","target":"agent-b","status":"deferred","acked_at":"2026-06-09T12:00:01.5+00:00","extra":1}"#;
    assert_eq!(
        CustodyAck::from_json(ack.as_bytes()).unwrap().status,
        AckStatus::Deferred
    );

    // Our JSON satisfies the v1 Obligation model: the v1 fields with their
    // v1 types and constraints; our additions are extra fields.
    let ours: Value = serde_json::from_str(&ob.to_json()).unwrap();
    let o = ours.as_object().unwrap();
    for (k, ty) in [
        ("obligation_id", "string"),
        ("kind", "string"),
        ("target", "string"),
        ("created_at", "string"),
    ] {
        assert!(
            o[k].is_string() && !o[k].as_str().unwrap().is_empty(),
            "{k} must be a non-empty {ty}"
        );
    }
    assert!(o["payload"].is_object());
    assert!(o["deadline_seconds"].as_u64().unwrap() > 0);
    assert!(o["max_retries"].is_u64());
    assert!(o.get("sequence").is_none_or(|s| s.is_u64()));
    let ack = CustodyAck::new(
        ob.id().clone(),
        agent("agent-b"),
        AckStatus::Applied,
        at(0.0),
        Some(ob.digest()),
    );
    let a: Value = serde_json::from_str(&ack.to_json()).unwrap();
    assert_eq!(a["status"], "applied");
    for k in ["obligation_id", "target", "status", "acked_at"] {
        assert!(a[k].is_string(), "{k}");
    }
}

/// Checks a JSON value against the subset of JSON Schema the v1 manifest
/// uses (type, required, properties, $ref, minLength, minimum,
/// exclusiveMinimum, minItems, items). Returns the first violation.
fn check_schema(v: &Value, schema: &Value, defs: &Value, path: &str) -> Result<(), String> {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let name = r.trim_start_matches("#/$defs/");
        return check_schema(v, &defs[name], defs, path);
    }
    if let Some(t) = schema.get("type").and_then(Value::as_str) {
        let ok = match t {
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            _ => true,
        };
        if !ok {
            return Err(format!("{path}: expected {t}, got {v}"));
        }
    }
    if let (Some(min), Some(s)) = (schema.get("minLength").and_then(Value::as_u64), v.as_str()) {
        if (s.chars().count() as u64) < min {
            return Err(format!("{path}: shorter than {min}"));
        }
    }
    if let (Some(min), Some(n)) = (
        schema.get("exclusiveMinimum").and_then(Value::as_f64),
        v.as_f64(),
    ) {
        if n <= min {
            return Err(format!("{path}: must be > {min}"));
        }
    }
    if let (Some(min), Some(n)) = (schema.get("minimum").and_then(Value::as_f64), v.as_f64()) {
        if n < min {
            return Err(format!("{path}: must be >= {min}"));
        }
    }
    if let Some(req) = schema.get("required").and_then(Value::as_array) {
        for r in req {
            let r = r.as_str().unwrap_or_default();
            if v.get(r).is_none() {
                return Err(format!("{path}: missing {r}"));
            }
        }
    }
    if let (Some(props), Some(obj)) = (
        schema.get("properties").and_then(Value::as_object),
        v.as_object(),
    ) {
        for (k, s) in props {
            if let Some(x) = obj.get(k) {
                check_schema(x, s, defs, &format!("{path}.{k}"))?;
            }
        }
    }
    if let (Some(items), Some(arr)) = (schema.get("items"), v.as_array()) {
        if let Some(min) = schema.get("minItems").and_then(Value::as_u64) {
            if (arr.len() as u64) < min {
                return Err(format!("{path}: fewer than {min} items"));
            }
        }
        for (i, x) in arr.iter().enumerate() {
            check_schema(x, items, defs, &format!("{path}[{i}]"))?;
        }
    }
    Ok(())
}

// C-T-3: our KindProfile JSON validates under the published v1 schema, and
// a v1 peer's profile parses here.
#[test]
fn c_t_3_kind_profile_matches_published_v1_schema() {
    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shared/reference/abhyasa-v1-manifest.json"
        ))
        .or_else(|_| {
            std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../spec/schemas/abhyasa-v1-manifest.json"
            ))
        })
        .expect("v1 manifest"),
    )
    .unwrap();
    let schema = &manifest["agent_card_payload_schema"];
    let defs = &schema["$defs"];
    let peer = json!({"kind": "phala.belief_update", "obligation_endpoint": "https://b.example/abhyasa/obligations",
        "deadline_seconds": 86400, "max_retries": 2000, "backoff_cap_seconds": 300, "future_field": true});
    check_schema(&peer, &defs["KindProfile"], defs, "peer").unwrap();
    let p = KindProfile::from_json_map(peer.as_object().unwrap()).unwrap();
    assert_eq!(p.backoff, "exponential");
    assert_eq!(p.backoff_base_seconds, 1.0);
    let ours = p.to_json_value();
    check_schema(&ours, &defs["KindProfile"], defs, "ours").unwrap();
    let service = json!({"version": "1.0.0", "custody_ack_endpoint": "https://a.example/abhyasa/acks", "supported_kinds": [ours]});
    check_schema(&service, schema, defs, "service").unwrap();
    // The checker is not vacuous.
    assert!(check_schema(&json!({"kind": ""}), &defs["KindProfile"], defs, "x").is_err());
}

// C-AC-4: an incoherent profile is rejected naming the minimum; a coherent
// one is accepted.
#[test]
fn c_ac_4_kind_profile_sizing_rule() {
    let incoherent = json!({"kind": "anumati.consent", "obligation_endpoint": "https://x", "deadline_seconds": 86400,
        "max_retries": 6, "backoff_cap_seconds": 64});
    match KindProfile::from_json_map(incoherent.as_object().unwrap()) {
        Err(ProfileError::RetriesTooFew { minimum, .. }) => assert_eq!(minimum, 1356),
        other => panic!("{other:?}"),
    }
    let msg = KindProfile::from_json_map(incoherent.as_object().unwrap())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("set max_retries >= 1356"), "{msg}");
    let coherent = json!({"kind": "anumati.consent", "obligation_endpoint": "https://x", "deadline_seconds": 86400,
        "max_retries": 1356, "backoff_cap_seconds": 64});
    assert!(KindProfile::from_json_map(coherent.as_object().unwrap()).is_ok());
    let bad_backoff = json!({"kind": "k", "obligation_endpoint": "https://x", "deadline_seconds": 10,
        "max_retries": 10, "backoff_cap_seconds": 1, "backoff": "linear"});
    assert!(
        matches!(KindProfile::from_json_map(bad_backoff.as_object().unwrap()), Err(ProfileError::Field(f)) if f.field == "backoff")
    );
}

fn frame(env: &Envelope) -> Vec<u8> {
    let mut b = Vec::new();
    env.encode_frame(&mut b);
    b
}

/// An envelope with an arbitrary version and body field number, hand-encoded.
fn raw_envelope(version: u32, body_field: u32) -> Vec<u8> {
    let mut inner = Vec::new();
    // field 1 (version), varint
    prost::encoding::encode_varint(8, &mut inner);
    prost::encoding::encode_varint(u64::from(version), &mut inner);
    // field 2 (sender), length-delimited "peer"
    prost::encoding::encode_varint(18, &mut inner);
    prost::encoding::encode_varint(4, &mut inner);
    inner.extend_from_slice(b"peer");
    // body field, length-delimited empty message
    prost::encoding::encode_varint(u64::from(body_field << 3 | 2), &mut inner);
    prost::encoding::encode_varint(0, &mut inner);
    let mut out = Vec::new();
    prost::encoding::encode_varint(inner.len() as u64, &mut out);
    out.extend(inner);
    out
}

// C-T-4: unknown protocol version or message type: typed error, the stream
// survives, nothing accepted is lost.
#[test]
fn c_t_4_unknown_version_and_type_are_typed_and_the_stream_survives() {
    let good = Envelope::new(agent("custodian"), Message::Obligation(revoke("ob-1", "s")));
    let mut buf = BytesMut::new();
    buf.extend_from_slice(&frame(&good));
    buf.extend_from_slice(&raw_envelope(2, 10));
    buf.extend_from_slice(&raw_envelope(1, 99));
    buf.extend_from_slice(&[3, 0xff, 0xff, 0xff]); // three bytes of garbage
    buf.extend_from_slice(&frame(&good));
    let mut dec = FrameDecoder::default();
    let got: Vec<_> = std::iter::from_fn(|| dec.decode(&mut buf)).collect();
    assert_eq!(got.len(), 5);
    assert_eq!(got[0].as_ref().unwrap(), &good);
    assert_eq!(
        got[1],
        Err(PeerError::UnsupportedVersion {
            found: 2,
            supported: 1
        })
    );
    assert_eq!(got[2], Err(PeerError::UnknownMessageType));
    assert!(matches!(got[3], Err(PeerError::Malformed { .. })));
    assert_eq!(got[4].as_ref().unwrap(), &good, "the stream survives");
    assert_eq!(
        got[1].clone().unwrap_err().code(),
        ErrorCode::UnsupportedVersion
    );
    assert_eq!(
        got[2].clone().unwrap_err().code(),
        ErrorCode::UnknownMessageType
    );
}

// C-T-2: frames over the limit, partial frames, bad enum values and ids.
#[test]
fn c_t_2_bad_frames_are_typed_errors() {
    let good = Envelope::new(agent("custodian"), Message::Obligation(revoke("ob-1", "s")));
    let bytes = frame(&good);
    // Oversize: rejected from the length prefix, skipped as it streams in.
    let mut dec = FrameDecoder::new(64);
    let mut buf = BytesMut::from(&bytes[..40]);
    assert!(matches!(
        dec.decode(&mut buf),
        Some(Err(PeerError::FrameTooLarge { max: 64, .. }))
    ));
    buf.extend_from_slice(&bytes[40..]);
    assert!(
        dec.decode(&mut buf).is_none(),
        "rest of the oversize frame skipped"
    );
    let small = Envelope::new(
        agent("c"),
        Message::StatusQuery(vec![ObligationId::new("a").unwrap()]),
    );
    buf.extend_from_slice(&frame(&small));
    assert_eq!(dec.decode(&mut buf).unwrap().unwrap(), small);
    // Partial frame: needs more bytes.
    let mut dec = FrameDecoder::default();
    let mut buf = BytesMut::from(&bytes[..bytes.len() - 1]);
    assert!(dec.decode(&mut buf).is_none());
    buf.extend_from_slice(&bytes[bytes.len() - 1..]);
    assert!(dec.decode(&mut buf).unwrap().is_ok());
    // Empty sender, empty ack member list, unknown status value.
    let mut ack = CustodyAck::new(
        ObligationId::new("a").unwrap(),
        agent("r"),
        AckStatus::Applied,
        Timestamp::EPOCH,
        None,
    );
    ack.status = AckStatus::Deferred;
    let env = Envelope::new(agent("r"), Message::Acks(vec![ack]));
    let mut raw = env.encode();
    // Flip the status varint (3 = deferred) to 9 (unknown).
    let pos = raw.iter().rposition(|b| *b == 3).unwrap();
    raw[pos] = 9;
    match Envelope::decode(&raw) {
        Err(PeerError::Field(f)) => assert_eq!(f.field, "status"),
        other => panic!("{other:?}"),
    }
    let empty_acks = Envelope::new(agent("r"), Message::Acks(vec![]));
    assert!(
        matches!(Envelope::decode(&empty_acks.encode()), Err(PeerError::Field(f)) if f.field == "members")
    );
    assert!(matches!(
        Envelope::decode(&[0xff, 0xff]),
        Err(PeerError::Malformed { .. })
    ));
    // An empty frame has no version: malformed, not "version 0".
    assert!(matches!(
        Envelope::decode(&[]),
        Err(PeerError::Malformed { .. })
    ));
    let _ = AgentId::new("x");
}
