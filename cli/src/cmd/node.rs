//! `abhyasa node run`: one node process serving its control socket.

use std::path::PathBuf;
use std::time::Duration;

use abhyasa::{Node, NodeError, NodeEvent, NodeOptions};
use abhyasa_core::store::StoreError;
use abhyasa_quic::{Identity, QuicConfig};
use abhyasa_store::StoreOptions;

use crate::config::NodeConfig;
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
    // node resumes: say so on every start until someone looks at them.
    if let Ok(q) = cfg
        .store
        .open_for_repair(&cfg.store_path, &StoreOptions::default())
        .and_then(|r| r.quarantined())
    {
        if !q.is_empty() {
            tracing::warn!(
                rows = q.len(),
                "the store holds quarantined rows; see `abhyasa store quarantined`"
            );
        }
    }
    let store = cfg
        .store
        .open(&cfg.store_path, &StoreOptions::default())
        .map_err(|e| format!("store {}: {e}", cfg.store_path.display()))?;

    let mut qcfg = QuicConfig::new(cfg.agent.clone(), identity.clone(), cfg.listen);
    for p in &cfg.peers {
        qcfg = qcfg.with_peer(p.pin.clone(), p.addr);
    }
    let transport = abhyasa_quic::start(qcfg)
        .await
        .map_err(|e| format!("QUIC transport on {}: {e}", cfg.listen))?;
    let transport = super::relay::relayed_link(&cfg, &identity, transport);
    let listen = transport.handle.local_addr();

    let node = Node::open(options, store, transport)
        .await
        .map_err(|e| match e {
            NodeError::Store(corrupt @ StoreError::Corrupt { .. }) => {
                format!(
                    "node: store: {corrupt}; {}",
                    super::store::repair_hint(&a.dir)
                )
            }
            e => format!("node: {e}"),
        })?;
    tracing::info!(
        agent = %cfg.agent,
        listen = ?listen,
        store = %cfg.store,
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
    }
    control_task.abort();
    drop(socket);
    let result = node.shutdown().await.map_err(|e| format!("shutdown: {e}"));
    events_task.abort();
    tracing::info!("stopped");
    result
}

/// Removes the control socket when the node stops.
struct SocketGuard(PathBuf);

impl Drop for SocketGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

async fn log_events(mut rx: tokio::sync::broadcast::Receiver<NodeEvent>) {
    loop {
        match rx.recv().await {
            Ok(NodeEvent::PeerUp(p)) => tracing::info!(peer = %p, "peer connected"),
            Ok(NodeEvent::PeerDown(p)) => tracing::info!(peer = %p, "peer disconnected"),
            Ok(NodeEvent::PeerMisbehaved { peer, what }) => {
                tracing::warn!(peer = %peer, what = %what, "peer misbehaved");
            }
            Ok(e) => tracing::debug!(event = ?e, "event"),
            Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                tracing::warn!(skipped = n, "event log lagged");
            }
            Err(_) => return,
        }
    }
}
