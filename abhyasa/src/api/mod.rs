//! The public types of the embedding API, apart from [`crate::Node`]
//! itself: options and their builder, errors, events and status views.
//!
//! They live here, not in `node.rs`, so the driver depends on them and not
//! on the handle type: `node.rs` depends on the driver, never the reverse.

mod builder;
mod error;
mod event;
mod options;
mod status;

pub use builder::NodeBuilder;
pub use error::NodeError;
pub use event::{NodeEvent, Outcome};
pub use options::NodeOptions;
pub use status::{CustodianState, StatusView};
