//! `abhyasa node run` with peers over the A2A HTTP binding (issue 12):
//! alice reaches bob only over HTTPS with mutual TLS (`transport =
//! "http"`) and carol over QUIC, from one node, through the composed
//! transport; both obligations end applied.

use std::time::Duration;

mod process;
use process::{free_port, init, json, pin, spawn, wait_for, Children};

/// A `[[peers]]` snippet from `init`, turned into an HTTP peer at `url`.
fn over_http(snippet: &str, url: &str) -> String {
    snippet
        .lines()
        .filter(|l| !l.starts_with("addr = "))
        .chain(
            [
                "transport = \"http\"".to_string(),
                format!("url = \"{url}\""),
            ]
            .iter()
            .map(String::as_str),
        )
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

fn send(dir: &str, target: &str, id: &str) -> serde_json::Value {
    json(&[
        "send",
        "--dir",
        dir,
        "--kind",
        "anumati.consent",
        "--target",
        target,
        "--payload",
        r#"{"decision": "revoke", "scope": "email.read"}"#,
        "--deadline",
        "20",
        "--id",
        id,
        "--wait",
        "--json",
    ])
}

#[test]
fn node_reaches_one_peer_over_https_and_another_over_quic() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (a, b, c) = (
        tmp.path().join("alice"),
        tmp.path().join("bob"),
        tmp.path().join("carol"),
    );
    let (ha, hb) = (free_port(), free_port());
    let snip_a = init(&a, "alice", free_port());
    let snip_b = init(&b, "bob", free_port());
    let snip_c = init(&c, "carol", free_port());
    // alice and bob serve the binding; each reaches the other over it.
    pin(&a, &format!("[http]\nlisten = \"127.0.0.1:{ha}\"\n"));
    pin(&b, &format!("[http]\nlisten = \"127.0.0.1:{hb}\"\n"));
    pin(&a, &over_http(&snip_b, &format!("https://127.0.0.1:{hb}")));
    pin(&b, &over_http(&snip_a, &format!("https://127.0.0.1:{ha}")));
    // carol and alice over QUIC, as before.
    pin(&a, &snip_c);
    pin(&c, &snip_a);

    let _children = Children(vec![spawn(&a), spawn(&b), spawn(&c)]);
    wait_for("three control sockets", Duration::from_secs(20), || {
        [&a, &b, &c].iter().all(|d| d.join("control.sock").exists())
    });
    let da = a.to_str().expect("utf-8");
    let to_bob = send(da, "bob", "ob-http-1");
    assert_eq!(to_bob["outcome"]["state"], "applied", "{to_bob}");
    let to_carol = send(da, "carol", "ob-quic-1");
    assert_eq!(to_carol["outcome"]["state"], "applied", "{to_carol}");
    let st_b = json(&[
        "status",
        "ob-http-1",
        "--dir",
        b.to_str().expect("utf-8"),
        "--json",
    ]);
    assert_eq!(
        st_b["receiver"],
        serde_json::json!([["alice", "applied"]]),
        "bob's ledger is keyed on the mTLS-authenticated alice: {st_b}"
    );
}
