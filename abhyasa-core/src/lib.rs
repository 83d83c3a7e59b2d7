//! # abhyasa-core
//!
//! The sans-IO core of Abhyasa, a deliver-or-report protocol for governance
//! obligations between agents: every admissible obligation ends
//! **applied**, **declined**, or **escalated** with a principal-side
//! fail-safe already applied. None is silently lost; none is applied twice.
//!
//! This crate never reads a clock, opens a socket or draws from a global
//! RNG: time comes in as `now` arguments and randomness from seeds in the
//! configuration. See [`custody::Custodian`] and [`custody::Receiver`] for
//! the polling contracts, and `spec/protocol.md` for the normative rules.
#![forbid(unsafe_code)]

pub mod canonical;
pub mod custody;
pub mod error;
pub mod model;
#[cfg(feature = "mutations")]
pub mod mutations;
pub mod polarity;
pub mod principal;
pub mod store;
pub mod wire;

/// JSON v1, the other codec; it lives in [`wire::json`], beside the
/// protobuf codec, and keeps its old path here.
pub use wire::json;

// The README's Rust blocks run as doctests of this crate, so its library
// example cannot drift from the API (issue 11 §6).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

pub use error::{FieldError, FieldProblem, OfferError, PeerError, ProfileError};
pub use model::*;
