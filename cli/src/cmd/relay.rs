//! `abhyasa relay init|run|status`: the store-and-forward relay daemon
//! (abhyasa-spool), and the relayed link a node builds from `via` entries.
//!
//! A relay directory holds `config.toml`, `identity/{cert,key}.pem`, the
//! spool (`spool.redb`) and `status.json` (written by the running relay).
//!
//! ```toml
//! agent = "relay-1"               # the relay's agent id (required)
//! listen = "0.0.0.0:7500"         # QUIC listen address (UDP); edges dial out to it
//! max_hold_seconds = 86400        # longest a frame is held, whatever its deadline
//! per_destination = 100000        # frames queued per destination
//! per_origin = 100000             # frames held per origin
//! total_frames = 1000000          # frames held in total
//! total_bytes = 1073741824        # bytes held in total
//!
//! [[peers]]                       # custodians and edges, pinned as for nodes
//! agent = "alice"
//! fingerprint = "3f…"
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use abhyasa_core::AgentId;
use abhyasa_quic::{Fingerprint, Identity, PeerPin, QuicConfig};
use abhyasa_spool::{RelayConfig, RelayedConfig, SpoolLimits, SpoolStatus};
use abhyasa_transport::Transport;
use serde::{Deserialize, Serialize};

use crate::config::{PeerConfig, Resolved, CONFIG_FILE};

/// `abhyasa relay …`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum RelayCommand {
    /// Creates a relay directory: config.toml and a key and certificate.
    Init(InitArgs),
    /// Runs the relay in the foreground until SIGINT or SIGTERM.
    Run(RunArgs),
    /// Per destination: queue depth, oldest frame age, expired and refused
    /// counts (as last written by the running relay).
    Status(StatusArgs),
}

/// Options of `abhyasa relay init`.
#[derive(Debug, clap::Args)]
pub(crate) struct InitArgs {
    /// The relay directory to create.
    #[arg(long)]
    dir: PathBuf,
    /// The relay's agent id.
    #[arg(long)]
    agent: String,
    /// QUIC listen address (UDP).
    #[arg(long, default_value = "0.0.0.0:7500")]
    listen: String,
}

/// Options of `abhyasa relay run`.
#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    /// The relay directory (from `abhyasa relay init`).
    #[arg(long)]
    dir: PathBuf,
    /// Log filter when RUST_LOG is unset.
    #[arg(long, default_value = "info")]
    log_level: String,
}

/// Options of `abhyasa relay status`.
#[derive(Debug, clap::Args)]
pub(crate) struct StatusArgs {
    /// The relay directory.
    #[arg(long)]
    dir: PathBuf,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// A relay's `config.toml`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RelayFile {
    agent: String,
    #[serde(default = "d_listen")]
    listen: String,
    #[serde(default = "d_hold")]
    max_hold_seconds: u64,
    #[serde(default = "d_100k")]
    per_destination: usize,
    #[serde(default = "d_100k")]
    per_origin: usize,
    #[serde(default = "d_1m")]
    total_frames: usize,
    #[serde(default = "d_gib")]
    total_bytes: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    peers: Vec<PeerConfig>,
}

fn d_listen() -> String {
    "0.0.0.0:7500".into()
}
fn d_hold() -> u64 {
    24 * 3600
}
fn d_100k() -> usize {
    100_000
}
fn d_1m() -> usize {
    1_000_000
}
fn d_gib() -> u64 {
    1 << 30
}

/// Runs `abhyasa relay …`.
pub(crate) fn run(cmd: RelayCommand) -> Result<(), String> {
    match cmd {
        RelayCommand::Init(a) => init(a),
        RelayCommand::Run(a) => {
            let filter = tracing_subscriber::EnvFilter::try_from_default_env()
                .or_else(|_| tracing_subscriber::EnvFilter::try_new(&a.log_level))
                .map_err(|e| format!("--log-level {:?}: {e}", a.log_level))?;
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(std::io::stderr)
                .with_ansi(false)
                .try_init();
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("tokio runtime: {e}"))?;
            rt.block_on(serve(a))
        }
        RelayCommand::Status(a) => status(a),
    }
}

fn init(a: InitArgs) -> Result<(), String> {
    let agent = AgentId::new(&a.agent).map_err(|e| format!("--agent: {e}"))?;
    a.listen
        .parse::<std::net::SocketAddr>()
        .map_err(|e| format!("--listen {:?}: {e}", a.listen))?;
    if a.dir.join(CONFIG_FILE).exists() || a.dir.join("identity").exists() {
        return Err(format!(
            "{} is already a directory with a config; refusing to overwrite it",
            a.dir.display()
        ));
    }
    let identity = super::init::create_identity(&a.dir, &agent)?;
    let file: RelayFile = toml::from_str(&format!("agent = {:?}", agent.as_str()))
        .map_err(|e| format!("config: {e}"))?;
    let file = RelayFile {
        listen: a.listen.clone(),
        ..file
    };
    let text = toml::to_string(&file).map_err(|e| format!("config: {e}"))?;
    let header = "# Abhyasa relay config. Pin custodians and edges with [[peers]]\n\
                  # entries (agent, fingerprint), as for nodes.\n";
    super::init::write_config(&a.dir, header, &text)?;
    super::init::announce(
        "relay",
        &a.dir,
        &agent,
        &identity,
        &a.listen,
        "each node that uses it",
    );
    Ok(())
}

