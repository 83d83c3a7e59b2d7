//! The node directory and its `config.toml`.
//!
//! A node directory holds `config.toml`, `identity/{cert.pem,key.pem}`, the
//! store and (while the node runs) `control.sock`. Every key but `agent` has
//! a default; unknown keys are rejected, naming the key.
//!
//! ```toml
//! agent = "alice"                 # this node's agent id (required)
//! listen = "0.0.0.0:7400"         # QUIC listen address (UDP)
//! store = "log"                   # "log" (default), "fjall", "redb", "sled" or "postgres"
//! store_path = "store.log"        # relative to the node directory (default store.<store>)
//! postgres_url = "postgres://…"  # store = "postgres": the database (else env ABHYASA_PG_URL)
//! postgres_lease_ms = 10000       # store = "postgres": ownership lease (a standby takes over after it)
//! postgres_standby = false        # store = "postgres": wait for the owner's lease instead of failing
//! postgres_holder = "host-a"      # store = "postgres": this node's owner name (default: host:pid:start)
//! retention_seconds = 604800      # terminal records kept this long (7 days)
//! compaction_interval_seconds = 3600 # how often they are compacted (0: never)
//! max_created_at_skew_seconds = 60   # receiver: created_at at most this far ahead
//! max_deadline_seconds = 2592000  # receiver: longest deadline accepted (30 days)
//! ledger_quota = 1000000          # receiver: ledger entries held per custodian
//! max_pending = 1000000           # admission bound on pending obligations
//! skew_margin_ms = 2000           # receiver clock-skew margin
//! backoff_base_ms = 1000          # retry backoff: first interval
//! backoff_cap_ms = 64000          # retry backoff: largest interval
//! backoff_jitter = 0.1            # retry backoff: jitter fraction, [0, 1]
//! seed = 0                        # seed of the jitter stream
//! decline_policy = "apply_safe"   # default: "apply_safe" or "surface"
//! control_socket = "control.sock" # relative to the node directory
//! card_endpoint = "https://…"    # advertised in `abhyasa card` (default: the [http] URLs, else quic://<listen>)
//! card_deadline_seconds = 300     # advertised custody deadline per kind (a leased grant longer than it warns)
//!
//! [kind_decline_policy]           # per-kind override of decline_policy
//! "anumati.consent" = "surface"
//!
//! [http]                          # optional: serve the A2A HTTP binding too
//! listen = "127.0.0.1:7443"       # TCP address (HTTPS, mutual TLS with the node identity)
//! public_url = "https://…"        # base URL the card advertises (default https://<listen>)
//! plain_http_loopback = false     # plain HTTP instead of HTTPS: loopback listen only
//! bearer_only = ["carol"]         # peers that may present only their token over HTTPS (default
//!                                 # none: a pinned client certificate is mandatory)
//! handshake_timeout_ms = 5000     # a connection not authenticated by then is closed
//! header_read_timeout_ms = 5000   # request headers must arrive within this
//!
//! [limits]                        # optional: bounds before authentication (defaults shown)
//! descriptor_reserve = 64         # descriptors kept back from the listeners (control socket,
//!                                 # store, dials); listeners hold at most RLIMIT_NOFILE minus it
//! max_handshakes = 64             # unauthenticated connections per listener (QUIC, WebSocket, HTTP)
//! max_handshakes_per_source = 8   # of those, from one address (an IPv4 address or an IPv6 /64)
//! allow_plaintext_ws = false      # allow ws:// peer URLs whose host is not loopback
//!
//! [mcp]                           # optional: what `abhyasa mcp --custodian C` lets C govern
//! kinds = ["anumati.consent"]     # optional: the kinds C may issue to the guard (default: every kind)
//! keys = ["anumati.consent/mcp-server/scope:"] # optional: key prefixes C may govern (default: every key)
//!
//! [[peers]]
//! agent = "bob"
//! fingerprint = "3f…"             # SHA-256 of bob's certificate (hex)
//! addr = "192.0.2.7:7400"         # optional: omit for accept-only peers
//!
//! [[peers]]                       # a peer reached over the HTTP binding
//! agent = "carol"
//! fingerprint = "9a…"             # pinned for mTLS, both directions
//! transport = "http"              # "quic" (default), "ws" or "http"; "http" needs [http]
//! url = "https://192.0.2.8:7443"  # carol's base URL (…/abhyasa/obligations, …/custody_ack)
//! token = "…"                     # optional: a bearer credential carol may present instead of mTLS
//! via = "relay-1"                 # optional: also reach carol through this relay peer
//! kinds = ["anumati.consent"]     # optional: the kinds carol may issue here (default: every kind)
//! keys = ["anumati.consent/alice/scope:"] # optional: key prefixes carol may govern (default: every key)
//!
//! [[peers]]                       # a peer (here a relay) reached over WebSocket
//! agent = "relay-2"
//! fingerprint = "5c…"
//! transport = "ws"                # dial ws://… (this node only dials WebSocket; it listens on QUIC)
//! url = "ws://192.0.2.9:7501/"
//! relay = true                    # governs nothing here (default: true when a `via` names it)
//! ```
//!
//! Each `via` names a `[[peers]]` entry reached directly (QUIC or
//! WebSocket); different peers may name different relays.
//!
//! Authority (C-AZ-1): an obligation is applied only from the peer that
//! issued it, on state held under that peer's own identity; a peer never
//! governs another's keys. `kinds` and `keys` narrow what a peer may issue
//! (`keys` are prefixes of the issuer-less key `kind/target/name`); a
//! relay governs nothing. Anything else is declined `unauthorized`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use abhyasa_core::custody::CustodyProfile;
use abhyasa_core::{AgentId, DeclinePolicy, Kind, RetryBackoff};
use abhyasa_identity::{Fingerprint, PeerPin};
use abhyasa_store::StoreKind;
use serde::{Deserialize, Serialize};

/// File name of the config inside a node directory.
pub(crate) const CONFIG_FILE: &str = "config.toml";

