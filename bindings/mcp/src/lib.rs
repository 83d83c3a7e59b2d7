//! # abhyasa-mcp
//!
//! Abhyasa over the Model Context Protocol:
//!
//! - [`envelope`]: the custody envelope under the `_meta` key
//!   `io.github.ravikiran438/abhyasa` (obligation in, ack out).
//! - [`guard`]: envelope before request (C-MCP-1), a layer around any rmcp
//!   server that applies the envelope through a durable Abhyasa receiver
//!   before the tool call runs, and refuses the call when the envelope
//!   withdrew the authority the tool needs.
//! - [`server`]: the `abhyasa mcp` stdio server (the v1 reference server's
//!   tools, plus tools that drive a running node over its control socket).
//!
//! A server without Abhyasa ignores `_meta` and never acks: the custodian
//! handles that by its schedule (retries, then escalation with the
//! fail-safe applied), exactly as for an unreachable peer.
#![forbid(unsafe_code)]

pub mod control;
pub mod envelope;
pub mod guard;
pub mod server;
pub mod tools;

pub use envelope::{Envelope, EnvelopeError, EnvelopeReply, ENVELOPE_KEY};
pub use guard::{GuardError, GuardReceiver, Guarded, ToolPolicy};
pub use server::{McpArgs, ReferenceServer};
