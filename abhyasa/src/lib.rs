//! # abhyasa
//!
//! The Abhyasa node: one tokio process per agent hosting the sans-IO
//! custodian and receiver of [`abhyasa_core`], a durable store, and a
//! transport. Embed it with [`Node::open`]; run it with the `abhyasa` CLI.
//!
//! The driver feeds inputs to the state machines, arms one timer for the
//! next timeout, commits the records they emit as one group commit on a
//! store thread (many obligations per fsync), and only then releases the
//! transmits, acks and events that depend on them.
#![forbid(unsafe_code)]

pub mod applier;
pub mod clock;
pub mod compaction;
mod driver;
mod gate;
pub mod leases;
pub mod metrics;
mod node;
mod store_thread;

pub use applier::{AsyncApplier, AsyncApplierHandle};
pub use compaction::{CompactionPolicy, CompactionReport};
pub use node::{Node, NodeError, NodeEvent, NodeOptions, Outcome, StatusView};
