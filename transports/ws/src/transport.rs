//! The WebSocket transport: a TCP listener that upgrades, runs the signed
//! hello and then carries one frame per binary message; dial loops for
//! peers with a URL.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use abhyasa_core::{AgentId, PeerError};
use abhyasa_identity::{Enrolment, LivePins, PinError, PinSet};
use abhyasa_transport::link::{
    Accepted, Admission, Admitted, Attempt, DialError, InboundSink, Link, Registry,
};
use abhyasa_transport::Transport;
use bytes::Bytes;
use futures_util::{SinkExt as _, StreamExt as _};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::config::WsConfig;
use crate::hello::{self, HelloError};

/// Messages may exceed the frame limit by this much and still be read, so
/// a slightly oversize frame is reported as `FrameTooLarge` on a surviving
/// connection (C-T-4); anything larger ends the connection.
const MESSAGE_SLACK: usize = 64 * 1024;
/// Frames written before one flush when several are queued.
const WRITE_BATCH: usize = 64;
/// How long a closing handshake may take at shutdown.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// The transport could not start (local configuration or environment).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The peer list is inconsistent.
    #[error("peer configuration: {0}")]
    Pins(#[from] PinError),
    /// A peer URL is not a WebSocket URL.
    #[error("peer {peer}: bad URL {url:?}: {reason}")]
    Url {
        /// The peer.
        peer: AgentId,
        /// The URL.
        url: String,
        /// Why it is refused.
        reason: String,
    },
    /// A plaintext `ws://` listener or peer URL off loopback, and
    /// `allow_plaintext_remote` is not set (C-PA-3).
    #[error("refusing plaintext ws:// on {0}: frames after the hello have no integrity; use a loopback address, or set allow_plaintext_remote explicitly")]
    PlaintextRemote(String),
    /// A timeout knob is out of range.
    #[error("invalid timeouts: {0}")]
    Timeouts(String),
    /// The TCP listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

pub(crate) struct Ctx {
    pub(crate) config: WsConfig,
    pub(crate) pins: LivePins,
    registry: Registry,
    io: Option<Arc<dyn StreamIo>>,
    /// C-ND-5, C-PA-1: inbound handshakes (upgrade + hello) in flight,
    /// capped; each connection holds a descriptor; refusals counted and
    /// logged rate-limited.
    admission: Admission,
}

/// A byte stream a WebSocket can run over.
pub trait IoStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> IoStream for T {}

/// A boxed [`IoStream`].
pub type BoxedIo = Box<dyn IoStream>;

/// A future of a stream [`StreamIo`] opened or accepted.
pub type IoFuture<'a, T> = Pin<Box<dyn Future<Output = std::io::Result<T>> + Send + 'a>>;

/// Where the transport's byte streams come from instead of real TCP: for a
/// simulated network (netsim runs the transport over turmoil TCP). See
/// [`start_with_io`].
pub trait StreamIo: Send + Sync + 'static {
    /// The next inbound stream and its remote address (called only when
    /// the configuration has a `listen` address).
    fn accept(&self) -> IoFuture<'_, (BoxedIo, SocketAddr)>;
    /// Opens a stream to `host:port` (from a peer's `ws://` URL).
    fn connect(&self, host: String, port: u16) -> IoFuture<'_, BoxedIo>;
}

pub(crate) fn ws_config(max_frame: usize) -> WebSocketConfig {
    let limit = max_frame.saturating_add(MESSAGE_SLACK);
    WebSocketConfig::default()
        .max_message_size(Some(limit))
        .max_frame_size(Some(limit))
}

/// Starts the WebSocket transport: listens on `config.listen` (if any) and
/// dials every peer that has a URL. Must be called within a tokio runtime.
pub async fn start(config: WsConfig) -> Result<Transport, StartError> {
    Ok(start_inner(config, None).await?.0)
}

