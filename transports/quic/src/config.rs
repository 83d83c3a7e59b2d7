//! QUIC transport configuration.

use std::net::SocketAddr;
use std::time::Duration;

use abhyasa_core::AgentId;
use abhyasa_transport::LinkConfig;

use abhyasa_identity::{Identity, PeerPin};

/// Default idle timeout: 30 s. A connection that hears nothing (not even a
/// keep-alive acknowledgement) for this long is closed and, for configured
/// peers, re-dialled.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default keep-alive interval: 5 s, a sixth of the idle timeout, so that
/// five consecutive keep-alives (plus QUIC's own retransmissions) may be
/// lost before a lossy but live link is declared dead.
pub const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(5);
/// Default bound on one dial attempt (handshake included): 10 s.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// One peer: its pin, and the address to dial it at (none: it dials us).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuicPeer {
    /// Agent id bound to the certificate fingerprint.
    pub pin: PeerPin,
    /// Where to dial; `None` for a peer that only dials in.
    pub addr: Option<SocketAddr>,
}

/// Everything [`start`](crate::start) needs.
#[derive(Debug, Clone)]
pub struct QuicConfig {
    /// This node's agent id.
    pub agent: AgentId,
    /// This node's key and certificate.
    pub identity: Identity,
    /// UDP address to listen on (`127.0.0.1:0` picks a free port).
    pub listen: SocketAddr,
    /// The pinned peers; no other certificate is accepted.
    pub peers: Vec<QuicPeer>,
    /// Frame limit, queues and reconnect backoff.
    pub link: LinkConfig,
    /// See [`DEFAULT_IDLE_TIMEOUT`].
    pub idle_timeout: Duration,
    /// See [`DEFAULT_KEEP_ALIVE`]; must be below `idle_timeout`.
    pub keep_alive: Duration,
    /// See [`DEFAULT_CONNECT_TIMEOUT`].
    pub connect_timeout: Duration,
    /// A fixed UDP payload size (initial and minimum MTU, no path MTU
    /// discovery), for simulated networks that have no path MTU (netsim
    /// over turmoil): whole handshake flights then fit one datagram, so
    /// the datagram count does not depend on the (randomised) length of
    /// ECDSA signatures. `None` (default): quinn's discovery from 1200.
    pub fixed_mtu: Option<u16>,
    /// Seed of quinn's internal random stream (connection ids, packet
    /// number skipping, transport-parameter grease), for reproducible
    /// simulations only; `None` (default): the platform's entropy. TLS
    /// keeps its own randomness either way.
    pub dangerous_rng_seed: Option<[u8; 32]>,
    /// C-ND-5: most inbound handshakes in flight (not yet authenticated);
    /// one more is refused at once. Default
    /// [`DEFAULT_MAX_HANDSHAKES`](abhyasa_transport::limit::DEFAULT_MAX_HANDSHAKES) (64).
    pub max_handshakes: usize,
    /// C-PA-1: most of those from one validated source address (an IPv4
    /// address or an IPv6 /64). Default
    /// [`DEFAULT_MAX_HANDSHAKES_PER_SOURCE`](abhyasa_transport::limit::DEFAULT_MAX_HANDSHAKES_PER_SOURCE) (8).
    pub max_handshakes_per_source: usize,
}

impl QuicConfig {
    /// A configuration with no peers and default knobs.
    pub fn new(agent: AgentId, identity: Identity, listen: SocketAddr) -> Self {
        Self {
            agent,
            identity,
            listen,
            peers: Vec::new(),
            link: LinkConfig::default(),
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            keep_alive: DEFAULT_KEEP_ALIVE,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            fixed_mtu: None,
            dangerous_rng_seed: None,
            max_handshakes: abhyasa_transport::limit::DEFAULT_MAX_HANDSHAKES,
            max_handshakes_per_source: abhyasa_transport::limit::DEFAULT_MAX_HANDSHAKES_PER_SOURCE,
        }
    }

    /// Adds a peer (builder style).
    pub fn with_peer(mut self, pin: PeerPin, addr: Option<SocketAddr>) -> Self {
        self.peers.push(QuicPeer { pin, addr });
        self
    }
}
