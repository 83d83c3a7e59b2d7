//! `abhyasa relay init|run|status|enrol|unenrol`: the store-and-forward
//! relay daemon (abhyasa-spool), and the relayed link a node builds from
//! `via` entries.
//!
//! A relay directory holds `config.toml`, `identity/{cert,key}.pem`, the
//! spool (`spool.redb`) and `status.json` (written by the running relay).
//!
//! **Enrolment without a restart.** The running relay re-reads its
//! `config.toml` every second ([`RELOAD_EVERY`]); a `[[peers]]` entry
//! added (by `abhyasa relay enrol` or by editing the file) is pinned on
//! every listener at once, one removed is unpinned and its connections
//! closed (what is spooled for it stays until its hold time). A changed
//! fingerprint is an unenrol and an enrol. A file that does not parse is
//! logged and ignored (the running peer set stays); other keys take effect
//! at the next start. A poll rather than SIGHUP or a control socket: it
//! needs no second process to signal the relay, works for an edited file
//! as for `relay enrol`, and a second is well inside any edge's dial
//! backoff.
//!
//! ```toml
//! agent = "relay-1"               # the relay's agent id (required)
//! listen = "0.0.0.0:7500"         # QUIC listen address (UDP); edges dial out to it
//! ws_listen = "0.0.0.0:7501"      # WebSocket listen address (TCP), beside or instead of QUIC
//! max_hold_seconds = 86400        # longest a frame is held, whatever its deadline
//! per_destination = 100000        # frames queued per destination
//! per_origin = 100000             # frames held per origin
//! per_origin_bytes = 67108864     # bytes held per origin (one tenant cannot fill the spool)
//! total_frames = 1000000          # frames held in total
//! total_bytes = 1073741824        # bytes held in total
//! max_handshakes = 64             # unauthenticated connections per listener
//! max_handshakes_per_source = 8   # of those, from one address (an IPv4 address or an IPv6 /64)
//! handshake_timeout_ms = 5000     # WebSocket: closed if the signed hello is not done by then
//! descriptor_reserve = 64         # descriptors kept back from the listeners
//! allow_plaintext_ws = false      # ws_listen off loopback (ws:// has no integrity after the hello)
//!
//! [[peers]]                       # custodians and edges, pinned as for nodes
//! agent = "alice"
//! fingerprint = "3f…"
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use abhyasa_core::AgentId;
use abhyasa_identity::{Fingerprint, Identity, PeerPin};
use abhyasa_quic::QuicConfig;
use abhyasa_spool::{RelayConfig, RelayHandle, RelayedConfig, SpoolLimits, SpoolStatus};
use abhyasa_transport::Transport;
use abhyasa_ws::WsConfig;
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
    /// Pins a custodian or edge in the relay's config.toml; a running relay
    /// accepts it within a second, without a restart.
    Enrol(EnrolArgs),
    /// Removes a peer from the relay's config.toml; a running relay closes
    /// its connections within a second (frames held for it stay until
    /// their hold time).
    Unenrol(UnenrolArgs),
}

/// Options of `abhyasa relay enrol`.
#[derive(Debug, clap::Args)]
pub(crate) struct EnrolArgs {
    /// The relay directory.
    #[arg(long)]
    dir: PathBuf,
    /// The peer's agent id.
    #[arg(long)]
    agent: String,
    /// The SHA-256 fingerprint of the peer's certificate (hex), as printed
    /// by its `abhyasa init`.
    #[arg(long)]
    fingerprint: String,
}

/// Options of `abhyasa relay unenrol`.
#[derive(Debug, clap::Args)]
pub(crate) struct UnenrolArgs {
    /// The relay directory.
    #[arg(long)]
    dir: PathBuf,
    /// The peer's agent id.
    #[arg(long)]
    agent: String,
}

