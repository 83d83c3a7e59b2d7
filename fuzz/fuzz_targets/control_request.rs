//! C-T-6 / C-SD-5: one control-socket request line, as the socket reads
//! it: a typed `bad_request` / `invalid_obligation` refusal or a command
//! that, written back as a request, reads as the same command again.
#![no_main]

use abhyasa_cli::fuzzing::read_control_request;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match read_control_request(data) {
        Ok(None) => {}
        Ok(Some(line)) => {
            assert_eq!(
                read_control_request(line.as_bytes()),
                Ok(Some(line.clone()))
            );
        }
        Err(e) => assert!(
            e.code == "bad_request" || e.code == "invalid_obligation",
            "{e:?}"
        ),
    }
});