/// `config.toml`, as written by `abhyasa init` and read by every command.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NodeConfig {
    pub(crate) agent: String,
    #[serde(default = "d_listen")]
    pub(crate) listen: String,
    /// `None`: the default ([`StoreKind::default`]), but see
    /// [`NodeConfig::store_name`] for a node that predates it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) store: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) store_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) postgres_url: Option<Secret>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) postgres_lease_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) postgres_standby: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) postgres_holder: Option<String>,
    #[serde(default = "d_retention")]
    pub(crate) retention_seconds: u64,
    #[serde(default = "d_compaction_interval")]
    pub(crate) compaction_interval_seconds: u64,
    #[serde(default = "d_max_created_at_skew")]
    pub(crate) max_created_at_skew_seconds: u64,
    #[serde(default = "d_max_deadline")]
    pub(crate) max_deadline_seconds: u64,
    #[serde(default = "d_ledger_quota")]
    pub(crate) ledger_quota: usize,
    #[serde(default = "d_max_pending")]
    pub(crate) max_pending: usize,
    #[serde(default = "d_skew")]
    pub(crate) skew_margin_ms: u64,
    #[serde(default = "d_base")]
    pub(crate) backoff_base_ms: u64,
    #[serde(default = "d_cap")]
    pub(crate) backoff_cap_ms: u64,
    #[serde(default = "d_jitter")]
    pub(crate) backoff_jitter: f64,
    #[serde(default)]
    pub(crate) seed: u64,
    #[serde(default = "d_policy")]
    pub(crate) decline_policy: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) kind_decline_policy: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) control_socket: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) card_endpoint: Option<String>,
    #[serde(default = "d_card_deadline")]
    pub(crate) card_deadline_seconds: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) http: Option<HttpSection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) limits: Option<LimitsSection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) mcp: Option<McpSection>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) peers: Vec<PeerConfig>,
}

/// The `[mcp]` section: what the stdio client of `abhyasa mcp --agent …`
/// (its `--custodian`) may govern at the MCP guard, as a peer's `kinds`
/// and `keys` narrow what it may issue to the node (C-AZ-1).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct McpSection {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) kinds: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) keys: Option<Vec<String>>,
}

/// The `[http]` section: serve the A2A HTTP binding beside QUIC.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HttpSection {
    pub(crate) listen: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) public_url: Option<String>,
    #[serde(default)]
    pub(crate) plain_http_loopback: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) bearer_only: Vec<String>,
    #[serde(default = "d_handshake_ms")]
    pub(crate) handshake_timeout_ms: u64,
    #[serde(default = "d_handshake_ms")]
    pub(crate) header_read_timeout_ms: u64,
}

/// The `[limits]` section: what unauthenticated peers can make the node
/// hold (C-PA-1, C-PA-3).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LimitsSection {
    #[serde(default = "d_descriptor_reserve")]
    pub(crate) descriptor_reserve: usize,
    #[serde(default = "d_max_handshakes")]
    pub(crate) max_handshakes: usize,
    #[serde(default = "d_max_handshakes_per_source")]
    pub(crate) max_handshakes_per_source: usize,
    #[serde(default)]
    pub(crate) allow_plaintext_ws: bool,
}

impl Default for LimitsSection {
    fn default() -> Self {
        Self {
            descriptor_reserve: d_descriptor_reserve(),
            max_handshakes: d_max_handshakes(),
            max_handshakes_per_source: d_max_handshakes_per_source(),
            allow_plaintext_ws: false,
        }
    }
}

fn d_handshake_ms() -> u64 {
    5000
}
fn d_descriptor_reserve() -> usize {
    abhyasa_transport::limit::DEFAULT_DESCRIPTOR_RESERVE
}
fn d_max_handshakes() -> usize {
    abhyasa_transport::limit::DEFAULT_MAX_HANDSHAKES
}
fn d_max_handshakes_per_source() -> usize {
    abhyasa_transport::limit::DEFAULT_MAX_HANDSHAKES_PER_SOURCE
}

/// A `kinds` list (`[[peers]]`, `[mcp]`) as kinds; `key` names it in the
/// error.
fn checked_kinds(kinds: Option<&[String]>, key: &str) -> Result<Option<Vec<Kind>>, String> {
    kinds
        .map(|ks| {
            ks.iter()
                .map(|k| Kind::new(k).map_err(|e| format!("config.toml: key `{key}`: {e}")))
                .collect()
        })
        .transpose()
}

/// A `keys` list of governed-key prefixes: none may be empty (it would
/// match every key).
fn checked_key_prefixes(keys: Option<&[String]>, key: &str) -> Result<(), String> {
    match keys.into_iter().flatten().find(|k| k.is_empty()) {
        Some(empty) => Err(format!(
            "config.toml: key `{key}`: {empty:?}: an empty prefix would match every key; omit keys instead"
        )),
        None => Ok(()),
    }
}

/// One `[[peers]]` entry.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PeerConfig {
    pub(crate) agent: String,
    pub(crate) fingerprint: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) addr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) transport: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) token: Option<String>,
    /// Reach this peer through the relay of that `[[peers]]` entry
    /// (abhyasa-spool); with `addr` too, direct first and the relay as
    /// fallback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) via: Option<String>,
    /// A relay governs nothing in its own name: every obligation it issues
    /// is declined `unauthorized`. Default: true when another entry names
    /// this one in `via`, else false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) relay: Option<bool>,
    /// The kinds this peer may issue here (default: every kind).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) kinds: Option<Vec<String>>,
    /// Prefixes of the issuer-less governed keys (`kind/target/name`) this
    /// peer may govern here (default: every key, held under its identity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) keys: Option<Vec<String>>,
}

fn d_listen() -> String {
    "0.0.0.0:7400".into()
}
fn d_retention() -> u64 {
    abhyasa::CompactionPolicy::DEFAULT_RETENTION.as_secs()
}
fn d_compaction_interval() -> u64 {
    abhyasa::CompactionPolicy::DEFAULT_INTERVAL.as_secs()
}
// The receiver bounds default to `ReceiverConfig::new`'s, so a node run
// from the CLI and an embedded one hold the same.
fn receiver_defaults() -> abhyasa_core::custody::ReceiverConfig {
    abhyasa_core::custody::ReceiverConfig::new(
        AgentId::new("defaults").unwrap_or_else(|_| unreachable!("a valid agent id")),
    )
}
fn d_max_created_at_skew() -> u64 {
    receiver_defaults().max_created_at_skew.as_secs()
}
fn d_max_deadline() -> u64 {
    receiver_defaults().max_deadline.as_secs()
}
fn d_ledger_quota() -> usize {
    receiver_defaults().ledger_quota
}
fn d_max_pending() -> usize {
    1_000_000
}
fn d_skew() -> u64 {
    2000
}
fn d_base() -> u64 {
    1000
}
fn d_cap() -> u64 {
    64_000
}
fn d_jitter() -> f64 {
    0.1
}
fn d_policy() -> String {
    "apply_safe".into()
}
fn d_card_deadline() -> u64 {
    300
}

