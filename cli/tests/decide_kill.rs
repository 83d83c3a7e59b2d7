//! C-ND-2 with real processes: `abhyasa decide` answers only once the
//! decision is durable. SIGKILL of the node the moment the CLI returns,
//! twenty times: after every restart each decision is there, shown by
//! `abhyasa authorizations` with when and why it changed.

use std::time::Duration;

use serde_json::Value;

mod process;
use process::{free_port, init, json, ok, spawn, wait_for, Children};

const ROUNDS: usize = 20;

#[test]
fn c_nd_2_decide_survives_sigkill_the_moment_the_cli_returns() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("alice");
    let d = dir.to_str().expect("utf-8");
    init(&dir, "alice", free_port());
    let mut children = Children(Vec::new());
    for round in 0..=ROUNDS {
        children.0.push(spawn(&dir));
        wait_for("the node to serve", Duration::from_secs(20), || {
            std::os::unix::net::UnixStream::connect(dir.join("control.sock")).is_ok()
        });
        // Every decision answered before a SIGKILL is durable.
        let rows = json(&["authorizations", "--dir", d, "--json"]);
        let rows = rows.as_array().expect("an array of keys");
        assert_eq!(rows.len(), round, "round {round}: {rows:?}");
        for (i, row) in rows.iter().enumerate() {
            assert_eq!(row["key"], format!("scope.{i:02}"), "{row}");
            assert_eq!(row["state"], "withheld", "{row}");
            assert_eq!(row["why"], "decision", "{row}");
            assert_eq!(row["sequence"], 0, "{row}");
            assert!(row["changed_at"].is_string(), "{row}");
            assert_eq!(row["obligation_id"], Value::Null, "{row}");
        }
        if round == ROUNDS {
            break;
        }
        let key = format!("scope.{round:02}");
        ok(&["decide", "--dir", d, "--key", &key, "--withhold"]);
        // The moment the CLI returns: SIGKILL, no chance to flush anything.
        let mut node = children.0.pop().expect("the node");
        node.kill().expect("SIGKILL");
        node.wait().expect("reaped");
    }
    // The human form names the cause too.
    let text = ok(&["authorizations", "--dir", d]);
    assert!(
        text.contains("scope.00") && text.contains("decision"),
        "{text}"
    );
    assert!(
        text.contains(&format!("{ROUNDS} governed key(s)")),
        "{text}"
    );
}
