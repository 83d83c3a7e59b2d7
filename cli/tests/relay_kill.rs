//! C-TR-3 with real processes: a relay SIGKILLed and restarted mid-hold
//! loses nothing it had receipted, and nothing is applied twice.
//!
//! Three `abhyasa` processes on loopback QUIC: the relay (`abhyasa relay
//! run`), alice the custodian and an edge that reaches alice only through
//! the relay (`via = "relay-1"`, no address: it dials out to the relay and
//! never accepts connections from alice). With the edge away, alice offers
//! obligations and the relay spools them. Then alice is SIGKILLed (so its
//! retries cannot refill the spool), the relay is SIGKILLed and restarted:
//! its spool still holds every frame. The edge comes up, pulls and applies
//! them from the relay alone, and its acks are spooled for alice; alice
//! restarts and discharges everything from those acks. The edge applied
//! each obligation exactly once; alice holds nothing pending.
#![allow(clippy::unwrap_used)]

mod process;

use std::path::Path;
use std::time::Duration;

use abhyasa_core::Timestamp;
use process::relay::{relay_spawn, relay_status, via_relay};
use process::{
    free_port, init, linked, ok, pin, set_config, spawn, wait_for, wait_for_or, Children, Control,
};
use serde_json::{json, Value};

const N: usize = 20;

fn relay_init(dir: &Path, port: u16) -> String {
    let out = ok(&[
        "relay",
        "init",
        "--dir",
        dir.to_str().unwrap(),
        "--agent",
        "relay-1",
        "--listen",
        &format!("127.0.0.1:{port}"),
    ]);
    let at = out
        .find("[[peers]]")
        .expect("relay init prints a peers snippet");
    out[at..].to_string()
}

fn edge_depth(relay_dir: &Path) -> Option<u64> {
    let v = relay_status(relay_dir)?;
    Some(
        v["destinations"]
            .as_array()?
            .iter()
            .find(|d| d["destination"] == "edge")
            .and_then(|d| d["depth"].as_u64())
            .unwrap_or(0),
    )
}

fn call(dir: &Path, req: &Value) -> Option<Value> {
    Control::connect(dir).ok()?.call(req).ok()
}

fn count(dir: &Path, state: &str) -> Option<usize> {
    call(dir, &json!({"op": "list", "state": state}))?["result"]["items"]
        .as_array()
        .map(Vec::len)
}

#[test]
fn c_tr_3_relay_killed_mid_hold_loses_nothing_receipted() {
    let root = tempfile::tempdir().unwrap();
    let (r, a, e) = (
        root.path().join("relay"),
        root.path().join("alice"),
        root.path().join("edge"),
    );
    let relay_pin = relay_init(&r, free_port());
    let alice_pin = init(&a, "alice", free_port());
    let edge_pin = init(&e, "edge", free_port());
    pin(&r, &alice_pin);
    pin(&r, &edge_pin);
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
    // Offer only once alice's link to the relay is up. When it comes up
    // alice asks the edge (through the relay) about whatever it holds;
    // that status query is a spooled frame too, so with offers made before
    // the link (the first dial can lose the race with the relay's start
    // and wait out a backoff) the spool could hold the query beside all
    // but one obligation, and the depth count below could not tell them
    // apart. With nothing pending at link-up no query is sent.
    linked(&a);
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let created_at = Timestamp::from_unix_seconds(i64::try_from(secs).unwrap()).to_rfc3339();
    for i in 0..N {
        let ob = json!({
            "obligation_id": format!("relay-{i:03}"),
            "kind": "anumati.consent",
            "target": "edge",
            "payload": {"decision": "revoke", "scope": format!("s{i}")},
            "deadline_seconds": 300,
            "max_retries": 1000,
            "created_at": created_at,
        });
        let v = call(&a, &json!({"op": "offer", "obligation": ob})).expect("offer answered");
        assert_eq!(v["ok"], true, "{v}");
    }
    wait_for_or(
        "the relay to spool every frame",
        Duration::from_secs(30),
        || edge_depth(&r) == Some(N as u64),
        || format!("relay status: {:?}", relay_status(&r)),
    );

    // Alice stops (its retries would refill the spool); the relay dies
    // mid-hold and comes back.
    procs.0[1].kill().unwrap();
    procs.0[1].wait().unwrap();
    procs.0[0].kill().unwrap();
    procs.0[0].wait().unwrap();
    std::fs::remove_file(r.join("status.json")).unwrap();
    procs.0[0] = relay_spawn(&r);
    wait_for(
        "the restarted relay's status",
        Duration::from_secs(20),
        || edge_depth(&r).is_some(),
    );
    assert_eq!(
        edge_depth(&r),
        Some(N as u64),
        "the relay lost receipted frames"
    );

    // The edge dials out, pulls everything from the relay alone and acks
    // (to the relay's spool: alice is down).
    procs.0.push(spawn(&e));
    wait_for_or(
        "the edge to apply every obligation",
        Duration::from_secs(60),
        || {
            call(&e, &json!({"op": "metrics"}))
                .and_then(|v| v["result"]["receiver_applied"].as_u64())
                == Some(N as u64)
        },
        || {
            format!(
                "edge metrics: {:?}\nrelay status: {:?}",
                call(&e, &json!({"op": "metrics"})),
                relay_status(&r)
            )
        },
    );
    // Alice comes back and discharges from the spooled acks.
    procs.0[1] = spawn(&a);
    wait_for(
        "alice to discharge everything",
        Duration::from_secs(60),
        || count(&a, "pending") == Some(0) && count(&a, "applied") == Some(N),
    );
    // Nothing applied twice, whatever was retried or replayed.
    let applied =
        call(&e, &json!({"op": "metrics"})).unwrap()["result"]["receiver_applied"].as_u64();
    assert_eq!(applied, Some(N as u64));
    wait_for("the spool to drain", Duration::from_secs(30), || {
        edge_depth(&r) == Some(0)
    });
}
