//! `abhyasa node run`: one node process serving its control socket.

use std::path::PathBuf;
use std::time::Duration;

use abhyasa::{Node, NodeError, NodeEvent, NodeOptions};
use abhyasa_core::store::StoreError;
use abhyasa_identity::Identity;
use abhyasa_quic::QuicConfig;
use abhyasa_store::StoreOptions;

use abhyasa_a2a::{HttpConfig, HttpPeer};

use crate::config::{HttpServe, NodeConfig, Resolved};
use crate::control;

/// `abhyasa node …`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum NodeCommand {
    /// Runs the node in the foreground until SIGINT or SIGTERM.
    Run(RunArgs),
}

/// Options of `abhyasa node run`.
#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    /// The node directory (from `abhyasa init`).
    #[arg(long)]
    dir: PathBuf,
    /// Log filter when RUST_LOG is unset (error, warn, info, debug, trace).
    #[arg(long, default_value = "info")]
    log_level: String,
}

/// Runs `abhyasa node …`.
pub(crate) fn run(cmd: NodeCommand) -> Result<(), String> {
    let NodeCommand::Run(a) = cmd;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&a.log_level))
        .map_err(|e| format!("--log-level {:?}: {e}", a.log_level))?;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    rt.block_on(serve(a))
}

/// Opens the agent's partition on PostgreSQL off the runtime: it connects,
/// migrates, and under `postgres_standby` waits for the owner's lease.
async fn open_postgres(
    pg: &crate::config::PgSettings,
    agent: &abhyasa_core::AgentId,
) -> Result<Box<dyn abhyasa_core::store::Store>, String> {
    let (url, agent, options) = (pg.url.clone(), agent.clone(), pg.options.clone());
    if matches!(options.takeover, abhyasa_pg::Takeover::Wait { .. }) {
        tracing::info!(holder = %options.holder, "standing by for the agent's lease");
    }
    let store =
        tokio::task::spawn_blocking(move || abhyasa_pg::PgStore::open(&url, &agent, &options))
            .await
            .map_err(|e| format!("store postgres: {e}"))?
            .map_err(|e| format!("store postgres: {e}"))?;
    tracing::info!(holder = %store.holder(), epoch = store.epoch(), "took the agent's partition");
    Ok(Box::new(store))
}

