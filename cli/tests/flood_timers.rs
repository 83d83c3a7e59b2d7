//! C-ND-3 with real processes: a node whose control socket is flooded
//! with offers and reads still escalates an obligation to a dead peer
//! within a second of its deadline (`closed_at − deadline_at`).
//!
//! Wall-clock figures, so it is behind `--ignored` and prints them:
//! `cargo test -p abhyasa-cli --test flood_timers -- --ignored --nocapture`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use abhyasa_core::Timestamp;
use serde_json::json;

mod process;
use process::{free_port, init, json, pin, spawn, wait_for, Children, Control};

fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    Timestamp::from_unix_seconds(i64::try_from(secs).expect("fits")).to_rfc3339()
}

fn revoke(id: &str, deadline: u64, created_at: &str) -> serde_json::Value {
    json!({
        "obligation_id": id,
        "kind": "anumati.consent",
        "target": "bob",
        "payload": {"decision": "revoke", "scope": id},
        "deadline_seconds": deadline,
        "max_retries": 2_000,
        "created_at": created_at,
    })
}

#[test]
#[ignore = "wall-clock figure; run with --ignored --nocapture"]
fn c_nd_3_flooded_node_escalates_within_a_second_of_the_deadline() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (a, b) = (tmp.path().join("alice"), tmp.path().join("bob"));
    let _ = init(&a, "alice", free_port());
    // Bob is pinned but never runs: every attempt to him fails.
    let snip_b = init(&b, "bob", free_port());
    pin(&a, &snip_b);
    let _children = Children(vec![spawn(&a)]);
    wait_for("alice to serve", Duration::from_secs(20), || {
        std::os::unix::net::UnixStream::connect(a.join("control.sock")).is_ok()
    });
    let stop = Arc::new(AtomicBool::new(false));
    let offered = Arc::new(AtomicUsize::new(0));
    let created_at = now_rfc3339();
    let flood: Vec<_> = (0..6)
        .map(|t| {
            let (dir, stop, offered, created_at) =
                (a.clone(), stop.clone(), offered.clone(), created_at.clone());
            std::thread::spawn(move || {
                let mut c = Control::connect(&dir).expect("control socket");
                let mut i = 0;
                while !stop.load(Ordering::SeqCst) {
                    let req = if t % 3 == 2 {
                        json!({"op": "metrics"})
                    } else {
                        let id = format!("flood-{t}-{i:07}");
                        json!({"op": "offer", "obligation": revoke(&id, 600, &created_at)})
                    };
                    let v = c.call(&req).expect("the node answers");
                    assert_eq!(v["ok"], true, "{v}");
                    if t % 3 != 2 {
                        offered.fetch_add(1, Ordering::SeqCst);
                    }
                    i += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let mut c = Control::connect(&a).expect("control socket");
    let target = revoke("dead-line", 3, &now_rfc3339());
    let v = c
        .call(&json!({"op": "offer", "obligation": target}))
        .expect("offer");
    assert_eq!(v["ok"], true, "{v}");
    // Flood on past the deadline.
    std::thread::sleep(Duration::from_secs(5));
    stop.store(true, Ordering::SeqCst);
    for f in flood {
        f.join().expect("flood thread");
    }
    let rows = json(&[
        "list",
        "--dir",
        a.to_str().expect("utf-8"),
        "--state",
        "escalated",
        "--json",
    ]);
    let row = rows["items"]
        .as_array()
        .expect("rows")
        .iter()
        .find(|r| r["obligation_id"] == "dead-line")
        .cloned()
        .expect("the obligation escalated");
    let at = |f: &str| {
        Timestamp::parse_rfc3339(f, row[f].as_str().expect("a timestamp")).expect("rfc3339")
    };
    let late = at("closed_at").saturating_duration_since(at("deadline_at"));
    eprintln!(
        "C-ND-3: closed_at - deadline_at = {late:?} under a flood of {} offers",
        offered.load(Ordering::SeqCst)
    );
    assert!(late < Duration::from_secs(1), "escalated {late:?} late");
}
