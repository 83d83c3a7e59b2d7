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

use serde_json::Value;

use super::client::{call, print_json, ReadArgs};
use crate::control::Request;

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