/// Which listeners `abhyasa relay init` configures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Listeners {
    /// QUIC only (UDP).
    Quic,
    /// WebSocket only (TCP: for sites that pass only TCP or HTTP).
    Ws,
    /// QUIC on --listen and WebSocket on --ws-listen.
    Both,
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
    /// The listen address: QUIC (UDP) for `--transport quic|both`,
    /// WebSocket (TCP) for `--transport ws`.
    #[arg(long, default_value = "0.0.0.0:7500")]
    listen: String,
    /// Which listeners: quic, ws, or both.
    #[arg(long, value_enum, default_value = "quic")]
    transport: Listeners,
    /// WebSocket listen address (TCP) for `--transport both`.
    #[arg(long)]
    ws_listen: Option<String>,
    /// Allow the WebSocket listener on a non-loopback address: `ws://`
    /// frames after the signed hello have no integrity or secrecy of
    /// their own (put a TLS-terminating proxy in front, or use QUIC).
    #[arg(long)]
    allow_plaintext_ws: bool,
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
    /// QUIC; when neither this nor `ws_listen` is set, QUIC on 0.0.0.0:7500.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    listen: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ws_listen: Option<String>,
    #[serde(default = "d_hold")]
    max_hold_seconds: u64,
    #[serde(default = "d_100k")]
    per_destination: usize,
    #[serde(default = "d_100k")]
    per_origin: usize,
    #[serde(default = "d_per_origin_bytes")]
    per_origin_bytes: u64,
    #[serde(default = "d_1m")]
    total_frames: usize,
    #[serde(default = "d_gib")]
    total_bytes: u64,
    #[serde(default = "d_max_handshakes")]
    max_handshakes: usize,
    #[serde(default = "d_max_handshakes_per_source")]
    max_handshakes_per_source: usize,
    #[serde(default = "d_handshake_timeout_ms")]
    handshake_timeout_ms: u64,
    #[serde(default = "d_descriptor_reserve")]
    descriptor_reserve: usize,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    allow_plaintext_ws: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    peers: Vec<PeerConfig>,
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
fn d_per_origin_bytes() -> u64 {
    SpoolLimits::default().per_origin_bytes
}
fn d_max_handshakes() -> usize {
    abhyasa_transport::limit::DEFAULT_MAX_HANDSHAKES
}
fn d_max_handshakes_per_source() -> usize {
    abhyasa_transport::limit::DEFAULT_MAX_HANDSHAKES_PER_SOURCE
}
fn d_handshake_timeout_ms() -> u64 {
    abhyasa_ws::DEFAULT_HANDSHAKE_TIMEOUT.as_millis() as u64
}
fn d_descriptor_reserve() -> usize {
    abhyasa_transport::limit::DEFAULT_DESCRIPTOR_RESERVE
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
        RelayCommand::Enrol(a) => enrol(a),
        RelayCommand::Unenrol(a) => unenrol(a),
    }
}

fn init(a: InitArgs) -> Result<(), String> {
    let agent = AgentId::new(&a.agent).map_err(|e| format!("--agent: {e}"))?;
    a.listen
        .parse::<std::net::SocketAddr>()
        .map_err(|e| format!("--listen {:?}: {e}", a.listen))?;
    let (quic, ws) = match (a.transport, &a.ws_listen) {
        (Listeners::Quic, None) => (Some(a.listen.clone()), None),
        (Listeners::Ws, None) => (None, Some(a.listen.clone())),
        (Listeners::Both, Some(w)) => {
            w.parse::<std::net::SocketAddr>()
                .map_err(|e| format!("--ws-listen {w:?}: {e}"))?;
            (Some(a.listen.clone()), Some(w.clone()))
        }
        (Listeners::Both, None) => {
            return Err("--transport both needs --ws-listen ADDR (TCP) beside --listen".into())
        }
        (_, Some(_)) => return Err("--ws-listen is only for --transport both".into()),
    };
    if let Some(w) = &ws {
        let off_loopback = w
            .parse::<std::net::SocketAddr>()
            .is_ok_and(|w| !w.ip().is_loopback());
        if off_loopback && !a.allow_plaintext_ws {
            return Err(format!(
                "WebSocket on {w} is plaintext off loopback (frames after the signed hello have no integrity): \
                 use a loopback address behind a TLS-terminating proxy, QUIC, or pass --allow-plaintext-ws"
            ));
        }
    }
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
        listen: quic.clone(),
        ws_listen: ws.clone(),
        allow_plaintext_ws: a.allow_plaintext_ws,
        ..file
    };
    let text = toml::to_string(&file).map_err(|e| format!("config: {e}"))?;
    let header = "# Abhyasa relay config. Pin custodians and edges with [[peers]]\n\
                  # entries (agent, fingerprint), as for nodes, or with\n\
                  # `abhyasa relay enrol`; a running relay picks changes up\n\
                  # within a second.\n";
    super::init::write_config(&a.dir, header, &text)?;
    match &quic {
        Some(q) => super::init::announce(
            "relay",
            &a.dir,
            &agent,
            &identity,
            q,
            "each node that uses it",
        ),
        None => announce_ws(&a.dir, &agent, &identity),
    }
    if let (Some(_), Some(w)) = (&quic, &ws) {
        println!();
        println!("(or, for a node that reaches it over WebSocket, instead of addr:)");
        println!("transport = \"ws\"");
        println!("url = \"ws://{w}/\"");
    }
    Ok(())
}

