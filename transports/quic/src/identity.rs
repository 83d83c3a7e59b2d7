//! Node identities: an ECDSA P-256 key and a self-signed certificate per
//! node, pinned by peers by the certificate's SHA-256 fingerprint.
//!
//! The pin, not the certificate's names or validity dates, is the trust
//! anchor: a peer is whoever proves possession of the key of a pinned
//! certificate, and the pin says which agent id that is. Rotating a key
//! means distributing a new pin.

use std::collections::HashMap;
use std::fmt;
use std::io::Write as _;
use std::path::Path;
use std::str::FromStr;

use abhyasa_core::AgentId;
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer};
use sha2::{Digest as _, Sha256};

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

/// SHA-256 over a certificate's DER encoding: what peers pin.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// The fingerprint of a DER certificate.
    pub fn of(cert_der: &[u8]) -> Self {
        Self(Sha256::digest(cert_der).into())
    }

    /// Lowercase hex, 64 digits.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.to_hex())
    }
}

/// A string that is not a SHA-256 fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a SHA-256 fingerprint (64 hex digits, optionally `sha256:`-prefixed and colon-separated): {0:?}")]
pub struct FingerprintParseError(pub String);

impl FromStr for Fingerprint {
    type Err = FingerprintParseError;

    /// Accepts 64 hex digits, optionally prefixed `sha256:` and separated
    /// by colons (as `openssl x509 -fingerprint -sha256` prints).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || FingerprintParseError(s.to_string());
        let body = s.strip_prefix("sha256:").unwrap_or(s);
        let digits: String = body.chars().filter(|c| *c != ':').collect();
        let mut out = [0u8; 32];
        hex::decode_to_slice(&digits, &mut out).map_err(|_| err())?;
        Ok(Self(out))
    }
}

impl serde::Serialize for Fingerprint {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> serde::Deserialize<'de> for Fingerprint {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
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

/// A configured peer: its agent id bound to its certificate fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct PeerPin {
    /// The peer's agent id.
    pub agent: AgentId,
    /// SHA-256 fingerprint of its certificate.
    pub fingerprint: Fingerprint,
}

/// A peer configuration that cannot be right.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PinError {
    /// Two pins name the same agent.
    #[error("agent {0} is pinned twice")]
    DuplicateAgent(AgentId),
    /// Two agents share one certificate: the key could not be bound to one
    /// agent id.
    #[error("fingerprint {fingerprint} is pinned for both {first} and {second}")]
    DuplicateFingerprint {
        /// The shared fingerprint.
        fingerprint: Fingerprint,
        /// One agent.
        first: AgentId,
        /// The other.
        second: AgentId,
    },
    /// A pin names this node itself.
    #[error("agent {0} is this node; it cannot be its own peer")]
    SelfPin(AgentId),
}

/// The pinned peers, looked up both ways.
#[derive(Debug, Clone, Default)]
pub struct PinSet {
    by_fingerprint: HashMap<Fingerprint, AgentId>,
    by_agent: HashMap<AgentId, Fingerprint>,
}

impl PinSet {
    /// Checks and indexes `pins` for node `local`.
    pub fn new<'a>(
        local: &AgentId,
        pins: impl IntoIterator<Item = &'a PeerPin>,
    ) -> Result<Self, PinError> {
        let mut set = Self::default();
        for pin in pins {
            if &pin.agent == local {
                return Err(PinError::SelfPin(pin.agent.clone()));
            }
            if set.by_agent.contains_key(&pin.agent) {
                return Err(PinError::DuplicateAgent(pin.agent.clone()));
            }
            if let Some(first) = set.by_fingerprint.get(&pin.fingerprint) {
                return Err(PinError::DuplicateFingerprint {
                    fingerprint: pin.fingerprint,
                    first: first.clone(),
                    second: pin.agent.clone(),
                });
            }
            set.by_agent.insert(pin.agent.clone(), pin.fingerprint);
            set.by_fingerprint
                .insert(pin.fingerprint, pin.agent.clone());
        }
        Ok(set)
    }

    /// The agent pinned to this certificate fingerprint.
    pub fn agent(&self, fingerprint: &Fingerprint) -> Option<&AgentId> {
        self.by_fingerprint.get(fingerprint)
    }

    /// The fingerprint pinned for this agent.
    pub fn fingerprint(&self, agent: &AgentId) -> Option<&Fingerprint> {
        self.by_agent.get(agent)
    }

    /// Every pinned agent.
    pub fn agents(&self) -> impl Iterator<Item = &AgentId> {
        self.by_agent.keys()
    }

    /// Whether `pin` could be added for node `local` (the checks of
    /// [`new`](Self::new)): `Ok(true)` if new, `Ok(false)` if the agent is
    /// already pinned to this fingerprint, an error if the agent is pinned
    /// to another one ([`PinError::DuplicateAgent`]: remove the old pin
    /// first, a key rotation is a deliberate act), the fingerprint to
    /// another agent, or the pin names `local`.
    pub fn check(&self, local: &AgentId, pin: &PeerPin) -> Result<bool, PinError> {
        if &pin.agent == local {
            return Err(PinError::SelfPin(pin.agent.clone()));
        }
        if let Some(fp) = self.by_agent.get(&pin.agent) {
            if *fp == pin.fingerprint {
                return Ok(false);
            }
            return Err(PinError::DuplicateAgent(pin.agent.clone()));
        }
        if let Some(first) = self.by_fingerprint.get(&pin.fingerprint) {
            return Err(PinError::DuplicateFingerprint {
                fingerprint: pin.fingerprint,
                first: first.clone(),
                second: pin.agent.clone(),
            });
        }
        Ok(true)
    }

    /// Adds `pin` after [`check`](Self::check); `Ok(true)` when added.
    pub fn insert(&mut self, local: &AgentId, pin: &PeerPin) -> Result<bool, PinError> {
        let new = self.check(local, pin)?;
        if new {
            self.by_agent.insert(pin.agent.clone(), pin.fingerprint);
            self.by_fingerprint
                .insert(pin.fingerprint, pin.agent.clone());
        }
        Ok(new)
    }

    /// Removes `agent`'s pin; returns the fingerprint it had.
    pub fn remove(&mut self, agent: &AgentId) -> Option<Fingerprint> {
        let fp = self.by_agent.remove(agent)?;
        self.by_fingerprint.remove(&fp);
        Some(fp)
    }
}