/// [`start`], and the [`Enrolment`] that adds and removes accepted peers
/// while the transport runs (the signed hello checks the live pins; an
/// unenrolled peer's connections are closed).
pub async fn start_enrollable(config: WsConfig) -> Result<(Transport, Enrolment), StartError> {
    start_inner(config, None).await
}

/// Starts the WebSocket transport over streams from `io` instead of real
/// TCP: accepts from `io` when `config.listen` is set (the address is then
/// only reported), dials peers' URLs through `io`. Otherwise the same as
/// [`start`].
pub async fn start_with_io(
    config: WsConfig,
    io: Arc<dyn StreamIo>,
) -> Result<Transport, StartError> {
    Ok(start_inner(config, Some(io)).await?.0)
}

async fn start_inner(
    config: WsConfig,
    io: Option<Arc<dyn StreamIo>>,
) -> Result<(Transport, Enrolment), StartError> {
    if config.keep_alive >= config.idle_timeout {
        return Err(StartError::Timeouts(format!(
            "keep_alive ({:?}) must be below idle_timeout ({:?})",
            config.keep_alive, config.idle_timeout
        )));
    }
    if config.keep_alive.is_zero() {
        return Err(StartError::Timeouts("keep_alive must not be zero".into()));
    }
    let pins = LivePins::new(
        config.agent.clone(),
        PinSet::new(&config.agent, config.peers.iter().map(|p| &p.pin))?,
    );
    if let Some(addr) = config.listen {
        if !config.allow_plaintext_remote && !addr.ip().is_loopback() {
            return Err(StartError::PlaintextRemote(addr.to_string()));
        }
    }
    for peer in &config.peers {
        if let Some(url) = &peer.url {
            let loopback = check_url(url).map_err(|reason| StartError::Url {
                peer: peer.pin.agent.clone(),
                url: url.clone(),
                reason,
            })?;
            if !config.allow_plaintext_remote && !loopback {
                return Err(StartError::PlaintextRemote(url.clone()));
            }
        }
    }
    let listener = match (config.listen, &io) {
        (Some(addr), None) => Some(bind(addr).map_err(|source| StartError::Bind { addr, source })?),
        _ => None,
    };
    let listen_io = config.listen.zip(io.clone());
    let (registry, transport) = Registry::new(config.agent.clone(), config.link.clone());
    for peer in &config.peers {
        registry.add_peer(peer.pin.agent.clone());
    }
    let admission = Admission::new(
        registry.clone(),
        "WebSocket",
        config.max_handshakes,
        config.max_handshakes_per_source,
    )
    .with_descriptors();
    let enrolment = Enrolment::new(pins.clone(), registry.clone());
    let ctx = Arc::new(Ctx {
        config,
        pins,
        registry: registry.clone(),
        io,
        admission,
    });
    if let Some((addr, io)) = listen_io {
        registry.set_local_addr(addr);
        registry.spawn(accept_loop(ctx.clone(), io));
    }
    if let Some(listener) = listener {
        if let Ok(addr) = listener.local_addr() {
            registry.set_local_addr(addr);
        }
        registry.spawn(accept_loop(ctx.clone(), Arc::new(Tcp(listener))));
    }
    for peer in &ctx.config.peers {
        if let Some(url) = &peer.url {
            let (ctx, agent, url) = (ctx.clone(), peer.pin.agent.clone(), url.clone());
            registry.spawn_dialer(peer.pin.agent.clone(), move || {
                dial(ctx.clone(), agent.clone(), url.clone())
            });
        }
    }
    Ok((transport, enrolment))
}

/// Checks a peer URL; `Ok(true)` when its host is loopback.
fn check_url(url: &str) -> Result<bool, String> {
    if !url.starts_with("ws://") {
        return Err("only ws:// URLs are supported".into());
    }
    let request = url.into_client_request().map_err(|e| e.to_string())?;
    let host = request.uri().host().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Ok(host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback()))
}

fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // A restarted node must get its port back while the old connections
    // sit in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// Real TCP as a [`StreamIo`], so one accept loop serves real and
/// simulated networks. Nagle is off on every stream.
struct Tcp(tokio::net::TcpListener);

impl StreamIo for Tcp {
    fn accept(&self) -> IoFuture<'_, (BoxedIo, SocketAddr)> {
        Box::pin(async move {
            let (tcp, remote) = self.0.accept().await?;
            let _ = tcp.set_nodelay(true);
            Ok((Box::new(tcp) as BoxedIo, remote))
        })
    }

    fn connect(&self, host: String, port: u16) -> IoFuture<'_, BoxedIo> {
        Box::pin(async move {
            let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            let _ = tcp.set_nodelay(true);
            Ok(Box::new(tcp) as BoxedIo)
        })
    }
}

/// An accepted stream: its TCP handshake proved the source address.
struct StreamAttempt {
    stream: BoxedIo,
    remote: SocketAddr,
}

impl Attempt for StreamAttempt {
    fn remote(&self) -> SocketAddr {
        self.remote
    }

    fn source_validated(&self) -> bool {
        true
    }

    /// Closes the stream.
    fn refuse(self) {
        drop(self.stream);
    }
}

async fn accept_loop(ctx: Arc<Ctx>, io: Arc<dyn StreamIo>) {
    let io = &io;
    let next = move || async move {
        match io.accept().await {
            Ok((stream, remote)) => Accepted::Attempt(StreamAttempt { stream, remote }),
            Err(e) => Accepted::Failed(e),
        }
    };
    let handshake = |attempt: StreamAttempt, admitted| {
        let ctx = ctx.clone();
        async move { accept(&ctx, attempt.stream, admitted).await }
    };
    ctx.admission.run(next, handshake).await;
}

async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    ctx: &Ctx,
    tcp: S,
    mut admitted: Admitted,
) -> Result<(), DialError> {
    let cfg = ws_config(ctx.config.link.max_frame);
    let handshake = async {
        let mut ws = tokio_tungstenite::accept_async_with_config(tcp, Some(cfg))
            .await
            .map_err(DialError::new)?;
        match server_hello(ctx, &mut ws).await {
            Ok(peer) => Ok((ws, peer)),
            Err(e) => {
                refuse(&mut ws).await;
                Err(DialError::new(e))
            }
        }
    };
    let (ws, peer) = tokio::time::timeout(ctx.config.handshake_timeout, handshake)
        .await
        .map_err(|_| DialError::new("handshake timed out"))??;
    admitted.authenticated();
    tracing::info!(%peer, "accepted WebSocket connection");
    run(ctx, ws, peer).await
}

async fn dial(ctx: Arc<Ctx>, peer: AgentId, url: String) -> Result<(), DialError> {
    if let Some(io) = ctx.io.clone() {
        return dial_io(&ctx, io, peer, url).await;
    }
    let cfg = ws_config(ctx.config.link.max_frame);
    let open = async {
        tokio_tungstenite::connect_async_with_config(url.as_str(), Some(cfg), true)
            .await
            .map(|(ws, _response)| ws)
            .map_err(DialError::new)
    };
    hello_and_run(&ctx, peer, &url, open).await
}

async fn dial_io(
    ctx: &Ctx,
    io: Arc<dyn StreamIo>,
    peer: AgentId,
    url: String,
) -> Result<(), DialError> {
    let cfg = ws_config(ctx.config.link.max_frame);
    let request = url.as_str().into_client_request().map_err(DialError::new)?;
    let host = request.uri().host().unwrap_or_default().to_string();
    let port = request.uri().port_u16().unwrap_or(80);
    let open = async {
        let stream = io.connect(host, port).await.map_err(DialError::new)?;
        tokio_tungstenite::client_async_with_config(request, stream, Some(cfg))
            .await
            .map(|(ws, _response)| ws)
            .map_err(DialError::new)
    };
    hello_and_run(ctx, peer, &url, open).await
}

