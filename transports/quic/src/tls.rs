//! quinn crypto configuration: the pinned rustls configurations of
//! `abhyasa-identity` with the QUIC ALPN and transport parameters.

use std::sync::Arc;

use abhyasa_core::AgentId;
use abhyasa_identity::{
    dangerous_pinned_client_tls, live_pinned_server_tls, Fingerprint, Identity, LivePins, TlsError,
    PINNED_SERVER_NAME,
};
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};

/// ALPN protocol id; a peer that does not speak it fails the handshake.
pub(crate) const ALPN: &[u8] = b"abhyasa/1";
/// Server name sent in the handshake. Never checked: the pin identifies the
/// server, not a DNS name (agent ids need not be DNS names).
pub(crate) const SERVER_NAME: &str = PINNED_SERVER_NAME;

/// The server side: presents our certificate, requires a pinned client
/// certificate.
pub(crate) fn server_config(
    identity: &Identity,
    pins: LivePins,
    transport: Arc<quinn::TransportConfig>,
) -> Result<quinn::ServerConfig, TlsError> {
    let tls = live_pinned_server_tls(identity, pins, true, vec![ALPN.to_vec()])?;
    let quic = QuicServerConfig::try_from(tls).map_err(TlsError::new)?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(quic));
    config.transport_config(transport);
    Ok(config)
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
    let quic = QuicClientConfig::try_from(tls).map_err(TlsError::new)?;
    let mut config = quinn::ClientConfig::new(Arc::new(quic));
    config.transport_config(transport);
    Ok(config)
}

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
