//! # abhyasa-checker
//!
//! An exhaustive, bounded model checker over the **real** `abhyasa-core`
//! state machines: the [`Custodian`](abhyasa_core::custody::Custodian) and
//! the [`Receiver`](abhyasa_core::custody::Receiver) are driven through
//! their polling contracts and composed with
//!
//! * an adversarial network — a multiset of in-flight frames from which
//!   any frame may be delivered (reordering), lost, or duplicated (within a
//!   budget);
//! * crash and restart of either side between any two steps: the durable
//!   state is the fold of the committed records
//!   ([`CustodianSnapshot::apply`](abhyasa_core::custody::CustodianSnapshot::apply),
//!   [`ReceiverSnapshot::apply`](abhyasa_core::custody::ReceiverSnapshot::apply)),
//!   a crash loses the write buffer and all volatile state, and restart
//!   goes through `restore`;
//! * a virtual clock advanced by explicit actions (one second, or straight
//!   to the custodian's next timer), bounded by a horizon;
//! * a receiver applier whose answer (apply / decline / defer) is chosen
//!   nondeterministically, and nondeterministic completion of deferrals.
//!
//! [stateright](https://docs.rs/stateright) explores the state space
//! breadth-first (or depth-first, [`Search`], for configurations whose
//! breadth-first frontier would not fit in memory) and deduplicates on a
//! canonical fingerprint of the composed state (see the `encode` module).
//! Every run reports distinct states, max depth and time ([`CheckReport`]). The properties are those of
//! `tla/Abhyasa.tla` and `tla/AbhyasaCrash.tla`; `tla/README.md` maps each
//! TLA+ action to the Rust function it stands for.
#![forbid(unsafe_code)]

mod checked;
pub mod config;
mod encode;
mod fingerprint;
pub mod hostile;
pub mod model;
pub mod properties;
pub mod run;
pub mod system;
pub mod trace;

pub use config::{CheckConfig, ObligationSpec, Preset, Scope};
pub use model::{AbhyasaModel, Action, Decision};
pub use run::{check, CheckReport, Counterexample, RunOptions, Search};