/// [`super::init::announce`] for a WebSocket-only relay: the entry a node
/// pastes names the `ws://` URL instead of a QUIC address.
fn announce_ws(dir: &Path, agent: &AgentId, identity: &Identity) {
    let fp = identity.pin(agent.clone()).fingerprint;
    println!("Initialised relay {agent} in {}", dir.display());
    println!("fingerprint: {fp}");
    println!();
    println!("Paste this into the config.toml of each node that uses it:");
    println!();
    println!("[[peers]]");
    println!("agent = {:?}", agent.as_str());
    println!("fingerprint = \"{fp}\"");
    println!("transport = \"ws\"");
    let ws = load(dir)
        .ok()
        .and_then(|(f, _)| f.ws_listen)
        .unwrap_or_default();
    println!("url = \"ws://{ws}/\"");
}

fn load(dir: &Path) -> Result<(RelayFile, Vec<PeerPin>), String> {
    let path = dir.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    parse(&text, &path)
}

/// Parses a relay's config text; the error names the file and key.
fn parse(text: &str, path: &Path) -> Result<(RelayFile, Vec<PeerPin>), String> {
    let file: RelayFile =
        toml::from_str(text).map_err(|e| format!("{}: {}", path.display(), e.message()))?;
    let mut pins: Vec<PeerPin> = Vec::new();
    for (i, p) in file.peers.iter().enumerate() {
        let bad = |f: &str, e: String| format!("config.toml: key `peers[{i}].{f}`: {e}");
        let agent = AgentId::new(&p.agent).map_err(|e| bad("agent", e.to_string()))?;
        let fingerprint: Fingerprint = p
            .fingerprint
            .parse()
            .map_err(|e| bad("fingerprint", format!("{e}")))?;
        if pins.iter().any(|q| q.agent == agent) {
            return Err(bad("agent", format!("{agent} is pinned twice")));
        }
        // An `addr`, `url` or `transport` pasted from a node's snippet is
        // ignored: the relay only listens, on every listener, for every peer.
        pins.push(PeerPin { agent, fingerprint });
    }
    Ok((file, pins))
}

/// How often the running relay re-reads its config.toml for enrolments.
pub(crate) const RELOAD_EVERY: Duration = Duration::from_secs(1);

