//! Not a stable API: the hello decoders, reachable from the property tests
//! (`tests/props_hello.rs`) and the cargo-fuzz targets (`fuzz/`), which
//! live outside the crate. C-T-6: each step of the hello answers arbitrary
//! peer bytes with a value or a typed [`HelloError`], never a panic.

use abhyasa_core::AgentId;
use abhyasa_identity::{generate_identity, Identity, PinSet};

use crate::hello::{self, ClientState, HelloError};

/// A server and a client that pin each other, each midway through a hello,
/// so any bytes can be fed to the step that reads the peer's next message.
#[derive(Debug)]
pub struct HelloHarness {
    server: AgentId,
    server_identity: Identity,
    server_pins: PinSet,
    server_nonce: Vec<u8>,
    client: AgentId,
    client_identity: Identity,
    client_pins: PinSet,
    client_state: ClientState,
    challenge: Vec<u8>,
    hello: Vec<u8>,
    welcome: Vec<u8>,
}

impl HelloHarness {
    /// Two fresh identities (`server`, `client`) and one honest exchange,
    /// whose messages are the seeds for mutation.
    pub fn new() -> Result<Self, HelloError> {
        let local = |e: &dyn std::fmt::Display| HelloError::Local(e.to_string());
        let server = AgentId::new("server").map_err(|e| local(&e))?;
        let client = AgentId::new("client").map_err(|e| local(&e))?;
        let server_identity = generate_identity(&server).map_err(|e| local(&e))?;
        let client_identity = generate_identity(&client).map_err(|e| local(&e))?;
        let server_pins =
            PinSet::new(&server, &[client_identity.pin(client.clone())]).map_err(|e| local(&e))?;
        let client_pins =
            PinSet::new(&client, &[server_identity.pin(server.clone())]).map_err(|e| local(&e))?;
        let server_nonce = hello::nonce()?;
        let challenge = hello::challenge(&server, &server_nonce);
        let (hello, client_state) =
            hello::answer_challenge(&client_identity, &client, &server, &challenge)?;
        let (_, welcome) = hello::answer_hello(
            &server_identity,
            &server,
            &server_pins,
            &server_nonce,
            &hello,
        )?;
        Ok(Self {
            server,
            server_identity,
            server_pins,
            server_nonce,
            client,
            client_identity,
            client_pins,
            client_state,
            challenge,
            hello,
            welcome,
        })
    }

    /// The honest challenge, hello and welcome.
    pub fn valid_messages(&self) -> [&[u8]; 3] {
        [&self.challenge, &self.hello, &self.welcome]
    }

    /// The client reads `bytes` as the server's challenge.
    pub fn client_reads_challenge(&self, bytes: &[u8]) -> Result<(), HelloError> {
        hello::answer_challenge(&self.client_identity, &self.client, &self.server, bytes)
            .map(|_| ())
    }

    /// The server reads `bytes` as the client's hello; returns the
    /// authenticated client.
    pub fn server_reads_hello(&self, bytes: &[u8]) -> Result<AgentId, HelloError> {
        hello::answer_hello(
            &self.server_identity,
            &self.server,
            &self.server_pins,
            &self.server_nonce,
            bytes,
        )
        .map(|(client, _)| client)
    }

    /// The client reads `bytes` as the server's welcome.
    pub fn client_reads_welcome(&self, bytes: &[u8]) -> Result<(), HelloError> {
        hello::check_welcome(
            &self.client,
            &self.server,
            &self.client_pins,
            &self.client_state,
            bytes,
        )
    }
}
