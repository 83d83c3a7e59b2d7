//! C-T-6 / C-SD-5: the bodies the A2A HTTP binding reads from a peer: the
//! JSON-RPC request (`SendMessage` / `message/send`, its obligation in
//! `message.metadata`), the HTTP+JSON `message:send` body, the
//! `/abhyasa/obligations` body, the AgentCard's Abhyasa extension params,
//! and the `A2A-Version` / `A2A-Extensions` headers. A typed error or a
//! value that reads back the same; the header only ever widens what is
//! accepted.
#![no_main]

use abhyasa_a2a::card::AbhyasaServiceRef;
use abhyasa_a2a::message::{requested_extensions, A2aVersion, RpcRequest, SendMessage};
use abhyasa_core::Obligation;
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};

fn send_message(params: &Map<String, Value>) {
    let listed = SendMessage::from_params(params, false);
    let active = SendMessage::from_params(params, true);
    if let Ok(sm) = &listed {
        assert_eq!(
            Ok(sm),
            active.as_ref(),
            "the header changed an accepted message"
        );
    }
    if let Ok(sm) = active {
        let back =
            Obligation::from_json(sm.obligation.to_json().as_bytes()).expect("own JSON decodes");
        assert_eq!(back, sm.obligation);
    }
}

fuzz_target!(|data: &[u8]| {
    match RpcRequest::parse(data) {
        Ok(req) => {
            assert!(matches!(
                req.id,
                Value::String(_) | Value::Number(_) | Value::Null
            ));
            send_message(&req.params);
        }
        Err((id, _)) => {
            assert!(matches!(
                id,
                Value::String(_) | Value::Number(_) | Value::Null
            ));
        }
    }
    if let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(data) {
        send_message(&m);
    }
    if let Ok(ob) = Obligation::from_json(data) {
        let back = Obligation::from_json(ob.to_json().as_bytes()).expect("own JSON decodes");
        assert_eq!(back, ob);
    }
    if let Ok(r) = AbhyasaServiceRef::from_json(data) {
        let back =
            AbhyasaServiceRef::from_json_value(&r.to_json_value()).expect("own JSON decodes");
        assert_eq!(back, r);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = A2aVersion::from_header(Some(text));
        for uri in requested_extensions(text) {
            assert!(!uri.is_empty() && !uri.contains(','), "{uri:?}");
        }
    }
});