async fn serve(a: RunArgs) -> Result<(), String> {
    let (file, pins) = load(&a.dir)?;
    let agent = AgentId::new(&file.agent).map_err(|e| format!("config.toml: key `agent`: {e}"))?;
    let addr = |key: &str, v: &str| {
        v.parse::<std::net::SocketAddr>()
            .map_err(|e| format!("config.toml: key `{key}`: {v:?}: {e}"))
    };
    // Neither listener named: QUIC on the default port (configs written
    // before `ws_listen` existed always had QUIC).
    let quic_listen = match (&file.listen, &file.ws_listen) {
        (Some(l), _) => Some(addr("listen", l)?),
        (None, None) => Some(addr("listen", "0.0.0.0:7500")?),
        (None, Some(_)) => None,
    };
    let ws_listen = file
        .ws_listen
        .as_deref()
        .map(|w| addr("ws_listen", w))
        .transpose()?;
    let ident_dir = a.dir.join("identity");
    let identity = Identity::load_pem(&ident_dir.join("cert.pem"), &ident_dir.join("key.pem"))
        .map_err(|e| format!("identity: {e}"))?;
    // The relay only listens: custodians and edges dial out to it, over
    // either listener, so both pin every peer.
    let quic = quic_listen.map(|l| {
        pins.iter().fold(
            QuicConfig::new(agent.clone(), identity.clone(), l),
            |q, p| q.with_peer(p.clone(), None),
        )
    });
    if file.handshake_timeout_ms == 0 {
        return Err("config.toml: key `handshake_timeout_ms`: must be at least 1".into());
    }
    // C-PA-1: descriptors kept back from the listeners.
    let fds = abhyasa_transport::limit::Descriptors::reserve(file.descriptor_reserve);
    tracing::info!(
        limit = ?fds.limit,
        reserve = fds.reserve,
        connections = fds.connections,
        "descriptor budget of the listeners"
    );
    let quic = quic.map(|mut q| {
        q.max_handshakes = file.max_handshakes;
        q.max_handshakes_per_source = file.max_handshakes_per_source;
        q
    });
    let ws = ws_listen.map(|l| {
        let mut w = pins.iter().fold(
            WsConfig::new(agent.clone(), identity.clone(), Some(l)),
            |w, p| w.with_peer(p.clone(), None),
        );
        w.max_handshakes = file.max_handshakes;
        w.max_handshakes_per_source = file.max_handshakes_per_source;
        w.handshake_timeout = Duration::from_millis(file.handshake_timeout_ms);
        w.allow_plaintext_remote = file.allow_plaintext_ws;
        w
    });
    let mut limits = SpoolLimits::default();
    limits.max_hold = Duration::from_secs(file.max_hold_seconds);
    limits.per_destination = file.per_destination;
    limits.per_origin = file.per_origin;
    limits.per_origin_bytes = file.per_origin_bytes;
    limits.total_frames = file.total_frames;
    limits.total_bytes = file.total_bytes;
    let relay = abhyasa_spool::start(RelayConfig {
        quic,
        ws,
        spool_path: a.dir.join("spool.redb"),
        limits,
        status_path: Some(a.dir.join("status.json")),
    })
    .await
    .map_err(|e| format!("relay: {e}"))?;
    let st = relay.status();
    tracing::info!(
        agent = %agent,
        quic = ?relay.quic_addr(),
        ws = ?relay.ws_addr(),
        peers = pins.len(),
        spooled = st.frames,
        "relay running"
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("signal handler: {e}"))?;
    let mut running = pins;
    let mut tick = tokio::time::interval(RELOAD_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => { tracing::info!("SIGINT: stopping"); break }
            _ = term.recv() => { tracing::info!("SIGTERM: stopping"); break }
            _ = tick.tick() => reload(&a.dir, &relay, &mut running).await,
        }
    }
    relay.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

/// Brings the running relay's peers in line with config.toml's: removed
/// (or re-keyed) peers are unenrolled, new ones enrolled. A config that
/// does not parse changes nothing.
async fn reload(dir: &Path, relay: &RelayHandle, running: &mut Vec<PeerPin>) {
    let wanted = match load(dir) {
        Ok((_, pins)) => pins,
        Err(e) => {
            tracing::warn!(error = %e, "config.toml not reloaded; the running peers stay");
            return;
        }
    };
    if wanted == *running {
        return;
    }
    for old in running.iter().filter(|p| !wanted.contains(p)) {
        if let Err(e) = relay.unenrol(&old.agent).await {
            tracing::error!(peer = %old.agent, error = %e, "unenrol failed");
        }
    }
    let mut now: Vec<PeerPin> = running
        .iter()
        .filter(|p| wanted.contains(p))
        .cloned()
        .collect();
    for new in wanted.iter().filter(|p| !running.contains(p)) {
        match relay.enrol(new).await {
            Ok(_) => now.push(new.clone()),
            Err(e) => tracing::error!(peer = %new.agent, error = %e, "enrol failed"),
        }
    }
    *running = now;
}

