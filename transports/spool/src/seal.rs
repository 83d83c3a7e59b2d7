//! Sealing and opening relayed frames with the nodes' identity keys.
//!
//! The origin signs with the same ECDSA P-256 key its QUIC and WebSocket
//! links present; the destination verifies against the certificate
//! fingerprint it already pins for that origin. Nothing new to distribute:
//! a pin is a pin, whether the peer is reached directly or through a relay.

use std::collections::HashMap;

use abhyasa_core::wire::relay::{max_inner, MAX_ORIGIN_CERT};
use abhyasa_core::wire::{DedupKey, Envelope, SealError, Sealed};
use abhyasa_core::{AgentId, Timestamp};
use abhyasa_identity::{verify_signature, Fingerprint, Identity, PeerPin};

/// Why a frame could not be sealed (local faults: nothing was sent).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SealFailure {
    /// The inner envelope's sender is not this node.
    #[error("envelope sender {sender} is not this node ({local})")]
    ForeignSender {
        /// The envelope's sender.
        sender: AgentId,
        /// This node.
        local: AgentId,
    },
    /// The inner envelope does not leave room for the wrapper in the
    /// frame limit.
    #[error("inner frame of {size} bytes exceeds the {max} bytes a sealed frame leaves")]
    TooLarge {
        /// Encoded inner size.
        size: usize,
        /// `max_inner(max_frame)`.
        max: usize,
    },
    /// This node's certificate is larger than a sealed frame carries.
    #[error("certificate of {0} bytes exceeds the {MAX_ORIGIN_CERT}-byte limit")]
    CertificateTooLarge(usize),
    /// The key could not sign.
    #[error("cannot sign: {0}")]
    Sign(#[from] abhyasa_identity::IdentityError),
}

/// Seals this node's envelopes for a relay.
#[derive(Debug, Clone)]
pub struct Sealer {
    local: AgentId,
    identity: Identity,
    max_frame: usize,
}

impl Sealer {
    /// A sealer for node `local` with its identity, for frames of at most
    /// `max_frame` bytes.
    pub fn new(local: AgentId, identity: Identity, max_frame: usize) -> Self {
        Self {
            local,
            identity,
            max_frame,
        }
    }

    /// This node.
    pub fn local(&self) -> &AgentId {
        &self.local
    }

    /// Wraps `inner` for `destination`. The relay holds it until
    /// `expires_at` at most.
    pub fn seal(
        &self,
        destination: &AgentId,
        inner: &Envelope,
        expires_at: Timestamp,
    ) -> Result<Sealed, SealFailure> {
        if inner.sender != self.local {
            return Err(SealFailure::ForeignSender {
                sender: inner.sender.clone(),
                local: self.local.clone(),
            });
        }
        let bytes = inner.encode();
        let max = max_inner(self.max_frame);
        if bytes.len() > max {
            return Err(SealFailure::TooLarge {
                size: bytes.len(),
                max,
            });
        }
        let cert = self.identity.cert_der.to_vec();
        if cert.len() > MAX_ORIGIN_CERT {
            return Err(SealFailure::CertificateTooLarge(cert.len()));
        }
        let mut sealed = Sealed {
            origin: self.local.clone(),
            destination: destination.clone(),
            expires_at,
            dedup_key: DedupKey::for_message(&inner.message, &bytes),
            inner: bytes,
            origin_cert: cert,
            signature: Vec::new(),
        };
        sealed.signature = self.identity.sign(&sealed.signing_input())?;
        Ok(sealed)
    }
}

/// Opens sealed frames addressed to this node, verifying each against the
/// origin's pinned certificate fingerprint (C-TR-5).
#[derive(Debug, Clone)]
pub struct Opener {
    local: AgentId,
    pins: HashMap<AgentId, Fingerprint>,
}

impl Opener {
    /// An opener for node `local` that trusts exactly `pins`.
    pub fn new<'a>(local: AgentId, pins: impl IntoIterator<Item = &'a PeerPin>) -> Self {
        Self {
            local,
            pins: pins
                .into_iter()
                .map(|p| (p.agent.clone(), p.fingerprint))
                .collect(),
        }
    }

    /// Adds or replaces one origin's pin (enrolment without a restart).
    pub fn pin(&mut self, pin: &PeerPin) {
        self.pins.insert(pin.agent.clone(), pin.fingerprint);
    }

    /// Whether `origin` is pinned.
    pub fn knows(&self, origin: &AgentId) -> bool {
        self.pins.contains_key(origin)
    }

    /// Verifies `sealed` and returns the inner envelope, to be processed
    /// exactly as if its origin had sent it. Order: pin, certificate,
    /// signature, then the key-free checks of [`Sealed::open`]; every
    /// failure is a typed [`SealError`] and nothing of the frame is used.
    pub fn open(&self, sealed: &Sealed) -> Result<Envelope, SealError> {
        let pinned = self
            .pins
            .get(&sealed.origin)
            .ok_or_else(|| SealError::UnknownOrigin(sealed.origin.clone()))?;
        // A replay under another key: the certificate is not the one we
        // pinned for the claimed origin.
        if Fingerprint::of(&sealed.origin_cert) != *pinned {
            return Err(SealError::CertificateNotPinned(sealed.origin.clone()));
        }
        verify_signature(
            &sealed.origin_cert,
            &sealed.signing_input(),
            &sealed.signature,
        )
        .map_err(|_| SealError::BadSignature(sealed.origin.clone()))?;
        sealed.open(&self.local)
    }
}
