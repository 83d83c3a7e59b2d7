//! The custodian's and receiver's keys: retry backoff, admission and
//! receiver bounds, the card's deadline, and the decline policies.

use std::time::Duration;

use abhyasa_core::{DeclinePolicy, Kind, RetryBackoff};

use super::file::{bad, NodeConfig};

/// The retry backoff (`backoff_*`): a positive base, a cap not below it,
/// a jitter fraction in [0, 1].
pub(super) fn backoff(c: &NodeConfig) -> Result<RetryBackoff, String> {
    if c.backoff_base_ms == 0 {
        return Err(bad("backoff_base_ms", "must be positive".into()));
    }
    if c.backoff_cap_ms < c.backoff_base_ms {
        return Err(bad(
            "backoff_cap_ms",
            format!("{} is below backoff_base_ms", c.backoff_cap_ms),
        ));
    }
    if !(0.0..=1.0).contains(&c.backoff_jitter) {
        return Err(bad(
            "backoff_jitter",
            format!("{} is outside [0, 1]", c.backoff_jitter),
        ));
    }
    Ok(RetryBackoff {
        base: Duration::from_millis(c.backoff_base_ms),
        cap: Duration::from_millis(c.backoff_cap_ms),
        jitter: c.backoff_jitter,
    })
}

/// The bounds that must be positive: admission, the receiver's ledger and
/// deadline, and the deadline the card advertises.
pub(super) fn bounds(c: &NodeConfig) -> Result<(), String> {
    if c.max_pending == 0 {
        return Err(bad("max_pending", "must be positive".into()));
    }
    if c.ledger_quota == 0 {
        return Err(bad("ledger_quota", "must be positive".into()));
    }
    if c.max_deadline_seconds == 0 {
        return Err(bad("max_deadline_seconds", "must be positive".into()));
    }
    if c.card_deadline_seconds == 0 {
        return Err(bad("card_deadline_seconds", "must be positive".into()));
    }
    Ok(())
}

/// The default decline policy and the per-kind overrides
/// (`kind_decline_policy.KIND`).
pub(super) fn policies(
    c: &NodeConfig,
) -> Result<(DeclinePolicy, Vec<(Kind, DeclinePolicy)>), String> {
    let decline_policy = parse_policy(&c.decline_policy).map_err(|e| bad("decline_policy", e))?;
    let mut kind_policies = Vec::new();
    for (k, v) in &c.kind_decline_policy {
        let key = format!("kind_decline_policy.{k}");
        let kind = Kind::new(k).map_err(|e| bad(&key, e.to_string()))?;
        kind_policies.push((kind, parse_policy(v).map_err(|e| bad(&key, e))?));
    }
    Ok((decline_policy, kind_policies))
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
