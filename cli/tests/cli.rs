//! End to end through the `abhyasa` binary: init two nodes, pin them to
//! each other, run both as processes on loopback QUIC, drive them over the
//! control socket.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

mod process;
use process::{abhyasa, free_port, init, json, ok, pin, spawn, wait_for, Children};

#[test]
fn two_nodes_over_the_cli() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (a, b) = (tmp.path().join("alice"), tmp.path().join("bob"));
    let (ds_a, ds_b) = (a.to_str().expect("utf-8"), b.to_str().expect("utf-8"));
    let (pa, pb) = (free_port(), free_port());
    let snip_a = init(&a, "alice", pa);
    let snip_b = init(&b, "bob", pb);

    // The key is owner-only; init refuses to overwrite a node directory.
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(a.join("identity/key.pem"))
            .expect("key.pem")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let again = abhyasa(&["init", "--dir", ds_a, "--agent", "alice"]);
    assert!(!again.status.success());

    pin(&a, &snip_b);
    pin(&b, &snip_a);
    // Alice surfaces declines for the principal instead of applying safe(O).
    let cfg_a = a.join("config.toml");
    let text = std::fs::read_to_string(&cfg_a).expect("config.toml");
    let text = text.replace(
        "decline_policy = \"apply_safe\"",
        "decline_policy = \"surface\"",
    );
    std::fs::write(&cfg_a, text).expect("config.toml written");

    // No node yet: a clear error, non-zero exit.
    let down = abhyasa(&["inbox", "--dir", ds_a]);
    assert!(!down.status.success());
    let err = String::from_utf8_lossy(&down.stderr);
    assert!(err.contains("no node is running"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    let mut children = Children(vec![spawn(&a), spawn(&b)]);
    wait_for("both control sockets", Duration::from_secs(10), || {
        a.join("control.sock").exists() && b.join("control.sock").exists()
    });

    // A second node on the same directory is refused, the first unharmed.
    let twice = abhyasa(&["node", "run", "--dir", ds_a]);
    assert!(!twice.status.success());
    let err = String::from_utf8_lossy(&twice.stderr);
    assert!(err.contains("already running"), "{err}");
    assert!(a.join("control.sock").exists());

    // An Anumati revocation from alice to bob, under custody, to applied.
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
        "20",
        "--id",
        "ob-cli-1",
        "--wait",
        "--json",
    ]);
    assert_eq!(sent["mode"], "custody", "{sent}");
    assert_eq!(sent["outcome"]["state"], "applied", "{sent}");

    // The same through a JSON file (created_at and id filled in).
    let file = tmp.path().join("ob.json");
    std::fs::write(
        &file,
        r#"{"kind": "oauth.token", "target": "bob", "payload": {"action": "revoke", "token_id": "tok-1"},
            "deadline_seconds": 20, "max_retries": 8}"#,
    )
    .expect("obligation file");
    let sent2 = json(&[
        "send",
        "--dir",
        ds_a,
        "--file",
        file.to_str().expect("utf-8"),
        "--wait",
        "--json",
    ]);
    assert_eq!(sent2["outcome"]["state"], "applied", "{sent2}");

    let st = json(&["status", "ob-cli-1", "--dir", ds_a, "--json"]);
    assert_eq!(st["custodian"], "applied", "{st}");
    let st_b = json(&["status", "ob-cli-1", "--dir", ds_b, "--json"]);
    assert_eq!(
        st_b["receiver"],
        serde_json::json!([["alice", "applied"]]),
        "{st_b}"
    );
    let human = ok(&["status", "ob-cli-1", "--dir", ds_a]);
    assert!(human.contains("applied"), "{human}");

    let list = json(&["list", "--dir", ds_a, "--state", "applied", "--json"]);
    let rows = list["items"].as_array().expect("list items are an array");
    assert_eq!(rows.len(), 2, "{list}");
    assert!(rows.iter().any(|r| r["obligation_id"] == "ob-cli-1"));
    assert_eq!(list["next"], Value::Null, "one page holds both: {list}");
    // Paged (issue 11 §5): one item a page, the cursor leads to the other.
    let first = json(&[
        "list", "--dir", ds_a, "--state", "applied", "--limit", "1", "--json",
    ]);
    assert_eq!(first["items"].as_array().map(Vec::len), Some(1), "{first}");
    let next = first["next"].as_str().expect("a next cursor").to_string();
    assert_eq!(first["items"][0]["obligation_id"], next.as_str(), "{first}");
    let second = json(&[
        "list", "--dir", ds_a, "--state", "applied", "--limit", "1", "--after", &next, "--json",
    ]);
    assert_eq!(
        second["items"].as_array().map(Vec::len),
        Some(1),
        "{second}"
    );
    assert_ne!(
        second["items"][0]["obligation_id"],
        next.as_str(),
        "{second}"
    );
    assert_eq!(second["next"], Value::Null, "{second}");
    let pending = json(&["list", "--dir", ds_a, "--state", "pending", "--json"]);
    assert_eq!(pending["items"], Value::Array(vec![]), "{pending}");

    let inbox = json(&["inbox", "--dir", ds_a, "--json"]);
    assert_eq!(inbox["pending"], 0, "{inbox}");
    assert_eq!(inbox["escalated"], 0, "{inbox}");
    let esc = json(&["escalations", "--dir", ds_a, "--json"]);
    assert_eq!(esc["escalations"], Value::Array(vec![]), "{esc}");
    assert_eq!(esc["decisions"], Value::Array(vec![]), "{esc}");
    let metrics = json(&[
        "metrics",
        "--socket",
        a.join("control.sock").to_str().expect("utf-8"),
        "--json",
    ]);
    // Two custody transfers, both applied on a clean loopback link.
    for (field, want) in [
        ("opened", 2),
        ("applied", 2),
        ("pending", 0),
        ("declined", 0),
        ("escalated", 0),
        ("best_effort", 0),
        ("acks_ignored", 0),
        ("receiver_applied", 0),
    ] {
        assert_eq!(metrics[field], want, "{field}: {metrics}");
    }
    for field in ["commits", "frames_out", "frames_in"] {
        assert!(
            metrics[field].as_u64().is_some_and(|n| n >= 2),
            "{field}: {metrics}"
        );
    }

    // A principal decision on a key.
    let decided = json(&[
        "decide",
        "--dir",
        ds_a,
        "--key",
        "email.read",
        "--withhold",
        "--json",
    ]);
    assert_eq!(
        decided,
        serde_json::json!({"outcome": "applied"}),
        "{decided}"
    );
    // A newer grant on another key applies; an older withhold behind it
    // is superseded (the principal-side guard), naming the newest sequence.
    let grant = json(&[
        "decide",
        "--dir",
        ds_a,
        "--key",
        "calendar.read",
        "--grant",
        "--sequence",
        "5",
        "--json",
    ]);
    assert_eq!(grant, serde_json::json!({"outcome": "applied"}), "{grant}");
    let stale = json(&[
        "decide",
        "--dir",
        ds_a,
        "--key",
        "calendar.read",
        "--withhold",
        "--sequence",
        "3",
        "--json",
    ]);
    assert_eq!(
        stale,
        serde_json::json!({"outcome": "superseded", "newest": 5}),
        "{stale}"
    );

    // A deadline inside bob's skew margin: bob declines it as expired, and
    // alice surfaces the decline; the principal resolves it.
    let declined = json(&[
        "send",
        "--dir",
        ds_a,
        "--kind",
        "anumati.consent",
        "--target",
        "bob",
        "--payload",
        r#"{"decision": "revoke", "scope": "files.write"}"#,
        "--deadline",
        "1",
        "--id",
        "ob-cli-late",
        "--wait",
        "--json",
    ]);
    assert_eq!(declined["outcome"]["state"], "declined", "{declined}");
    let esc = json(&["escalations", "--dir", ds_a, "--json"]);
    let items = esc["decisions"].as_array().expect("decisions");
    assert!(
        items.iter().any(|d| d["obligation_id"] == "ob-cli-late"),
        "{esc}"
    );
    let human = ok(&["escalations", "--dir", ds_a]);
    assert!(human.contains("1 decision(s) required"), "{human}");
    ok(&[
        "decide",
        "--dir",
        ds_a,
        "--obligation",
        "ob-cli-late",
        "--apply-safe",
    ]);
    let esc = json(&["escalations", "--dir", ds_a, "--json"]);
    assert_eq!(esc["decisions"], Value::Array(vec![]), "{esc}");

    // Unknown obligation, bad input file: one line, non-zero.
    let unknown = abhyasa(&["status", "ob-nope", "--dir", ds_a]);
    assert!(!unknown.status.success());
    std::fs::write(&file, "{not json").expect("bad file");
    let bad = abhyasa(&[
        "send",
        "--dir",
        ds_a,
        "--file",
        file.to_str().expect("utf-8"),
    ]);
    assert!(!bad.status.success());
    assert_eq!(
        String::from_utf8_lossy(&bad.stderr).trim().lines().count(),
        1
    );

    // A target that is not pinned: refused up front, one line.
    let nowhere = abhyasa(&[
        "send",
        "--dir",
        ds_a,
        "--kind",
        "anumati.consent",
        "--target",
        "mallory",
        "--payload",
        r#"{"decision": "revoke", "scope": "x"}"#,
    ]);
    assert!(!nowhere.status.success());
    let err = String::from_utf8_lossy(&nowhere.stderr);
    assert!(
        err.contains("mallory") && err.contains("unreachable"),
        "{err}"
    );

    // A malformed request gets a typed error and the connection stays up.
    {
        use std::io::{BufRead, BufReader, Write};
        let mut s = std::os::unix::net::UnixStream::connect(a.join("control.sock"))
            .expect("control socket");
        s.write_all(b"{\"op\": \"frobnicate\"}\nnot json\n{\"op\": \"inbox\"}\n")
            .expect("write");
        let mut r = BufReader::new(s);
        for expect_ok in [false, false, true] {
            let mut line = String::new();
            r.read_line(&mut line).expect("a response line");
            let v: Value = serde_json::from_str(&line).expect("JSON response");
            assert_eq!(v["ok"], expect_ok, "{line}");
            if !expect_ok {
                assert_eq!(v["error"]["code"], "bad_request", "{line}");
            }
        }
    }

    // The card reads the config only.
    let card = json(&["card", "--dir", ds_a]);
    assert_eq!(
        card["uri"],
        "https://ravikiran438.github.io/abhyasa-protocol/v1"
    );
    assert_eq!(card["params"]["version"], "1.0.0");
    let kinds = card["params"]["supported_kinds"]
        .as_array()
        .expect("supported_kinds");
    assert!(
        kinds.iter().any(|k| k["kind"] == "anumati.consent"),
        "{card}"
    );

    // SIGTERM stops a node cleanly and removes its socket.
    let pid = children.0[1].id().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let status = children.0[1].wait().expect("bob exits");
    assert!(status.success(), "bob exited with {status}");
    assert!(!b.join("control.sock").exists());

    // A stale socket from a crashed run is replaced on the next start.
    drop(std::os::unix::net::UnixListener::bind(b.join("control.sock")).expect("stale socket"));
    children.0[1] = spawn(&b);
    wait_for("bob to serve again", Duration::from_secs(10), || {
        std::os::unix::net::UnixStream::connect(b.join("control.sock")).is_ok()
    });
    let inbox_b = json(&["inbox", "--dir", ds_b, "--json"]);
    // Bob's durable state survived the restart: nothing pending or in
    // doubt, and its ledger still answers for alice's obligation.
    for field in [
        "pending",
        "decision_required",
        "escalated",
        "deferred_overdue",
        "late_applied",
        "outcome_unknown",
    ] {
        assert_eq!(inbox_b[field], 0, "{field}: {inbox_b}");
    }
    let st_b = json(&["status", "ob-cli-1", "--dir", ds_b, "--json"]);
    assert_eq!(
        st_b["receiver"],
        serde_json::json!([["alice", "applied"]]),
        "{st_b}"
    );
}

#[test]
fn bad_config_names_the_key() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("n");
    init(&dir, "carol", free_port());
    let path = dir.join("config.toml");
    let good = std::fs::read_to_string(&path).expect("config.toml");
    let d = dir.to_str().expect("utf-8");

    std::fs::write(&path, format!("{good}\nretension_seconds = 5\n")).expect("write");
    for args in [vec!["card", "--dir", d], vec!["node", "run", "--dir", d]] {
        let out = abhyasa(&args);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("retension_seconds"), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }

    std::fs::write(&path, good.replace("store = \"log\"", "store = \"mysql\"")).expect("write");
    let out = abhyasa(&["card", "--dir", d]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`store`"), "{err}");

    std::fs::write(
        &path,
        good.replace("max_pending = 1000000", "max_pending = \"lots\""),
    )
    .expect("write");
    let out = abhyasa(&["card", "--dir", d]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("max_pending"), "{err}");
}
