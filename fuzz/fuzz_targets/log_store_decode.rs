//! C-SD-5: the log store's decoders over any bytes — a log of either
//! version (the newest and an older one, for a node's open and for a
//! check) and a snapshot (strict and salvaged). Never panics; every error
//! is a typed damage report and every value read lies inside the bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(rule) = abhyasa_store::fuzzing::log_store_decode(data) {
        panic!("{rule}");
    }
});