/// Opens the WebSocket with `open`, runs the client hello against the
/// pinned `peer` (refusing the connection if it fails), all within the
/// handshake timeout, then serves the connection.
async fn hello_and_run<S: AsyncRead + AsyncWrite + Unpin>(
    ctx: &Ctx,
    peer: AgentId,
    url: &str,
    open: impl std::future::Future<Output = Result<WebSocketStream<S>, DialError>>,
) -> Result<(), DialError> {
    let handshake = async {
        let mut ws = open.await?;
        match client_hello(&ctx.config, &ctx.pins, &peer, &mut ws).await {
            Ok(()) => Ok(ws),
            Err(e) => {
                refuse(&mut ws).await;
                Err(DialError::new(e))
            }
        }
    };
    let ws = tokio::time::timeout(ctx.config.handshake_timeout, handshake)
        .await
        .map_err(|_| DialError::new(format!("no handshake with {url} within the timeout")))??;
    tracing::info!(%peer, %url, "dialled WebSocket connection");
    run(ctx, ws, peer).await
}

/// Ends a connection whose hello failed; the reason stays in our log.
async fn refuse<S: AsyncRead + AsyncWrite + Unpin>(ws: &mut WebSocketStream<S>) {
    let frame = CloseFrame {
        code: CloseCode::Policy,
        reason: "unauthorized".into(),
    };
    let _ = tokio::time::timeout(CLOSE_GRACE, ws.close(Some(frame))).await;
}

/// The next binary message of the hello (pings are skipped).
async fn recv_hello<S: AsyncRead + AsyncWrite + Unpin>(
    ws: &mut WebSocketStream<S>,
) -> Result<Bytes, HelloError> {
    loop {
        match ws.next().await {
            Some(Ok(Message::Binary(b))) => return Ok(b),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Ok(Message::Close(c))) => {
                return Err(HelloError::Closed(c.map_or_else(
                    || "close".to_string(),
                    |c| format!("close: {} {}", c.code, c.reason),
                )))
            }
            Some(Ok(_)) => {
                return Err(HelloError::Malformed(
                    "expected a binary hello message".into(),
                ))
            }
            Some(Err(e)) => return Err(HelloError::Closed(e.to_string())),
            None => return Err(HelloError::Closed("end of stream".into())),
        }
    }
}

async fn send_hello<S: AsyncRead + AsyncWrite + Unpin>(
    ws: &mut WebSocketStream<S>,
    bytes: Vec<u8>,
) -> Result<(), HelloError> {
    ws.send(Message::Binary(bytes.into()))
        .await
        .map_err(|e| HelloError::Closed(e.to_string()))
}

pub(crate) async fn server_hello<S: AsyncRead + AsyncWrite + Unpin>(
    ctx: &Ctx,
    ws: &mut WebSocketStream<S>,
) -> Result<AgentId, HelloError> {
    let nonce = hello::nonce()?;
    send_hello(ws, hello::challenge(&ctx.config.agent, &nonce)).await?;
    let msg = recv_hello(ws).await?;
    let (peer, welcome) = hello::answer_hello(
        &ctx.config.identity,
        &ctx.config.agent,
        &ctx.pins,
        &nonce,
        &msg,
    )?;
    send_hello(ws, welcome).await?;
    Ok(peer)
}

pub(crate) async fn client_hello<S: AsyncRead + AsyncWrite + Unpin>(
    config: &WsConfig,
    pins: &impl hello::PinLookup,
    server: &AgentId,
    ws: &mut WebSocketStream<S>,
) -> Result<(), HelloError> {
    let challenge = recv_hello(ws).await?;
    let (hello, state) =
        hello::answer_challenge(&config.identity, &config.agent, server, &challenge)?;
    send_hello(ws, hello).await?;
    let welcome = recv_hello(ws).await?;
    hello::check_welcome(&config.agent, server, pins, &state, &welcome)
}

