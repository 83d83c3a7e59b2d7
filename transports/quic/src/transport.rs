//! The QUIC transport: one endpoint that accepts pinned peers and dials
//! configured ones; one connection carries frames in two unidirectional
//! streams, one per direction.

use std::sync::Arc;

use abhyasa_core::AgentId;
use abhyasa_identity::{Enrolment, LivePins, PinError, PinSet, TlsError};
use abhyasa_transport::link::{Accepted, Admission, Admitted, Attempt, DialError, Link, Registry};
use abhyasa_transport::Transport;
use bytes::Bytes;

use crate::config::QuicConfig;
use crate::tls;

/// Largest chunk read from a stream at once.
const READ_CHUNK: usize = 64 * 1024;
/// Frames coalesced into one write when the queue has several waiting.
const WRITE_BATCH: usize = 64;
/// First bytes of each side's stream, before any frame.
const PREAMBLE: &[u8] = b"abhyasa1";
/// Application close codes.
const CLOSE_SHUTDOWN: u32 = 0;
const CLOSE_UNKNOWN_PEER: u32 = 1;
const CLOSE_PROTOCOL: u32 = 2;

/// The transport could not start (local configuration or environment).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The peer list is inconsistent.
    #[error("peer configuration: {0}")]
    Pins(#[from] PinError),
    /// The TLS configuration could not be built.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// A timeout knob is out of range.
    #[error("invalid timeouts: {0}")]
    Timeouts(String),
    /// `fixed_mtu` is out of range.
    #[error("invalid fixed_mtu: {0}")]
    Mtu(String),
    /// The UDP socket could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

struct Ctx {
    config: QuicConfig,
    pins: LivePins,
    registry: Registry,
    endpoint: quinn::Endpoint,
    transport: Arc<quinn::TransportConfig>,
    /// C-ND-5, C-PA-1: inbound handshakes in flight, capped; refusals
    /// counted and logged rate-limited.
    admission: Admission,
}

fn transport_config(config: &QuicConfig) -> Result<quinn::TransportConfig, StartError> {
    if config.keep_alive >= config.idle_timeout {
        return Err(StartError::Timeouts(format!(
            "keep_alive ({:?}) must be below idle_timeout ({:?})",
            config.keep_alive, config.idle_timeout
        )));
    }
    let idle = quinn::IdleTimeout::try_from(config.idle_timeout)
        .map_err(|e| StartError::Timeouts(format!("idle_timeout: {e}")))?;
    let mut t = quinn::TransportConfig::default();
    t.max_idle_timeout(Some(idle))
        .keep_alive_interval(Some(config.keep_alive))
        // One unidirectional stream each way; nothing else is allowed, so a
        // peer cannot make us buffer streams we never read.
        .max_concurrent_bidi_streams(0u8.into())
        .max_concurrent_uni_streams(1u8.into());
    if let Some(mtu) = config.fixed_mtu {
        if mtu < 1200 {
            return Err(StartError::Mtu(format!(
                "{mtu} is below QUIC's minimum of 1200"
            )));
        }
        t.initial_mtu(mtu).min_mtu(mtu).mtu_discovery_config(None);
    }
    Ok(t)
}

/// Starts the QUIC transport: binds `config.listen`, accepts pinned peers
/// and dials every peer that has an address. Must be called within a tokio
/// runtime.
pub async fn start(config: QuicConfig) -> Result<Transport, StartError> {
    Ok(start_enrollable(config).await?.0)
}

/// [`start`], and the [`Enrolment`] that adds and removes accepted peers
/// while the endpoint runs.
pub async fn start_enrollable(config: QuicConfig) -> Result<(Transport, Enrolment), StartError> {
    let socket = std::net::UdpSocket::bind(config.listen).map_err(|source| StartError::Bind {
        addr: config.listen,
        source,
    })?;
    let runtime: Arc<dyn quinn::Runtime> = Arc::new(quinn::TokioRuntime);
    let socket = runtime
        .wrap_udp_socket(socket)
        .map_err(|source| StartError::Bind {
            addr: config.listen,
            source,
        })?;
    start_inner(config, socket, runtime).await
}

/// Starts the QUIC transport on a given socket and runtime instead of
/// binding `config.listen` (which is then ignored): for a simulated network
/// (netsim runs it over turmoil's UDP with a seeded dropper). Otherwise the
/// same as [`start`].
pub async fn start_with_socket(
    config: QuicConfig,
    socket: Arc<dyn quinn::AsyncUdpSocket>,
    runtime: Arc<dyn quinn::Runtime>,
) -> Result<Transport, StartError> {
    Ok(start_inner(config, socket, runtime).await?.0)
}

async fn start_inner(
    config: QuicConfig,
    socket: Arc<dyn quinn::AsyncUdpSocket>,
    runtime: Arc<dyn quinn::Runtime>,
) -> Result<(Transport, Enrolment), StartError> {
    let pins = LivePins::new(
        config.agent.clone(),
        PinSet::new(&config.agent, config.peers.iter().map(|p| &p.pin))?,
    );
    let transport = Arc::new(transport_config(&config)?);
    let mut server = tls::server_config(&config.identity, pins.clone(), transport.clone())?;
    // C-PA-1: what quinn itself holds for connection attempts not yet
    // accepted: a bounded queue, and a bounded buffer of their early
    // datagrams (a handshake's Initial flight fits well inside 16 KiB).
    server
        .max_incoming(config.max_handshakes.saturating_mul(2).max(1))
        .incoming_buffer_size(16 * 1024)
        .incoming_buffer_size_total(
            u64::try_from(config.max_handshakes.saturating_mul(2).max(1))
                .unwrap_or(u64::MAX)
                .saturating_mul(16 * 1024),
        );
    let addr = socket.local_addr().unwrap_or(config.listen);
    let mut endpoint_config =
        quinn::EndpointConfig::new(Arc::new(tls::reset_key(&config.identity)));
    endpoint_config.rng_seed(config.dangerous_rng_seed);
    if let Some(mtu) = config.fixed_mtu {
        // Receive buffers must hold the fixed-size datagrams.
        endpoint_config
            .max_udp_payload_size(mtu)
            .map_err(|e| StartError::Mtu(format!("{mtu}: {e}")))?;
    }
    let endpoint =
        quinn::Endpoint::new_with_abstract_socket(endpoint_config, Some(server), socket, runtime)
            .map_err(|source| StartError::Bind { addr, source })?;
    let (registry, handle) = Registry::new(config.agent.clone(), config.link.clone());
    if let Ok(addr) = endpoint.local_addr() {
        registry.set_local_addr(addr);
    }
    for peer in &config.peers {
        registry.add_peer(peer.pin.agent.clone());
    }
    let admission = Admission::new(
        registry.clone(),
        "QUIC",
        config.max_handshakes,
        config.max_handshakes_per_source,
    );
    let enrolment = Enrolment::new(pins.clone(), registry.clone());
    let ctx = Arc::new(Ctx {
        config,
        pins,
        registry: registry.clone(),
        endpoint,
        transport,
        admission,
    });
    registry.spawn(accept_loop(ctx.clone()));
    for peer in &ctx.config.peers {
        if let Some(addr) = peer.addr {
            let (ctx, agent) = (ctx.clone(), peer.pin.agent.clone());
            registry.spawn_dialer(peer.pin.agent.clone(), move || {
                dial(ctx.clone(), agent.clone(), addr)
            });
        }
    }
    Ok((handle, enrolment))
}

/// An inbound QUIC connection attempt.
struct QuicAttempt(quinn::Incoming);

impl Attempt for QuicAttempt {
    fn remote(&self) -> std::net::SocketAddr {
        self.0.remote_address()
    }

    fn source_validated(&self) -> bool {
        self.0.remote_address_validated()
    }

    /// Sends a Retry: the peer's next Initial proves its address.
    fn retry(self) -> Option<Self> {
        if !self.0.may_retry() {
            return Some(self);
        }
        if let Err(e) = self.0.retry() {
            e.into_incoming().ignore();
        }
        None
    }

    /// A CONNECTION_REFUSED close.
    fn refuse(self) {
        self.0.refuse();
    }
}

async fn accept_loop(ctx: Arc<Ctx>) {
    let endpoint = &ctx.endpoint;
    let next = move || async move {
        match endpoint.accept().await {
            Some(incoming) => Accepted::Attempt(QuicAttempt(incoming)),
            None => Accepted::Closed,
        }
    };
    let handshake = |attempt: QuicAttempt, admitted| {
        let ctx = ctx.clone();
        async move { accept(&ctx, attempt.0, admitted).await }
    };
    ctx.admission.run(next, handshake).await;
    ctx.endpoint.close(CLOSE_SHUTDOWN.into(), b"shutdown");
    // Let the close frames go out and closing connections drain (up to
    // three probe timeouts) so the UDP port is free when this returns.
    ctx.endpoint.wait_idle().await;
}

async fn accept(
    ctx: &Ctx,
    incoming: quinn::Incoming,
    mut admitted: Admitted,
) -> Result<(), DialError> {
    let connecting = incoming.accept().map_err(DialError::new)?;
    let conn = tokio::time::timeout(ctx.config.connect_timeout, connecting)
        .await
        .map_err(|_| DialError::new("handshake timed out"))?
        .map_err(DialError::new)?;
    // The verifier admitted only pinned fingerprints; this maps the one
    // presented to its agent id (the authenticated peer).
    let Some(peer) = tls::peer_fingerprint(&conn).and_then(|fp| ctx.pins.agent(&fp)) else {
        conn.close(CLOSE_UNKNOWN_PEER.into(), b"unknown peer");
        return Err(DialError::new("peer certificate not pinned"));
    };
    admitted.authenticated();
    tracing::info!(%peer, remote = %conn.remote_address(), "accepted QUIC connection");
    run(ctx, conn, peer).await
}

async fn dial(ctx: Arc<Ctx>, peer: AgentId, addr: std::net::SocketAddr) -> Result<(), DialError> {
    let expected = ctx
        .pins
        .fingerprint(&peer)
        .ok_or_else(|| DialError::new("peer is not pinned"))?;
    let client = tls::dangerous_pinned_client_config(
        &ctx.config.identity,
        &peer,
        expected,
        ctx.transport.clone(),
    )
    .map_err(DialError::new)?;
    let connecting = ctx
        .endpoint
        .connect_with(client, addr, tls::SERVER_NAME)
        .map_err(DialError::new)?;
    let conn = tokio::time::timeout(ctx.config.connect_timeout, connecting)
        .await
        .map_err(|_| {
            DialError::new(format!(
                "no handshake with {addr} within the connect timeout"
            ))
        })?
        .map_err(DialError::new)?;
    // Belt and braces: the verifier already compared the pin.
    if tls::peer_fingerprint(&conn) != Some(expected) {
        conn.close(CLOSE_UNKNOWN_PEER.into(), b"unexpected certificate");
        return Err(DialError::new("server certificate does not match the pin"));
    }
    tracing::info!(%peer, %addr, "dialled QUIC connection");
    run(&ctx, conn, peer).await
}

/// Opens our stream and waits for the peer's. The peer's preamble is the
/// proof that it accepted us: in TLS 1.3 a client finishes its handshake
/// before the server has checked the client certificate, and a server only
/// opens its stream once it has.
async fn open_streams(
    conn: &quinn::Connection,
) -> Result<(quinn::SendStream, quinn::RecvStream), DialError> {
    let mut send = conn.open_uni().await.map_err(DialError::new)?;
    send.write_all(PREAMBLE).await.map_err(DialError::new)?;
    let mut recv = conn.accept_uni().await.map_err(DialError::new)?;
    let mut preamble = [0u8; PREAMBLE.len()];
    recv.read_exact(&mut preamble)
        .await
        .map_err(DialError::new)?;
    if preamble != PREAMBLE {
        return Err(DialError::new(
            "peer stream does not start with the abhyasa preamble",
        ));
    }
    Ok((send, recv))
}

/// Carries frames over an authenticated connection until it ends. `Err`
/// if the connection never got as far as carrying frames.
async fn run(ctx: &Ctx, conn: quinn::Connection, peer: AgentId) -> Result<(), DialError> {
    let streams = tokio::time::timeout(ctx.config.connect_timeout, open_streams(&conn)).await;
    let (send, recv) = match streams {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            conn.close(CLOSE_PROTOCOL.into(), b"no stream");
            return Err(e);
        }
        Err(_) => {
            conn.close(CLOSE_PROTOCOL.into(), b"no stream");
            return Err(DialError::new(
                "peer opened no stream within the connect timeout",
            ));
        }
    };
    let link = match ctx.registry.attach(&peer).await {
        Ok(link) => link,
        Err(e) => {
            conn.close(CLOSE_SHUTDOWN.into(), b"not accepting");
            return Err(DialError::new(e));
        }
    };
    let Link {
        guard,
        outbound,
        inbound,
    } = link;
    let token = ctx.registry.shutdown_token();
    let why = tokio::select! {
        biased;
        _ = token.cancelled() => {
            conn.close(CLOSE_SHUTDOWN.into(), b"shutdown");
            "shutdown".to_string()
        }
        e = write_frames(send, outbound) => e,
        e = read_frames(recv, inbound) => e,
    };
    if conn.close_reason().is_none() && !token.is_cancelled() {
        conn.close(CLOSE_PROTOCOL.into(), why.as_bytes());
    }
    tracing::info!(%peer, reason = %why, "QUIC connection ended");
    guard.close().await;
    Ok(())
}

