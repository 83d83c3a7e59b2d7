//! Leased grants at the receiver (C-TR-4): the authority on a governed key
//! is read at the moment of use, and a lease that lapses is reported.

use super::super::lease::{self, Authority};
use super::super::record::EffectValue;
use super::{Receiver, LEASE_SUFFIX};
use crate::model::{AgentId, GovernedKey, Timestamp};

impl Receiver {
    /// What this agent may do on governed key `key` at `now`, read at the
    /// moment of use: a leased grant holds only while
    /// `now + skew_margin < lease_until` (C-TR-4), so a partitioned agent
    /// stops at lease expiry though no revocation arrives. Reflects
    /// uncommitted writes too: check before acting, after the commit that
    /// an ack reports.
    ///
    /// `key` held under an issuer (`@issuer/kind/target/name`) reads that
    /// issuer's authority. An issuer-less key (`kind/target/name`) reads
    /// every issuer's on it (C-AZ-2) and holds only if none withholds:
    /// withheld if any issuer withholds, else lapsed if any lease lapsed,
    /// else granted (until the earliest lease end) if any grants, else
    /// unknown.
    pub fn authority(&self, key: &str, now: Timestamp) -> Authority {
        if key.starts_with('@') {
            return self.authority_held(key, now);
        }
        let mut out = Authority::Unknown;
        for (_, a) in self.authority_by_issuer(key, now) {
            out = match (out, a) {
                (_, Authority::Withheld) => return Authority::Withheld,
                (Authority::Lapsed { lease_until }, _) | (_, Authority::Lapsed { lease_until }) => {
                    Authority::Lapsed { lease_until }
                }
                (Authority::Granted { lease_until: a }, Authority::Granted { lease_until: b }) => {
                    Authority::Granted {
                        lease_until: match (a, b) {
                            (Some(a), Some(b)) => Some(a.min(b)),
                            (a, b) => a.or(b),
                        },
                    }
                }
                (Authority::Unknown, g) => g,
                (o, _) => o,
            };
        }
        out
    }

    /// The authority on `key` exactly as written (a key held under its
    /// issuer).
    fn authority_held(&self, key: &str, now: Timestamp) -> Authority {
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

    /// What each issuer holds on the issuer-less governed key `key`
    /// (`kind/target/name`) at `now`, by issuer, in issuer order: the
    /// authority every peer that governs `key` under its own identity
    /// grants or withholds (C-AZ-2). A caller that needs them all to agree
    /// (a tool guarded by a scope) refuses when any withholds.
    pub fn authority_by_issuer(&self, key: &str, now: Timestamp) -> Vec<(AgentId, Authority)> {
        let mut out: Vec<(AgentId, Authority)> = self
            .effects
            .keys()
            .filter(|k| k.starts_with('@') && !k.ends_with(LEASE_SUFFIX))
            .filter_map(|k| {
                let gk = GovernedKey::new(k).ok()?;
                (gk.unqualified() == key).then_some(gk)
            })
            .filter_map(|gk| Some((gk.issuer()?, self.authority_held(gk.as_str(), now))))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
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
                Some((key.to_string(), until, self.authority_held(key, now)))
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
