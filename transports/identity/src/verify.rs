//! rustls certificate verifiers that trust exactly the pinned certificates.
//!
//! Both verifiers replace WebPKI chain building (there is no CA: every
//! node's certificate is self-signed) with a lookup of the end-entity
//! certificate's SHA-256 fingerprint in the pins. Everything else stays
//! with rustls: the handshake signatures (`CertificateVerify`) are checked
//! with the ring provider's algorithms against the presented certificate,
//! so only a holder of the pinned certificate's private key passes.
//! Validity dates and names are not checked: the pin is the trust anchor,
//! and rotation is done by changing the pin.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, OtherError, SignatureScheme,
};

use crate::enrol::LivePins;
use crate::pin::{Fingerprint, PinSet};

/// The pins a server verifier checks: fixed at start, or changing while
/// the transport runs (a relay enrolling edges).
#[derive(Debug, Clone)]
pub(crate) enum ServerPins {
    Fixed(Arc<PinSet>),
    Live(LivePins),
}

impl ServerPins {
    fn is_pinned(&self, fp: &Fingerprint) -> bool {
        match self {
            Self::Fixed(p) => p.agent(fp).is_some(),
            Self::Live(p) => p.agent(fp).is_some(),
        }
    }
}

/// Why a presented certificate was refused (carried inside the rustls
/// error, so it reaches the logs of both ends).
#[derive(Debug, thiserror::Error)]
enum PinRefusal {
    #[error("certificate {0} is not pinned for any peer")]
    Unknown(Fingerprint),
    #[error("certificate {found} is not the one pinned for peer {peer} ({expected})")]
    Mismatch {
        peer: String,
        expected: Fingerprint,
        found: Fingerprint,
    },
}

fn refuse(r: PinRefusal) -> rustls::Error {
    tracing::warn!(reason = %r, "refusing TLS peer");
    rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(r))))
}

fn algorithms() -> WebPkiSupportedAlgorithms {
    rustls::crypto::ring::default_provider().signature_verification_algorithms
}

/// Server side: accepts a client certificate iff its fingerprint is pinned
/// for some peer. Which peer it is gets decided after the handshake from
/// the same fingerprint ([`PinSet::agent`]).
#[derive(Debug)]
pub(crate) struct PinnedClientVerifier {
    pins: ServerPins,
    mandatory: bool,
    algs: WebPkiSupportedAlgorithms,
}

impl PinnedClientVerifier {
    pub(crate) fn new(pins: ServerPins, mandatory: bool) -> Self {
        Self {
            pins,
            mandatory,
            algs: algorithms(),
        }
    }
}

impl ClientCertVerifier for PinnedClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let fp = Fingerprint::of(end_entity);
        if !self.pins.is_pinned(&fp) {
            return Err(refuse(PinRefusal::Unknown(fp)));
        }
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

/// Client side: accepts the server certificate iff it is the one pinned
/// for the peer being dialled. One verifier per dialled peer.
#[derive(Debug)]
pub(crate) struct PinnedServerVerifier {
    peer: String,
    expected: Fingerprint,
    algs: WebPkiSupportedAlgorithms,
}

impl PinnedServerVerifier {
    pub(crate) fn new(peer: &abhyasa_core::AgentId, expected: Fingerprint) -> Self {
        Self {
            peer: peer.to_string(),
            expected,
            algs: algorithms(),
        }
    }
}

impl ServerCertVerifier for PinnedServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let found = Fingerprint::of(end_entity);
        if found != self.expected {
            return Err(refuse(PinRefusal::Mismatch {
                peer: self.peer.clone(),
                expected: self.expected,
                found,
            }));
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}
