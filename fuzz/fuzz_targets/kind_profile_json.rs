//! C-T-6: `KindProfile` JSON (the AgentCard params' per-kind profile,
//! including the AB-2 sizing rule on any numbers): a typed error or a
//! profile whose JSON decodes back to it.
#![no_main]

use abhyasa_core::json::parse_object;
use abhyasa_core::KindProfile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = parse_object(data) {
        if let Ok(p) = KindProfile::from_json_map(&m) {
            let v = p.to_json_value();
            let m = v.as_object().expect("a profile is an object");
            assert_eq!(KindProfile::from_json_map(m).expect("own JSON decodes"), p);
        }
    }
    let _ = serde_json::from_slice::<KindProfile>(data);
});