/// Carries frames over an authenticated connection until it ends.
async fn run<S: AsyncRead + AsyncWrite + Unpin>(
    ctx: &Ctx,
    ws: WebSocketStream<S>,
    peer: AgentId,
) -> Result<(), DialError> {
    let mut ws = ws;
    let link = match ctx.registry.attach(&peer).await {
        Ok(link) => link,
        Err(e) => {
            refuse(&mut ws).await;
            return Err(DialError::new(e));
        }
    };
    let Link {
        guard,
        outbound,
        inbound,
    } = link;
    let (mut sink, mut stream) = ws.split();
    let token = ctx.registry.shutdown_token();
    // Biased (as the other selects here): a fixed poll order keeps runs
    // under a seeded simulated runtime reproducible; no branch can starve.
    let why = tokio::select! {
        biased;
        _ = token.cancelled() => "shutdown".to_string(),
        r = read_frames(&mut stream, inbound, ctx.config.idle_timeout) => r,
        w = write_frames(&mut sink, outbound, ctx.config.keep_alive) => w,
    };
    let frame = CloseFrame {
        code: if token.is_cancelled() {
            CloseCode::Away
        } else {
            CloseCode::Normal
        },
        reason: "closing".into(),
    };
    let _ = tokio::time::timeout(CLOSE_GRACE, sink.send(Message::Close(Some(frame)))).await;
    tracing::info!(%peer, reason = %why, "WebSocket connection ended");
    guard.close().await;
    Ok(())
}

async fn read_frames<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut futures_util::stream::SplitStream<WebSocketStream<S>>,
    mut inbound: InboundSink,
    idle_timeout: Duration,
) -> String {
    loop {
        // Any message, pongs to our pings included, proves the peer alive.
        let msg = match tokio::time::timeout(idle_timeout, stream.next()).await {
            Err(_) => return format!("idle for {idle_timeout:?}"),
            Ok(None) => return "end of stream".into(),
            Ok(Some(Err(e))) => return e.to_string(),
            Ok(Some(Ok(m))) => m,
        };
        let delivered = match msg {
            Message::Binary(b) => inbound.push_message(&b).await,
            Message::Text(_) => {
                inbound
                    .report(PeerError::Malformed {
                        format: "websocket",
                        detail: "text message; frames travel in binary messages".into(),
                    })
                    .await
            }
            Message::Close(_) => return "closed by peer".into(),
            Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => Ok(()),
        };
        if delivered.is_err() {
            return "incoming receiver dropped".into();
        }
    }
}

async fn write_frames<S: AsyncRead + AsyncWrite + Unpin>(
    sink: &mut futures_util::stream::SplitSink<WebSocketStream<S>, Message>,
    mut outbound: mpsc::Receiver<Bytes>,
    keep_alive: Duration,
) -> String {
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + keep_alive, keep_alive);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let result = tokio::select! {
            biased;
            frame = outbound.recv() => {
                let Some(frame) = frame else { return "send queue closed".into() };
                write_batch(sink, frame, &mut outbound).await
            }
            _ = ping.tick() => sink.send(Message::Ping(Bytes::new())).await,
        };
        if let Err(e) = result {
            return e.to_string();
        }
    }
}

async fn write_batch<S: AsyncRead + AsyncWrite + Unpin>(
    sink: &mut futures_util::stream::SplitSink<WebSocketStream<S>, Message>,
    first: Bytes,
    outbound: &mut mpsc::Receiver<Bytes>,
) -> Result<(), tokio_tungstenite::tungstenite::Error> {
    sink.feed(Message::Binary(first)).await?;
    for _ in 1..WRITE_BATCH {
        match outbound.try_recv() {
            Ok(frame) => sink.feed(Message::Binary(frame)).await?,
            Err(_) => break,
        }
    }
    sink.flush().await
}