/// A peer as the transport needs it.
#[derive(Debug, Clone)]
pub(crate) struct Peer {
    pub(crate) pin: PeerPin,
    pub(crate) addr: Option<SocketAddr>,
    /// Reached over the HTTP binding at this base URL (no trailing slash)
    /// instead of QUIC.
    pub(crate) http_url: Option<String>,
    /// Dialled over WebSocket at this `ws://` URL instead of QUIC.
    pub(crate) ws_url: Option<String>,
    /// A bearer credential the peer may present over HTTP instead of mTLS.
    pub(crate) token: Option<String>,
    /// The relay peer this one is (also) reached through.
    pub(crate) via: Option<AgentId>,
    /// What this peer may govern here.
    pub(crate) authority: abhyasa_core::custody::PeerPolicy,
}

/// The checked `[http]` section.
#[derive(Debug, Clone)]
pub(crate) struct HttpServe {
    pub(crate) listen: SocketAddr,
    /// Base URL without a trailing slash.
    pub(crate) base_url: String,
    pub(crate) plain_http_loopback: bool,
    pub(crate) bearer_only: Vec<AgentId>,
    pub(crate) handshake_timeout: Duration,
    pub(crate) header_read_timeout: Duration,
}

/// A config value that may carry a password: kept as written, never shown
/// by `Debug`.
#[derive(Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct Secret(pub(crate) String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// `store = "postgres"`: where the database is and how this node holds
/// its agent's partition.
#[derive(Clone)]
pub(crate) struct PgSettings {
    /// The database URL (may carry a password: never printed).
    pub(crate) url: String,
    /// Lease, holder name, fail or stand by.
    pub(crate) options: abhyasa_pg::PgOptions,
}

impl std::fmt::Debug for PgSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgSettings")
            .field("url", &"<redacted>")
            .field("options", &self.options)
            .finish()
    }
}

/// Shortest `postgres_lease_ms` accepted: renewals run every third of it.
const MIN_PG_LEASE_MS: u64 = 300;

/// A checked config: every value parsed.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    pub(crate) raw: NodeConfig,
    pub(crate) agent: AgentId,
    pub(crate) listen: SocketAddr,
    pub(crate) store: StoreKind,
    pub(crate) store_path: PathBuf,
    /// Set when `store = "postgres"` (then `store` and `store_path` are unused).
    pub(crate) postgres: Option<PgSettings>,
    pub(crate) socket: PathBuf,
    pub(crate) backoff: RetryBackoff,
    pub(crate) decline_policy: DeclinePolicy,
    pub(crate) kind_policies: Vec<(Kind, DeclinePolicy)>,
    pub(crate) peers: Vec<Peer>,
    pub(crate) http: Option<HttpServe>,
    pub(crate) limits: LimitsSection,
    /// The `[mcp]` section as the MCP guard's policy for its custodian.
    pub(crate) mcp: Option<abhyasa_core::custody::PeerPolicy>,
}

impl NodeConfig {
    /// Defaults for `agent` listening on `listen`.
    pub(crate) fn new(agent: &str, listen: &str) -> Self {
        let mut c: NodeConfig = toml::from_str(&format!("agent = {agent:?}"))
            .unwrap_or_else(|_| unreachable!("a one-key config parses"));
        c.listen = listen.to_string();
        // A new node names its store: a later change of the default never
        // moves it.
        c.store = Some(StoreKind::default().as_str().into());
        c
    }

    /// The store named by `store`, or the default. A config without
    /// `store` (nor `store_path`) written when an earlier default (redb,
    /// then fjall) was in force, whose node directory holds
    /// `store.fjall` or `store.redb` and no store of the default keeps the
    /// one it has (the newer if both): otherwise the node would start on a
    /// new, empty store and leave every pending obligation behind.
    fn store_name(&self, dir: &Path) -> String {
        if let Some(s) = &self.store {
            return s.clone();
        }
        let file = |k: StoreKind| dir.join(format!("store.{}", k.as_str()));
        if self.store_path.is_none() && !file(StoreKind::default()).exists() {
            let earlier = [StoreKind::Fjall, StoreKind::Redb];
            if let Some(legacy) = earlier.into_iter().find(|k| file(*k).exists()) {
                tracing::warn!(
                    "config.toml names no store and {} exists: keeping {legacy} (write `store = \"{legacy}\"` to silence this)",
                    file(legacy).display()
                );
                return legacy.as_str().into();
            }
        }
        StoreKind::default().as_str().into()
    }

