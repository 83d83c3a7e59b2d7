//! # abhyasa-transport
//!
//! The one transport abstraction of Abhyasa, shared by QUIC
//! (`abhyasa-quic`), WebSocket (`abhyasa-ws`) and the in-memory test
//! network in [`mem`].
//!
//! A transport is started from its config (an ordinary `async fn` of the
//! transport crate, no async traits) and yields a [`Transport`]:
//!
//! * a cloneable [`TransportHandle`] whose [`send`](TransportHandle::send)
//!   encodes an [`Envelope`](abhyasa_core::wire::Envelope) and queues it on
//!   the live connection to a peer **without blocking**; a full queue, an
//!   unknown or unconnected peer, an oversize frame are typed
//!   [`SendError`]s;
//! * a bounded `mpsc` receiver of [`Incoming`] items: frames tagged with the
//!   **authenticated** peer, malformed or unauthorized frames (the
//!   connection stays up), connection state changes.
//!
//! Transports never claim delivery. A queued frame may still be lost with
//! its connection; the custody layer owns retries (AB-2) and a receiver's
//! ack is the only evidence of application. Links to configured peers are
//! re-dialled with capped exponential backoff ([`Backoff`]).
//!
//! Transport crates build on [`link`]: a [`link::Registry`] keeps the peer
//! table behind the handle, hands each authenticated connection a
//! [`link::Link`] (outbound queue + [`link::InboundSink`] that runs the
//! [`FrameDecoder`](abhyasa_core::wire::FrameDecoder) and the sender
//! binding check), and runs dial loops.
//!
//! A node that reaches some peers over one transport and others over
//! another (QUIC and the A2A HTTP binding) combines them with
//! [`routed::compose`] into one [`Transport`] that routes by peer.
#![forbid(unsafe_code)]

mod backoff;
mod config;
mod handle;
mod incoming;
pub mod limit;
pub mod link;
pub mod mem;
pub mod routed;
mod stats;

pub use backoff::{Backoff, BackoffSchedule};
pub use config::LinkConfig;
pub use handle::{Router, SendError, Transport, TransportHandle};
pub use incoming::Incoming;
pub use stats::TransportStats;
