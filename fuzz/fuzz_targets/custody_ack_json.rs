//! C-T-6: `CustodyAck::from_json` over any bytes: a typed error or an ack
//! whose JSON decodes back to it.
#![no_main]

use abhyasa_core::CustodyAck;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(a) = CustodyAck::from_json(data) {
        let back = CustodyAck::from_json(a.to_json().as_bytes()).expect("own JSON decodes");
        assert_eq!(back, a);
    }
    let _ = serde_json::from_slice::<CustodyAck>(data);
});
