//! rustls and quinn crypto configuration: TLS 1.3 only, ring provider,
//! mutual authentication against the pins.

use std::sync::Arc;

use abhyasa_core::AgentId;
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::PrivateKeyDer;

use crate::enrol::LivePins;
use crate::identity::{Fingerprint, Identity, PinSet};
use crate::verify::{PinnedClientVerifier, PinnedServerVerifier, ServerPins};

/// ALPN protocol id; a peer that does not speak it fails the handshake.
pub(crate) const ALPN: &[u8] = b"abhyasa/1";
/// Server name sent in the handshake. Never checked: the pin identifies the
/// server, not a DNS name (agent ids need not be DNS names).
pub(crate) const SERVER_NAME: &str = "abhyasa.invalid";

/// A TLS configuration could not be built from the identity.
#[derive(Debug, thiserror::Error)]
#[error("TLS configuration: {0}")]
pub struct TlsError(String);

fn tls_err(e: impl std::fmt::Display) -> TlsError {
    TlsError(e.to_string())
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
        .map_err(tls_err)?
        .with_client_cert_verifier(Arc::new(PinnedClientVerifier::new(pins, mandatory)))
        .with_single_cert(
            vec![identity.cert_der.clone()],
            PrivateKeyDer::Pkcs8(identity.key_der.clone_key()),
        )
        .map_err(tls_err)?;
    tls.alpn_protocols = alpn;
    Ok(tls)
}

/// The server side: presents our certificate, requires a pinned client
/// certificate.
pub(crate) fn server_config(
    identity: &Identity,
    pins: LivePins,
    transport: Arc<quinn::TransportConfig>,
) -> Result<quinn::ServerConfig, TlsError> {
    let tls = live_pinned_server_tls(identity, pins, true, vec![ALPN.to_vec()])?;
    let quic = QuicServerConfig::try_from(tls).map_err(tls_err)?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(quic));
    config.transport_config(transport);
    Ok(config)
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
        .map_err(tls_err)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(PinnedServerVerifier::new(peer, expected)))
        .with_client_auth_cert(
            vec![identity.cert_der.clone()],
            PrivateKeyDer::Pkcs8(identity.key_der.clone_key()),
        )
        .map_err(tls_err)?;
    tls.alpn_protocols = alpn;
    Ok(tls)
}

/// The QUIC client side for dialling `peer` (see
/// [`dangerous_pinned_client_tls`]).
pub(crate) fn dangerous_pinned_client_config(
    identity: &Identity,
    peer: &AgentId,
    expected: Fingerprint,
    transport: Arc<quinn::TransportConfig>,
) -> Result<quinn::ClientConfig, TlsError> {
    let tls = dangerous_pinned_client_tls(identity, peer, expected, vec![ALPN.to_vec()])?;
    let quic = QuicClientConfig::try_from(tls).map_err(tls_err)?;
    let mut config = quinn::ClientConfig::new(Arc::new(quic));
    config.transport_config(transport);
    Ok(config)
}

/// The SERVER_NAME the pinned clients send (never checked; see
/// [`dangerous_pinned_client_tls`]).
pub const PINNED_SERVER_NAME: &str = SERVER_NAME;

/// The fingerprint of the certificate a connection's peer presented.
pub(crate) fn peer_fingerprint(conn: &quinn::Connection) -> Option<Fingerprint> {
    let certs = conn
        .peer_identity()?
        .downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
        .ok()?;
    certs.first().map(|c| Fingerprint::of(c))
}

/// Stateless-reset key derived from the node key: a restarted node answers
/// packets of its predecessor's connections with a valid stateless reset,
/// so peers notice the restart at once instead of after the idle timeout.
pub(crate) fn reset_key(identity: &Identity) -> ring::hmac::Key {
    use sha2::{Digest as _, Sha256};
    let mut h = Sha256::new();
    h.update(b"abhyasa quic stateless reset key v1\0");
    h.update(identity.key_der.secret_pkcs8_der());
    ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &h.finalize())
}
