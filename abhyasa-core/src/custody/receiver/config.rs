//! The receiver's configuration: its identity, the clock-skew margin and
//! the bounds a peer cannot push it past (C-ND-5).

use std::time::Duration;

use super::authority::AuthorityPolicy;
use crate::model::AgentId;

/// Receiver configuration.
#[derive(Clone, Debug)]
pub struct ReceiverConfig {
    /// This agent.
    pub agent: AgentId,
    /// Clock-skew margin on the safe side: an obligation is declined
    /// `expired` once `now + skew_margin >= deadline_at`.
    pub skew_margin: Duration,
    /// This process incarnation, echoed in acks.
    pub instance: Option<String>,
    /// C-ND-5: an obligation whose `created_at` is further ahead of this
    /// receiver's clock than this is declined (`policy`, the text says
    /// why) and nothing is kept: a peer cannot stretch how long we hold
    /// its ledger entry by dating obligations into the future.
    pub max_created_at_skew: Duration,
    /// C-ND-5: an obligation whose deadline is longer than this is declined
    /// (`policy`) and nothing is kept: its ledger entry would be retained
    /// until the deadline plus retention.
    pub max_deadline: Duration,
    /// C-ND-5: most ledger entries retained per custodian (decided and
    /// undecided, until compaction drops them). Beyond it a new obligation
    /// gets an `overloaded` error frame and nothing is kept; the custodian
    /// keeps custody and retries on its schedule.
    pub ledger_quota: usize,
    /// Most apply requests outstanding at once (asked, not yet decided).
    /// Beyond it a new obligation gets an `overloaded` error frame and
    /// nothing is kept; the custodian keeps custody and retries (C-ND-5:
    /// a slow agent cannot make the receiver hold unbounded requests).
    pub max_outstanding_requests: usize,
    /// What each authenticated peer may govern (C-AZ-1). Default: every
    /// peer issues every kind on keys held under its own identity only.
    pub authority: AuthorityPolicy,
}

impl ReceiverConfig {
    /// Defaults: 2 s skew margin; `created_at` at most 60 s ahead; deadlines
    /// up to 30 days; 1,000,000 ledger entries per custodian.
    pub fn new(agent: AgentId) -> Self {
        Self {
            agent,
            skew_margin: Duration::from_secs(2),
            instance: None,
            max_created_at_skew: Duration::from_secs(60),
            max_deadline: Duration::from_secs(30 * 24 * 3600),
            ledger_quota: 1_000_000,
            max_outstanding_requests: 10_000,
            authority: AuthorityPolicy::default(),
        }
    }
}
