//! WebSocket transport configuration.

use std::net::SocketAddr;
use std::time::Duration;

use abhyasa_core::AgentId;
use abhyasa_identity::{Identity, PeerPin};
use abhyasa_transport::LinkConfig;

/// Default ping interval: 5 s.
pub const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(5);
/// Default idle timeout: 30 s without any message (pongs included) closes
/// the connection; six pings may go unanswered first.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default bound on TCP connect + WebSocket upgrade + signed hello: 5 s.
/// An inbound connection that has not proved a pinned key by then is
/// closed (C-PA-1).
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// One peer: its pin, and the URL to dial it at (none: it dials us).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WsPeer {
    /// Agent id bound to the certificate fingerprint of its node key.
    pub pin: PeerPin,
    /// `ws://host:port/path` to dial; `None` for a peer that only dials
    /// in. The path is not interpreted by the server (proxies may route on
    /// it).
    pub url: Option<String>,
}

/// Everything [`start`](crate::start) needs.
#[derive(Debug, Clone)]
pub struct WsConfig {
    /// This node's agent id.
    pub agent: AgentId,
    /// This node's key and certificate (the same identity as QUIC).
    pub identity: Identity,
    /// TCP address to accept WebSocket connections on; `None` to only dial.
    pub listen: Option<SocketAddr>,
    /// The pinned peers; no other key is accepted.
    pub peers: Vec<WsPeer>,
    /// Frame limit, queues and reconnect backoff.
    pub link: LinkConfig,
    /// See [`DEFAULT_KEEP_ALIVE`].
    pub keep_alive: Duration,
    /// See [`DEFAULT_IDLE_TIMEOUT`]; must exceed `keep_alive`.
    pub idle_timeout: Duration,
    /// See [`DEFAULT_HANDSHAKE_TIMEOUT`].
    pub handshake_timeout: Duration,
    /// C-ND-5: most inbound handshakes (WebSocket upgrade and signed
    /// hello) in flight; one more connection is closed at once. Default
    /// [`DEFAULT_MAX_HANDSHAKES`](abhyasa_transport::limit::DEFAULT_MAX_HANDSHAKES) (64).
    pub max_handshakes: usize,
    /// C-PA-1: most of those from one source address (an IPv4 address or
    /// an IPv6 /64); one more from it is closed at once. Default
    /// [`DEFAULT_MAX_HANDSHAKES_PER_SOURCE`](abhyasa_transport::limit::DEFAULT_MAX_HANDSHAKES_PER_SOURCE) (8).
    pub max_handshakes_per_source: usize,
    /// C-PA-3: `ws://` carries frames after the signed hello with no
    /// integrity or secrecy of its own, so by default the transport only
    /// listens on a loopback address and only dials loopback hosts
    /// (`127.0.0.0/8`, `::1`, `localhost`); anything else is refused at
    /// start. Set this to listen on or dial other addresses (behind a
    /// TLS-terminating proxy, or on a network you trust). Default `false`.
    pub allow_plaintext_remote: bool,
}

impl WsConfig {
    /// A configuration with no peers and default knobs.
    pub fn new(agent: AgentId, identity: Identity, listen: Option<SocketAddr>) -> Self {
        Self {
            agent,
            identity,
            listen,
            peers: Vec::new(),
            link: LinkConfig::default(),
            keep_alive: DEFAULT_KEEP_ALIVE,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            max_handshakes: abhyasa_transport::limit::DEFAULT_MAX_HANDSHAKES,
            max_handshakes_per_source: abhyasa_transport::limit::DEFAULT_MAX_HANDSHAKES_PER_SOURCE,
            allow_plaintext_remote: false,
        }
    }

    /// Adds a peer (builder style).
    pub fn with_peer(mut self, pin: PeerPin, url: Option<String>) -> Self {
        self.peers.push(WsPeer { pin, url });
        self
    }
}
