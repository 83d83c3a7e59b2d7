//! C-A2A-1: the AgentCard extension entry builds and parses; an absent
//! entry is none; other URIs are skipped; the manifest's params schema
//! equals the schema derived from the live types.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use abhyasa_a2a::card::{agent_card, kind_profile, params_schema, AgentExtension};
use abhyasa_a2a::{AbhyasaServiceRef, AgentCard, EXTENSION_URI};
use abhyasa_core::{Kind, KindProfile, RetryBackoff};
use serde_json::{json, Value};

fn spec(path: &str) -> Value {
    let p = format!("{}/../../spec/{path}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&p).expect(&p)).unwrap()
}

fn profile(kind: &str) -> KindProfile {
    KindProfile {
        kind: Kind::new(kind).unwrap(),
        obligation_endpoint: "http://127.0.0.1:1/abhyasa/obligations".into(),
        deadline_seconds: 3600,
        max_retries: 70,
        backoff: "exponential".into(),
        backoff_base_seconds: 1.0,
        backoff_cap_seconds: 64,
    }
}

fn service() -> AbhyasaServiceRef {
    AbhyasaServiceRef::new(
        "http://127.0.0.1:1/abhyasa/custody_ack",
        vec![profile("anumati.consent"), profile("oauth.token")],
    )
    .unwrap()
}

// C-A2A-1: our card's entry round-trips through JSON and parses back.
#[test]
fn c_a2a_1_entry_builds_and_parses() {
    let s = service();
    let card = agent_card("bob", "http://127.0.0.1:1", &s);
    let text = serde_json::to_string(&card).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let ext = &v["capabilities"]["extensions"][0];
    assert_eq!(ext["uri"], json!(EXTENSION_URI));
    assert_eq!(ext["required"], json!(false));
    assert!(ext["description"].is_string());
    assert_eq!(ext["params"]["version"], json!("1.0.0"));
    // Required A2A 1.0 card fields are present.
    for f in [
        "name",
        "description",
        "supportedInterfaces",
        "version",
        "capabilities",
        "defaultInputModes",
        "defaultOutputModes",
        "skills",
    ] {
        assert!(v.get(f).is_some(), "card lacks {f}");
    }
    assert_eq!(
        v["supportedInterfaces"][0]["protocolBinding"],
        json!("JSONRPC")
    );
    assert_eq!(
        v["supportedInterfaces"][1]["protocolBinding"],
        json!("HTTP+JSON")
    );
    assert_eq!(
        v["securitySchemes"]["abhyasa_bearer"]["httpAuthSecurityScheme"]["scheme"],
        json!("Bearer")
    );
    let back: AgentCard = serde_json::from_str(&text).unwrap();
    assert_eq!(back, card);
    assert_eq!(AbhyasaServiceRef::from_card(&back).unwrap(), Some(s));
}

// C-A2A-1: absent entry is none; other URIs are skipped, even before ours.
#[test]
fn c_a2a_1_absent_none_other_uris_skipped() {
    assert_eq!(AbhyasaServiceRef::from_extensions(&[]).unwrap(), None);
    let other = AgentExtension {
        uri: "https://example.com/other/v1".into(),
        description: None,
        required: true,
        params: Some(json!({"version": 7})),
    };
    assert_eq!(
        AbhyasaServiceRef::from_extensions(std::slice::from_ref(&other)).unwrap(),
        None
    );
    let ours = service().to_extension("x");
    assert_eq!(
        AbhyasaServiceRef::from_extensions(&[other, ours]).unwrap(),
        Some(service())
    );
}

// C-A2A-1 / C-T-3: a v1 peer's params (defaults omitted, extra fields)
// parse; a present entry that cannot be honored is an error, not "none".
#[test]
fn c_a2a_1_v1_params_parse_and_bad_ones_name_the_field() {
    let v1 = json!({
        "version": "1.0.0",
        "custody_ack_endpoint": "https://a.example/abhyasa/custody_ack",
        "x-extra": true,
        "supported_kinds": [{
            "kind": "phala.belief_update",
            "obligation_endpoint": "https://a.example/abhyasa/obligations",
            "deadline_seconds": 86400,
            "max_retries": 1400,
            "backoff_cap_seconds": 64,
            "extra": [1, 2]
        }]
    });
    let r = AbhyasaServiceRef::from_json_value(&v1).unwrap();
    assert_eq!(r.supported_kinds[0].backoff, "exponential");
    assert_eq!(r.supported_kinds[0].backoff_base_seconds, 1.0);

    let mut few = v1.clone();
    few["supported_kinds"][0]["max_retries"] = json!(3);
    let e = AbhyasaServiceRef::from_json_value(&few).unwrap_err();
    assert!(e.to_string().contains("max_retries >= "), "{e}");
    assert_eq!(e.field(), "supported_kinds[0].max_retries");

    let mut float = v1.clone();
    float["supported_kinds"][0]["deadline_seconds"] = json!(86400.0);
    let e = AbhyasaServiceRef::from_json_value(&float).unwrap_err();
    assert_eq!(e.field(), "supported_kinds[0].deadline_seconds");

    let mut empty = v1.clone();
    empty["supported_kinds"] = json!([]);
    assert_eq!(
        AbhyasaServiceRef::from_json_value(&empty)
            .unwrap_err()
            .field(),
        "supported_kinds"
    );
    let mut missing = v1;
    missing
        .as_object_mut()
        .unwrap()
        .remove("custody_ack_endpoint");
    assert_eq!(
        AbhyasaServiceRef::from_json_value(&missing)
            .unwrap_err()
            .field(),
        "custody_ack_endpoint"
    );
    let bad = AgentExtension {
        uri: EXTENSION_URI.into(),
        description: None,
        required: false,
        params: None,
    };
    assert!(AbhyasaServiceRef::from_extensions(&[bad]).is_err());
}

// C-A2A-1: spec/manifest.json's params schema equals the schema derived
// from the live types, and both equal the published v1 schema.
#[test]
fn c_a2a_1_manifest_schema_equals_live_types() {
    let derived = params_schema();
    let ours = spec("manifest.json");
    assert_eq!(ours["extension"]["uri"], json!(EXTENSION_URI));
    assert_eq!(
        ours["agent_card_payload_schema"],
        derived,
        "spec/manifest.json is stale: derived schema is\n{}",
        serde_json::to_string_pretty(&derived).unwrap()
    );
    let published = spec("schemas/abhyasa-v1-manifest.json");
    assert_eq!(published["agent_card_payload_schema"], derived);
}

// The card never advertises a profile that fails its own AB-2 check,
// whatever the backoff (the `abhyasa card` bug: a 1.5 s cap).
#[test]
fn advertised_profile_passes_its_own_sizing_check() {
    for cap_ms in [300u64, 1000, 1500, 2500, 64_000, 90_500] {
        for base_ms in [100u64, 250, 1000] {
            let b = RetryBackoff {
                base: Duration::from_millis(base_ms),
                cap: Duration::from_millis(cap_ms),
                jitter: 0.1,
            };
            let p = kind_profile(Kind::new("anumati.consent").unwrap(), "http://h/x", 600, &b)
                .unwrap_or_else(|e| panic!("cap {cap_ms} ms base {base_ms} ms: {e}"));
            assert_eq!(p.backoff_cap_seconds, (cap_ms / 1000).max(1));
            // Enough retries for the real (sub-second-precision) schedule too.
            let real =
                abhyasa_core::min_retries_to_span(600, b.base.as_secs_f64(), b.cap.as_secs_f64());
            assert!(
                p.max_retries > real,
                "cap {cap_ms}: {} <= {real}",
                p.max_retries
            );
        }
    }
}
