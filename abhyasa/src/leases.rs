//! Leases as the node reports them (custody plus leases).
//!
//! The receiver stores each leased grant's absolute end with its effect;
//! [`crate::Node::authorized`] and [`crate::Node::leases`] read the
//! authority at the moment of asking, so a partitioned agent that checks
//! before acting stops at lease expiry though no revocation arrives
//! (C-TR-4).
//!
//! As principal, the node renews the leased grants it offered (the core's
//! [`Renewals`](abhyasa_core::custody::renewal::Renewals) scheduler, served
//! on the driver's timer loop; shown by [`crate::Node::renewals`]) and
//! warns about leases that outlast the revocation deadline
//! ([`LeaseWarning`], [`crate::Node::lease_warnings`]).

use abhyasa_core::custody::lease::Authority;
pub use abhyasa_core::custody::renewal::{LeaseWarning, LeaseWarningKind, RenewalView};
use abhyasa_core::Timestamp;

/// One governed key that holds (or held) a leased grant.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LeaseView {
    /// The governed key.
    pub key: String,
    /// When the lease ends (the grant's `created_at + lease_seconds`).
    pub lease_until: Timestamp,
    /// True while the grant may be exercised (`now + skew < lease_until`).
    pub authorized: bool,
    /// `granted`, `lapsed` or `withheld`.
    pub state: &'static str,
}

impl LeaseView {
    pub(crate) fn new(key: String, lease_until: Timestamp, authority: Authority) -> Self {
        let state = match authority {
            Authority::Granted { .. } => "granted",
            Authority::Lapsed { .. } => "lapsed",
            Authority::Withheld => "withheld",
            _ => "unknown",
        };
        Self {
            key,
            lease_until,
            authorized: authority.is_authorized(),
            state,
        }
    }
}
