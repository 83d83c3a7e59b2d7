//! C-T-6: the WebSocket hello's three reading steps (challenge, hello,
//! welcome) over any bytes: a typed `HelloError` of the peer's fault, never
//! a panic; only the honest client authenticates.
#![no_main]

use std::sync::OnceLock;

use abhyasa_ws::fuzzing::HelloHarness;
use abhyasa_ws::HelloError;
use libfuzzer_sys::fuzz_target;

fn harness() -> &'static HelloHarness {
    static H: OnceLock<HelloHarness> = OnceLock::new();
    H.get_or_init(|| HelloHarness::new().expect("harness"))
}

fn peer_fault(r: Result<(), HelloError>) {
    if let Err(e) = r {
        assert!(
            !matches!(e, HelloError::Local(_) | HelloError::Closed(_)),
            "peer bytes produced a local error: {e}"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let h = harness();
    peer_fault(h.client_reads_challenge(data));
    peer_fault(
        h.server_reads_hello(data)
            .map(|who| assert_eq!(who.as_str(), "client")),
    );
    peer_fault(h.client_reads_welcome(data));
});
