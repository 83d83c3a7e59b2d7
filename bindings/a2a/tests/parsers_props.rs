//! C-T-6: every A2A parser answers arbitrary input with a typed error (or
//! a value) and never panics.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use abhyasa_a2a::message::{requested_extensions, A2aVersion, RpcRequest, SendMessage};
use abhyasa_a2a::{AbhyasaServiceRef, AgentCard, EXTENSION_URI};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

/// Arbitrary JSON values, nested a few levels, with the keys our parsers
/// look for mixed into random ones so the deep paths are reached.
fn value() -> impl Strategy<Value = Value> {
    let keys = prop_oneof![
        Just("message".to_string()),
        Just("metadata".to_string()),
        Just("extensions".to_string()),
        Just(EXTENSION_URI.to_string()),
        Just("obligation_id".to_string()),
        Just("deadline_seconds".to_string()),
        Just("created_at".to_string()),
        Just("supported_kinds".to_string()),
        Just("backoff_cap_seconds".to_string()),
        "[a-z_]{0,8}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        ".{0,12}".prop_map(Value::from),
        Just(Value::from(EXTENSION_URI)),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((keys.clone(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    // C-T-6: raw bytes into every byte-level parser.
    #[test]
    fn c_t_6_arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = RpcRequest::parse(&bytes);
        let _ = AbhyasaServiceRef::from_json(&bytes);
        let _ = serde_json::from_slice::<AgentCard>(&bytes);
        let text = String::from_utf8_lossy(&bytes);
        let _ = A2aVersion::from_header(Some(&text));
        let _ = requested_extensions(&text);
    }

    // C-T-6: arbitrary JSON into the structured parsers, so errors deep in
    // a message or a service ref are reached too.
    #[test]
    fn c_t_6_arbitrary_json_never_panics(v in value(), header in any::<bool>()) {
        if let Value::Object(m) = &v {
            let _ = SendMessage::from_params(m, header);
            let wrapped: Map<String, Value> =
                [("message".to_string(), json!({"metadata": {EXTENSION_URI: v.clone()}, "extensions": [EXTENSION_URI]}))]
                    .into_iter()
                    .collect();
            let _ = SendMessage::from_params(&wrapped, header);
        }
        let _ = AbhyasaServiceRef::from_json_value(&v);
        let _ = AbhyasaServiceRef::from_json_value(&json!({
            "version": "1.0.0", "custody_ack_endpoint": "x", "supported_kinds": [v.clone()]
        }));
        let bytes = serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": v})).unwrap();
        if let Ok(req) = RpcRequest::parse(&bytes) {
            let _ = SendMessage::from_params(&req.params, header);
        }
    }
}
