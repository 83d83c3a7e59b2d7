//! Issue 10: a corrupt row never takes a node down silently. With real
//! processes: a node whose store holds one unreadable row refuses to start
//! with a message naming the row and the repair path; `abhyasa store
//! check` lists it, `abhyasa store quarantine` moves it aside, and the node
//! then starts with every other row (here a pending revocation) intact.

use std::time::Duration;

use serde_json::Value;

mod process;
use process::{abhyasa, free_port, init, json, ok, pin, spawn, wait_for, Children, Control};

#[test]
fn a_corrupt_row_is_named_and_quarantined_and_the_rest_survives() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (a, b) = (tmp.path().join("alice"), tmp.path().join("bob"));
    let ds_a = a.to_str().expect("utf-8");
    init(&a, "alice", free_port());
    // The damage below is planted with redb's own API; the same repair on
    // every embedded store is abhyasa-store's (tests/suite.rs, reads.rs).
    process::set_config(&a, "store", "\"redb\"");
    let snip_b = init(&b, "bob", free_port());
    pin(&a, &snip_b);

    // Bob never runs: the revocation stays pending at alice.
    let mut nodes = Children(vec![spawn(&a)]);
    wait_for("alice's control socket", Duration::from_secs(20), || {
        Control::connect(&a).is_ok()
    });
    let sent = json(&[
        "send",
        "--dir",
        ds_a,
        "--kind",
        "anumati.consent",
        "--target",
        "bob",
        "--payload",
        r#"{"decision": "revoke", "scope": "email.read"}"#,
        "--deadline",
        "3600",
        "--json",
    ]);
    let id = sent["obligation_id"].as_str().expect("an id").to_string();
    for mut c in nodes.0.drain(..) {
        c.kill().expect("kill");
        c.wait().expect("reaped");
    }

    // Damage from outside: one row that is not a pending record.
    {
        let db = redb::Database::open(a.join("store.redb")).expect("store.redb");
        let def: redb::TableDefinition<&[u8], &[u8]> =
            redb::TableDefinition::new("custody_pending");
        let w = db.begin_write().expect("write");
        w.open_table(def)
            .expect("table")
            .insert(&b"broken-1"[..], &b"\xff\xfe not a row"[..])
            .expect("insert");
        w.commit().expect("commit");
    }

    let refused = abhyasa(&["node", "run", "--dir", ds_a]);
    assert!(
        !refused.status.success(),
        "a node started on a corrupt store"
    );
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("custody_pending entry broken-1"), "{err}");
    assert!(err.contains("abhyasa store quarantine --dir"), "{err}");

    let check = abhyasa(&["store", "check", "--dir", ds_a, "--json"]);
    assert!(!check.status.success(), "check must fail on a corrupt row");
    let listed: Value = serde_json::from_slice(&check.stdout).expect("JSON");
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(listed[0]["table"], "custody_pending");
    assert_eq!(listed[0]["key"], "broken-1");

    let moved = json(&["store", "quarantine", "--dir", ds_a, "--json"]);
    assert_eq!(moved[0]["key"], "broken-1", "{moved}");
    ok(&["store", "check", "--dir", ds_a]);
    let kept = json(&["store", "quarantined", "--dir", ds_a, "--json"]);
    assert_eq!(kept, moved);

    nodes.0.push(spawn(&a));
    wait_for("alice restarts", Duration::from_secs(20), || {
        Control::connect(&a).is_ok()
    });
    let status = json(&["status", "--dir", ds_a, &id, "--json"]);
    assert_eq!(status["custodian"], "pending", "{status}");
    assert_eq!(status["attempts"], 1, "{status}");
}
