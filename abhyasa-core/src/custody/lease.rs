//! Leases: custody plus leases (DESIGN §3).
//!
//! Custody cannot stop an agent that is partitioned from acting on
//! authority it holds; a lease can. A grant of autonomously exercisable
//! authority (Anumati `grant`, OAuth `issue` / `refresh`) may carry a lease
//! term in its payload, `"lease_seconds": <positive integer>` — inside the
//! payload, so the v1 schema is unchanged, a v1 peer ignores it, and the
//! content digest covers it by the usual rules (spec §2). The receiver
//! stores the absolute `lease_until = created_at + lease_seconds` with the
//! effect, in the same ledger record (AB-3), as the effect key
//! [`lease_key`]; authority holds only while
//! `now + skew_margin < lease_until`. The lease is measured from the
//! issuer's `created_at`, so a delayed or replayed grant never extends it.
//! A revocation writes the lease away with the withhold, so a revocation
//! under custody ends the lease on application. Renewals are new grants
//! with a higher sequence (best-effort: their loss is safe, the lease
//! lapses), sent about every half term ([`renewal_delay`]).

use std::time::Duration;

use super::record::EffectValue;
use crate::model::{Obligation, Timestamp};
use crate::principal::Authorization;
use crate::FieldError;

/// The payload field that carries a grant's lease term, in whole seconds.
pub const LEASE_FIELD: &str = "lease_seconds";

/// The effect key under which the lease of governed key `key` is stored.
pub fn lease_key(key: &str) -> String {
    format!("{key}#lease_until")
}

/// The lease term `ob` carries, if any. A present field that is not a
/// positive integer number of seconds is an error naming the field.
pub fn lease_term(ob: &Obligation) -> Result<Option<Duration>, FieldError> {
    let Some(v) = ob.payload().get(LEASE_FIELD) else {
        return Ok(None);
    };
    match v.as_u64().filter(|s| *s > 0) {
        Some(s) => Ok(Some(Duration::from_secs(s))),
        None => Err(FieldError::invalid(
            format!("payload.{LEASE_FIELD}"),
            format!("must be a positive integer number of seconds, got {v}"),
        )),
    }
}

/// The absolute end of the lease `ob` carries: `created_at + lease_seconds`.
pub fn lease_until(ob: &Obligation) -> Result<Option<Timestamp>, FieldError> {
    Ok(lease_term(ob)?.map(|t| ob.created_at().saturating_add(t)))
}

/// The effect value that records a lease end (`None`: no lease).
pub fn encode_lease(until: Option<Timestamp>) -> EffectValue {
    EffectValue::Json(match until {
        Some(t) => serde_json::json!({ "lease_until_us": t.unix_micros() }),
        None => serde_json::Value::Null,
    })
}

/// The lease end an effect value records, if it records one.
pub fn decode_lease(v: &EffectValue) -> Option<Timestamp> {
    match v {
        EffectValue::Json(j) => j
            .get("lease_until_us")
            .and_then(serde_json::Value::as_i64)
            .map(Timestamp::from_unix_micros),
        _ => None,
    }
}

/// What an agent may do on a governed key now, read at the moment of use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Authority {
    /// Granted; `lease_until` is the lease end, if the grant was leased.
    Granted {
        /// When a leased grant ends (minus the skew margin it is honored).
        lease_until: Option<Timestamp>,
    },
    /// Granted under a lease that was not renewed in time: not exercisable.
    Lapsed {
        /// When it lapsed.
        lease_until: Timestamp,
    },
    /// Withheld (revoked or restricted).
    Withheld,
    /// Nothing was ever applied on this key.
    Unknown,
}

impl Authority {
    /// True only for a grant whose lease (if any) still holds.
    pub fn is_authorized(self) -> bool {
        matches!(self, Self::Granted { .. })
    }

    /// Authority from the stored authorization and lease end, at `now`
    /// with the receiver's skew margin on the safe side.
    pub fn at(
        state: Option<Authorization>,
        lease_until: Option<Timestamp>,
        now: Timestamp,
        skew_margin: Duration,
    ) -> Self {
        match (state, lease_until) {
            (None, _) => Self::Unknown,
            (Some(Authorization::Withheld), _) => Self::Withheld,
            (Some(Authorization::Granted), None) => Self::Granted { lease_until: None },
            (Some(Authorization::Granted), Some(until)) => {
                if now.saturating_add(skew_margin) < until {
                    Self::Granted {
                        lease_until: Some(until),
                    }
                } else {
                    Self::Lapsed { lease_until: until }
                }
            }
        }
    }
}

/// When the principal should send the next renewal of a lease of `term`:
/// a little under half the usable term (`term - skew_margin`), less a
/// jitter drawn by the caller (`u` in `[0, 1)`, from a seeded RNG): between
/// 35 % and 45 % of it. Two renewal intervals then fit inside one term, so
/// one lost renewal is tolerated and the second loss lets the lease lapse.
pub fn renewal_delay(term: Duration, skew_margin: Duration, u: f64) -> Duration {
    let usable = term.saturating_sub(skew_margin);
    let u = if u.is_finite() {
        u.clamp(0.0, 1.0)
    } else {
        0.0
    };
    usable.mul_f64(0.45 - 0.10 * u)
}

/// A configuration warning when a lease outlasts the revocation that would
/// end it: for up to `term - deadline` a partitioned agent may go on
/// acting after the revocation escalated.
pub fn lease_warning(term: Duration, revocation_deadline: Duration) -> Option<String> {
    (term > revocation_deadline).then(|| {
        format!(
            "lease term of {} s is longer than the revocation deadline of {} s: a partitioned \
             agent may act for up to {} s after a revocation escalates; use a shorter lease",
            term.as_secs(),
            revocation_deadline.as_secs(),
            (term - revocation_deadline).as_secs()
        )
    })
}
