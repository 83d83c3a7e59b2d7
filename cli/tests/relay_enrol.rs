//! The relay over WebSocket, and edges enrolled without a restart, with
//! real processes on loopback.
//!
//! `abhyasa relay init --transport ws`: the relay listens on WebSocket
//! only, and alice and the edge reach it with `transport = "ws"` entries
//! (the snippet `relay init` prints). The relay starts pinning alice
//! alone; `abhyasa relay enrol` adds the edge to its config.toml while it
//! runs, the edge connects and gets alice's obligation applied once.
//! `abhyasa relay unenrol` then removes it: the running relay refuses
//! frames for it (`unknown_destination`, in `relay status`), and custody
//! keeps the obligation.
#![allow(clippy::unwrap_used)]

mod process;

use std::path::Path;
use std::time::Duration;

use abhyasa_core::Timestamp;
use process::relay::{relay_spawn, relay_status, via_relay};
use process::{free_port, init, ok, pin, set_config, spawn, wait_for, Children, Control};
use serde_json::{json, Value};

fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("a free TCP port")
        .port()
}

fn fingerprint(snippet: &str) -> String {
    snippet
        .lines()
        .find_map(|l| l.strip_prefix("fingerprint = \""))
        .and_then(|f| f.strip_suffix('"'))
        .expect("a fingerprint line")
        .to_string()
}

fn call(dir: &Path, req: &Value) -> Option<Value> {
    Control::connect(dir).ok()?.call(req).ok()
}

fn metric(dir: &Path, name: &str) -> Option<u64> {
    call(dir, &json!({"op": "metrics"}))?["result"][name].as_u64()
}

fn offer(dir: &Path, id: &str) {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let created_at = Timestamp::from_unix_seconds(i64::try_from(secs).unwrap()).to_rfc3339();
    let ob = json!({
        "obligation_id": id,
        "kind": "anumati.consent",
        "target": "edge",
        "payload": {"decision": "revoke", "scope": id},
        "deadline_seconds": 300,
        "max_retries": 1000,
        "created_at": created_at,
    });
    let v = call(dir, &json!({"op": "offer", "obligation": ob})).expect("offer answered");
    assert_eq!(v["ok"], true, "{v}");
}

/// The relay's `unknown_destination` refusals, from `relay status
/// --json` (counted against the pinned hop that sent them, alice).
fn unknown_destination(relay: &Path) -> u64 {
    let Some(v) = relay_status(relay) else {
        return 0;
    };
    v["destinations"].as_array().map_or(0, |ds| {
        ds.iter()
            .filter_map(|d| d["refused"]["unknown_destination"].as_u64())
            .sum()
    })
}

#[test]
fn relay_over_websocket_enrols_an_edge_while_running() {
    let root = tempfile::tempdir().unwrap();
    let (r, a, e) = (
        root.path().join("relay"),
        root.path().join("alice"),
        root.path().join("edge"),
    );
    let ws_port = free_tcp_port();
    let out = ok(&[
        "relay",
        "init",
        "--dir",
        r.to_str().unwrap(),
        "--agent",
        "relay-1",
        "--transport",
        "ws",
        "--listen",
        &format!("127.0.0.1:{ws_port}"),
    ]);
    let relay_pin = out[out.find("[[peers]]").expect("a peers snippet")..].to_string();
    assert!(
        relay_pin.contains("transport = \"ws\"")
            && relay_pin.contains(&format!("url = \"ws://127.0.0.1:{ws_port}/\"")),
        "{relay_pin}"
    );
    let alice_pin = init(&a, "alice", free_port());
    let edge_pin = init(&e, "edge", free_port());
    // The relay starts knowing alice only.
    pin(&r, &alice_pin);
    pin(&a, &relay_pin);
    pin(&a, &via_relay(&edge_pin));
    pin(&e, &relay_pin);
    pin(&e, &via_relay(&alice_pin));
    for d in [&a, &e] {
        set_config(d, "backoff_base_ms", "200");
        set_config(d, "backoff_cap_ms", "1000");
    }
    let mut procs = Children(vec![relay_spawn(&r), spawn(&a)]);
    wait_for("alice's control socket", Duration::from_secs(20), || {
        Control::connect(&a).is_ok()
    });

    // Enrolled while the relay runs (no restart): the edge connects over
    // WebSocket and gets alice's obligation, once.
    ok(&[
        "relay",
        "enrol",
        "--dir",
        r.to_str().unwrap(),
        "--agent",
        "edge",
        "--fingerprint",
        &fingerprint(&edge_pin),
    ]);
    procs.0.push(spawn(&e));
    wait_for("the edge's control socket", Duration::from_secs(20), || {
        Control::connect(&e).is_ok()
    });
    offer(&a, "enrolled-1");
    wait_for("the edge to apply it", Duration::from_secs(30), || {
        metric(&e, "receiver_applied") == Some(1)
    });
    wait_for("alice to discharge it", Duration::from_secs(30), || {
        metric(&a, "applied") == Some(1)
    });

    // Unenrolled while running: frames for the edge are refused, custody
    // keeps the obligation, nothing more is applied.
    ok(&[
        "relay",
        "unenrol",
        "--dir",
        r.to_str().unwrap(),
        "--agent",
        "edge",
    ]);
    std::thread::sleep(Duration::from_millis(1500));
    offer(&a, "unenrolled-1");
    wait_for(
        "the relay to refuse frames for the unenrolled edge",
        Duration::from_secs(30),
        || unknown_destination(&r) > 0,
    );
    assert_eq!(metric(&e, "receiver_applied"), Some(1));
    assert_eq!(metric(&a, "applied"), Some(1));
}
