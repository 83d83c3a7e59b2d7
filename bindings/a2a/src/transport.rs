//! The HTTP binding as a node transport.
//!
//! [`start`] binds the A2A/HTTP server and returns an ordinary
//! [`Transport`]: every configured peer is one always-up link of an
//! [`abhyasa_transport::link::Registry`], so the node sees HTTP peers like
//! QUIC ones and keeps the same custody guarantees (AB-3 keyed on the
//! authenticated peer, acks bound, write-ahead).
//!
//! * An authenticated `POST` carrying an obligation becomes an
//!   `Incoming::Frame` from that peer. The node's ack frame to that peer
//!   answers the waiting request (200 for applied/declined, 202 for
//!   deferred); a final ack with no request waiting (it came after a
//!   deferral or after the wait ran out) is POSTed to the peer's
//!   `custody_ack_endpoint`.
//! * `POST /abhyasa/custody_ack` from a peer becomes an ack frame from it.
//! * An obligation frame the node sends to a peer with an
//!   `obligation_endpoint` is POSTed there; a `200` ack in the answer is fed
//!   back as an ack frame from that peer; a `202` leaves the final ack to
//!   the peer's later POST to our `/abhyasa/custody_ack`.
//!
//! Who is asking (C-A2A-3): with [`HttpConfig::tls`] set the binding
//! serves HTTPS and authenticates node peers by mutual TLS: a client
//! certificate must be one pinned in [`HttpPeer::fingerprint`] (the same
//! self-signed node identities and pins as QUIC), and every request on
//! that connection is bound to that agent id. Client certificates are
//! mandatory at the handshake unless [`HttpConfig::bearer_only`] lists
//! peers that cannot do mTLS: those present their per-peer bearer
//! credential ([`HttpPeer::token`]) on a connection without a certificate,
//! and no other peer's credential is taken on such a connection.
//!
//! Nothing unauthenticated holds the node (C-PA-1): an accepted connection
//! takes a pre-authentication slot ([`HttpConfig::max_handshakes`] in all,
//! [`HttpConfig::max_handshakes_per_source`] from one address) and a
//! descriptor from the process budget
//! ([`abhyasa_transport::limit::Descriptors`]), or is closed at once. It
//! keeps the slot until it is authenticated (a pinned certificate at the
//! TLS handshake, or a request with a valid bearer credential) and is
//! closed if that has not happened within [`HttpConfig::handshake_timeout`];
//! request headers must arrive within [`HttpConfig::header_read_timeout`].
//! Our own POSTs to `https://` endpoints present our certificate and
//! accept only the peer's pinned one. Plain HTTP is served (and spoken)
//! only when [`HttpConfig::plain_http_loopback`] is set, and only on
//! loopback; anything else is refused at start with a typed error.
//!
//! The binding never acks anything itself: every ack is the node's, sent
//! only after its records are durable (write-ahead).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use abhyasa_core::wire::Message;
use abhyasa_core::{AckStatus, AgentId, CustodyAck, KindProfile, Obligation};
use abhyasa_transport::limit::{Descriptors, HandshakeSlot, HandshakeSlots};
use abhyasa_transport::link::{decode_message, LinkGuard, Registry};
use abhyasa_transport::{LinkConfig, Transport};
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::card::{agent_card, AbhyasaServiceRef, AgentCard, ServiceRefError};
use crate::client::{check_endpoint, JsonClient};
use crate::state::{lock, Answer, PeerSide, State, TlsPeer};
pub use crate::state::{HttpPeer, HttpStats};
use abhyasa_identity::{
    dangerous_pinned_client_tls, pinned_server_tls, Fingerprint, Identity, PeerPin, PinError,
    PinSet, TlsError,
};

