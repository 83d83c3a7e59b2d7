//! Authority belongs to its issuer, through real processes (C-AZ-1): a
//! pinned peer marked `relay = true` sends bob a grant in its own name and
//! is declined `unauthorized`; bob counts it and shows it in `status`.
//! Order comes from the issuer (C-OR-1): `abhyasa send` without
//! `--sequence` gives each obligation the next sequence on its key.

use std::time::Duration;

mod process;
use process::{free_port, init, json, pin, spawn, wait_for, Children};

fn send(dir: &str, id: &str, payload: &str) -> serde_json::Value {
    json(&[
        "send",
        "--dir",
        dir,
        "--kind",
        "anumati.consent",
        "--target",
        "bob",
        "--payload",
        payload,
        "--deadline",
        "20",
        "--id",
        id,
        "--wait",
        "--json",
    ])
}

// C-AZ-1 (processes): a relay-like pinned peer governs nothing.
#[test]
fn c_az_1_relay_peer_grant_in_its_own_name_is_declined_unauthorized() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (r, b) = (tmp.path().join("relay"), tmp.path().join("bob"));
    let (ds_r, ds_b) = (r.to_str().expect("utf-8"), b.to_str().expect("utf-8"));
    let snip_r = init(&r, "relay", free_port());
    let snip_b = init(&b, "bob", free_port());
    pin(&r, &snip_b);
    // Bob pins the relay and marks it one (the last table of the file is
    // its [[peers]] entry).
    pin(
        &b,
        &format!("{}relay = true\n", snip_r.trim_end().to_owned() + "\n"),
    );
    let _children = Children(vec![spawn(&r), spawn(&b)]);
    wait_for("both control sockets", Duration::from_secs(10), || {
        r.join("control.sock").exists() && b.join("control.sock").exists()
    });
    let out = send(
        ds_r,
        "relay-revoke",
        r#"{"decision": "revoke", "scope": "email.read"}"#,
    );
    assert_eq!(out["outcome"]["state"], "declined", "{out}");
    assert_eq!(out["outcome"]["reason"], "unauthorized", "{out}");
    // The grant is best-effort: wait for bob to record its refusal.
    let _ = json(&[
        "send",
        "--dir",
        ds_r,
        "--kind",
        "anumati.consent",
        "--target",
        "bob",
        "--payload",
        r#"{"decision": "grant", "scope": "email.read"}"#,
        "--id",
        "relay-grant",
        "--json",
    ]);
    let mut status = serde_json::Value::Null;
    wait_for("bob records the grant", Duration::from_secs(10), || {
        let out = process::abhyasa(&["status", "relay-grant", "--dir", ds_b, "--json"]);
        if !out.status.success() {
            return false;
        }
        status = serde_json::from_slice(&out.stdout).expect("json");
        true
    });
    assert_eq!(status["declines"][0][1], "unauthorized", "{status}");
    assert!(
        status["declines"][0][2]
            .as_str()
            .is_some_and(|t| t.contains("relay")),
        "{status}"
    );
    let m = json(&["metrics", "--dir", ds_b, "--json"]);
    assert_eq!(m["receiver_unauthorized"], 2, "{m}");
    assert_eq!(m["receiver_applied"], 0, "{m}");
    let leases = json(&["leases", "--dir", ds_b, "--json"]);
    assert_eq!(leases["leases"], serde_json::json!([]), "{leases}");
}

// C-OR-1 (processes): `abhyasa send` without `--sequence` gives the
// obligation the next sequence on its key: after a grant at 5, a revoke
// sent without one carries 6, so a grant at 6 is superseded and one at 7
// applies (were the revoke unsequenced, bob would decline both; were its
// sequence 7 or more, both).
#[test]
fn c_or_1_send_assigns_the_next_sequence_on_the_key() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (a, b) = (tmp.path().join("alice"), tmp.path().join("bob"));
    let (ds_a, ds_b) = (a.to_str().expect("utf-8"), b.to_str().expect("utf-8"));
    let snip_a = init(&a, "alice", free_port());
    let snip_b = init(&b, "bob", free_port());
    pin(&a, &snip_b);
    pin(&b, &snip_a);
    let _children = Children(vec![spawn(&a), spawn(&b)]);
    wait_for("both control sockets", Duration::from_secs(10), || {
        a.join("control.sock").exists() && b.join("control.sock").exists()
    });
    let warm = send(
        ds_a,
        "warm-up",
        r#"{"decision": "revoke", "scope": "other"}"#,
    );
    assert_eq!(warm["outcome"]["state"], "applied", "{warm}");
    let grant = |id: &str, seq: &str| {
        let _ = json(&[
            "send",
            "--dir",
            ds_a,
            "--kind",
            "anumati.consent",
            "--target",
            "bob",
            "--payload",
            r#"{"decision": "grant", "scope": "s"}"#,
            "--sequence",
            seq,
            "--id",
            id,
            "--json",
        ]);
        let mut status = serde_json::Value::Null;
        wait_for("bob records the grant", Duration::from_secs(10), || {
            let out = process::abhyasa(&["status", id, "--dir", ds_b, "--json"]);
            out.status.success() && {
                status = serde_json::from_slice(&out.stdout).expect("json");
                true
            }
        });
        status
    };
    let g5 = grant("g-5", "5");
    assert_eq!(g5["receiver"][0][1], "applied", "{g5}");
    let revoke = send(ds_a, "r-auto", r#"{"decision": "revoke", "scope": "s"}"#);
    assert_eq!(revoke["outcome"]["state"], "applied", "{revoke}");
    let g6 = grant("g-6", "6");
    assert_eq!(g6["declines"][0][1], "superseded", "{g6}");
    let g7 = grant("g-7", "7");
    assert_eq!(g7["receiver"][0][1], "applied", "{g7}");
}
