//! # abhyasa-check
//!
//! The one checker of Abhyasa's invariants, and the seeded abstract sweep
//! that feeds it.
//!
//! * [`trace`]: the ground-truth record of what happened — offers with
//!   their deadlines and admissibility, every application by a receiver's
//!   applier and every committed `applied` ledger record, each custodian
//!   terminal event (discharged, declined, escalated with its fail-safe
//!   outcome), principal-side writes and weights.
//! * [`check()`]: reads a [`Trace`] and returns typed [`Violation`]s, each
//!   naming the invariant it breaks ([`Invariant`]: AC-1, AB-1..AB-4,
//!   declined ≠ applied, deadlines, supersession, withdrawn authority
//!   stays withdrawn, issuers apart).
//! * [`sim`]: one custodian, one receiver and a seeded lossy channel in
//!   virtual time — the deliver-or-report sweep (C-DOR-1..3) and the engine
//!   of `abhyasa-sim sweep`'s core model — whose every transfer is checked
//!   by [`check()`].
//!
//! Every driver of the protocol (this sweep, netsim's reference-v1 driver
//! and its full-stack simulator) turns what it saw into a [`Trace`] and
//! calls the same [`check()`], so a rule holds or fails the same way
//! everywhere. The harness lives here, not in `abhyasa-core`, so the
//! sans-IO core's public API is the protocol only.
#![forbid(unsafe_code)]

pub mod checker;
pub mod sim;
pub mod trace;

pub use checker::{check, Invariant, Violation};
pub use trace::{
    Application, AppliedByApplier, AuthorityWrite, Key, Offer, Outcome, PrincipalProbe,
    PrincipalSequence, Terminal, Trace,
};