/// Configuration of the HTTP binding.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// Address to bind.
    pub listen: SocketAddr,
    /// Base URL advertised in the card (no trailing slash); default
    /// `http://<bound address>`.
    pub public_url: Option<String>,
    /// This node's identity (key + self-signed certificate, the one QUIC
    /// uses): serve HTTPS with mutual TLS against the peers' pinned
    /// fingerprints, and present it on our POSTs to `https://` endpoints.
    pub tls: Option<Identity>,
    /// Serve plain HTTP when `tls` is `None`, and allow `http://` peer
    /// endpoints. Only on a loopback address and only when set explicitly;
    /// the binding refuses to start otherwise.
    pub plain_http_loopback: bool,
    /// The peers and their credentials.
    pub peers: Vec<HttpPeer>,
    /// Kind profiles for the card; their `obligation_endpoint` is replaced
    /// by this server's (the card tells the truth).
    pub profiles: Vec<KindProfile>,
    /// Agent name in the card.
    pub name: String,
    /// Largest request body, in bytes (default 64 KiB).
    pub max_body: usize,
    /// How long a request waits for the node's ack before it is answered
    /// `202` (default 2 s).
    pub sync_wait: Duration,
    /// Requests waiting for an ack at once, across peers (default 4096);
    /// beyond it requests get 503 (bounded memory, C-ND-5).
    pub max_waiting: usize,
    /// Requests being served at once, authenticated or not (default 256);
    /// beyond it requests get 503 before anything is read (bounded memory
    /// under a hostile client, C-ND-5).
    pub max_inflight: usize,
    /// Timeout of our outbound POSTs (default 5 s).
    pub client_timeout: Duration,
    /// Peers that may authenticate over HTTPS with their bearer credential
    /// alone, on a connection without a client certificate (each must have
    /// a [`HttpPeer::token`]). Empty (default): client certificates are
    /// mandatory. Plain HTTP (loopback) has no certificates: there every
    /// peer's credential is taken.
    pub bearer_only: Vec<AgentId>,
    /// How long an accepted connection may stay unauthenticated: TLS
    /// handshake included, and on a connection without a certificate until
    /// a request with a valid bearer credential arrives (default 5 s,
    /// C-PA-1). The card may be fetched meanwhile.
    pub handshake_timeout: Duration,
    /// How long a client has to send a request's headers (default 5 s,
    /// C-PA-1).
    pub header_read_timeout: Duration,
    /// Connections held unauthenticated at once (default 64, C-PA-1); one
    /// more is closed at once.
    pub max_handshakes: usize,
    /// Of those, most from one source address (an IPv4 address or an IPv6
    /// /64; default 8, C-PA-1).
    pub max_handshakes_per_source: usize,
    /// Link knobs (frame limit, queues).
    pub link: LinkConfig,
}

impl HttpConfig {
    /// Defaults for a loopback test server with plain HTTP explicitly on.
    pub fn loopback(
        name: impl Into<String>,
        peers: Vec<HttpPeer>,
        profiles: Vec<KindProfile>,
    ) -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            public_url: None,
            tls: None,
            plain_http_loopback: true,
            peers,
            profiles,
            name: name.into(),
            max_body: 64 * 1024,
            sync_wait: Duration::from_secs(2),
            max_waiting: 4096,
            max_inflight: 256,
            client_timeout: Duration::from_secs(5),
            bearer_only: Vec::new(),
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            max_handshakes: abhyasa_transport::limit::DEFAULT_MAX_HANDSHAKES,
            max_handshakes_per_source: abhyasa_transport::limit::DEFAULT_MAX_HANDSHAKES_PER_SOURCE,
            link: LinkConfig::default(),
        }
    }
}

impl HttpConfig {
    /// Defaults for a loopback HTTPS server with mutual TLS under
    /// `identity` (plain HTTP off).
    pub fn mtls(
        name: impl Into<String>,
        identity: Identity,
        peers: Vec<HttpPeer>,
        profiles: Vec<KindProfile>,
    ) -> Self {
        let mut c = Self::loopback(name, peers, profiles);
        c.tls = Some(identity);
        c.plain_http_loopback = false;
        c
    }
}

