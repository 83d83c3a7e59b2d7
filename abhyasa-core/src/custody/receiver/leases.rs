//! Leased grants at the receiver (C-TR-4): the authority on a governed key
//! is read at the moment of use, and a lease that lapses is reported.

use super::super::lease::{self, Authority};
use super::super::record::EffectValue;
use super::{Receiver, LEASE_SUFFIX};
use crate::model::Timestamp;

impl Receiver {
    /// What this agent may do on governed key `key` at `now`, read at the
    /// moment of use: a leased grant holds only while
    /// `now + skew_margin < lease_until` (C-TR-4), so a partitioned agent
    /// stops at lease expiry though no revocation arrives. Reflects
    /// uncommitted writes too: check before acting, after the commit that
    /// an ack reports.
    pub fn authority(&self, key: &str, now: Timestamp) -> Authority {
        let state = match self.effects.get(key) {
            Some(EffectValue::Authorization(a)) => Some(*a),
            _ => None,
        };
        let until = self
            .effects
            .get(&lease::lease_key(key))
            .and_then(lease::decode_lease);
        Authority::at(state, until, now, self.config.skew_margin)
    }

    /// Every governed key that holds or held a lease, with its end and its
    /// authority at `now` (for `abhyasa leases`), in key order.
    pub fn leases(&self, now: Timestamp) -> Vec<(String, Timestamp, Authority)> {
        let mut out: Vec<_> = self
            .effects
            .iter()
            .filter_map(|(k, v)| {
                let key = k.strip_suffix(LEASE_SUFFIX)?;
                let until = lease::decode_lease(v)?;
                Some((key.to_string(), until, self.authority(key, now)))
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Follows a lease write (`lease_key`, value) in the lapse timers.
    pub(super) fn track_lease(&mut self, lease_key: &str, value: &EffectValue) {
        let Some(key) = lease_key.strip_suffix(LEASE_SUFFIX) else {
            return;
        };
        if let Some(old) = self.leases.remove(key) {
            let at = old.saturating_sub(self.config.skew_margin);
            self.lease_timers.remove(&(at, key.to_string()));
        }
        if let Some(until) = lease::decode_lease(value) {
            self.leases.insert(key.to_string(), until);
            let at = until.saturating_sub(self.config.skew_margin);
            self.lease_timers.insert((at, key.to_string()));
        }
    }
}