    /// Reads and checks `DIR/config.toml`.
    pub(crate) fn load(dir: &Path) -> Result<Resolved, String> {
        let path = dir.join(CONFIG_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => format!(
                "{} is not a node directory (no {CONFIG_FILE}; create one with `abhyasa init`)",
                dir.display()
            ),
            _ => format!("cannot read {}: {e}", path.display()),
        })?;
        Self::parse(&text, &path)?.resolve(dir)
    }

    /// Parses config text; the error is one line naming the file, line and key.
    pub(crate) fn parse(text: &str, path: &Path) -> Result<NodeConfig, String> {
        toml::from_str(text).map_err(|e| {
            let msg = e.message().replace('\n', " ");
            let Some(span) = e.span() else {
                return format!("{}: {msg}", path.display());
            };
            let line_no = text[..span.start.min(text.len())].matches('\n').count() + 1;
            let line = text.lines().nth(line_no - 1).unwrap_or("");
            match line.split_once('=') {
                Some((k, _)) if !msg.contains("unknown field") => format!(
                    "{}:{line_no}: key `{}`: {msg}",
                    path.display(),
                    k.trim().trim_matches('"')
                ),
                _ => format!("{}:{line_no}: {msg}", path.display()),
            }
        })
    }

    /// Checks every value; the error names the key.
    pub(crate) fn resolve(self, dir: &Path) -> Result<Resolved, String> {
        let bad = |key: &str, why: String| format!("config.toml: key `{key}`: {why}");
        let agent = AgentId::new(&self.agent).map_err(|e| bad("agent", e.to_string()))?;
        let listen: SocketAddr = self
            .listen
            .parse()
            .map_err(|e| bad("listen", format!("{:?}: {e}", self.listen)))?;
        let store_name = self.store_name(dir);
        let postgres = if store_name == "postgres" {
            Some(self.postgres_settings()?)
        } else {
            None
        };
        let store: StoreKind = if postgres.is_some() {
            StoreKind::default()
        } else {
            store_name
                .parse()
                .map_err(|e| bad("store", format!("{e} (or \"postgres\")")))?
        };
        let store_path = dir.join(
            self.store_path
                .clone()
                .unwrap_or_else(|| format!("store.{}", store.as_str())),
        );
        let socket = dir.join(
            self.control_socket
                .clone()
                .unwrap_or_else(|| "control.sock".into()),
        );
        if self.backoff_base_ms == 0 {
            return Err(bad("backoff_base_ms", "must be positive".into()));
        }
        if self.backoff_cap_ms < self.backoff_base_ms {
            return Err(bad(
                "backoff_cap_ms",
                format!("{} is below backoff_base_ms", self.backoff_cap_ms),
            ));
        }
        if !(0.0..=1.0).contains(&self.backoff_jitter) {
            return Err(bad(
                "backoff_jitter",
                format!("{} is outside [0, 1]", self.backoff_jitter),
            ));
        }
        if self.max_pending == 0 {
            return Err(bad("max_pending", "must be positive".into()));
        }
        if self.ledger_quota == 0 {
            return Err(bad("ledger_quota", "must be positive".into()));
        }
        if self.max_deadline_seconds == 0 {
            return Err(bad("max_deadline_seconds", "must be positive".into()));
        }
        if self.card_deadline_seconds == 0 {
            return Err(bad("card_deadline_seconds", "must be positive".into()));
        }
        let decline_policy =
            parse_policy(&self.decline_policy).map_err(|e| bad("decline_policy", e))?;
        let mut kind_policies = Vec::new();
        for (k, v) in &self.kind_decline_policy {
            let key = format!("kind_decline_policy.{k}");
            let kind = Kind::new(k).map_err(|e| bad(&key, e.to_string()))?;
            kind_policies.push((kind, parse_policy(v).map_err(|e| bad(&key, e))?));
        }
        let mut peers = Vec::new();
        for (i, p) in self.peers.iter().enumerate() {
            let key = |f: &str| format!("peers[{i}].{f}");
            let agent = AgentId::new(&p.agent).map_err(|e| bad(&key("agent"), e.to_string()))?;
            let fingerprint: Fingerprint = p
                .fingerprint
                .parse()
                .map_err(|e| bad(&key("fingerprint"), format!("{e}")))?;
            let addr = p
                .addr
                .as_deref()
                .map(|a| {
                    a.parse::<SocketAddr>()
                        .map_err(|e| bad(&key("addr"), format!("{a:?}: {e}")))
                })
                .transpose()?;
            let (http_url, ws_url) = match p.transport.as_deref() {
                None | Some("quic") => {
                    if p.url.is_some() {
                        return Err(bad(
                            &key("url"),
                            "only for transport = \"http\" or \"ws\"".into(),
                        ));
                    }
                    (None, None)
                }
                Some("http") => {
                    let url = p.url.as_deref().ok_or_else(|| {
                        bad(
                            &key("url"),
                            "transport = \"http\" needs the peer's base URL".into(),
                        )
                    })?;
                    if !(url.starts_with("https://") || url.starts_with("http://")) {
                        return Err(bad(
                            &key("url"),
                            format!("{url:?} is not an http(s):// URL"),
                        ));
                    }
                    if self.http.is_none() {
                        return Err(bad(
                            &key("transport"),
                            "\"http\" needs an [http] section (this node serves the binding to get acks)".into(),
                        ));
                    }
                    (Some(url.trim_end_matches('/').to_string()), None)
                }
                Some("ws") => {
                    let url = p.url.as_deref().ok_or_else(|| {
                        bad(
                            &key("url"),
                            "transport = \"ws\" needs the peer's ws:// URL".into(),
                        )
                    })?;
                    if !url.starts_with("ws://") {
                        return Err(bad(&key("url"), format!("{url:?} is not a ws:// URL")));
                    }
                    if p.addr.is_some() {
                        return Err(bad(
                            &key("addr"),
                            "a QUIC address on a ws peer; use url".into(),
                        ));
                    }
                    (None, Some(url.to_string()))
                }
                Some(other) => {
                    return Err(bad(
                        &key("transport"),
                        format!("{other:?} is not a transport (quic | ws | http)"),
                    ))
                }
            };
            if p.token.is_some() && http_url.is_none() {
                return Err(bad(&key("token"), "only for transport = \"http\"".into()));
            }
            if http_url.is_some() && p.addr.is_some() {
                return Err(bad(
                    &key("addr"),
                    "a QUIC address on an http peer; use url".into(),
                ));
            }
            let via = p
                .via
                .as_deref()
                .map(|v| AgentId::new(v).map_err(|e| bad(&key("via"), e.to_string())))
                .transpose()?;
            if via.is_some() && http_url.is_some() {
                return Err(bad(
                    &key("via"),
                    "a relay carries QUIC and WebSocket peers, not http ones".into(),
                ));
            }
            let kinds = checked_kinds(p.kinds.as_deref(), &key("kinds"))?;
            checked_key_prefixes(p.keys.as_deref(), &key("keys"))?;
            let named_as_relay = self
                .peers
                .iter()
                .any(|q| q.via.as_deref() == Some(p.agent.as_str()));
            peers.push(Peer {
                pin: PeerPin { agent, fingerprint },
                addr,
                http_url,
                ws_url,
                token: p.token.clone(),
                via,
                authority: abhyasa_core::custody::PeerPolicy {
                    relay: p.relay.unwrap_or(named_as_relay),
                    kinds,
                    keys: p.keys.clone(),
                },
            });
        }
        let mcp = match &self.mcp {
            None => None,
            Some(m) => {
                let kinds = checked_kinds(m.kinds.as_deref(), "mcp.kinds")?;
                checked_key_prefixes(m.keys.as_deref(), "mcp.keys")?;
                Some(abhyasa_core::custody::PeerPolicy {
                    relay: false,
                    kinds,
                    keys: m.keys.clone(),
                })
            }
        };
        let http = match &self.http {
            None => None,
            Some(h) => {
                let listen: SocketAddr = h
                    .listen
                    .parse()
                    .map_err(|e| bad("http.listen", format!("{:?}: {e}", h.listen)))?;
                if h.plain_http_loopback && !listen.ip().is_loopback() {
                    return Err(bad(
                        "http.plain_http_loopback",
                        format!("plain HTTP is served only on loopback, not {listen}"),
                    ));
                }
                let scheme = if h.plain_http_loopback {
                    "http"
                } else {
                    "https"
                };
                let base_url = h
                    .public_url
                    .clone()
                    .unwrap_or_else(|| format!("{scheme}://{listen}"))
                    .trim_end_matches('/')
                    .to_string();
                if !base_url.starts_with(&format!("{scheme}://")) {
                    return Err(bad(
                        "http.public_url",
                        format!("{base_url:?} must be a {scheme}:// URL"),
                    ));
                }
                let mut bearer_only = Vec::new();
                for (i, b) in h.bearer_only.iter().enumerate() {
                    let field = format!("http.bearer_only[{i}]");
                    let agent = AgentId::new(b).map_err(|e| bad(&field, e.to_string()))?;
                    let has_token = peers
                        .iter()
                        .any(|p| p.pin.agent == agent && p.http_url.is_some() && p.token.is_some());
                    if !has_token {
                        return Err(bad(
                            &field,
                            format!("{agent} is not a transport = \"http\" peer with a token"),
                        ));
                    }
                    bearer_only.push(agent);
                }
                for (name, v) in [
                    ("http.handshake_timeout_ms", h.handshake_timeout_ms),
                    ("http.header_read_timeout_ms", h.header_read_timeout_ms),
                ] {
                    if v == 0 {
                        return Err(bad(name, "must be at least 1".to_string()));
                    }
                }
                Some(HttpServe {
                    listen,
                    base_url,
                    plain_http_loopback: h.plain_http_loopback,
                    bearer_only,
                    handshake_timeout: Duration::from_millis(h.handshake_timeout_ms),
                    header_read_timeout: Duration::from_millis(h.header_read_timeout_ms),
                })
            }
        };
        // A relay named by `via` must itself be a pinned peer reached
        // directly over QUIC or WebSocket (it carries sealed binary
        // frames). Each peer names its own; a node may use several relays.
        for (i, p) in peers.iter().enumerate() {
            if let Some(v) = &p.via {
                let relay = peers.iter().find(|q| &q.pin.agent == v);
                if relay.is_none_or(|r| {
                    r.via.is_some() || r.http_url.is_some() || r.pin.agent == p.pin.agent
                }) {
                    return Err(bad(
                        &format!("peers[{i}].via"),
                        format!("{v} is not a [[peers]] entry reached directly (quic or ws)"),
                    ));
                }
            }
        }
        Ok(Resolved {
            agent,
            listen,
            store,
            store_path,
            postgres,
            socket,
            backoff: RetryBackoff {
                base: Duration::from_millis(self.backoff_base_ms),
                cap: Duration::from_millis(self.backoff_cap_ms),
                jitter: self.backoff_jitter,
            },
            decline_policy,
            kind_policies,
            peers,
            http,
            limits: self.limits.clone().unwrap_or_default(),
            mcp,
            raw: self,
        })
    }
}