async fn serve(a: RunArgs) -> Result<(), String> {
    let cfg = NodeConfig::load(&a.dir)?;
    let ident_dir = a.dir.join("identity");
    let identity = Identity::load_pem(&ident_dir.join("cert.pem"), &ident_dir.join("key.pem"))
        .map_err(|e| format!("identity: {e}"))?;

    // The socket first: a second `node run` on the same directory fails
    // here with a clear message, before it touches the store.
    let listener = control::bind(&cfg.socket)?;
    let socket = SocketGuard(cfg.socket.clone());

    let mut options = NodeOptions::new(cfg.agent.clone());
    options.custodian.default_profile = cfg.default_profile();
    for (kind, policy) in &cfg.kind_policies {
        let mut p = cfg.default_profile();
        p.decline_policy = *policy;
        options.custodian.profiles.insert(kind.clone(), p);
    }
    options.custodian.seed = cfg.raw.seed;
    options.custodian.max_pending = cfg.raw.max_pending;
    options.receiver.skew_margin = Duration::from_millis(cfg.raw.skew_margin_ms);
    cfg.apply_limits(&mut options);

    // Rows moved aside by `abhyasa store quarantine` are not custody the
    // node resumes: say so on every start until someone looks at them
    // (embedded stores only: PostgreSQL has no quarantine table).
    let quarantined = match cfg.postgres {
        Some(_) => None,
        None => cfg
            .store
            .open_for_repair(&cfg.store_path, &StoreOptions::default())
            .and_then(|r| r.quarantined())
            .ok(),
    };
    if let Some(q) = quarantined.filter(|q| !q.is_empty()) {
        tracing::warn!(
            rows = q.len(),
            "the store holds quarantined rows; see `abhyasa store quarantined`"
        );
    }
    let store: Box<dyn abhyasa_core::store::Store> = match &cfg.postgres {
        Some(pg) => open_postgres(pg, &cfg.agent).await?,
        None => cfg
            .store
            .open(&cfg.store_path, &StoreOptions::default())
            .map_err(|e| match e {
                // C-SD-2: refused, nothing changed; the operator's next step.
                e @ StoreError::Damaged { .. } => format!(
                    "store {}: {e}; {}",
                    cfg.store_path.display(),
                    super::store::damage_hint(&a.dir)
                ),
                e => format!("store {}: {e}", cfg.store_path.display()),
            })?,
    };

    // QUIC for the peers it pins; WebSocket (dial only) for `transport =
    // "ws"` peers; the HTTP binding (when `[http]` is set) for `transport =
    // "http"` peers, all routed by peer as one transport.
    // C-PA-1: descriptors are kept back from every listener, so the
    // control socket still accepts while a listener is flooded.
    let fds = abhyasa_transport::limit::Descriptors::reserve(cfg.limits.descriptor_reserve);
    tracing::info!(
        limit = ?fds.limit,
        reserve = fds.reserve,
        connections = fds.connections,
        "descriptor budget of the listeners"
    );
    let mut qcfg = QuicConfig::new(cfg.agent.clone(), identity.clone(), cfg.listen);
    qcfg.max_handshakes = cfg.limits.max_handshakes;
    qcfg.max_handshakes_per_source = cfg.limits.max_handshakes_per_source;
    for p in cfg
        .peers
        .iter()
        .filter(|p| p.http_url.is_none() && p.ws_url.is_none())
    {
        qcfg = qcfg.with_peer(p.pin.clone(), p.addr);
    }
    let quic = abhyasa_quic::start(qcfg)
        .await
        .map_err(|e| format!("QUIC transport on {}: {e}", cfg.listen))?;
    let listen = quic.handle.local_addr();
    let mut parts = vec![quic];
    let ws_peers: Vec<_> = cfg.peers.iter().filter(|p| p.ws_url.is_some()).collect();
    if !ws_peers.is_empty() {
        let mut wcfg = abhyasa_ws::WsConfig::new(cfg.agent.clone(), identity.clone(), None);
        wcfg.allow_plaintext_remote = cfg.limits.allow_plaintext_ws;
        for p in ws_peers {
            wcfg = wcfg.with_peer(p.pin.clone(), p.ws_url.clone());
        }
        parts.push(
            abhyasa_ws::start(wcfg)
                .await
                .map_err(|e| format!("WebSocket transport: {e}"))?,
        );
    }
    if let Some(h) = &cfg.http {
        parts.push(start_http(&cfg, h, identity.clone()).await?);
    }
    let transport = if parts.len() == 1 {
        parts.pop().ok_or("no transport")?
    } else {
        abhyasa_transport::routed::compose(
            parts,
            abhyasa_transport::LinkConfig::default().incoming_queue,
        )
        .map_err(|e| format!("transports: {e}"))?
    };
    // Peers with `via` are (also) reached sealed through their relays,
    // whichever transport reaches the relay (the wrapper sits on the
    // composed transport, so it sends to a relay on any part).
    let transport = super::relay::relayed_link(&cfg, &identity, transport);

    let node = Node::open(options, store, transport)
        .await
        .map_err(|e| match e {
            NodeError::Store(corrupt @ StoreError::Corrupt { .. }) => {
                format!(
                    "node: store: {corrupt}; {}",
                    super::store::repair_hint(&a.dir)
                )
            }
            NodeError::Store(damaged @ StoreError::Damaged { .. }) => {
                format!(
                    "node: store: {damaged}; {}",
                    super::store::damage_hint(&a.dir)
                )
            }
            e => format!("node: {e}"),
        })?;
    // The recovery decoded every stored row once; what it freed goes back
    // to the system now rather than after mimalloc's purge delay (the
    // memory per pending obligation in the README is measured so).
    abhyasa_alloc::collect();
    tracing::info!(
        agent = %cfg.agent,
        listen = ?listen,
        store = if cfg.postgres.is_some() { "postgres" } else { cfg.store.as_str() },
        socket = %cfg.socket.display(),
        peers = cfg.peers.len(),
        "node running"
    );

    let peers = std::sync::Arc::new(cfg.peers.iter().map(|p| p.pin.agent.clone()).collect());
    let control_task = tokio::spawn(control::serve(listener, node.clone(), peers));
    let events_task = tokio::spawn(log_events(node.subscribe()));

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("signal handler: {e}"))?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
        _ = term.recv() => tracing::info!("SIGTERM: stopping"),
        // The node stopped on its own (a failed commit, or the store was
        // taken over by a standby): exit with its reason, so a supervisor
        // sees the failure rather than a process that answers nothing.
        stopped = node.stopped() => {
            control_task.abort();
            drop(socket);
            events_task.abort();
            return match stopped {
                Ok(()) => Ok(()),
                Err(e) => Err(format!("node stopped: {e}")),
            };
        }
    }
    control_task.abort();
    drop(socket);
    let result = node.shutdown().await.map_err(|e| format!("shutdown: {e}"));
    events_task.abort();
    tracing::info!("stopped");
    result
}

