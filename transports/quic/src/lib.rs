//! # abhyasa-quic
//!
//! The QUIC transport of Abhyasa, on `quinn` and `rustls` with the `ring`
//! provider (no system dependencies).
//!
//! * **Identity.** Each node has the ECDSA P-256 key and self-signed
//!   certificate of `abhyasa-identity`; peers are pinned by the
//!   certificate's SHA-256 fingerprint, bound to their agent id.
//! * **Mutual TLS 1.3.** The server requires a client certificate; both
//!   sides accept only pinned certificates and still verify the handshake
//!   signatures, so a connection from an unknown or mismatched key is
//!   refused (and logged at `warn`). The authenticated peer of a connection
//!   is the agent pinned to the certificate it presented.
//! * **Framing.** Each side opens one unidirectional stream, writes the
//!   8-byte preamble `abhyasa1`, then length-delimited `Envelope` frames;
//!   the reader runs them through the core's `FrameDecoder` with the
//!   configured frame limit. A connection is reported `Connected` only once
//!   the peer's preamble has arrived: in TLS 1.3 a client completes its
//!   handshake before the server has checked the client certificate, so
//!   this is the client's proof that it was accepted.
//! * **Lossy links.** Keep-alive every 5 s, idle timeout 30 s
//!   ([`DEFAULT_KEEP_ALIVE`], [`DEFAULT_IDLE_TIMEOUT`]); configured peers
//!   are re-dialled with capped exponential backoff. The stateless-reset
//!   key is derived from the node key, so a restarted node resets its
//!   predecessor's connections and peers reconnect at once.
//!
//! * **Enrolment.** [`start_enrollable`] also returns an
//!   [`abhyasa_identity::Enrolment`]: accepted peers can be added and
//!   removed while the endpoint runs (a relay enrolling edges without a
//!   restart); removing one closes its connections.
//!
//! [`start`] returns the common [`abhyasa_transport::Transport`].
#![forbid(unsafe_code)]

mod config;
mod tls;
mod transport;

pub use config::{
    QuicConfig, QuicPeer, DEFAULT_CONNECT_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_KEEP_ALIVE,
};
pub use transport::{start, start_enrollable, start_with_socket, StartError};

#[cfg(test)]
mod tests;