fn load(dir: &Path) -> Result<(RelayFile, Vec<PeerPin>), String> {
    let path = dir.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let file: RelayFile =
        toml::from_str(&text).map_err(|e| format!("{}: {}", path.display(), e.message()))?;
    let mut pins = Vec::new();
    for (i, p) in file.peers.iter().enumerate() {
        let bad = |f: &str, e: String| format!("config.toml: key `peers[{i}].{f}`: {e}");
        let agent = AgentId::new(&p.agent).map_err(|e| bad("agent", e.to_string()))?;
        let fingerprint: Fingerprint = p
            .fingerprint
            .parse()
            .map_err(|e| bad("fingerprint", format!("{e}")))?;
        pins.push(PeerPin { agent, fingerprint });
    }
    Ok((file, pins))
}

async fn serve(a: RunArgs) -> Result<(), String> {
    let (file, pins) = load(&a.dir)?;
    let agent = AgentId::new(&file.agent).map_err(|e| format!("config.toml: key `agent`: {e}"))?;
    let listen = file
        .listen
        .parse()
        .map_err(|e| format!("config.toml: key `listen`: {e}"))?;
    let ident_dir = a.dir.join("identity");
    let identity = Identity::load_pem(&ident_dir.join("cert.pem"), &ident_dir.join("key.pem"))
        .map_err(|e| format!("identity: {e}"))?;
    let mut quic = QuicConfig::new(agent.clone(), identity, listen);
    for p in pins {
        // The relay only listens: custodians and edges dial out to it.
        quic = quic.with_peer(p, None);
    }
    let mut limits = SpoolLimits::default();
    limits.max_hold = Duration::from_secs(file.max_hold_seconds);
    limits.per_destination = file.per_destination;
    limits.per_origin = file.per_origin;
    limits.total_frames = file.total_frames;
    limits.total_bytes = file.total_bytes;
    let relay = abhyasa_spool::start(RelayConfig {
        quic: Some(quic),
        ws: None,
        spool_path: a.dir.join("spool.redb"),
        limits,
        status_path: Some(a.dir.join("status.json")),
    })
    .await
    .map_err(|e| format!("relay: {e}"))?;
    let st = relay.status();
    tracing::info!(
        agent = %agent,
        listen = ?relay.local_addr(),
        spooled = st.frames,
        "relay running"
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("signal handler: {e}"))?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
        _ = term.recv() => tracing::info!("SIGTERM: stopping"),
    }
    relay.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

fn status(a: StatusArgs) -> Result<(), String> {
    let path = a.dir.join("status.json");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "cannot read {}: {e} (is `abhyasa relay run --dir {}` running?)",
            path.display(),
            a.dir.display()
        )
    })?;
    let st: SpoolStatus =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&st).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    println!(
        "{} frames, {} bytes spooled (as of unix {})",
        st.frames, st.bytes, st.as_of_unix_seconds
    );
    println!(
        "{:<24} {:>8} {:>12} {:>10} {:>8}  refused",
        "destination", "depth", "bytes", "oldest_s", "expired"
    );
    for d in &st.destinations {
        let refused: Vec<String> = d.refused.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!(
            "{:<24} {:>8} {:>12} {:>10} {:>8}  {}",
            d.destination.as_str(),
            d.depth,
            d.bytes,
            d.oldest_age_seconds,
            d.expired,
            refused.join(",")
        );
    }
    Ok(())
}

/// Wraps a node's transport with its relayed link when a `[[peers]]` entry
/// names `via` (direct first, the relay as fallback).
pub(crate) fn relayed_link(cfg: &Resolved, identity: &Identity, transport: Transport) -> Transport {
    let Some(relay) = cfg.peers.iter().find_map(|p| p.via.clone()) else {
        return transport;
    };
    let peers: Vec<PeerPin> = cfg
        .peers
        .iter()
        .filter(|p| p.via.as_ref() == Some(&relay))
        .map(|p| p.pin.clone())
        .collect();
    tracing::info!(%relay, peers = peers.len(), "relayed link");
    // Refusals are logged as they come (hop acceptance only: custody is
    // unaffected).
    let (t, _stats) = abhyasa_spool::relayed(
        transport,
        RelayedConfig::new(relay, peers, identity.clone()),
    );
    t
}
