//! Subcommands of the `abhyasa` binary.

pub(crate) mod client;
pub(crate) mod demo;
pub(crate) mod init;
pub(crate) mod leases;
pub(crate) mod node;
pub(crate) mod relay;
pub(crate) mod store;