/// `abhyasa relay enrol`: adds a `[[peers]]` entry to the relay's config.
fn enrol(a: EnrolArgs) -> Result<(), String> {
    let agent = AgentId::new(&a.agent).map_err(|e| format!("--agent: {e}"))?;
    let fingerprint: Fingerprint = a
        .fingerprint
        .parse()
        .map_err(|e| format!("--fingerprint: {e}"))?;
    let (mut file, pins) = load(&a.dir)?;
    if agent.as_str() == file.agent {
        return Err(format!("{agent} is the relay itself"));
    }
    match pins.iter().find(|p| p.agent == agent) {
        Some(p) if p.fingerprint == fingerprint => {
            println!("{agent} is already enrolled");
            return Ok(());
        }
        Some(_) => {
            return Err(format!(
                "{agent} is enrolled with another fingerprint; `abhyasa relay unenrol` it first"
            ))
        }
        None => {}
    }
    if let Some(p) = pins.iter().find(|p| p.fingerprint == fingerprint) {
        return Err(format!(
            "fingerprint {fingerprint} is already enrolled for {}",
            p.agent
        ));
    }
    file.peers.push(PeerConfig {
        agent: agent.to_string(),
        fingerprint: fingerprint.to_string(),
        addr: None,
        transport: None,
        url: None,
        token: None,
        via: None,
        relay: None,
        kinds: None,
        keys: None,
    });
    rewrite(&a.dir, &file)?;
    println!("enrolled {agent}; a running relay accepts it within a second");
    Ok(())
}

/// `abhyasa relay unenrol`: removes a peer's `[[peers]]` entry.
fn unenrol(a: UnenrolArgs) -> Result<(), String> {
    let (mut file, _) = load(&a.dir)?;
    let before = file.peers.len();
    file.peers.retain(|p| p.agent != a.agent);
    if file.peers.len() == before {
        return Err(format!("{} is not enrolled", a.agent));
    }
    rewrite(&a.dir, &file)?;
    println!(
        "unenrolled {}; a running relay closes its connections within a second",
        a.agent
    );
    Ok(())
}

/// Writes config.toml whole (to a temporary file renamed over it, so the
/// running relay never reads half a file).
fn rewrite(dir: &Path, file: &RelayFile) -> Result<(), String> {
    let text = toml::to_string(file).map_err(|e| format!("config: {e}"))?;
    let path = dir.join(CONFIG_FILE);
    let tmp = path.with_extension("toml.tmp");
    let header = "# Abhyasa relay config (rewritten by `abhyasa relay enrol|unenrol`).\n";
    std::fs::write(&tmp, format!("{header}{text}"))
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
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

/// Wraps a node's transport with its relayed link when `[[peers]]` entries
/// name `via` (direct first, the relay as fallback): one wrapper for every
/// relay named, each peer sealed through its own.
pub(crate) fn relayed_link(cfg: &Resolved, identity: &Identity, transport: Transport) -> Transport {
    let mut relays: Vec<&AgentId> = Vec::new();
    for r in cfg.peers.iter().filter_map(|p| p.via.as_ref()) {
        if !relays.contains(&r) {
            relays.push(r);
        }
    }
    if relays.is_empty() {
        return transport;
    }
    let configs: Vec<RelayedConfig> = relays
        .into_iter()
        .map(|relay| {
            let peers: Vec<PeerPin> = cfg
                .peers
                .iter()
                .filter(|p| p.via.as_ref() == Some(relay))
                .map(|p| p.pin.clone())
                .collect();
            tracing::info!(%relay, peers = peers.len(), "relayed link");
            RelayedConfig::new(relay.clone(), peers, identity.clone())
        })
        .collect();
    // Refusals are logged as they come (hop acceptance only: custody is
    // unaffected).
    let (t, _stats) = abhyasa_spool::relayed_via(transport, configs);
    t
}