impl NodeConfig {
    /// The `postgres_*` keys, checked (`store = "postgres"`).
    fn postgres_settings(&self) -> Result<PgSettings, String> {
        let bad = |key: &str, why: String| format!("config.toml: key `{key}`: {why}");
        let url = match &self.postgres_url {
            Some(u) => u.0.clone(),
            None => std::env::var(abhyasa_pg::URL_ENV)
                .ok()
                .filter(|u| !u.is_empty())
                .ok_or_else(|| {
                    bad(
                        "postgres_url",
                        format!(
                            "store = \"postgres\" needs postgres_url or the environment variable {}",
                            abhyasa_pg::URL_ENV
                        ),
                    )
                })?,
        };
        let lease_ms = self.postgres_lease_ms.unwrap_or(10_000);
        if lease_ms < MIN_PG_LEASE_MS {
            return Err(bad(
                "postgres_lease_ms",
                format!("{lease_ms} is below {MIN_PG_LEASE_MS}"),
            ));
        }
        let lease = Duration::from_millis(lease_ms);
        let mut options = abhyasa_pg::PgOptions::with_lease(lease);
        if let Some(h) = &self.postgres_holder {
            if h.is_empty() {
                return Err(bad("postgres_holder", "must not be empty".into()));
            }
            options.holder = h.clone();
        }
        if self.postgres_standby {
            options.takeover = abhyasa_pg::Takeover::Wait {
                poll: (lease / 10).max(Duration::from_millis(50)),
            };
        }
        Ok(PgSettings { url, options })
    }
}

fn parse_policy(s: &str) -> Result<DeclinePolicy, String> {
    match s {
        "apply_safe" => Ok(DeclinePolicy::ApplySafe),
        "surface" => Ok(DeclinePolicy::Surface),
        other => Err(format!(
            "{other:?} is not a decline policy (apply_safe | surface)"
        )),
    }
}

impl Resolved {
    /// The custody profile of kinds without an override.
    pub(crate) fn default_profile(&self) -> CustodyProfile {
        CustodyProfile {
            backoff: self.backoff,
            decline_policy: self.decline_policy,
        }
    }

