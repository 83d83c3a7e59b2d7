//! The signed hello: binds each end of a WebSocket connection to the agent
//! id pinned for its key, before any frame is accepted.
//!
//! ```text
//! server → client  Challenge { version, server agent, server nonce }
//! client → server  Hello     { version, client agent, client nonce, client cert,
//!                              sig_client(transcript("client")) }
//! server → client  Welcome   { server cert, sig_server(transcript("server")) }
//! ```
//!
//! `transcript(role)` covers a domain label, the role, both agent ids and
//! both 32-byte nonces, so a signature cannot be replayed on another
//! connection (fresh server nonce), reflected to the other role (role
//! label) or moved to other agents. Each side checks that the presented
//! certificate is the one pinned for the claimed agent and that the
//! signature (ECDSA P-256/SHA-256) verifies against it.
//!
//! Scope: the hello authenticates the two ends when the connection opens.
//! Without TLS underneath (`ws://`), frames after the hello are not
//! integrity-protected, so an on-path attacker able to inject into the TCP
//! stream could forge frames; across untrusted networks use QUIC, or run
//! this transport behind TLS.

use abhyasa_core::AgentId;
use abhyasa_identity::{verify_signature, Fingerprint, Identity, LivePins, PinSet};

/// Where the hello looks up the key pinned for an agent: a fixed
/// [`PinSet`], or the [`LivePins`] of a running transport whose peers are
/// enrolled at runtime.
pub(crate) trait PinLookup {
    /// The fingerprint pinned for `agent`.
    fn pinned(&self, agent: &AgentId) -> Option<Fingerprint>;
}

impl PinLookup for PinSet {
    fn pinned(&self, agent: &AgentId) -> Option<Fingerprint> {
        self.fingerprint(agent).copied()
    }
}

impl PinLookup for LivePins {
    fn pinned(&self, agent: &AgentId) -> Option<Fingerprint> {
        self.fingerprint(agent)
    }
}
use prost::Message as _;
use ring::rand::{SecureRandom as _, SystemRandom};

