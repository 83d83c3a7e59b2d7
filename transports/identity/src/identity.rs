//! Node identities: an ECDSA P-256 key and a self-signed certificate per
//! node, pinned by peers by the certificate's SHA-256 fingerprint.
//!
//! The pin, not the certificate's names or validity dates, is the trust
//! anchor: a peer is whoever proves possession of the key of a pinned
//! certificate, and the pin says which agent id that is. Rotating a key
//! means distributing a new pin.

use std::fmt;
use std::io::Write as _;
use std::path::Path;

use abhyasa_core::AgentId;
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer};

use crate::pin::{Fingerprint, PeerPin};

/// Problems with a node's own key or certificate (local, not the peer's
/// fault).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// Key or certificate generation failed.
    #[error("cannot generate identity: {0}")]
    Generate(String),
    /// A PEM file does not hold the expected block.
    #[error("{what}: {detail}")]
    Pem {
        /// Which input (`certificate` or `private key`).
        what: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// The private key is not a PKCS#8 ECDSA P-256 key.
    #[error("private key is not a PKCS#8 ECDSA P-256 key: {0}")]
    Key(String),
    /// The certificate does not parse as X.509.
    #[error("certificate does not parse: {0}")]
    Certificate(String),
    /// The private key does not belong to the certificate.
    #[error("private key does not match the certificate's public key")]
    KeyMismatch,
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// A node's key pair and self-signed certificate.
pub struct Identity {
    /// The self-signed certificate (DER); its common name is the agent id.
    pub cert_der: CertificateDer<'static>,
    /// The ECDSA P-256 private key (PKCS#8 DER). Secret.
    pub key_der: PrivatePkcs8KeyDer<'static>,
    /// SHA-256 of `cert_der`: the pin peers put in their config.
    pub fingerprint: Fingerprint,
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Self {
            cert_der: self.cert_der.clone(),
            key_der: self.key_der.clone_key(),
            fingerprint: self.fingerprint,
        }
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

/// Generates a fresh ECDSA P-256 key and a self-signed certificate whose
/// common name is `agent` (what `abhyasa init` calls).
pub fn generate_identity(agent: &AgentId) -> Result<Identity, IdentityError> {
    let gen = |e: rcgen::Error| IdentityError::Generate(e.to_string());
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(gen)?;
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, agent.as_str());
    let cert = params.self_signed(&key).map_err(gen)?;
    Identity::from_der(
        cert.der().clone(),
        PrivatePkcs8KeyDer::from(key.serialize_der()),
    )
}

const CERT_PEM_TAG: &str = "CERTIFICATE";
const KEY_PEM_TAG: &str = "PRIVATE KEY";
/// Signed and verified when an identity is loaded, to prove the key belongs
/// to the certificate.
const KEY_CHECK_MESSAGE: &[u8] = b"abhyasa identity key check v1";

impl Identity {
    /// Builds an identity from DER parts, checking that the key is a
    /// PKCS#8 ECDSA P-256 key and that it belongs to the certificate.
    pub fn from_der(
        cert_der: CertificateDer<'static>,
        key_der: PrivatePkcs8KeyDer<'static>,
    ) -> Result<Self, IdentityError> {
        let identity = Self {
            fingerprint: Fingerprint::of(&cert_der),
            cert_der,
            key_der,
        };
        let sig = identity.sign(KEY_CHECK_MESSAGE)?;
        match verify_signature(&identity.cert_der, KEY_CHECK_MESSAGE, &sig) {
            Ok(()) => Ok(identity),
            Err(SignatureError::Certificate(e)) => Err(IdentityError::Certificate(e)),
            Err(SignatureError::Invalid) => Err(IdentityError::KeyMismatch),
        }
    }

    /// Signs `message` with the node key: ECDSA P-256 with SHA-256,
    /// ASN.1 DER signature. Verify with [`verify_signature`].
    pub fn sign(&self, message: &[u8]) -> Result<Vec<u8>, IdentityError> {
        let rng = SystemRandom::new();
        let pair = EcdsaKeyPair::from_pkcs8(
            &ECDSA_P256_SHA256_ASN1_SIGNING,
            self.key_der.secret_pkcs8_der(),
            &rng,
        )
        .map_err(|e| IdentityError::Key(e.to_string()))?;
        let sig = pair
            .sign(&rng, message)
            .map_err(|_| IdentityError::Key("signing failed".into()))?;
        Ok(sig.as_ref().to_vec())
    }

    /// The certificate and the private key as PEM (`CERTIFICATE`,
    /// `PRIVATE KEY`).
    pub fn to_pem(&self) -> (String, String) {
        let enc = |tag: &str, der: &[u8]| pem::encode(&pem::Pem::new(tag, der.to_vec()));
        (
            enc(CERT_PEM_TAG, &self.cert_der),
            enc(KEY_PEM_TAG, self.key_der.secret_pkcs8_der()),
        )
    }

    /// Parses PEM written by [`to_pem`](Self::to_pem) (or any PEM with one
    /// `CERTIFICATE` and one PKCS#8 `PRIVATE KEY` block) and checks it.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, IdentityError> {
        let cert = pem_block("certificate", cert_pem, CERT_PEM_TAG)?;
        let key = pem_block("private key", key_pem, KEY_PEM_TAG)?;
        Self::from_der(CertificateDer::from(cert), PrivatePkcs8KeyDer::from(key))
    }

    /// Writes the certificate and key as PEM files. The key file is created
    /// owner-only (0600 on Unix). Refuses to overwrite an existing key file,
    /// so a node's identity is never replaced by accident.
    pub fn save_pem(&self, cert_path: &Path, key_path: &Path) -> Result<(), IdentityError> {
        let (cert_pem, key_pem) = self.to_pem();
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |source| IdentityError::Io { path, source }
        };
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt as _;
            opts.mode(0o600);
        }
        let mut f = opts.open(key_path).map_err(io(key_path))?;
        f.write_all(key_pem.as_bytes()).map_err(io(key_path))?;
        f.sync_all().map_err(io(key_path))?;
        std::fs::write(cert_path, cert_pem).map_err(io(cert_path))?;
        Ok(())
    }

    /// Reads and checks PEM files written by [`save_pem`](Self::save_pem).
    pub fn load_pem(cert_path: &Path, key_path: &Path) -> Result<Self, IdentityError> {
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(|source| IdentityError::Io {
                path: path.display().to_string(),
                source,
            })
        };
        Self::from_pem(&read(cert_path)?, &read(key_path)?)
    }

    /// The pin a peer puts in its config for this node.
    pub fn pin(&self, agent: AgentId) -> PeerPin {
        PeerPin {
            agent,
            fingerprint: self.fingerprint,
        }
    }
}

