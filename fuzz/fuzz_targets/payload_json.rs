//! C-T-6 / C-T-5: a payload's JSON text (as a protobuf frame or a store row
//! carries it): a typed error or a payload whose canonical text decodes
//! back to the same canonical text.
#![no_main]

use abhyasa_core::Payload;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = Payload::from_json_bytes(data) {
        let back = Payload::from_json_bytes(p.canonical_json().as_bytes())
            .expect("canonical text decodes");
        assert_eq!(back.canonical_json(), p.canonical_json());
    }
});
