//! Loopback tests of the WebSocket transport (127.0.0.1 only, bounded in
//! time).

mod auth;
mod hello;
mod transport;

use std::net::SocketAddr;
use std::time::Duration;

use abhyasa_core::wire::{Envelope, Message};
use abhyasa_core::{AgentId, ObligationId};
use abhyasa_identity::{generate_identity, Identity, PinSet};
use abhyasa_transport::{Backoff, Incoming, LinkConfig, Transport};
use tokio::net::TcpStream;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::{start, WsConfig};

pub(super) type RawWs = WebSocketStream<MaybeTlsStream<TcpStream>>;

pub(super) fn id(s: &str) -> AgentId {
    AgentId::new(s).expect("valid agent id")
}

pub(super) fn identity(agent: &AgentId) -> Identity {
    generate_identity(agent).expect("identity")
}

pub(super) fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

pub(super) fn url(addr: SocketAddr) -> String {
    format!("ws://{addr}/abhyasa")
}

pub(super) fn config(agent: &AgentId, identity: &Identity, listen: Option<SocketAddr>) -> WsConfig {
    let mut c = WsConfig::new(agent.clone(), identity.clone(), listen);
    c.keep_alive = Duration::from_millis(500);
    c.idle_timeout = Duration::from_secs(5);
    c.handshake_timeout = Duration::from_secs(3);
    c.link = LinkConfig {
        backoff: Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(300),
        },
        ..LinkConfig::default()
    };
    c
}

pub(super) fn query(sender: &AgentId, n: usize) -> Envelope {
    let oid = ObligationId::new(format!("o-{n}")).expect("valid id");
    Envelope::new(sender.clone(), Message::StatusQuery(vec![oid]))
}

pub(super) fn frame(env: &Envelope) -> Vec<u8> {
    let mut v = Vec::new();
    env.encode_frame(&mut v);
    v
}

pub(super) async fn next(t: &mut Transport) -> Incoming {
    tokio::time::timeout(Duration::from_secs(10), t.incoming.recv())
        .await
        .expect("an incoming item within 10 s")
        .expect("incoming channel open")
}

/// A listening node `b` that pins `a` (no URL: `a` dials in).
pub(super) struct Server {
    pub(super) b: Transport,
    pub(super) a_id: Identity,
    pub(super) b_id: Identity,
    pub(super) addr: SocketAddr,
}

pub(super) async fn server(max_frame: Option<usize>) -> Server {
    let (a_id, b_id) = (identity(&id("a")), identity(&id("b")));
    let mut cfg = config(&id("b"), &b_id, Some(loopback())).with_peer(a_id.pin(id("a")), None);
    if let Some(m) = max_frame {
        cfg.link.max_frame = m;
    }
    let b = start(cfg).await.expect("b starts");
    let addr = b.handle.local_addr().expect("b listens");
    Server {
        b,
        a_id,
        b_id,
        addr,
    }
}

/// A bare WebSocket connection to `addr`, upgraded but before the hello.
pub(super) async fn raw_connect(addr: SocketAddr) -> RawWs {
    let (ws, _) = tokio::time::timeout(
        Duration::from_secs(5),
        tokio_tungstenite::connect_async(url(addr)),
    )
    .await
    .expect("connects within 5 s")
    .expect("upgrade");
    ws
}

/// Runs the client side of the hello as `me`/`agent`, expecting `server`
/// pinned as `pins` says.
pub(super) async fn raw_hello(
    ws: &mut RawWs,
    me: &Identity,
    agent: &AgentId,
    server: &AgentId,
    pins: &PinSet,
) -> Result<(), crate::HelloError> {
    let cfg = config(agent, me, None);
    tokio::time::timeout(
        Duration::from_secs(5),
        crate::transport::client_hello(&cfg, pins, server, ws),
    )
    .await
    .expect("hello settles within 5 s")
}

/// Polls `cond` until it holds, for at most 10 s. For conditions no event
/// announces (counters).
pub(super) async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
