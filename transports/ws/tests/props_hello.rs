//! C-T-6: the WebSocket hello's three decoding steps (client reads the
//! challenge, server reads the hello, client reads the welcome) answer any
//! bytes with a value or a typed `HelloError`, never a panic. Inputs are
//! random bytes, the honest messages mutated, and protobuf messages of the
//! hello's shape with arbitrary field values. `fuzz/` has the same steps as
//! a cargo-fuzz target.
#![allow(missing_docs, clippy::unwrap_used)]

use std::sync::OnceLock;

use abhyasa_ws::fuzzing::HelloHarness;
use abhyasa_ws::HelloError;
use proptest::prelude::*;
use prost::Message as _;

/// One harness for every case: key generation is the slow part.
fn harness() -> &'static HelloHarness {
    static H: OnceLock<HelloHarness> = OnceLock::new();
    H.get_or_init(|| HelloHarness::new().expect("harness"))
}

fn cases(default: u32) -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A message with every field of the hello's three messages (challenge,
/// hello and welcome share tags 1-5 with compatible wire types only in
/// part, which is the point: each step reads the others' shapes too).
#[derive(Clone, PartialEq, prost::Message)]
struct AnyHello {
    #[prost(uint32, tag = "1")]
    version: u32,
    #[prost(string, tag = "2")]
    agent: String,
    #[prost(bytes = "vec", tag = "3")]
    nonce: Vec<u8>,
    #[prost(bytes = "vec", tag = "4")]
    cert: Vec<u8>,
    #[prost(bytes = "vec", tag = "5")]
    signature: Vec<u8>,
}

fn shaped() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![Just(1u32), Just(0), any::<u32>()],
        prop_oneof![
            Just("client".to_string()),
            Just("server".to_string()),
            Just(String::new()),
            ".{0,8}"
        ],
        prop_oneof![
            prop::collection::vec(any::<u8>(), 32),
            prop::collection::vec(any::<u8>(), 0..40)
        ],
        prop::collection::vec(any::<u8>(), 0..80),
        prop::collection::vec(any::<u8>(), 0..80),
    )
        .prop_map(|(version, agent, nonce, cert, signature)| {
            AnyHello {
                version,
                agent,
                nonce,
                cert,
                signature,
            }
            .encode_to_vec()
        })
}

fn mutated() -> impl Strategy<Value = Vec<u8>> {
    (
        0..3usize,
        prop::collection::vec((any::<usize>(), any::<u8>(), 0..3u8), 1..5),
        any::<usize>(),
    )
        .prop_map(|(which, edits, cut)| {
            let mut b = harness().valid_messages()[which].to_vec();
            for (i, v, op) in edits {
                if b.is_empty() {
                    b.push(v);
                    continue;
                }
                let i = i % b.len();
                match op {
                    0 => b[i] ^= v | 1,
                    1 => b.insert(i, v),
                    _ => {
                        b.remove(i);
                    }
                }
            }
            if cut % 4 == 0 && !b.is_empty() {
                b.truncate(cut % b.len());
            }
            b
        })
}

fn input() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..200),
        2 => shaped(),
        3 => mutated(),
    ]
}

/// Every error is one of the typed, peer-fault answers.
fn typed(e: &HelloError) -> Result<(), TestCaseError> {
    prop_assert!(
        !matches!(e, HelloError::Local(_) | HelloError::Closed(_)),
        "peer bytes produced a non-peer error: {e}"
    );
    Ok(())
}

proptest! {
    #![proptest_config(cases(256))]

    // C-T-6: no hello step panics on any bytes; errors are the peer's.
    #[test]
    fn c_t_6_ws_hello_decoders_never_panic(bytes in input()) {
        let h = harness();
        if let Err(e) = h.client_reads_challenge(&bytes) {
            typed(&e)?;
        }
        match h.server_reads_hello(&bytes) {
            // Only the honest client's signature over this nonce passes.
            Ok(who) => prop_assert_eq!(who.as_str(), "client"),
            Err(e) => typed(&e)?,
        }
        if let Err(e) = h.client_reads_welcome(&bytes) {
            typed(&e)?;
        }
    }
}

// The seeds are the honest exchange: each step accepts its own message,
// so mutations start past the first checks.
#[test]
fn c_t_6_ws_hello_seeds_are_accepted() {
    let h = harness();
    let [challenge, hello, welcome] = h.valid_messages();
    h.client_reads_challenge(challenge).unwrap();
    assert_eq!(h.server_reads_hello(hello).unwrap().as_str(), "client");
    h.client_reads_welcome(welcome).unwrap();
    assert!(h.server_reads_hello(welcome).is_err());
}
