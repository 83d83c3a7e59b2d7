//! # abhyasa-ws
//!
//! The WebSocket transport of Abhyasa, on `tokio-tungstenite`, for peers
//! behind HTTP infrastructure.
//!
//! * **Authentication.** After the upgrade, a signed hello binds each end
//!   to the agent id pinned for its key (the node identity of
//!   `abhyasa-identity`): the server issues a nonce, each side signs a
//!   transcript of both nonces and both agent ids with its ECDSA P-256 key,
//!   and the other checks the certificate against the pin and the signature
//!   against the certificate. An unknown agent, a mismatched key or a bad
//!   signature is refused (close code 1008) and logged; no frame is
//!   accepted before the hello. See the [`HelloError`] variants, and the
//!   scope note on `ws://` in the `hello` module docs: across untrusted
//!   networks prefer QUIC or put TLS underneath.
//! * **Framing.** One length-delimited `Envelope` frame per binary message,
//!   run through the core's frame decoder with the configured limit; a
//!   text message, a truncated frame or trailing bytes are reported as
//!   `Malformed` and the connection goes on.
//! * **Liveness.** A ping every 5 s, idle timeout 30 s
//!   ([`DEFAULT_KEEP_ALIVE`], [`DEFAULT_IDLE_TIMEOUT`]); peers with a URL
//!   are re-dialled with capped exponential backoff.
//!
//! * **Enrolment.** [`start_enrollable`] also returns an
//!   [`abhyasa_identity::Enrolment`]: accepted peers are added and removed
//!   while the transport runs, and an unenrolled peer's connections close.
//!
//! [`start`] returns the common [`abhyasa_transport::Transport`].
#![forbid(unsafe_code)]

mod config;
// Not a stable API: the hello decoders for property tests and fuzz targets.
#[doc(hidden)]
pub mod fuzzing;
mod hello;
mod transport;

pub use config::{
    WsConfig, WsPeer, DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_KEEP_ALIVE,
};
pub use hello::HelloError;
pub use transport::{
    start, start_enrollable, start_with_io, BoxedIo, IoFuture, IoStream, StartError, StreamIo,
};

#[cfg(test)]
mod tests;
