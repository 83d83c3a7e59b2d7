//! Who the peers are and how the custodian is configured: names,
//! credentials, the custody schedule and the surfaced kind.

use std::time::Duration;

use abhyasa_core::AgentId;

/// The kind alice holds under the "surface" decline policy (C-DC-2): a
/// decline of it raises a decision item instead of applying `safe(O)`.
/// Every other kind has the default policy (apply `safe(O)`).
pub const SURFACE_KIND: &str = "oauth.token";

/// The custody schedule of a world's custodian.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    /// First retry after this long.
    pub base: Duration,
    /// Retries at most this far apart (before jitter).
    pub cap: Duration,
    /// Each interval is stretched by up to this fraction (seeded).
    pub jitter: f64,
}

impl Schedule {
    /// Fast retries, for scenarios about loss (50 ms, capped at 200 ms).
    pub const FAST: Schedule = Schedule {
        base: Duration::from_millis(50),
        cap: Duration::from_millis(200),
        jitter: 0.1,
    };
    /// Slow retries, for scenarios that count attempts on a clean link (a
    /// loaded machine must not retry before the ack is back).
    pub const PATIENT: Schedule = Schedule {
        base: Duration::from_secs(3),
        cap: Duration::from_secs(5),
        jitter: 0.1,
    };
    /// The schedule C-AB2-2 measures: 100 ms doubling to a 400 ms cap
    /// (so a lost doubling or cap is off by at least 100 ms), jitter up to
    /// 50 % (so another seed's draws are far apart).
    pub const BACKOFF: Schedule = Schedule {
        base: Duration::from_millis(100),
        cap: Duration::from_millis(400),
        jitter: 0.5,
    };
}

/// The seed of every world's custodian's jitter stream (C-AB2-2: same
/// seed, same schedule).
pub const CUSTODIAN_SEED: u64 = 0x00AB_2202;

pub(crate) const ALICE: &str = "alice";
pub(crate) const BOB: &str = "bob";
pub(crate) const RELAY: &str = "relay-1";

/// The bearer credential `who` presents on its POSTs (HTTP cells).
pub(crate) fn token(who: &str) -> String {
    format!("{who}-conformance-secret")
}

/// The agent id `s` (a valid literal).
pub fn agent(s: &str) -> AgentId {
    AgentId::new(s).unwrap_or_else(|e| panic!("agent id {s}: {e}"))
}
