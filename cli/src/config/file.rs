//! `config.toml` as written: the keys, their defaults, and how a key's
//! error reads.

use std::collections::BTreeMap;

use abhyasa_core::AgentId;
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
    /// `store::store_name` for a node that predates it.
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
}

/// A rejected value: one line naming the key.
pub(crate) fn bad(key: &str, why: String) -> String {
    format!("config.toml: key `{key}`: {why}")
}
