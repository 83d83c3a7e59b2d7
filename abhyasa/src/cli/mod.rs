//! Subcommands of the `abhyasa` binary.

pub(crate) mod demo;