/// Version of the hello exchange.
pub(crate) const HELLO_VERSION: u32 = 1;
const NONCE_LEN: usize = 32;
const DOMAIN: &[u8] = b"abhyasa-ws-hello/1\0";

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Challenge {
    #[prost(uint32, tag = "1")]
    pub(crate) version: u32,
    #[prost(string, tag = "2")]
    pub(crate) agent: String,
    #[prost(bytes = "vec", tag = "3")]
    pub(crate) nonce: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Hello {
    #[prost(uint32, tag = "1")]
    pub(crate) version: u32,
    #[prost(string, tag = "2")]
    pub(crate) agent: String,
    #[prost(bytes = "vec", tag = "3")]
    pub(crate) nonce: Vec<u8>,
    #[prost(bytes = "vec", tag = "4")]
    pub(crate) cert: Vec<u8>,
    #[prost(bytes = "vec", tag = "5")]
    pub(crate) signature: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Welcome {
    #[prost(bytes = "vec", tag = "1")]
    pub(crate) cert: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub(crate) signature: Vec<u8>,
}

/// Why a hello was refused. Every variant but `Local` is the peer's fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HelloError {
    /// A hello message did not decode or broke the protocol.
    #[error("malformed hello: {0}")]
    Malformed(String),
    /// The peer speaks another hello version.
    #[error("unsupported hello version {0} (this node speaks {HELLO_VERSION})")]
    Version(u32),
    /// The claimed agent is not pinned.
    #[error("agent {0:?} is not a pinned peer")]
    UnknownAgent(String),
    /// The server is not the agent that was dialled.
    #[error("dialled {expected} but the server says it is {found:?}")]
    WrongAgent {
        /// The agent dialled.
        expected: AgentId,
        /// The agent the server named.
        found: String,
    },
    /// The presented certificate is not the one pinned for the agent.
    #[error("certificate {found} is not the one pinned for {agent} ({expected})")]
    KeyMismatch {
        /// The claimed agent.
        agent: AgentId,
        /// The pinned fingerprint.
        expected: Fingerprint,
        /// The presented certificate's fingerprint.
        found: Fingerprint,
    },
    /// The signature does not verify against the pinned certificate.
    #[error("hello signature of {0} does not verify against its pinned key")]
    BadSignature(AgentId),
    /// The connection ended or timed out during the hello.
    #[error("connection ended during the hello: {0}")]
    Closed(String),
    /// This node could not sign or draw a nonce.
    #[error("local error: {0}")]
    Local(String),
}

pub(crate) fn nonce() -> Result<Vec<u8>, HelloError> {
    let mut n = vec![0u8; NONCE_LEN];
    SystemRandom::new()
        .fill(&mut n)
        .map_err(|_| HelloError::Local("no randomness for the nonce".into()))?;
    Ok(n)
}

fn check_nonce(n: &[u8]) -> Result<(), HelloError> {
    if n.len() == NONCE_LEN {
        Ok(())
    } else {
        Err(HelloError::Malformed(format!(
            "nonce of {} bytes, expected {NONCE_LEN}",
            n.len()
        )))
    }
}

/// The bytes each side signs.
pub(crate) fn transcript(
    role: &str,
    server: &AgentId,
    client: &AgentId,
    server_nonce: &[u8],
    client_nonce: &[u8],
) -> Vec<u8> {
    let mut t = Vec::with_capacity(256);
    t.extend_from_slice(DOMAIN);
    t.extend_from_slice(role.as_bytes());
    t.push(0);
    for field in [
        server.as_str().as_bytes(),
        client.as_str().as_bytes(),
        server_nonce,
        client_nonce,
    ] {
        // Length-prefixed so no two field splits give the same bytes.
        t.extend_from_slice(&u32::try_from(field.len()).unwrap_or(u32::MAX).to_be_bytes());
        t.extend_from_slice(field);
    }
    t
}

pub(crate) fn decode<M: prost::Message + Default>(bytes: &[u8]) -> Result<M, HelloError> {
    M::decode(bytes).map_err(|e| HelloError::Malformed(e.to_string()))
}

/// Checks `cert` is pinned for `agent` and `signature` signs `message`.
fn check_proof(
    pins: &impl PinLookup,
    agent: &AgentId,
    cert: &[u8],
    message: &[u8],
    signature: &[u8],
) -> Result<(), HelloError> {
    let expected = pins
        .pinned(agent)
        .ok_or_else(|| HelloError::UnknownAgent(agent.to_string()))?;
    let found = Fingerprint::of(cert);
    if found != expected {
        return Err(HelloError::KeyMismatch {
            agent: agent.clone(),
            expected,
            found,
        });
    }
    verify_signature(cert, message, signature).map_err(|_| HelloError::BadSignature(agent.clone()))
}

/// Server side, step 1.
pub(crate) fn challenge(local: &AgentId, server_nonce: &[u8]) -> Vec<u8> {
    Challenge {
        version: HELLO_VERSION,
        agent: local.to_string(),
        nonce: server_nonce.to_vec(),
    }
    .encode_to_vec()
}

/// Server side, step 2: checks the client's hello; returns the
/// authenticated client and the welcome to send.
pub(crate) fn answer_hello(
    identity: &Identity,
    local: &AgentId,
    pins: &impl PinLookup,
    server_nonce: &[u8],
    hello: &[u8],
) -> Result<(AgentId, Vec<u8>), HelloError> {
    let hello: Hello = decode(hello)?;
    if hello.version != HELLO_VERSION {
        return Err(HelloError::Version(hello.version));
    }
    check_nonce(&hello.nonce)?;
    let client =
        AgentId::new(&hello.agent).map_err(|_| HelloError::UnknownAgent(hello.agent.clone()))?;
    let t = transcript("client", local, &client, server_nonce, &hello.nonce);
    check_proof(pins, &client, &hello.cert, &t, &hello.signature)?;
    let t = transcript("server", local, &client, server_nonce, &hello.nonce);
    let signature = identity
        .sign(&t)
        .map_err(|e| HelloError::Local(e.to_string()))?;
    let welcome = Welcome {
        cert: identity.cert_der.to_vec(),
        signature,
    };
    Ok((client, welcome.encode_to_vec()))
}

/// Client side, step 1: checks the challenge of the server dialled as
/// `server`; returns the hello to send and the state for step 2.
pub(crate) fn answer_challenge(
    identity: &Identity,
    local: &AgentId,
    server: &AgentId,
    challenge: &[u8],
) -> Result<(Vec<u8>, ClientState), HelloError> {
    let c: Challenge = decode(challenge)?;
    if c.version != HELLO_VERSION {
        return Err(HelloError::Version(c.version));
    }
    if c.agent != server.as_str() {
        return Err(HelloError::WrongAgent {
            expected: server.clone(),
            found: c.agent,
        });
    }
    check_nonce(&c.nonce)?;
    let client_nonce = nonce()?;
    let t = transcript("client", server, local, &c.nonce, &client_nonce);
    let signature = identity
        .sign(&t)
        .map_err(|e| HelloError::Local(e.to_string()))?;
    let hello = Hello {
        version: HELLO_VERSION,
        agent: local.to_string(),
        nonce: client_nonce.clone(),
        cert: identity.cert_der.to_vec(),
        signature,
    };
    Ok((
        hello.encode_to_vec(),
        ClientState {
            server_nonce: c.nonce,
            client_nonce,
        },
    ))
}

/// What the client keeps between its hello and the server's welcome.
#[derive(Debug)]
pub(crate) struct ClientState {
    server_nonce: Vec<u8>,
    client_nonce: Vec<u8>,
}

/// Client side, step 2: checks the server's welcome.
pub(crate) fn check_welcome(
    local: &AgentId,
    server: &AgentId,
    pins: &impl PinLookup,
    state: &ClientState,
    welcome: &[u8],
) -> Result<(), HelloError> {
    let w: Welcome = decode(welcome)?;
    let t = transcript(
        "server",
        server,
        local,
        &state.server_nonce,
        &state.client_nonce,
    );
    check_proof(pins, server, &w.cert, &t, &w.signature)
}
