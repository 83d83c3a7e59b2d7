//! C-T-6: `Envelope::decode` over any bytes: a typed error or an envelope
//! that re-encodes to an equal one.
#![no_main]

use abhyasa_core::wire::Envelope;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(env) = Envelope::decode(data) {
        let again = Envelope::decode(&env.encode()).expect("re-encoding decodes");
        assert_eq!(again, env);
    }
});
