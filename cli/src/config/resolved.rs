//! A checked config: every value parsed, and what the node takes from it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use abhyasa_core::custody::CustodyProfile;
use abhyasa_core::{AgentId, DeclinePolicy, Kind, RetryBackoff};
use abhyasa_identity::PeerPin;
use abhyasa_store::StoreKind;

use super::file::{LimitsSection, NodeConfig};

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
