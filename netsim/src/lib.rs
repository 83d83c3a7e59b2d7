//! # abhyasa-netsim
//!
//! The partition simulator researchers run to choose deadlines, retry
//! budgets and lease terms, and to check that deliver-or-report holds: every
//! admissible obligation ends applied, declined or escalated (with the
//! fail-safe applied); none is lost silently, none applied twice.
//!
//! Today it runs the **abstract sweep** ([`sweep::run_sweep`], the
//! `abhyasa-sim sweep` command): independent custody transfers, each between
//! a real [`abhyasa_core`] custodian and receiver over a seeded lossy
//! channel, on every core, with every invariant checked on every transfer.
//! Two channel models ([`settings::Model`]):
//!
//! * `core` — the abstract sweep of [`abhyasa_check::sim`]
//!   (`run_sweep_range`), checked by the one invariant checker;
//! * `reference-v1` — the public Python reference harness reproduced draw
//!   for draw ([`mod@reference`], on [`pyrandom::PyRandom`]).
//!
//! Runs are seeded and replayable (a violation prints the seed, the
//! failing transfer and the command that replays it) and shardable
//! ([`shard::Shard`], [`merge`]). Full-stack scenarios run the node
//! runtime under turmoil ([`fullstack`], `abhyasa-sim run`); studies sweep
//! a scenario parameter over them ([`study`], `abhyasa-sim study`).
//!
//! Every model and the full-stack runs are checked by the same rules:
//! each turns what it saw into an [`abhyasa_check::Trace`] and calls
//! [`abhyasa_check::check`] ([`check`] and `fullstack`'s checker are the
//! adapters).
#![forbid(unsafe_code)]

pub mod check;
pub mod cli;
pub mod fullstack;
pub mod merge;
pub mod pyrandom;
pub mod reference;
pub mod settings;
pub mod shard;
pub mod study;
pub mod summary;
pub mod sweep;

pub use settings::{Fault, Model, SweepSettings};
pub use shard::Shard;
pub use summary::SweepSummary;
pub use sweep::{run_sweep, SweepPlan};