/// Starts the A2A HTTP binding of `[http]`: HTTPS with mutual TLS under
/// the node identity (or plain HTTP on loopback when configured), serving
/// the card's endpoints and reaching the `transport = "http"` peers.
async fn start_http(
    cfg: &Resolved,
    h: &HttpServe,
    identity: Identity,
) -> Result<abhyasa_transport::Transport, String> {
    let peers = cfg
        .peers
        .iter()
        .filter_map(|p| {
            let url = p.http_url.as_ref()?;
            Some(HttpPeer {
                agent: p.pin.agent.clone(),
                token: p.token.clone(),
                fingerprint: Some(p.pin.fingerprint),
                custody_ack_endpoint: Some(format!("{url}/abhyasa/custody_ack")),
                obligation_endpoint: Some(format!("{url}/abhyasa/obligations")),
                outbound_token: None,
            })
        })
        .collect();
    let (_, obligation_endpoint) = cfg.card_endpoints();
    let profiles = cfg.card_profiles(&obligation_endpoint)?;
    let mut hc = if h.plain_http_loopback {
        HttpConfig::loopback(cfg.agent.to_string(), peers, profiles)
    } else {
        HttpConfig::mtls(cfg.agent.to_string(), identity, peers, profiles)
    };
    hc.listen = h.listen;
    hc.public_url = Some(h.base_url.clone());
    hc.bearer_only = h.bearer_only.clone();
    hc.handshake_timeout = h.handshake_timeout;
    hc.header_read_timeout = h.header_read_timeout;
    hc.max_handshakes = cfg.limits.max_handshakes;
    hc.max_handshakes_per_source = cfg.limits.max_handshakes_per_source;
    let (transport, server) = abhyasa_a2a::start(cfg.agent.clone(), hc)
        .await
        .map_err(|e| format!("HTTP binding on {}: {e}", h.listen))?;
    tracing::info!(addr = %server.addr, url = %server.base_url, "A2A HTTP binding serving");
    Ok(transport)
}

/// Removes the control socket when the node stops.
struct SocketGuard(PathBuf);

impl Drop for SocketGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

async fn log_events(mut rx: abhyasa::Subscription) {
    // A relay can refuse every frame it is sent: a few lines per minute,
    // then a count of what was held back (C-ND-5: logs are bounded too).
    let refusals = abhyasa_transport::limit::WarnLimiter::new(5, Duration::from_secs(60));
    loop {
        match rx.recv().await {
            Ok(NodeEvent::RelayRefused {
                relay,
                destination,
                obligation_id,
                code,
                retry_after_seconds,
            }) => {
                if let Some(held) = refusals.allow() {
                    tracing::warn!(
                        %relay,
                        destination = ?destination,
                        obligation = ?obligation_id,
                        code = ?code,
                        retry_after_seconds,
                        held_back = held,
                        "the relay refused a frame; custody keeps its schedule"
                    );
                }
            }
            Ok(NodeEvent::PeerUp(p)) => tracing::info!(peer = %p, "peer connected"),
            Ok(NodeEvent::PeerDown(p)) => tracing::info!(peer = %p, "peer disconnected"),
            Ok(NodeEvent::PeerMisbehaved { peer, what }) => {
                tracing::warn!(peer = %peer, what = %what, "peer misbehaved");
            }
            Ok(e) => tracing::debug!(event = ?e, "event"),
            Err(e @ abhyasa::SubscriptionError::Compacted { .. }) => {
                tracing::warn!(error = %e, "event log lagged past retention");
            }
            Err(_) => return,
        }
    }
}
