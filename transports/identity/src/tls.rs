//! rustls configurations for mutual authentication against the pins: TLS
//! 1.3 only, ring provider. The same builders serve QUIC, and the A2A
//! binding's HTTPS, so a node has one identity for every transport.

use std::sync::Arc;

use abhyasa_core::AgentId;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::PrivateKeyDer;

use crate::enrol::LivePins;
use crate::identity::Identity;
use crate::pin::{Fingerprint, PinSet};
use crate::verify::{PinnedClientVerifier, PinnedServerVerifier, ServerPins};

/// Server name the pinned clients send in the handshake. Never checked:
/// the pin identifies the server, not a DNS name (agent ids need not be
/// DNS names).
pub const PINNED_SERVER_NAME: &str = "abhyasa.invalid";

/// A TLS configuration could not be built from the identity.
#[derive(Debug, thiserror::Error)]
#[error("TLS configuration: {0}")]
pub struct TlsError(String);

impl TlsError {
    /// A configuration error from whatever refused it (for transports that
    /// wrap these configurations in their own).
    pub fn new(e: impl std::fmt::Display) -> Self {
        Self(e.to_string())
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A rustls server configuration (TLS 1.3, ring) that presents
/// `identity`'s certificate and accepts only client certificates pinned in
/// `pins`. With `mandatory`, a client without a certificate fails the
/// handshake; without it such a client is let through unauthenticated at
/// the TLS layer, and the protocol on top must authenticate it another way
/// (the A2A binding's bearer credentials). A client that does present a
/// certificate is refused unless it is pinned, either way. The same pins
/// and verifier serve QUIC and the HTTP binding, so a node has one
/// identity for both.
pub fn pinned_server_tls(
    identity: &Identity,
    pins: Arc<PinSet>,
    mandatory: bool,
    alpn: Vec<Vec<u8>>,
) -> Result<rustls::ServerConfig, TlsError> {
    server_tls(identity, ServerPins::Fixed(pins), mandatory, alpn)
}

/// [`pinned_server_tls`] against pins that change while the server runs.
pub fn live_pinned_server_tls(
    identity: &Identity,
    pins: LivePins,
    mandatory: bool,
    alpn: Vec<Vec<u8>>,
) -> Result<rustls::ServerConfig, TlsError> {
    server_tls(identity, ServerPins::Live(pins), mandatory, alpn)
}

fn server_tls(
    identity: &Identity,
    pins: ServerPins,
    mandatory: bool,
    alpn: Vec<Vec<u8>>,
) -> Result<rustls::ServerConfig, TlsError> {
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(TlsError::new)?
        .with_client_cert_verifier(Arc::new(PinnedClientVerifier::new(pins, mandatory)))
        .with_single_cert(
            vec![identity.cert_der.clone()],
            PrivateKeyDer::Pkcs8(identity.key_der.clone_key()),
        )
        .map_err(TlsError::new)?;
    tls.alpn_protocols = alpn;
    Ok(tls)
}

/// A rustls client configuration (TLS 1.3, ring) for reaching `peer`: it
/// presents `identity`'s certificate and accepts only the server
/// certificate whose fingerprint is `expected`.
///
/// "Dangerous" in rustls's sense: WebPKI path validation is replaced by a
/// custom verifier. This is sound here because there is no CA to validate
/// against — the pinned fingerprint is the trust anchor, compared exactly
/// (SHA-256 over the whole certificate), and the verifier still delegates
/// the TLS 1.3 `CertificateVerify` signature check to rustls with the ring
/// algorithms, so the server must hold the pinned certificate's key.
pub fn dangerous_pinned_client_tls(
    identity: &Identity,
    peer: &AgentId,
    expected: Fingerprint,
    alpn: Vec<Vec<u8>>,
) -> Result<rustls::ClientConfig, TlsError> {
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(TlsError::new)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(PinnedServerVerifier::new(peer, expected)))
        .with_client_auth_cert(
            vec![identity.cert_der.clone()],
            PrivateKeyDer::Pkcs8(identity.key_der.clone_key()),
        )
        .map_err(TlsError::new)?;
    tls.alpn_protocols = alpn;
    Ok(tls)
}