    /// C-ND-5: the compaction schedule and the receiver's bounds, from the
    /// config, onto the node options.
    pub(crate) fn apply_limits(&self, o: &mut abhyasa::NodeOptions) {
        o.compaction = abhyasa::CompactionPolicy::new(
            Duration::from_secs(self.raw.retention_seconds),
            Duration::from_secs(self.raw.compaction_interval_seconds),
        );
        o.receiver.max_created_at_skew = Duration::from_secs(self.raw.max_created_at_skew_seconds);
        o.receiver.max_deadline = Duration::from_secs(self.raw.max_deadline_seconds);
        o.receiver.ledger_quota = self.raw.ledger_quota;
        for p in &self.peers {
            o.receiver
                .authority
                .set_peer(p.pin.agent.clone(), p.authority.clone());
        }
        // Revocations carry the advertised custody deadline, so
        // a leased grant whose term is longer draws a lease warning.
        o.revocation_deadline = Some(Duration::from_secs(self.raw.card_deadline_seconds));
    }

    /// The kind profiles the card advertises (and the HTTP binding serves):
    /// every standard kind, with `card_deadline_seconds` and the node's
    /// backoff. v1 advertises whole-second caps: `kind_profile` sizes
    /// `max_retries` for the cap as advertised (and the real one), so the
    /// card passes its own AB-2 check even for a cap like 1.5 s.
    pub(crate) fn card_profiles(
        &self,
        obligation_endpoint: &str,
    ) -> Result<Vec<abhyasa_core::KindProfile>, String> {
        let mut kinds = Vec::new();
        for k in abhyasa_core::polarity::PolarityRegistry::standard().kinds() {
            let kind = Kind::new(&k).map_err(|e| format!("kind {k}: {e}"))?;
            let p = abhyasa_a2a::card::kind_profile(
                kind,
                obligation_endpoint,
                self.raw.card_deadline_seconds,
                &self.backoff,
            )
            .map_err(|e| format!("kind profile for {k}: {e}"))?;
            kinds.push(p);
        }
        Ok(kinds)
    }

