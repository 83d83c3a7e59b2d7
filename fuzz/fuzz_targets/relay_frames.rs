//! C-T-6 / C-SD-5: relay frames as a relay or an edge reads them (one
//! protobuf envelope: a sealed frame, a relay receipt, pull, pull-done or
//! delivered): a typed error or a message that re-encodes to an equal one.
//! A sealed frame then goes through the destination's checks: the key-free
//! `Sealed::open`, and `Opener::open` with the carried certificate pinned
//! for the claimed origin, so certificate parsing and the ECDSA check run
//! on the fuzzer's bytes. A frame that verifies must stop verifying when
//! its inner envelope changes by one bit.
#![no_main]

use abhyasa_core::wire::{Envelope, Message, SealError};
use abhyasa_identity::{Fingerprint, PeerPin};
use abhyasa_spool::Opener;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(env) = Envelope::decode(data) else {
        return;
    };
    let again = Envelope::decode(&env.encode()).expect("re-encoding decodes");
    assert_eq!(again, env);
    let Message::Relay(relay) = &env.message else {
        return;
    };
    let abhyasa_core::wire::RelayMessage::Sealed(sealed) = relay else {
        return;
    };
    let local = sealed.destination.clone();
    let keyless = sealed.open(&local);
    if let Ok(inner) = &keyless {
        assert_eq!(inner.sender, sealed.origin);
        assert!(!matches!(inner.message, Message::Relay(_)));
    }
    let pin = PeerPin {
        agent: sealed.origin.clone(),
        fingerprint: Fingerprint::of(&sealed.origin_cert),
    };
    let opener = Opener::new(local.clone(), [&pin]);
    match opener.open(sealed) {
        Ok(inner) => {
            assert_eq!(
                Ok(inner),
                keyless,
                "a verified frame opens as the key-free checks open it"
            );
            let mut tampered = (**sealed).clone();
            if let Some(b) = tampered.inner.last_mut() {
                *b ^= 1;
            }
            assert_eq!(
                opener.open(&tampered),
                Err(SealError::BadSignature(sealed.origin.clone())),
                "a changed inner envelope still verified"
            );
        }
        Err(SealError::BadSignature(_)) => {}
        Err(e) => assert_eq!(
            Err(e),
            keyless,
            "only the signature differs from the key-free checks"
        ),
    }
    // Another destination refuses the frame before anything else.
    let elsewhere = abhyasa_core::AgentId::new("elsewhere").expect("valid id");
    if elsewhere != local {
        assert!(matches!(
            sealed.open(&elsewhere),
            Err(SealError::WrongDestination { .. })
        ));
    }
});