/// Default [`HttpConfig::handshake_timeout`]: 5 s.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Default [`HttpConfig::header_read_timeout`]: 5 s.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the binding did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HttpError {
    /// No TLS identity, and plain HTTP was not explicitly allowed or the
    /// address is not loopback.
    #[error("refusing plain HTTP on {0}: configure a TLS identity (mTLS), or set plain_http_loopback and bind a loopback address")]
    PlainHttpNotAllowed(SocketAddr),
    /// Two peers share a credential, or a credential is empty.
    #[error("peer {0}: bearer credential must be non-empty and unique per peer")]
    BadCredential(AgentId),
    /// A peer has no way to authenticate: no pinned fingerprint with TLS
    /// on, and no bearer credential usable on this listener (over HTTPS a
    /// credential alone counts only for a peer listed in `bearer_only`).
    #[error("peer {0}: needs a pinned certificate fingerprint with TLS on, or a bearer credential (over HTTPS: and a place in bearer_only)")]
    NoAuthentication(AgentId),
    /// `bearer_only` names a peer that is not configured or has no bearer
    /// credential.
    #[error("bearer_only peer {0}: not a configured peer with a bearer credential")]
    BearerOnly(AgentId),
    /// The pinned fingerprints cannot be right (a duplicate, or our own id).
    #[error("pins: {0}")]
    Pins(#[from] PinError),
    /// Our identity could not be turned into a TLS configuration.
    #[error("TLS: {0}")]
    Tls(#[from] TlsError),
    /// A peer endpoint is not usable.
    #[error("peer {peer}: endpoint {url}: {reason}")]
    BadEndpoint {
        /// The peer.
        peer: AgentId,
        /// The URL.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// The card's service ref is invalid (e.g. the AB-2 sizing rule).
    #[error("agent card: {0}")]
    Card(#[from] ServiceRefError),
    /// Binding the socket failed.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// The transport shut down while starting.
    #[error("transport shut down while starting")]
    ShuttingDown,
}

/// A running HTTP binding: its address, its card and its counters. The
/// server stops with the transport (`TransportHandle::shutdown`).
#[derive(Clone, Debug)]
pub struct HttpServer {
    /// The bound address.
    pub addr: SocketAddr,
    /// The base URL the card advertises.
    pub base_url: String,
    /// The card served at `/.well-known/agent-card.json`.
    pub card: AgentCard,
    /// Counters.
    pub stats: Arc<HttpStats>,
}

/// Starts the HTTP binding for `local`: binds, builds the card, attaches
/// one link per peer and serves until the transport shuts down.
pub async fn start(local: AgentId, cfg: HttpConfig) -> Result<(Transport, HttpServer), HttpError> {
    let plain = cfg.plain_http_loopback && cfg.listen.ip().is_loopback();
    if cfg.tls.is_none() && !plain {
        return Err(HttpError::PlainHttpNotAllowed(cfg.listen));
    }
    let mut tokens = HashMap::new();
    let mut pins = Vec::new();
    let mut client_tls = HashMap::new();
    for p in &cfg.peers {
        if let Some(t) = &p.token {
            if t.is_empty() || tokens.insert(t.clone(), p.agent.clone()).is_some() {
                return Err(HttpError::BadCredential(p.agent.clone()));
            }
        }
        let pinned = match (&cfg.tls, p.fingerprint) {
            (Some(identity), Some(fp)) => {
                pins.push(PeerPin {
                    agent: p.agent.clone(),
                    fingerprint: fp,
                });
                let c = dangerous_pinned_client_tls(
                    identity,
                    &p.agent,
                    fp,
                    vec![b"http/1.1".to_vec()],
                )?;
                client_tls.insert(p.agent.clone(), Arc::new(c));
                true
            }
            _ => false,
        };
        if p.token.is_none() && !pinned {
            return Err(HttpError::NoAuthentication(p.agent.clone()));
        }
        for url in [&p.custody_ack_endpoint, &p.obligation_endpoint]
            .into_iter()
            .flatten()
        {
            check_endpoint(url, pinned, plain).map_err(|reason| HttpError::BadEndpoint {
                peer: p.agent.clone(),
                url: url.clone(),
                reason,
            })?;
        }
    }
    for b in &cfg.bearer_only {
        let listed = cfg.peers.iter().any(|p| &p.agent == b && p.token.is_some());
        if !listed {
            return Err(HttpError::BearerOnly(b.clone()));
        }
    }
    if cfg.tls.is_some() {
        // A peer with a credential but no pin authenticates over HTTPS
        // only if the listener lists it as bearer-only.
        for p in &cfg.peers {
            if p.fingerprint.is_none() && !cfg.bearer_only.contains(&p.agent) {
                return Err(HttpError::NoAuthentication(p.agent.clone()));
            }
        }
    }
    let pins = Arc::new(PinSet::new(&local, &pins)?);
    // Client certificates are mandatory unless the listener lists
    // bearer-only peers; a certificate that is presented must be pinned
    // either way (C-A2A-3, C-PA-1).
    let acceptor = match &cfg.tls {
        Some(identity) => {
            let mandatory = cfg.bearer_only.is_empty();
            let tls = pinned_server_tls(
                identity,
                pins.clone(),
                mandatory,
                vec![b"http/1.1".to_vec()],
            )?;
            Some(tokio_rustls::TlsAcceptor::from(Arc::new(tls)))
        }
        None => None,
    };
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .map_err(|source| HttpError::Bind {
            addr: cfg.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| HttpError::Bind {
        addr: cfg.listen,
        source,
    })?;
    let base_url = cfg
        .public_url
        .clone()
        .unwrap_or_else(|| match acceptor {
            Some(_) => format!("https://{addr}"),
            None => format!("http://{addr}"),
        })
        .trim_end_matches('/')
        .to_string();
    let profiles = cfg
        .profiles
        .iter()
        .cloned()
        .map(|mut p| {
            p.obligation_endpoint = format!("{base_url}/abhyasa/obligations");
            p
        })
        .collect();
    let service = AbhyasaServiceRef::new(format!("{base_url}/abhyasa/custody_ack"), profiles)?;
    let card = agent_card(&cfg.name, &base_url, &service);
    let card_json = Bytes::from(serde_json::to_vec(&card).unwrap_or_default());

    let (registry, transport) = Registry::new(local.clone(), cfg.link.clone());
    registry.set_local_addr(addr);
    let mut peers = HashMap::new();
    let mut outbound = Vec::new();
    for p in &cfg.peers {
        registry.add_peer(p.agent.clone());
        // HTTP has no connection to lose: the link is up for the life of
        // the transport, and custody retries whatever a POST loses.
        let link = registry
            .attach(&p.agent)
            .await
            .map_err(|_| HttpError::ShuttingDown)?;
        peers.insert(
            p.agent.clone(),
            PeerSide {
                config: p.clone(),
                client_tls: client_tls.remove(&p.agent),
                sink: tokio::sync::Mutex::new(link.inbound),
            },
        );
        outbound.push((p.agent.clone(), link.outbound, link.guard));
    }
    let stats = Arc::new(HttpStats::default());
    let state = Arc::new(State {
        local,
        tokens,
        bearer_only: cfg
            .tls
            .as_ref()
            .map(|_| cfg.bearer_only.iter().cloned().collect()),
        peers,
        waiting: Mutex::new(HashMap::new()),
        card: card_json,
        max_body: cfg.max_body,
        sync_wait: cfg.sync_wait,
        max_waiting: cfg.max_waiting.max(1),
        max_frame: cfg.link.max_frame,
        client: JsonClient::new(cfg.client_timeout),
        registry: registry.clone(),
        stats: stats.clone(),
        inflight: Arc::new(tokio::sync::Semaphore::new(cfg.max_inflight.max(1))),
    });
    let stop = registry.shutdown_token();
    for (peer, rx, guard) in outbound {
        registry.spawn(outbound_loop(state.clone(), peer, rx, guard, stop.clone()));
    }
    let app = crate::server::router(state.clone());
    let serve = Serve {
        acceptor,
        pins,
        app,
        state: state.clone(),
        handshakes: HandshakeSlots::with_per_source(
            cfg.max_handshakes,
            cfg.max_handshakes_per_source,
        ),
        handshake_timeout: cfg.handshake_timeout,
        header_read_timeout: cfg.header_read_timeout,
        registry: registry.clone(),
        stop,
    };
    registry.spawn(serve.run(listener));
    Ok((
        transport,
        HttpServer {
            addr,
            base_url,
            card,
            stats,
        },
    ))
}

/// Frames the node sends to one peer.
async fn outbound_loop(
    state: Arc<State>,
    peer: AgentId,
    mut rx: mpsc::Receiver<Bytes>,
    guard: LinkGuard,
    stop: CancellationToken,
) {
    loop {
        let frame = tokio::select! {
            _ = stop.cancelled() => break,
            f = rx.recv() => match f { Some(f) => f, None => break },
        };
        let envelope = match decode_message(&frame, state.max_frame) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(%peer, %e, "undecodable frame from the node");
                continue;
            }
        };
        match envelope.message {
            Message::Acks(acks) => {
                for ack in acks {
                    answer_or_push(&state, &peer, ack);
                }
            }
            Message::Error(e) => match e.obligation_id.clone() {
                Some(id) => {
                    for w in state.take_waiters(&(peer.clone(), id)) {
                        let _ = w.send(Answer::Error(e.clone()));
                    }
                }
                None => tracing::debug!(%peer, message = %e.message, "protocol error to peer"),
            },
            Message::Obligation(ob) => {
                let s = state.clone();
                let p = peer.clone();
                state
                    .registry
                    .spawn(async move { post_obligation(&s, &p, ob).await });
            }
            // Status queries have no HTTP form in v1: custody retries the
            // obligation instead, and the receiver re-acks (AB-3).
            Message::StatusQuery(_) | Message::StatusReply(_) => {}
            // Relay frames have no HTTP form: a relayed link rides QUIC.
            Message::Relay(_) => {
                tracing::debug!(%peer, "relay frame has no HTTP form; not sent")
            }
        }
    }
    guard.close().await;
}

/// An ack the node sent: to the request waiting for it, else (a final
/// ack) to the custodian's `custody_ack_endpoint`.
fn answer_or_push(state: &Arc<State>, peer: &AgentId, ack: CustodyAck) {
    let waiters = state.take_waiters(&(peer.clone(), ack.obligation_id.clone()));
    let mut answered = false;
    for w in waiters {
        answered |= w.send(Answer::Ack(ack.clone())).is_ok();
    }
    if answered || ack.status == AckStatus::Deferred {
        // A deferral with nobody waiting carries nothing the custodian's
        // schedule does not already assume.
        return;
    }
    let Some(url) = state
        .peers
        .get(peer)
        .and_then(|p| p.config.custody_ack_endpoint.clone())
    else {
        tracing::debug!(%peer, id = %ack.obligation_id, "final ack with no custody_ack_endpoint; the redelivery will be re-acked");
        return;
    };
    let s = state.clone();
    let p = peer.clone();
    state.registry.spawn(async move {
        let token = s
            .peers
            .get(&p)
            .and_then(|x| x.config.outbound_token.clone());
        let body = ack.to_json();
        // A few attempts; after that the custodian's own retry (AB-2) gets
        // the ack re-sent synchronously.
        for attempt in 0..3u32 {
            let tls = s.peers.get(&p).and_then(|x| x.client_tls.as_ref());
            match s
                .client
                .post(&url, token.as_deref(), body.clone(), tls)
                .await
            {
                Ok(r) if (200..300).contains(&r.status) => {
                    s.stats.acks_pushed.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Ok(r) => tracing::warn!(peer = %p, status = r.status, "custody_ack push refused"),
                Err(e) => tracing::debug!(peer = %p, %e, "custody_ack push failed"),
            }
            tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
        }
        s.stats.push_failures.fetch_add(1, Ordering::Relaxed);
    });
}

/// We are the custodian: POST the obligation to the peer's endpoint.
async fn post_obligation(state: &State, peer: &AgentId, ob: Obligation) {
    let Some(side) = state.peers.get(peer) else {
        return;
    };
    let Some(url) = side.config.obligation_endpoint.as_deref() else {
        tracing::debug!(%peer, "no obligation_endpoint for peer; custody will escalate");
        return;
    };
    state
        .stats
        .obligations_posted
        .fetch_add(1, Ordering::Relaxed);
    let reply = match state
        .client
        .post(
            url,
            side.config.outbound_token.as_deref(),
            ob.to_json(),
            side.client_tls.as_ref(),
        )
        .await
    {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(%peer, %e, "obligation POST failed; custody retries");
            return;
        }
    };
    match reply.status {
        // 200 carries the ack; 202 may carry a deferral.
        200 | 202 => match CustodyAck::from_json(&reply.body) {
            Ok(ack) => {
                state.deliver_acks(peer, vec![ack]).await;
            }
            Err(e) if reply.status == 200 => {
                tracing::warn!(%peer, %e, "200 without a valid CustodyAck")
            }
            Err(_) => {}
        },
        // A conflict carries the receiver's ack under "ack": the custodian
        // escalates with cause conflict (AB-3).
        409 => {
            let ack = serde_json::from_slice::<serde_json::Value>(&reply.body)
                .ok()
                .and_then(|v| v.get("ack").cloned())
                .and_then(|a| match a {
                    serde_json::Value::Object(m) => CustodyAck::from_json_map(&m).ok(),
                    _ => None,
                });
            match ack {
                Some(ack) => {
                    state.deliver_acks(peer, vec![ack]).await;
                }
                None => tracing::warn!(%peer, "409 without a valid CustodyAck"),
            }
        }
        s => tracing::debug!(%peer, status = s, "obligation POST refused; custody retries"),
    }
}

/// The slot an unauthenticated connection holds; the first authenticated
/// request on the connection frees it (C-PA-1).
#[derive(Clone, Debug)]
pub(crate) struct Preauth(Arc<Mutex<Option<HandshakeSlot>>>);

impl Preauth {
    fn authenticated(&self) {
        lock(&self.0).take();
    }

    fn is_authenticated(&self) -> bool {
        lock(&self.0).is_none()
    }
}

/// The accept loop (HTTP or HTTPS): a descriptor and a pre-authentication
/// slot per connection or it is closed at once; the TLS handshake with the
/// pinned verifier; HTTP/1.1 with a header-read timeout, the authenticated
/// agent attached to every request, and the connection closed if it is
/// still unauthenticated at the handshake timeout (C-PA-1).
struct Serve {
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    pins: Arc<PinSet>,
    app: axum::Router,
    state: Arc<State>,
    handshakes: HandshakeSlots,
    handshake_timeout: Duration,
    header_read_timeout: Duration,
    registry: Registry,
    stop: CancellationToken,
}

impl Serve {
    async fn run(self, listener: tokio::net::TcpListener) {
        let this = Arc::new(self);
        loop {
            let (tcp, remote) = tokio::select! {
                _ = this.stop.cancelled() => break,
                r = listener.accept() => match r {
                    Ok(a) => a,
                    Err(e) => {
                        // E.g. out of descriptors: back off, don't spin.
                        tracing::debug!(%e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                },
            };
            // C-PA-1: descriptors are kept back for the control socket,
            // and nothing unauthenticated takes more than its slot.
            let Some(fd) = Descriptors::take() else {
                this.refuse(remote, "descriptor budget spent");
                continue;
            };
            let slot = match this.handshakes.try_take_from(remote.ip()) {
                Ok(slot) => slot,
                Err(why) => {
                    this.refuse(remote, &why.to_string());
                    continue;
                }
            };
            let t = this.clone();
            this.registry.spawn(async move {
                t.serve(tcp, slot).await;
                drop(fd);
            });
        }
    }

    fn refuse(&self, remote: SocketAddr, why: &str) {
        let n = self
            .state
            .stats
            .connections_refused
            .fetch_add(1, Ordering::Relaxed);
        if n % 1024 == 0 {
            tracing::warn!(%remote, error = %why, refused = n + 1, "refused inbound HTTP connection");
        }
    }

    async fn serve(self: Arc<Self>, tcp: tokio::net::TcpStream, slot: HandshakeSlot) {
        let _ = tcp.set_nodelay(true);
        let deadline = tokio::time::Instant::now() + self.handshake_timeout;
        let stats = &self.state.stats;
        let (io, peer): (Box<dyn IoStream>, _) = match &self.acceptor {
            None => (Box::new(tcp), None),
            Some(acceptor) => {
                let tls = match tokio::time::timeout_at(deadline, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        stats.tls_refused.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(%e, "TLS handshake refused");
                        return;
                    }
                    Err(_) => {
                        stats.tls_refused.fetch_add(1, Ordering::Relaxed);
                        stats.unauthenticated_closed.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                };
                // The verifier accepted only pinned certificates, so a
                // presented certificate always names an agent here.
                let peer = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .and_then(|c| self.pins.agent(&Fingerprint::of(c)).cloned())
                    .map(TlsPeer);
                (Box::new(tls), peer)
            }
        };
        let preauth = Preauth(Arc::new(Mutex::new(Some(slot))));
        if peer.is_some() {
            // Authenticated by its pinned certificate.
            preauth.authenticated();
        }
        let app = self.app.clone();
        let state = self.state.clone();
        let gate = preauth.clone();
        let svc =
            hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                match &peer {
                    Some(p) => {
                        req.extensions_mut().insert(p.clone());
                    }
                    None => {
                        if state.bearer_peer(req.headers()).is_some() {
                            gate.authenticated();
                        }
                    }
                }
                let mut app = app.clone();
                async move { tower_service::Service::call(&mut app, req).await }
            });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(self.header_read_timeout)
            .serve_connection(hyper_util::rt::TokioIo::new(io), svc);
        tokio::pin!(conn);
        let mut watching = !preauth.is_authenticated();
        loop {
            tokio::select! {
                r = &mut conn => {
                    if let Err(e) = r {
                        tracing::debug!(%e, "HTTP connection ended");
                    }
                    break;
                }
                _ = self.stop.cancelled() => break,
                _ = tokio::time::sleep_until(deadline), if watching => {
                    if preauth.is_authenticated() {
                        watching = false;
                    } else {
                        stats.unauthenticated_closed.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                }
            }
        }
    }
}

/// A byte stream one connection is served over (TCP or TLS over TCP).
trait IoStream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static> IoStream for T {}
