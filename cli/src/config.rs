//! The node directory and its `config.toml`.
//!
//! A node directory holds `config.toml`, `identity/{cert.pem,key.pem}`, the
//! store and (while the node runs) `control.sock`. Every key but `agent` has
//! a default; unknown keys are rejected, naming the key.
//!
//! ```toml
//! agent = "alice"                 # this node's agent id (required)
//! listen = "0.0.0.0:7400"         # QUIC listen address (UDP)
//! store = "redb"                  # "redb" (default) or "sled"
//! store_path = "store.redb"       # relative to the node directory
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
//! card_endpoint = "https://…"    # advertised in `abhyasa card` (default quic://<listen>)
//! card_deadline_seconds = 300     # advertised custody deadline per kind
//!
//! [kind_decline_policy]           # per-kind override of decline_policy
//! "anumati.consent" = "surface"
//!
//! [[peers]]
//! agent = "bob"
//! fingerprint = "3f…"             # SHA-256 of bob's certificate (hex)
//! addr = "192.0.2.7:7400"         # optional: omit for accept-only peers
//! via = "relay-1"                 # optional: also reach bob through this relay peer
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use abhyasa_core::custody::CustodyProfile;
use abhyasa_core::{AgentId, Backoff, DeclinePolicy, Kind};
use abhyasa_quic::{Fingerprint, PeerPin};
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
    #[serde(default = "d_store")]
    pub(crate) store: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) store_path: Option<String>,
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
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) peers: Vec<PeerConfig>,
}

/// One `[[peers]]` entry.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PeerConfig {
    pub(crate) agent: String,
    pub(crate) fingerprint: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) addr: Option<String>,
    /// Reach this peer through the relay of that `[[peers]]` entry
    /// (abhyasa-spool); with `addr` too, direct first and the relay as
    /// fallback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) via: Option<String>,
}

fn d_listen() -> String {
    "0.0.0.0:7400".into()
}
fn d_store() -> String {
    "redb".into()
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
    /// The relay peer this one is (also) reached through.
    pub(crate) via: Option<AgentId>,
}

/// A checked config: every value parsed.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    pub(crate) raw: NodeConfig,
    pub(crate) agent: AgentId,
    pub(crate) listen: SocketAddr,
    pub(crate) store: StoreKind,
    pub(crate) store_path: PathBuf,
    pub(crate) socket: PathBuf,
    pub(crate) backoff: Backoff,
    pub(crate) decline_policy: DeclinePolicy,
    pub(crate) kind_policies: Vec<(Kind, DeclinePolicy)>,
    pub(crate) peers: Vec<Peer>,
}

impl NodeConfig {
    /// Defaults for `agent` listening on `listen`.
    pub(crate) fn new(agent: &str, listen: &str) -> Self {
        let mut c: NodeConfig = toml::from_str(&format!("agent = {agent:?}"))
            .unwrap_or_else(|_| unreachable!("a one-key config parses"));
        c.listen = listen.to_string();
        c
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
        let store: StoreKind = self
            .store
            .parse()
            .map_err(|e| bad("store", format!("{e}")))?;
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
            let via = p
                .via
                .as_deref()
                .map(|v| AgentId::new(v).map_err(|e| bad(&key("via"), e.to_string())))
                .transpose()?;
            peers.push(Peer {
                pin: PeerPin { agent, fingerprint },
                addr,
                via,
            });
        }
        // A relay named by `via` must itself be a pinned peer reached
        // directly; one relay per node (one relayed link).
        let relays: std::collections::BTreeSet<&AgentId> =
            peers.iter().filter_map(|p| p.via.as_ref()).collect();
        if relays.len() > 1 {
            return Err(bad("peers.via", "at most one relay per node".into()));
        }
        for (i, p) in peers.iter().enumerate() {
            if let Some(v) = &p.via {
                let relay = peers.iter().find(|q| &q.pin.agent == v);
                if relay.is_none_or(|r| r.via.is_some() || r.pin.agent == p.pin.agent) {
                    return Err(bad(
                        &format!("peers[{i}].via"),
                        format!("{v} is not a [[peers]] entry reached directly"),
                    ));
                }
            }
        }
        Ok(Resolved {
            agent,
            listen,
            store,
            store_path,
            socket,
            backoff: Backoff {
                base: Duration::from_millis(self.backoff_base_ms),
                cap: Duration::from_millis(self.backoff_cap_ms),
                jitter: self.backoff_jitter,
            },
            decline_policy,
            kind_policies,
            peers,
            raw: self,
        })
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
    }

    /// The endpoint advertised in the AgentCard.
    pub(crate) fn endpoint(&self) -> String {
        self.raw
            .card_endpoint
            .clone()
            .unwrap_or_else(|| format!("quic://{}", self.listen))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_unknown_keys() {
        let p = Path::new("config.toml");
        let c = NodeConfig::parse("agent = \"a\"\n", p).expect("parses");
        assert_eq!(c.store, "redb");
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
}