async fn write_frames(
    mut send: quinn::SendStream,
    mut outbound: tokio::sync::mpsc::Receiver<Bytes>,
) -> String {
    let mut batch = Vec::with_capacity(WRITE_BATCH);
    while let Some(frame) = outbound.recv().await {
        batch.push(frame);
        while batch.len() < WRITE_BATCH {
            match outbound.try_recv() {
                Ok(f) => batch.push(f),
                Err(_) => break,
            }
        }
        let mut chunk = [coalesce(&mut batch)];
        if let Err(e) = send.write_all_chunks(&mut chunk).await {
            return e.to_string();
        }
    }
    "send queue closed".into()
}

/// The frames of `batch` as one buffer (emptying `batch`). quinn keeps
/// every chunk written to a stream as its own segment until the peer
/// acknowledges it, and finds the bytes of each packet it sends by walking
/// those segments from the oldest: with a frame per chunk that walk grows
/// with the frames in flight. One copy of a few hundred bytes
/// per frame buys one segment per batch.
fn coalesce(batch: &mut Vec<Bytes>) -> Bytes {
    if batch.len() == 1 {
        return batch.pop().unwrap_or_default();
    }
    let mut one = bytes::BytesMut::with_capacity(batch.iter().map(Bytes::len).sum());
    for f in batch.drain(..) {
        one.extend_from_slice(&f);
    }
    one.freeze()
}

async fn read_frames(
    mut recv: quinn::RecvStream,
    mut inbound: abhyasa_transport::link::InboundSink,
) -> String {
    loop {
        match recv.read_chunk(READ_CHUNK, true).await {
            Ok(Some(chunk)) => {
                if inbound.push_stream(&chunk.bytes).await.is_err() {
                    return "incoming receiver dropped".into();
                }
            }
            Ok(None) => return "peer finished its stream".into(),
            Err(e) => return e.to_string(),
        }
    }
}
