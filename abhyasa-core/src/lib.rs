//! # abhyasa-core
//!
//! The sans-IO core of Abhyasa, a deliver-or-report protocol for governance
//! obligations between agents: every admissible obligation ends
//! **applied**, **declined**, or **escalated** with a principal-side
//! fail-safe already applied. None is silently lost; none is applied twice.
//!
//! This crate never reads a clock, opens a socket or draws from a global
//! RNG: time comes in as `now` arguments and randomness from seeds in the
//! configuration. See [`agent::Agent`] (one party: custodian, receiver and
//! lease renewals), [`custody::Custodian`] and [`custody::Receiver`] for
//! the polling contracts, and `spec/protocol.md` for the normative rules.
#![forbid(unsafe_code)]

pub mod agent;
pub mod canonical;
pub mod custody;
pub mod error;
pub mod model;
#[cfg(feature = "mutations")]
pub mod mutations;
pub mod polarity;
pub mod principal;
pub mod sharded;
mod splitmix;
pub mod store;
pub mod wire;

/// JSON v1, the other codec; it lives in [`wire::json`], beside the
/// protobuf codec, and keeps its old path here.
pub use wire::json;

/// The hash map of the state machines, the node and the transports. Its
/// keys are mostly ids a peer chooses, so every map is keyed at random
/// (from the OS's randomness at run time) as std's `HashMap` is, against
/// collision flooding (HashDoS), but hashes with aHash instead of
/// SipHash-1-3. A custody transfer makes a few dozen lookups; interleaved
/// against SipHash, custody cost 12.2 against 13.9 µs of CPU
/// per obligation.
pub type Map<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;

pub use sharded::ShardedMap;

// The Rust blocks of the README and the embedding guide run as doctests of
// this crate, so their library examples cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../docs/embedding.md")]
struct EmbeddingGuideDoctests;

pub use error::{FieldError, FieldProblem, OfferError, PeerError, ProfileError};
pub use model::*;

#[cfg(test)]
mod map_tests {
    /// Two maps hash one key differently: the keys are random, so a peer
    /// cannot precompute ids that collide (a fixed-key hasher fails this).
    #[test]
    fn every_map_is_keyed_at_random() {
        let (a, b) = (
            super::Map::<u8, u8>::default(),
            super::Map::<u8, u8>::default(),
        );
        let id = "obligation-7f3a";
        let hash = |m: &super::Map<u8, u8>| std::hash::BuildHasher::hash_one(m.hasher(), id);
        assert_ne!(hash(&a), hash(&b));
    }
}
