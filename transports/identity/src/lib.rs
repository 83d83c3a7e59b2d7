//! # abhyasa-identity
//!
//! Who a node is and whom it trusts, shared by every transport (QUIC,
//! WebSocket, the relay, the A2A binding's HTTPS).
//!
//! * **Identity.** Each node has an ECDSA P-256 key and a self-signed
//!   certificate ([`generate_identity`], PEM files on [`Identity`]; the key
//!   file is written owner-only and never overwritten). The key signs
//!   ([`Identity::sign`]); [`verify_signature`] checks a signature against
//!   a certificate.
//! * **Pins.** Peers are pinned by the certificate's SHA-256
//!   [`Fingerprint`], bound to their agent id ([`PeerPin`]); a [`PinSet`]
//!   refuses a key bound to two agents, an agent bound to two keys and a
//!   pin naming the node itself ([`PinError`]).
//! * **Enrolment.** [`LivePins`] change while a transport runs;
//!   [`Enrolment`] changes them together with the transport's peer table
//!   (a relay enrolling edges without a restart).
//! * **Pinned TLS.** rustls configurations (TLS 1.3, ring) whose verifiers
//!   trust exactly the pinned certificates and still check the handshake
//!   signatures: [`pinned_server_tls`], [`live_pinned_server_tls`],
//!   [`dangerous_pinned_client_tls`].
#![forbid(unsafe_code)]

mod enrol;
mod identity;
mod pin;
mod tls;
mod verify;

pub use enrol::{Enrolment, LivePins};
pub use identity::{generate_identity, verify_signature, Identity, IdentityError, SignatureError};
pub use pin::{Fingerprint, FingerprintParseError, PeerPin, PinError, PinSet};
pub use tls::{
    dangerous_pinned_client_tls, live_pinned_server_tls, pinned_server_tls, TlsError,
    PINNED_SERVER_NAME,
};

#[cfg(test)]
mod tests;
