//! `abhyasa leases [--json]` (custody plus leases): what this
//! node holds and renews under leases, read from the running node.
//!
//! The answer has three parts:
//! - `leases`: every governed key on which this node (as receiver) holds
//!   or held a leased grant: `key`, its `kind`, `target` and `scope` (the
//!   key's last segment), `lease_until`, and `state`: `active` while the
//!   grant may be exercised (`now + skew margin < lease_until`), `lapsed`
//!   once it may not (no renewal came in time), `withheld` if revoked;
//! - `renewing`: the leases this node (as principal) renews: key, target,
//!   the latest grant and its sequence, renewals sent, next renewal due;
//! - `warnings`: lease warnings raised when leased grants were offered (a
//!   term longer than the revocation deadline, `card_deadline_seconds`).

use abhyasa::Node;
use abhyasa_core::{AgentId, GovernedKey};
use serde_json::{json, Value};

use super::client::{call, print_json, ReadArgs};
use crate::control::{ControlError, Request};

/// The `leases` control request, answered from the node.
pub(crate) async fn answer(node: &Node) -> Result<Value, ControlError> {
    let leases: Vec<Value> = node
        .leases()
        .await?
        .into_iter()
        .map(|l| {
            // Keys are held under their issuer: `@<issuer>/<kind>/<target>/<name>`
            // (C-AZ-2); polarity rules build the `<kind>/<target>/<name>` part.
            let held = GovernedKey::new(&l.key).ok();
            let issuer = held.as_ref().and_then(GovernedKey::issuer);
            let bare = held.as_ref().map_or(l.key.as_str(), |k| k.unqualified());
            let mut parts = bare.splitn(3, '/');
            let (kind, target, scope) = (parts.next(), parts.next(), parts.next());
            let state = match l.state {
                "granted" => "active",
                other => other,
            };
            json!({
                "key": l.key,
                "issuer": issuer.as_ref().map(AgentId::as_str),
                "kind": kind,
                "target": target,
                "scope": scope,
                "lease_until": l.lease_until.to_rfc3339(),
                "state": state,
                "authorized": l.authorized,
            })
        })
        .collect();
    let renewing: Vec<Value> = node
        .renewals()
        .await?
        .into_iter()
        .map(|r| {
            json!({
                "key": r.key.as_str(),
                "target": r.target.as_str(),
                "root": r.root.as_str(),
                "last": r.last.as_str(),
                "sequence": r.sequence.0,
                "term_seconds": r.term_seconds,
                "renewals": r.renewals,
                "next_at": r.next_at.to_rfc3339(),
            })
        })
        .collect();
    let warnings = serde_json::to_value(node.lease_warnings().await?)
        .map_err(|e| ControlError::internal(e.to_string()))?;
    Ok(json!({"leases": leases, "renewing": renewing, "warnings": warnings}))
}

/// `abhyasa leases`.
pub(crate) fn run(a: ReadArgs) -> Result<(), String> {
    let r = call(&a.target.socket()?, &Request::Leases)?;
    if a.json {
        return print_json(&r);
    }
    let rows = |k: &str| r[k].as_array().cloned().unwrap_or_default();
    let text = |v: &Value| v.as_str().unwrap_or("-").to_string();
    let leases = rows("leases");
    for l in &leases {
        println!(
            "{:<48} {:<24} until {} {}",
            text(&l["key"]),
            text(&l["scope"]),
            text(&l["lease_until"]),
            text(&l["state"])
        );
    }
    println!("{} lease(s) held", leases.len());
    let renewing = rows("renewing");
    for n in &renewing {
        println!(
            "renewing {} for {}: seq {}, {} renewal(s), next at {}",
            text(&n["key"]),
            text(&n["target"]),
            n["sequence"],
            n["renewals"],
            text(&n["next_at"])
        );
    }
    if !renewing.is_empty() {
        println!("{} lease(s) renewed as principal", renewing.len());
    }
    for w in rows("warnings") {
        println!("warning: {}", text(&w["message"]));
    }
    Ok(())
}
