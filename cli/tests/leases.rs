//! `abhyasa leases [--json]` through real processes (issue 13, C-TR-4):
//! a leased grant from alice to bob is listed on bob as active, renewed
//! by alice as principal (with the configuration warning that its term
//! outlasts the revocation deadline), and lapses on bob once alice is
//! killed and renewals stop.

use std::time::Duration;

use serde_json::Value;

mod process;
use process::{free_port, init, json, ok, pin, set_config, spawn, wait_for, Children};

const KEY: &str = "anumati.consent/bob/scope:email.read";
/// The key as bob holds it: under alice, its issuer (C-AZ-2).
const HELD_KEY: &str = "@alice/anumati.consent/bob/scope:email.read";

fn lease_row(dir: &str) -> Option<Value> {
    let v = json(&["leases", "--dir", dir, "--json"]);
    v["leases"]
        .as_array()?
        .iter()
        .find(|l| l["key"] == HELD_KEY)
        .cloned()
}

// C-TR-4 (processes): active while alice renews, lapsed after alice dies.
#[test]
fn c_tr_4_leases_lists_active_then_lapsed_with_renewals_and_warning() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (a, b) = (tmp.path().join("alice"), tmp.path().join("bob"));
    let (ds_a, ds_b) = (a.to_str().expect("utf-8"), b.to_str().expect("utf-8"));
    let snip_a = init(&a, "alice", free_port());
    let snip_b = init(&b, "bob", free_port());
    pin(&a, &snip_b);
    pin(&b, &snip_a);
    for d in [&a, &b] {
        set_config(d, "skew_margin_ms", "100");
    }
    // Revocations carry a 1 s deadline: a 2 s lease outlasts it (warning).
    set_config(&a, "card_deadline_seconds", "1");
    let mut children = Children(vec![spawn(&a), spawn(&b)]);
    wait_for("both control sockets", Duration::from_secs(10), || {
        a.join("control.sock").exists() && b.join("control.sock").exists()
    });
    // The link is up once a custody transfer completes (the grant is
    // best-effort: one send).
    let warm = json(&[
        "send",
        "--dir",
        ds_a,
        "--kind",
        "anumati.consent",
        "--target",
        "bob",
        "--payload",
        r#"{"decision": "revoke", "scope": "other"}"#,
        "--deadline",
        "20",
        "--id",
        "warm-up",
        "--wait",
        "--json",
    ]);
    assert_eq!(warm["outcome"]["state"], "applied", "{warm}");
    let none = json(&["leases", "--dir", ds_b, "--json"]);
    assert_eq!(none["leases"], serde_json::json!([]), "{none}");

    let sent = json(&[
        "send",
        "--dir",
        ds_a,
        "--kind",
        "anumati.consent",
        "--target",
        "bob",
        "--payload",
        r#"{"decision": "grant", "scope": "email.read", "lease_seconds": 2}"#,
        "--sequence",
        "1",
        "--deadline",
        "20",
        "--id",
        "grant-1",
        "--json",
    ]);
    assert_eq!(sent["mode"], "best_effort", "{sent}");
    wait_for("bob holds the lease", Duration::from_secs(5), || {
        lease_row(ds_b).is_some_and(|l| l["state"] == "active")
    });
    let first = lease_row(ds_b).expect("lease row");
    assert_eq!(first["scope"], "scope:email.read", "{first}");
    assert_eq!(first["kind"], "anumati.consent", "{first}");
    assert_eq!(first["target"], "bob", "{first}");
    assert_eq!(first["authorized"], true, "{first}");
    assert!(first["lease_until"].is_string(), "{first}");

    // Alice renews as principal, and warned when the grant was offered.
    let mine = json(&["leases", "--dir", ds_a, "--json"]);
    let renewing = &mine["renewing"][0];
    assert_eq!(renewing["key"], KEY, "{mine}");
    assert_eq!(renewing["root"], "grant-1", "{mine}");
    assert_eq!(
        mine["warnings"][0]["warning"], "term_exceeds_revocation_deadline",
        "{mine}"
    );
    assert_eq!(mine["warnings"][0]["term_seconds"], 2, "{mine}");
    assert_eq!(
        mine["warnings"][0]["revocation_deadline_seconds"], 1,
        "{mine}"
    );
    let human = ok(&["leases", "--dir", ds_a]);
    assert!(
        human.contains("renewing") && human.contains("warning:"),
        "{human}"
    );

    // Past the first term: still active, on a later lease end.
    std::thread::sleep(Duration::from_millis(2500));
    let later = lease_row(ds_b).expect("lease row");
    assert_eq!(later["state"], "active", "renewals keep it: {later}");
    assert_ne!(later["lease_until"], first["lease_until"], "{later}");

    // Alice dies: no renewal comes, the lease lapses.
    let mut alice = children.0.remove(0);
    alice.kill().expect("kill alice");
    let _ = alice.wait();
    wait_for("the lease lapses", Duration::from_secs(5), || {
        lease_row(ds_b).is_some_and(|l| l["state"] == "lapsed" && l["authorized"] == false)
    });
    let human = ok(&["leases", "--dir", ds_b]);
    assert!(
        human.contains("lapsed") && human.contains("1 lease(s) held"),
        "{human}"
    );
}