fn pem_block(what: &'static str, text: &str, tag: &str) -> Result<Vec<u8>, IdentityError> {
    let blocks = pem::parse_many(text).map_err(|e| IdentityError::Pem {
        what,
        detail: e.to_string(),
    })?;
    let mut found = blocks.into_iter().filter(|p| p.tag() == tag);
    match (found.next(), found.next()) {
        (Some(p), None) => Ok(p.into_contents()),
        (None, _) => Err(IdentityError::Pem {
            what,
            detail: format!("no `{tag}` block"),
        }),
        (Some(_), Some(_)) => Err(IdentityError::Pem {
            what,
            detail: format!("more than one `{tag}` block"),
        }),
    }
}

/// A signature did not verify against a certificate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SignatureError {
    /// The certificate does not parse.
    #[error("certificate does not parse: {0}")]
    Certificate(String),
    /// The signature is not a valid ECDSA P-256/SHA-256 signature of the
    /// message by the certificate's key.
    #[error("signature does not verify against the certificate's key")]
    Invalid,
}

/// Verifies an ECDSA P-256/SHA-256 (ASN.1 DER) signature of `message` by
/// the public key of `cert_der`.
pub fn verify_signature(
    cert_der: &[u8],
    message: &[u8],
    signature: &[u8],
) -> Result<(), SignatureError> {
    let der = CertificateDer::from(cert_der);
    let cert = webpki::EndEntityCert::try_from(&der)
        .map_err(|e| SignatureError::Certificate(format!("{e:?}")))?;
    cert.verify_signature(webpki::ring::ECDSA_P256_SHA256, message, signature)
        .map_err(|_| SignatureError::Invalid)
}