    /// The card's `(custody_ack_endpoint, obligation_endpoint)`: the
    /// configured `card_endpoint` for both; else, when the node serves the
    /// HTTP binding, its `/abhyasa/custody_ack` and `/abhyasa/obligations`
    /// URLs (the card tells the truth: an A2A peer can use them); else the
    /// QUIC address.
    pub(crate) fn card_endpoints(&self) -> (String, String) {
        if let Some(e) = &self.raw.card_endpoint {
            return (e.clone(), e.clone());
        }
        match &self.http {
            Some(h) => (
                format!("{}/abhyasa/custody_ack", h.base_url),
                format!("{}/abhyasa/obligations", h.base_url),
            ),
            None => {
                let q = format!("quic://{}", self.listen);
                (q.clone(), q)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_unknown_keys() {
        let p = Path::new("config.toml");
        let c = NodeConfig::parse("agent = \"a\"\n", p).expect("parses");
        assert_eq!(c.store, None);
        let dir = tempfile::tempdir().expect("tempdir");
        let r = c.clone().resolve(dir.path()).expect("resolves");
        assert_eq!(r.store, StoreKind::Log, "the default store");
        assert_eq!(r.store_path, dir.path().join("store.log"));
        // A node from when redb was the default, its config naming no store,
        // keeps its store.redb rather than start on a new, empty store.
        std::fs::write(dir.path().join("store.redb"), b"").expect("write");
        let r = c.clone().resolve(dir.path()).expect("resolves");
        assert_eq!(r.store, StoreKind::Redb, "a legacy node keeps redb");
        assert_eq!(r.store_path, dir.path().join("store.redb"));
        // One from when fjall was (it may hold both): the newer, fjall.
        std::fs::create_dir(dir.path().join("store.fjall")).expect("mkdir");
        let r = c.clone().resolve(dir.path()).expect("resolves");
        assert_eq!(r.store, StoreKind::Fjall, "a legacy node keeps fjall");
        assert_eq!(r.store_path, dir.path().join("store.fjall"));
        // Once a store of the default is there, it is the node's.
        std::fs::create_dir(dir.path().join("store.log")).expect("mkdir");
        let r = c.clone().resolve(dir.path()).expect("resolves");
        assert_eq!(r.store, StoreKind::Log);
        // Named, the store is what the config says; a new node names it.
        let named = NodeConfig::parse("agent = \"a\"\nstore = \"redb\"\n", p).expect("parses");
        assert_eq!(
            named.resolve(dir.path()).expect("resolves").store,
            StoreKind::Redb
        );
        let new = NodeConfig::new("a", "127.0.0.1:7400");
        assert_eq!(new.store.as_deref(), Some("log"), "init writes the store");
        assert_eq!(c.max_pending, 1_000_000);
        // C-ND-5 defaults: documented in the module docs.
        assert_eq!(c.retention_seconds, 604_800);
        assert_eq!(c.compaction_interval_seconds, 3600);
        assert_eq!(c.max_created_at_skew_seconds, 60);
        assert_eq!(c.max_deadline_seconds, 2_592_000);
        assert_eq!(c.ledger_quota, 1_000_000);
        let e = NodeConfig::parse("agent = \"a\"\nbogus_key = 1\n", p).expect_err("rejected");
        assert!(e.contains("bogus_key") && !e.contains('\n'), "{e}");
        let e = NodeConfig::parse("agent = \"a\"\nmax_pending = \"x\"\n", p).expect_err("bad");
        assert!(e.contains("max_pending"), "{e}");
        let dir = Path::new("/tmp");
        let e = NodeConfig::parse("agent = \"a\"\nstore = \"mysql\"\n", p)
            .expect("parses")
            .resolve(dir)
            .expect_err("bad store");
        assert!(e.contains("`store`"), "{e}");
    }

    // C-AZ-1: `[[peers]]` authority: a peer another names in `via` is a
    // relay unless it says `relay = false`; `kinds` and `keys` narrow what
    // a peer may issue; a bad kind or an empty prefix is refused naming
    // the field.
    #[test]
    fn peer_authority_keys() {
        let p = Path::new("config.toml");
        let dir = Path::new("/tmp");
        let fp = |n: u8| format!("{n:02x}").repeat(32);
        let load = |extra: &str| {
            NodeConfig::parse(&format!("agent = \"a\"\n{extra}"), p).and_then(|c| c.resolve(dir))
        };
        let cfg = format!(
            "[[peers]]\nagent = \"relay-1\"\nfingerprint = \"{}\"\naddr = \"127.0.0.1:7500\"\n\
             [[peers]]\nagent = \"edge\"\nfingerprint = \"{}\"\nvia = \"relay-1\"\n\
             kinds = [\"anumati.consent\"]\nkeys = [\"anumati.consent/a/scope:mail.\"]\n\
             [[peers]]\nagent = \"hub\"\nfingerprint = \"{}\"\naddr = \"127.0.0.1:7501\"\nrelay = true\n",
            fp(1),
            fp(2),
            fp(3),
        );
        let r = load(&cfg).expect("resolves");
        let a: Vec<_> = r.peers.iter().map(|p| p.authority.clone()).collect();
        assert!(a[0].relay, "named in via: a relay by default");
        assert!(!a[1].relay);
        assert_eq!(
            a[1].kinds.as_deref().map(|k| k[0].as_str()),
            Some("anumati.consent")
        );
        assert_eq!(
            a[1].keys.as_deref(),
            Some(&["anumati.consent/a/scope:mail.".to_string()][..])
        );
        assert!(a[2].relay && a[2].kinds.is_none() && a[2].keys.is_none());
        let mut o = abhyasa::NodeOptions::new(AgentId::new("a").expect("id"));
        r.apply_limits(&mut o);
        assert!(
            o.receiver
                .authority
                .of(&AgentId::new("relay-1").expect("id"))
                .relay
        );
        let not_relay = cfg.replace(
            "addr = \"127.0.0.1:7500\"\n",
            "addr = \"127.0.0.1:7500\"\nrelay = false\n",
        );
        assert!(!load(&not_relay).expect("resolves").peers[0].authority.relay);
        for (bad, field) in [
            (
                cfg.replace("[\"anumati.consent\"]", "[\" x\"]"),
                "peers[1].kinds",
            ),
            (
                cfg.replace("[\"anumati.consent/a/scope:mail.\"]", "[\"\"]"),
                "peers[1].keys",
            ),
        ] {
            let e = load(&bad).expect_err("refused");
            assert!(e.contains(field), "{field}: {e}");
        }
    }

    // Several relays per node: each `[[peers]]` entry names its own `via`,
    // a relay may be reached over WebSocket, and every `via` must name a
    // peer reached directly over QUIC or WebSocket.
    #[test]
    fn relays_per_peer_and_websocket_peers() {
        let p = Path::new("config.toml");
        let dir = Path::new("/tmp");
        let fp = |n: u8| format!("{n:02x}").repeat(32);
        let load = |extra: &str| {
            NodeConfig::parse(&format!("agent = \"a\"\n{extra}"), p).and_then(|c| c.resolve(dir))
        };
        let two = format!(
            "[[peers]]\nagent = \"relay-1\"\nfingerprint = \"{}\"\naddr = \"127.0.0.1:7500\"\n\
             [[peers]]\nagent = \"relay-2\"\nfingerprint = \"{}\"\ntransport = \"ws\"\nurl = \"ws://127.0.0.1:7501/\"\n\
             [[peers]]\nagent = \"edge-a\"\nfingerprint = \"{}\"\nvia = \"relay-1\"\n\
             [[peers]]\nagent = \"edge-b\"\nfingerprint = \"{}\"\nvia = \"relay-2\"\n",
            fp(1),
            fp(2),
            fp(3),
            fp(4)
        );
        let c = load(&two).expect("two relays, one over WebSocket");
        let via: Vec<Option<&str>> = c
            .peers
            .iter()
            .map(|p| p.via.as_ref().map(AgentId::as_str))
            .collect();
        assert_eq!(via, [None, None, Some("relay-1"), Some("relay-2")]);
        assert_eq!(c.peers[1].ws_url.as_deref(), Some("ws://127.0.0.1:7501/"));
        assert!(c.peers[1].addr.is_none() && c.peers[1].http_url.is_none());
        // Each mistake names its key.
        let relay_http = format!(
            "[http]\nlisten = \"127.0.0.1:7443\"\n\
             [[peers]]\nagent = \"relay-1\"\nfingerprint = \"{}\"\ntransport = \"http\"\nurl = \"https://x\"\n\
             [[peers]]\nagent = \"edge\"\nfingerprint = \"{}\"\nvia = \"relay-1\"\n",
            fp(1),
            fp(3)
        );
        let chained = format!(
            "[[peers]]\nagent = \"relay-1\"\nfingerprint = \"{}\"\nvia = \"relay-2\"\n\
             [[peers]]\nagent = \"relay-2\"\nfingerprint = \"{}\"\naddr = \"127.0.0.1:1\"\n\
             [[peers]]\nagent = \"edge\"\nfingerprint = \"{}\"\nvia = \"relay-1\"\n",
            fp(1),
            fp(2),
            fp(3)
        );
        for (extra, key) in [
            (relay_http, "peers[1].via"),
            (chained, "peers[2].via"),
            (format!("[[peers]]\nagent = \"b\"\nfingerprint = \"{}\"\ntransport = \"ws\"\n", fp(1)), "peers[0].url"),
            (format!("[[peers]]\nagent = \"b\"\nfingerprint = \"{}\"\ntransport = \"ws\"\nurl = \"http://x\"\n", fp(1)), "peers[0].url"),
            (format!("[[peers]]\nagent = \"b\"\nfingerprint = \"{}\"\ntransport = \"ws\"\nurl = \"ws://x/\"\naddr = \"127.0.0.1:1\"\n", fp(1)), "peers[0].addr"),
        ] {
            let e = load(&extra).expect_err(key);
            assert!(e.contains(key), "{key}: {e}");
        }
    }

    #[test]
    fn http_section_and_http_peers() {
        let p = Path::new("config.toml");
        let dir = Path::new("/tmp");
        let fp = "0".repeat(64);
        let load = |extra: &str| {
            NodeConfig::parse(
                &format!("agent = \"a\"\nlisten = \"127.0.0.1:7400\"\n{extra}"),
                p,
            )
            .and_then(|c| c.resolve(dir))
        };
        let c = load("").expect("no http");
        assert!(c.http.is_none());
        assert_eq!(c.card_endpoints().0, "quic://127.0.0.1:7400");
        let c = load(&format!(
            "[http]\nlisten = \"127.0.0.1:7443\"\n[[peers]]\nagent = \"b\"\nfingerprint = \"{fp}\"\ntransport = \"http\"\nurl = \"https://127.0.0.1:9/\"\n"
        ))
        .expect("http peer");
        assert_eq!(
            c.card_endpoints(),
            (
                "https://127.0.0.1:7443/abhyasa/custody_ack".to_string(),
                "https://127.0.0.1:7443/abhyasa/obligations".to_string()
            )
        );
        assert_eq!(c.peers[0].http_url.as_deref(), Some("https://127.0.0.1:9"));
        // Each mistake names its key.
        for (extra, key) in [
            (format!("[[peers]]\nagent = \"b\"\nfingerprint = \"{fp}\"\ntransport = \"http\"\nurl = \"https://x\"\n"), "peers[0].transport"),
            (format!("[http]\nlisten = \"127.0.0.1:1\"\n[[peers]]\nagent = \"b\"\nfingerprint = \"{fp}\"\ntransport = \"http\"\n"), "peers[0].url"),
            (format!("[[peers]]\nagent = \"b\"\nfingerprint = \"{fp}\"\ntransport = \"smtp\"\n"), "peers[0].transport"),
            (format!("[[peers]]\nagent = \"b\"\nfingerprint = \"{fp}\"\nurl = \"https://x\"\n"), "peers[0].url"),
            ("[http]\nlisten = \"0.0.0.0:1\"\nplain_http_loopback = true\n".to_string(), "http.plain_http_loopback"),
            ("[http]\nlisten = \"127.0.0.1:1\"\npublic_url = \"http://x\"\n".to_string(), "http.public_url"),
            ("[http]\nlisten = \"nowhere\"\n".to_string(), "http.listen"),
            (format!("[http]\nlisten = \"127.0.0.1:1\"\nbearer_only = [\"b\"]\n[[peers]]\nagent = \"b\"\nfingerprint = \"{fp}\"\ntransport = \"http\"\nurl = \"https://x\"\n"), "http.bearer_only[0]"),
            ("[http]\nlisten = \"127.0.0.1:1\"\nhandshake_timeout_ms = 0\n".to_string(), "http.handshake_timeout_ms"),
            ("[mcp]\nkinds = [\"\"]\n".to_string(), "mcp.kinds"),
            ("[mcp]\nkeys = [\"\"]\n".to_string(), "mcp.keys"),
        ] {
            let e = load(&extra).expect_err(&extra);
            assert!(e.contains(&format!("`{key}`")), "{extra}: {e}");
        }
    }

    // C-PA-1: the [limits] section and [http] bearer_only, with their
    // defaults when absent.
    #[test]
    fn limits_section_and_bearer_only() {
        let p = Path::new("config.toml");
        let dir = Path::new("/tmp");
        let fp = "0".repeat(64);
        let load = |extra: &str| {
            NodeConfig::parse(
                &format!("agent = \"a\"\nlisten = \"127.0.0.1:7400\"\n{extra}"),
                p,
            )
            .and_then(|c| c.resolve(dir))
        };
        let c = load("").expect("defaults");
        assert_eq!(c.limits.descriptor_reserve, 64);
        assert_eq!(c.limits.max_handshakes, 64);
        assert_eq!(c.limits.max_handshakes_per_source, 8);
        assert!(!c.limits.allow_plaintext_ws);
        let c = load(&format!(
            "[http]\nlisten = \"127.0.0.1:7443\"\nbearer_only = [\"b\"]\nhandshake_timeout_ms = 700\n\n[limits]\ndescriptor_reserve = 32\nmax_handshakes_per_source = 2\nallow_plaintext_ws = true\n\n[[peers]]\nagent = \"b\"\nfingerprint = \"{fp}\"\ntransport = \"http\"\nurl = \"https://127.0.0.1:9/\"\ntoken = \"t\"\n"
        ))
        .expect("limits");
        assert_eq!(c.limits.descriptor_reserve, 32);
        assert_eq!(c.limits.max_handshakes_per_source, 2);
        assert!(c.limits.allow_plaintext_ws);
        let h = c.http.expect("http");
        assert_eq!(h.bearer_only, vec![AgentId::new("b").expect("id")]);
        assert_eq!(h.handshake_timeout, Duration::from_millis(700));
        assert_eq!(h.header_read_timeout, Duration::from_millis(5000));
    }

    // store = "postgres": the URL and lease are read and checked,
    // the standby flag selects waiting, and the URL never shows in Debug.
    #[test]
    fn postgres_store_keys() {
        let p = Path::new("config.toml");
        let dir = Path::new("/nonexistent");
        let text = "agent = \"a\"\nstore = \"postgres\"\n\
                    postgres_url = \"postgres://u:secret@127.0.0.1:5432/db\"\n\
                    postgres_lease_ms = 2000\npostgres_standby = true\n\
                    postgres_holder = \"host-b\"\n";
        let r = NodeConfig::parse(text, p).unwrap().resolve(dir).unwrap();
        let pg = r.postgres.as_ref().expect("postgres settings");
        assert_eq!(pg.url, "postgres://u:secret@127.0.0.1:5432/db");
        assert_eq!(pg.options.lease, Duration::from_millis(2000));
        assert_eq!(pg.options.holder, "host-b");
        assert!(matches!(
            pg.options.takeover,
            abhyasa_pg::Takeover::Wait { .. }
        ));
        assert!(!format!("{r:?}").contains("secret"), "URL printed");

        let short = text.replace("2000", "10");
        let e = NodeConfig::parse(&short, p)
            .unwrap()
            .resolve(dir)
            .expect_err("short lease");
        assert!(e.contains("`postgres_lease_ms`"), "{e}");

        let embedded = NodeConfig::parse("agent = \"a\"\n", p)
            .unwrap()
            .resolve(dir)
            .unwrap();
        assert!(embedded.postgres.is_none());
        if std::env::var(abhyasa_pg::URL_ENV).is_err() {
            let e = NodeConfig::parse("agent = \"a\"\nstore = \"postgres\"\n", p)
                .unwrap()
                .resolve(dir)
                .expect_err("no url");
            assert!(
                e.contains("`postgres_url`") && e.contains("ABHYASA_PG_URL"),
                "{e}"
            );
        }
    }
}
