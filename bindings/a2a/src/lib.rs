//! # abhyasa-a2a
//!
//! Abhyasa over A2A (spec 1.0, with 0.3 compatibility):
//!
//! * [`card`]: the AgentCard subset and our extension entry in
//!   `capabilities.extensions[]` under [`EXTENSION_URI`], whose `params`
//!   are the v1 [`AbhyasaServiceRef`]; its JSON Schema
//!   ([`card::params_schema`]) is derived from the live types and equals
//!   the published v1 manifest (`spec/manifest.json`).
//! * [`message`]: JSON-RPC `SendMessage` / `message/send` with the
//!   obligation in `message.metadata[<URI>]` and the ack in the reply's
//!   metadata.
//! * [`transport`]: the HTTP binding (axum) as a node transport: the card,
//!   JSON-RPC, HTTP+JSON `POST /message:send`, and the v1 endpoints
//!   `POST /abhyasa/obligations` / `POST /abhyasa/custody_ack`, every
//!   request bound to a peer by its pinned client certificate (mutual
//!   TLS, the node identities QUIC uses) or its bearer credential
//!   (C-A2A-3); [`client`] is the pinned HTTPS client it POSTs with. Feature
//!   `http` (default); without it only the card and message types build.
#![forbid(unsafe_code)]

pub mod card;
#[cfg(feature = "http")]
pub mod client;
pub mod message;
#[cfg(feature = "http")]
mod server;
#[cfg(feature = "http")]
mod state;
#[cfg(feature = "http")]
pub mod transport;

pub use card::{AbhyasaServiceRef, AgentCard, AgentExtension, EXTENSION_URI};
#[cfg(feature = "http")]
pub use transport::{start, HttpConfig, HttpError, HttpPeer, HttpServer, HttpStats};
