//! WebSocket over turmoil TCP: the real `abhyasa-ws` transport
//! ([`abhyasa_ws::start_with_io`]) on turmoil's `TcpListener` and
//! `TcpStream`. TCP under turmoil is reliable and ordered; partitions of a
//! WebSocket scenario hold the link (delivering what was held when it is
//! released), as TCP buffers across an outage.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use abhyasa_transport::{LinkConfig, Transport};
use abhyasa_ws::{BoxedIo, IoFuture, StreamIo, WsConfig};

use super::ctx::{start_err, HostCtx, HostError, Role, PORT};

struct TurmoilTcp {
    listener: Option<turmoil::net::TcpListener>,
}

impl StreamIo for TurmoilTcp {
    fn accept(&self) -> IoFuture<'_, (BoxedIo, SocketAddr)> {
        Box::pin(async move {
            match &self.listener {
                Some(l) => {
                    let (s, remote) = l.accept().await?;
                    Ok((Box::new(s) as BoxedIo, remote))
                }
                None => std::future::pending().await,
            }
        })
    }

    fn connect(&self, host: String, port: u16) -> IoFuture<'_, BoxedIo> {
        Box::pin(async move {
            let s = turmoil::net::TcpStream::connect((host.as_str(), port)).await?;
            Ok(Box::new(s) as BoxedIo)
        })
    }
}

/// Starts the WebSocket transport on turmoil TCP: receivers listen,
/// custodians dial `ws://receiver-N:PORT`.
pub(crate) async fn start(ctx: &HostCtx, link: LinkConfig) -> Result<Transport, HostError> {
    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", PORT))
        .await
        .map_err(|e| start_err(&ctx.name, format!("bind tcp: {e}")))?;
    let listen = listener.local_addr().map_err(|e| start_err(&ctx.name, e))?;
    let mut config = WsConfig::new(ctx.agent.clone(), ctx.identity.clone(), Some(listen));
    config.link = link;
    config.keep_alive = Duration::from_secs(2);
    config.idle_timeout = Duration::from_secs(10);
    config.handshake_timeout = Duration::from_secs(3);
    // The simulated network's addresses are not loopback; nothing leaves
    // the process.
    config.allow_plaintext_remote = true;
    for (host, pin) in &ctx.peers {
        let url = (ctx.role == Role::Custodian).then(|| format!("ws://{host}:{PORT}"));
        config = config.with_peer(pin.clone(), url);
    }
    let io = Arc::new(TurmoilTcp {
        listener: Some(listener),
    });
    abhyasa_ws::start_with_io(config, io)
        .await
        .map_err(|e| start_err(&ctx.name, e))
}
