//! The attacks on authority and on unauthenticated resources, rerun with
//! real `abhyasa` processes on loopback.
//!
//! * A hostile hop between alice and her relay holds alice's grant and
//!   delivers it (twice) after her revoke: the edge declines it
//!   `superseded` and ends withheld, and alice's custody reports the
//!   revoke applied, which it is (C-OR-1, C-OR-2).
//! * A greedy relay tenant is refused `origin_quota` once it holds its
//!   bytes; another tenant still gets in, and nothing accepted is lost
//!   (C-PA-2).
//! * Plaintext transports off loopback are refused at start with a clear
//!   error unless the config allows them explicitly (C-PA-3).
//! * Half-open and anonymous QUIC handshakes cannot keep a pinned peer
//!   out of a node's QUIC listener, and its control socket answers
//!   throughout (C-PA-1).
//! * The `[mcp]` section narrows what the stdio client of `abhyasa mcp`
//!   may govern at its guard (C-AZ-1).
#![allow(clippy::unwrap_used)]

mod process;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use abhyasa_core::custody::EffectValue;
use abhyasa_core::principal::Authorization;
use abhyasa_store::{StoreKind, StoreOptions};
use process::relay::{relay_spawn, relay_status, via_relay};
use process::wsproxy::HoldingProxy;
use process::{abhyasa, free_port, init, json, linked, ok, pin, set_config, spawn, wait_for};
use process::{Children, Control};
use serde_json::{json, Value};

fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("a free TCP port")
        .port()
}

fn d(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// `abhyasa send` of an Anumati decision on `scope` to the edge;
/// `sequence` as the caller's own, or none (the node assigns one).
fn send(
    dir: &Path,
    id: &str,
    decision: &str,
    scope: &str,
    sequence: Option<&str>,
    wait: bool,
) -> Value {
    let payload = json!({"decision": decision, "scope": scope}).to_string();
    let mut args = vec![
        "send",
        "--dir",
        d(dir),
        "--kind",
        "anumati.consent",
        "--target",
        "edge",
        "--payload",
        &payload,
        "--deadline",
        "30",
        "--id",
        id,
        "--json",
    ];
    if let Some(s) = sequence {
        args.extend(["--sequence", s]);
    }
    if wait {
        args.push("--wait");
    }
    json(&args)
}

/// `abhyasa status ID --json` on `dir`, if the node knows the id.
fn status(dir: &Path, id: &str) -> Option<Value> {
    let out = abhyasa(&["status", id, "--dir", d(dir), "--json"]);
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).expect("status prints JSON"))
}

fn metric(dir: &Path, name: &str) -> Option<u64> {
    Control::connect(dir)
        .ok()?
        .call(&json!({"op": "metrics"}))
        .ok()?["result"][name]
        .as_u64()
}

/// The receiver-owned authorization the edge holds on `scope`, read from
/// its store after it stopped.
fn edge_authorization(edge: &Path, scope: &str) -> Vec<(String, Authorization)> {
    let kind = StoreKind::default();
    let store = kind
        .open(edge.join(format!("store.{kind}")), &StoreOptions::default())
        .expect("the edge's store opens");
    let state = store.load().expect("the edge's state loads");
    let suffix = format!("anumati.consent/edge/scope:{scope}");
    state
        .receiver
        .effects
        .iter()
        .filter(|(k, _)| k.ends_with(&suffix))
        .map(|(k, v)| match v {
            EffectValue::Authorization(a) => (k.clone(), *a),
            other => panic!("{k}: not an authorization: {other:?}"),
        })
        .collect()
}

/// A WebSocket relay, alice reaching it through a [`HoldingProxy`], and an
/// edge reaching it directly; alice and the edge pin each other through
/// the relay. Returns (alice, edge, proxy, processes); both nodes are
/// linked and one revoke has gone through end to end.
fn relayed_through_a_hostile_hop(
    root: &Path,
) -> (
    std::path::PathBuf,
    std::path::PathBuf,
    HoldingProxy,
    Children,
) {
    let (r, a, e) = (root.join("relay"), root.join("alice"), root.join("edge"));
    let ws_port = free_tcp_port();
    let out = ok(&[
        "relay",
        "init",
        "--dir",
        d(&r),
        "--agent",
        "relay-1",
        "--transport",
        "ws",
        "--listen",
        &format!("127.0.0.1:{ws_port}"),
    ]);
    let relay_pin = out[out.find("[[peers]]").expect("a peers snippet")..].to_string();
    let proxy = HoldingProxy::start(SocketAddr::from(([127, 0, 0, 1], ws_port)));
    let alice_pin = init(&a, "alice", free_port());
    let edge_pin = init(&e, "edge", free_port());
    pin(&r, &alice_pin);
    pin(&r, &edge_pin);
    pin(
        &a,
        &relay_pin.replace(
            &format!("ws://127.0.0.1:{ws_port}/"),
            &format!("ws://{}/", proxy.addr),
        ),
    );
    pin(&a, &via_relay(&edge_pin));
    pin(&e, &relay_pin);
    pin(&e, &via_relay(&alice_pin));
    for dir in [&a, &e] {
        set_config(dir, "backoff_base_ms", "200");
        set_config(dir, "backoff_cap_ms", "1000");
    }
    let children = Children(vec![relay_spawn(&r), spawn(&e), spawn(&a)]);
    wait_for("the relay's status", Duration::from_secs(20), || {
        relay_status(&r).is_some()
    });
    linked(&e);
    linked(&a);
    let warm = send(&a, "warm-up", "revoke", "other", None, true);
    assert_eq!(warm["outcome"]["state"], "applied", "{warm}");
    (a, e, proxy, children)
}

/// The reorder attack: the hop holds alice's grant on `s`, passes her
/// revoke (applied, acked), then delivers the grant twice. The edge must
/// decline it `superseded` and end withheld on `s`; alice's custody says
/// the revoke was applied, and nothing else.
fn reorder_attack(grant_sequence: Option<&str>) {
    let root = tempfile::tempdir().unwrap();
    let (a, e, proxy, mut children) = relayed_through_a_hostile_hop(root.path());

    proxy.hold();
    let grant = send(&a, "grant-s", "grant", "s", grant_sequence, false);
    assert_eq!(grant["mode"], "best_effort", "{grant}");
    wait_for("the hop to hold the grant", Duration::from_secs(10), || {
        proxy.held() >= 1
    });
    proxy.pass();
    // Held, not lost to a retry: the edge has not seen the grant.
    assert!(
        status(&e, "grant-s").is_none(),
        "the grant got past the hop"
    );
    let revoke = send(&a, "revoke-s", "revoke", "s", None, true);
    assert_eq!(revoke["outcome"]["state"], "applied", "{revoke}");
    let before = proxy.forwarded();
    let written = proxy.release(2);
    assert!(written >= 2, "the hop delivered {written} held frames");
    eprintln!(
        "C-OR-2 processes: {written} held frames delivered after the revoke ({before} passed)"
    );

    let mut late = Value::Null;
    wait_for(
        "the edge to record the late grant",
        Duration::from_secs(15),
        || {
            status(&e, "grant-s").is_some_and(|v| {
                late = v;
                true
            })
        },
    );
    eprintln!("C-OR-2 processes: the late grant at the edge: {late}");
    assert_eq!(late["declines"][0][1], "superseded", "{late}");
    // Declined on order (the revoke carries the next sequence on the
    // key), not only by the rule for obligations without one.
    let want = format!(
        "sequence {} on @alice/anumati.consent/edge/scope:s superseded by {} (revoke-s)",
        grant_sequence.unwrap_or("1"),
        grant_sequence.map_or(2, |s| s.parse::<u64>().unwrap() + 1)
    );
    assert_eq!(late["declines"][0][2], want.as_str(), "{late}");
    assert!(
        late["receiver"]
            .as_array()
            .is_none_or(|r| r.iter().all(|x| x[1] != "applied")),
        "{late}"
    );
    assert_eq!(metric(&e, "receiver_applied"), Some(2));
    let revoke_at_alice = status(&a, "revoke-s").expect("alice knows her revoke");
    assert_eq!(revoke_at_alice["custodian"], "applied", "{revoke_at_alice}");

    for c in &mut children.0 {
        c.kill().unwrap();
        c.wait().unwrap();
    }
    let held = edge_authorization(&e, "s");
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[0].1, Authorization::Withheld, "{held:?}");
    assert!(held[0].0.starts_with("@alice/"), "{held:?}");
}

// C-OR-1, C-OR-2 (processes): neither side names a sequence; alice's node
// assigns the grant 1 and the revoke 2 on the key, so the held grant is
// older than the revoke it arrives after.
#[test]
fn c_or_2_held_grant_after_revoke_is_superseded_with_default_sequences() {
    reorder_attack(None);
}

// C-OR-1, C-OR-2 (processes): the leases recipe, a sequenced grant and a
// revoke sent without a sequence; the node gives the revoke the next one
// above the grant's.
#[test]
fn c_or_2_held_sequenced_grant_after_revoke_without_sequence_is_superseded() {
    reorder_attack(Some("5"));
}

fn start_at(args: &[&str], dir: &Path) -> std::process::Child {
    std::process::Command::new(process::BIN)
        .args(args)
        .args(["--dir", d(dir)])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("abhyasa runs")
}

/// Runs `abhyasa ARGS --dir DIR`, which must exit non-zero within 10 s
/// (refusing to start); returns what it printed on stderr.
fn refused_at_start(args: &[&str], dir: &Path) -> String {
    let mut child = start_at(args, dir);
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if let Some(st) = child.try_wait().expect("wait") {
            let mut err = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
            assert!(!st.success(), "exited 0 instead of refusing: {err}");
            return err;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    panic!("abhyasa {args:?} did not refuse to start");
}

/// Runs `abhyasa ARGS --dir DIR`, which must serve (its control socket
/// or relay status answers) and still run half a second later.
fn serves(args: &[&str], dir: &Path) {
    let mut child = Children(vec![start_at(args, dir)]);
    wait_for("it to serve", Duration::from_secs(10), || {
        metric(dir, "pending").is_some() || relay_status(dir).is_some()
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        child.0[0].try_wait().unwrap().is_none(),
        "abhyasa {args:?} stopped"
    );
}

fn append(dir: &Path, text: &str) {
    let path = dir.join("config.toml");
    let mut config = std::fs::read_to_string(&path).unwrap();
    config.push_str(text);
    std::fs::write(&path, config).unwrap();
}

// C-PA-3 (processes): a node whose peer is a ws:// URL off loopback does
// not start, and says why; `[limits] allow_plaintext_ws = true` lets it.
#[test]
fn c_pa_3_node_refuses_plaintext_ws_off_loopback_unless_allowed() {
    let root = tempfile::tempdir().unwrap();
    let (a, b) = (root.path().join("alice"), root.path().join("bob"));
    init(&a, "alice", free_port());
    let snip_b = init(&b, "bob", free_port());
    let over_ws: String = snip_b
        .lines()
        .filter(|l| !l.starts_with("addr = "))
        .map(|l| format!("{l}\n"))
        .chain(["transport = \"ws\"\nurl = \"ws://192.0.2.7:9/\"\n".into()])
        .collect();
    pin(&a, &over_ws);
    let err = refused_at_start(&["node", "run"], &a);
    assert!(
        err.contains("refusing plaintext ws:// on ws://192.0.2.7:9/"),
        "{err}"
    );
    append(&a, "\n[limits]\nallow_plaintext_ws = true\n");
    // Allowed explicitly, the node serves.
    serves(&["node", "run"], &a);
}

// C-PA-3 (processes): plain HTTP to a peer off loopback is refused at
// start even with plain HTTP on, and so is serving it off loopback.
#[test]
fn c_pa_3_node_refuses_plain_http_off_loopback() {
    let root = tempfile::tempdir().unwrap();
    let (a, b) = (root.path().join("alice"), root.path().join("bob"));
    init(&a, "alice", free_port());
    let snip_b = init(&b, "bob", free_port());
    let over_http: String = snip_b
        .lines()
        .filter(|l| !l.starts_with("addr = "))
        .map(|l| format!("{l}\n"))
        .chain(["transport = \"http\"\nurl = \"http://192.0.2.7:9\"\ntoken = \"t\"\n".into()])
        .collect();
    let config = std::fs::read_to_string(a.join("config.toml")).unwrap();
    let http = format!(
        "\n[http]\nlisten = \"127.0.0.1:{}\"\nplain_http_loopback = true\n\n",
        free_tcp_port()
    );
    std::fs::write(a.join("config.toml"), config.clone() + &http + &over_http).unwrap();
    let err = refused_at_start(&["node", "run"], &a);
    assert!(
        err.contains("plain http is allowed only to a loopback host"),
        "{err}"
    );
    let http = "\n[http]\nlisten = \"0.0.0.0:1\"\nplain_http_loopback = true\n";
    std::fs::write(a.join("config.toml"), config + http).unwrap();
    let err = refused_at_start(&["node", "run"], &a);
    assert!(
        err.contains("plain HTTP is served only on loopback, not 0.0.0.0:1"),
        "{err}"
    );
}

// C-PA-3 (processes): a relay does not listen on ws:// off loopback,
// neither from `relay init` nor from an edited config, unless allowed.
#[test]
fn c_pa_3_relay_refuses_plaintext_ws_listener_off_loopback_unless_allowed() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path().join("relay");
    let port = free_tcp_port();
    let out = abhyasa(&[
        "relay",
        "init",
        "--dir",
        d(&r),
        "--agent",
        "relay-1",
        "--transport",
        "ws",
        "--listen",
        &format!("0.0.0.0:{port}"),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("plaintext off loopback"), "{err}");
    ok(&[
        "relay",
        "init",
        "--dir",
        d(&r),
        "--agent",
        "relay-1",
        "--transport",
        "ws",
        "--listen",
        &format!("127.0.0.1:{port}"),
    ]);
    set_config(&r, "ws_listen", &format!("\"0.0.0.0:{port}\""));
    let err = refused_at_start(&["relay", "run"], &r);
    assert!(err.contains("plaintext"), "{err}");
    let config = std::fs::read_to_string(r.join("config.toml")).unwrap();
    let allowed = if config.contains("allow_plaintext_ws = ") {
        config.replace("allow_plaintext_ws = false", "allow_plaintext_ws = true")
    } else {
        format!("allow_plaintext_ws = true\n{config}")
    };
    std::fs::write(r.join("config.toml"), allowed).unwrap();
    // Allowed explicitly, the relay serves.
    serves(&["relay", "run"], &r);
}

fn relay_init_quic(dir: &Path, port: u16) -> String {
    let out = ok(&[
        "relay",
        "init",
        "--dir",
        d(dir),
        "--agent",
        "relay-1",
        "--listen",
        &format!("127.0.0.1:{port}"),
    ]);
    out[out.find("[[peers]]").expect("a peers snippet")..].to_string()
}

/// Offers a custody revoke to the edge through the control socket;
/// `padding` bytes of note make its frame large.
fn offer_to_edge(dir: &Path, id: &str, padding: usize) {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let created_at =
        abhyasa_core::Timestamp::from_unix_seconds(i64::try_from(secs).unwrap()).to_rfc3339();
    let ob = json!({
        "obligation_id": id,
        "kind": "anumati.consent",
        "target": "edge",
        "payload": {"decision": "revoke", "scope": id, "note": "x".repeat(padding)},
        "deadline_seconds": 120,
        "max_retries": 1000,
        "created_at": created_at,
    });
    let v = Control::connect(dir)
        .unwrap()
        .call(&json!({"op": "offer", "obligation": ob}))
        .unwrap();
    assert_eq!(v["ok"], true, "{v}");
}

fn edge_entry(relay: &Path) -> Value {
    relay_status(relay)
        .and_then(|v| {
            v["destinations"]
                .as_array()?
                .iter()
                .find(|d| d["destination"] == "edge")
                .cloned()
        })
        .unwrap_or(Value::Null)
}

const GREEDY: usize = 20;
const MODEST: usize = 5;
const PADDING: usize = 60_000;

// C-PA-2 (processes): a greedy tenant offering 20 frames of ~60 KB (the
// largest payload an obligation may carry is 64 KiB) to an edge that is
// away, against a relay holding at most 1 MB in all and 400 kB per
// origin, is refused `origin_quota` once it holds its bytes; another
// tenant's frames (~30 KB each, which a spool the greedy one had filled
// would refuse `spool_full`) still get in. When the edge comes, every obligation
// either tenant accepted is applied there once: nothing accepted is lost.
#[test]
fn c_pa_2_greedy_tenant_cannot_fill_the_relay_spool() {
    let root = tempfile::tempdir().unwrap();
    let (r, a, c, e) = (
        root.path().join("relay"),
        root.path().join("alice"),
        root.path().join("carol"),
        root.path().join("edge"),
    );
    let relay_pin = relay_init_quic(&r, free_port());
    set_config(&r, "per_origin_bytes", "400000");
    set_config(&r, "total_bytes", "1000000");
    let alice_pin = init(&a, "alice", free_port());
    let carol_pin = init(&c, "carol", free_port());
    let edge_pin = init(&e, "edge", free_port());
    for p in [&alice_pin, &carol_pin, &edge_pin] {
        pin(&r, p);
    }
    for dir in [&a, &c] {
        pin(dir, &relay_pin);
        pin(dir, &via_relay(&edge_pin));
        set_config(dir, "backoff_base_ms", "200");
        set_config(dir, "backoff_cap_ms", "1000");
    }
    pin(&e, &relay_pin);
    pin(&e, &via_relay(&alice_pin));
    pin(&e, &via_relay(&carol_pin));
    let mut procs = Children(vec![relay_spawn(&r), spawn(&a), spawn(&c)]);
    linked(&a);
    linked(&c);

    for i in 0..GREEDY {
        offer_to_edge(&a, &format!("greedy-{i:02}"), PADDING);
    }
    wait_for(
        "the relay to refuse the greedy tenant",
        Duration::from_secs(20),
        || metric(&a, "relay_refused").is_some_and(|n| n >= 1),
    );
    let greedy_held = edge_entry(&r)["depth"].as_u64().unwrap_or(0);
    for i in 0..MODEST {
        offer_to_edge(&c, &format!("modest-{i:02}"), PADDING / 2);
    }
    wait_for(
        "the other tenant's frames to be spooled",
        Duration::from_secs(20),
        || edge_entry(&r)["depth"].as_u64() >= Some(greedy_held + MODEST as u64),
    );
    let entry = edge_entry(&r);
    eprintln!(
        "C-PA-2: greedy tenant holds {greedy_held} frames of {GREEDY}; relay says {entry}; \
         greedy refused {:?} times, other tenant {:?}",
        metric(&a, "relay_refused"),
        metric(&c, "relay_refused")
    );
    assert!(
        greedy_held < GREEDY as u64 && greedy_held * (PADDING as u64) <= 400_000,
        "{entry}"
    );
    assert_eq!(metric(&c, "relay_refused"), Some(0));
    assert!(
        entry["refused"]["origin_quota"].as_u64() >= Some(1),
        "{entry}"
    );
    assert_eq!(
        entry["refused"]["spool_full"].as_u64().unwrap_or(0),
        0,
        "{entry}"
    );

    // The edge comes: everything either tenant accepted is applied once.
    procs.0.push(spawn(&e));
    wait_for(
        "every obligation applied at the edge",
        Duration::from_secs(30),
        || metric(&e, "receiver_applied") == Some((GREEDY + MODEST) as u64),
    );
    for (dir, prefix, n) in [(&a, "greedy", GREEDY), (&c, "modest", MODEST)] {
        for i in 0..n {
            let id = format!("{prefix}-{i:02}");
            wait_for("custody to close", Duration::from_secs(10), || {
                status(dir, &id).is_some_and(|v| v["custodian"] == "applied")
            });
        }
    }
}

/// `abhyasa mcp` on stdio, spoken to line by line (JSON-RPC).
struct McpStdio {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl McpStdio {
    fn spawn(args: &[&str]) -> Self {
        let mut child = std::process::Command::new(process::BIN)
            .arg("mcp")
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("abhyasa mcp runs");
        let stdin = child.stdin.take().unwrap();
        let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut s = Self {
            child,
            stdin,
            stdout,
        };
        let init = s.request(
            0,
            "initialize",
            json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "attacks", "version": "0"},
            }),
        );
        assert!(init["result"]["serverInfo"].is_object(), "{init}");
        s.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        s
    }

    fn send(&mut self, v: &Value) {
        use std::io::Write as _;
        let mut line = v.to_string();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).unwrap();
        self.stdin.flush().unwrap();
    }

    fn request(&mut self, id: u64, method: &str, params: Value) -> Value {
        use std::io::BufRead as _;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let mut line = String::new();
            assert!(
                self.stdout.read_line(&mut line).unwrap() > 0,
                "abhyasa mcp closed stdout"
            );
            let v: Value = serde_json::from_str(&line).expect("a JSON-RPC line");
            if v["id"] == id {
                return v;
            }
        }
    }
}

impl Drop for McpStdio {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const ENVELOPE_KEY: &str = "io.github.ravikiran438/abhyasa";

/// Calls the ungoverned `check_admissibility` with `ob` in the custody
/// envelope of `_meta`; returns the guard's ack.
fn envelope_ack(mcp: &mut McpStdio, id: u64, ob: &Value) -> Value {
    let r = mcp.request(
        id,
        "tools/call",
        json!({
            "name": "check_admissibility",
            "arguments": {"obligation": ob},
            "_meta": {ENVELOPE_KEY: {"obligation": ob}},
        }),
    );
    r["result"]["_meta"][ENVELOPE_KEY]["ack"].clone()
}

fn to_guard(id: &str, kind: &str, payload: Value) -> Value {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    json!({
        "obligation_id": id,
        "kind": kind,
        "target": "mcp-server",
        "payload": payload,
        "deadline_seconds": 600,
        "max_retries": 20,
        "created_at": abhyasa_core::Timestamp::from_unix_seconds(i64::try_from(secs).unwrap())
            .to_rfc3339(),
    })
}

// C-AZ-1 (processes): the `[mcp]` section of the node directory narrows
// what the stdio client of `abhyasa mcp --agent …` may govern at the
// guard; an envelope outside it is acked declined `unauthorized` and not
// applied, one inside it is applied.
#[test]
fn c_az_1_mcp_guard_declines_what_the_mcp_section_does_not_allow() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("server");
    init(&dir, "mcp-server", free_port());
    append(
        &dir,
        "\n[mcp]\nkinds = [\"anumati.consent\"]\nkeys = [\"anumati.consent/mcp-server/scope:email.\"]\n",
    );
    let store = root.path().join("guard.redb");
    let mut mcp = McpStdio::spawn(&[
        "--dir",
        d(&dir),
        "--agent",
        "mcp-server",
        "--custodian",
        "alice",
        "--guard-store",
        d(&store),
        "--require",
        r#"run_custody_transfer=anumati.consent:{"scope":"sim.run"}"#,
    ]);
    let revoke = |id: &str, scope: &str| {
        to_guard(
            id,
            "anumati.consent",
            json!({"decision": "revoke", "scope": scope}),
        )
    };
    let outside_keys = envelope_ack(&mut mcp, 1, &revoke("r-sim", "sim.run"));
    assert_eq!(outside_keys["status"], "declined", "{outside_keys}");
    assert_eq!(outside_keys["reason"], "unauthorized", "{outside_keys}");
    let outside_kinds = envelope_ack(
        &mut mcp,
        2,
        &to_guard(
            "t-1",
            "oauth.token",
            json!({"action": "revoke", "token_id": "t1"}),
        ),
    );
    assert_eq!(outside_kinds["status"], "declined", "{outside_kinds}");
    assert_eq!(outside_kinds["reason"], "unauthorized", "{outside_kinds}");
    let inside = envelope_ack(&mut mcp, 3, &revoke("r-mail", "email.read"));
    assert_eq!(inside["status"], "applied", "{inside}");
    // The declined revoke did not withdraw the tool: it still runs.
    let sim = mcp.request(
        4,
        "tools/call",
        json!({
            "name": "run_custody_transfer",
            "arguments": {"obligation": to_guard("x", "anumati.consent", json!({"decision": "revoke", "scope": "s"}))},
        }),
    );
    assert_ne!(sim["result"]["isError"], true, "{sim}");
}

/// `abhyasa node run` under `prlimit --nofile=N:N`.
fn spawn_limited(dir: &Path, nofile: u32) -> std::process::Child {
    std::process::Command::new("prlimit")
        .arg(format!("--nofile={nofile}:{nofile}"))
        .arg(process::BIN)
        .args(["node", "run", "--dir", d(dir)])
        .env("RUST_LOG", process::node_log_level())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("prlimit runs the abhyasa binary")
}

/// A QUIC client config with a fresh identity no node pins, expecting
/// the node's certificate `fingerprint` (as a pinned peer would).
fn anonymous_quic_client(node: &str, fingerprint: &str) -> quinn::ClientConfig {
    let me = abhyasa_identity::generate_identity(&abhyasa_core::AgentId::new("stranger").unwrap())
        .unwrap();
    let tls = abhyasa_identity::dangerous_pinned_client_tls(
        &me,
        &abhyasa_core::AgentId::new(node).unwrap(),
        fingerprint.parse().unwrap(),
        vec![b"abhyasa/1".to_vec()],
    )
    .unwrap();
    quinn::ClientConfig::new(std::sync::Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap(),
    ))
}

fn fingerprint_of(snippet: &str) -> String {
    snippet
        .lines()
        .find_map(|l| l.strip_prefix("fingerprint = \""))
        .and_then(|f| f.strip_suffix('"'))
        .expect("a fingerprint line")
        .to_string()
}

/// Half-open QUIC handshakes: from each source address, through a black
/// hole that forwards the client's datagrams to `to` and drops every
/// answer, a new handshake every 25 ms until `stop`. Returns how many
/// were started.
async fn half_open_flood(
    to: SocketAddr,
    sources: Vec<std::net::Ipv4Addr>,
    cfg: quinn::ClientConfig,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> usize {
    use std::sync::atomic::Ordering;
    let mut tasks = Vec::new();
    for src in sources {
        let hole_in = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let hole_out = std::sync::Arc::new(
            tokio::net::UdpSocket::bind(SocketAddr::from((src, 0)))
                .await
                .unwrap(),
        );
        let hole_addr = hole_in.local_addr().unwrap();
        let out = hole_out.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 65_536];
            while let Ok((n, _)) = hole_in.recv_from(&mut buf).await {
                let _ = out.send_to(&buf[..n], to).await;
            }
        });
        tokio::spawn(async move {
            let mut buf = vec![0u8; 65_536];
            while hole_out.recv_from(&mut buf).await.is_ok() {}
        });
        let (cfg, stop) = (cfg.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let ep = quinn::Endpoint::client(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
            let mut started = 0;
            while !stop.load(Ordering::Relaxed) {
                if let Ok(c) =
                    ep.connect_with(cfg.clone(), hole_addr, abhyasa_identity::PINNED_SERVER_NAME)
                {
                    started += 1;
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(Duration::from_secs(15), c).await;
                    });
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            started
        }));
    }
    let mut started = 0;
    for t in tasks {
        started += t.await.unwrap();
    }
    started
}

// C-PA-1 on the QUIC listener: a node (max_handshakes = 8, under a
// 256-descriptor limit) is flooded with half-open handshakes from four
// source addresses whose answers go nowhere, kept up for the whole test,
// and with anonymous handshakes (a certificate nobody pins) from a fifth.
// The anonymous ones are refused; the half-open ones cannot hold the
// slots (unvalidated sources are sent a Retry once a quarter of the slots
// are in use); the control socket answers throughout; alice, started
// during the flood, connects and gets her obligation applied.
#[test]
fn c_pa_1_quic_flood_is_bounded_and_the_pinned_peer_gets_in() {
    let root = tempfile::tempdir().unwrap();
    let (a, b) = (root.path().join("alice"), root.path().join("bob"));
    let b_port = free_port();
    let snip_a = init(&a, "alice", free_port());
    let snip_b = init(&b, "bob", b_port);
    pin(&a, &snip_b);
    // Accept-only: bob never dials alice, so alice's link is one of the
    // handshakes bob's listener admits.
    let accept_only: String = snip_a
        .lines()
        .filter(|l| !l.starts_with("addr = "))
        .map(|l| format!("{l}\n"))
        .collect();
    pin(&b, &accept_only);
    append(
        &b,
        "\n[limits]\nmax_handshakes = 8\nmax_handshakes_per_source = 4\n",
    );
    set_config(&a, "backoff_base_ms", "200");
    set_config(&a, "backoff_cap_ms", "1000");
    let mut procs = Children(vec![spawn_limited(&b, 256)]);
    wait_for("bob's control socket", Duration::from_secs(20), || {
        metric(&b, "pending").is_some()
    });

    let to = SocketAddr::from(([127, 0, 0, 1], b_port));
    let cfg = anonymous_quic_client("bob", &fingerprint_of(&snip_b));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let sources = (0..4)
        .map(|i| std::net::Ipv4Addr::new(127, 0, 3, 2 + i))
        .collect();
    let flood = rt.spawn(half_open_flood(to, sources, cfg.clone(), stop.clone()));
    std::thread::sleep(Duration::from_millis(500));

    // Anonymous full handshakes are refused.
    let refused = rt.block_on(async {
        let ep = quinn::Endpoint::client(SocketAddr::from(([127, 0, 4, 2], 0))).unwrap();
        let mut refused = 0;
        for _ in 0..10 {
            let c = ep
                .connect_with(cfg.clone(), to, abhyasa_identity::PINNED_SERVER_NAME)
                .unwrap();
            let conn = tokio::time::timeout(Duration::from_secs(5), async {
                let conn = c.await?;
                // A server that took the certificate would keep the
                // connection; one that refused it closes it.
                Ok::<_, quinn::ConnectionError>(conn.closed().await)
            })
            .await;
            if matches!(conn, Ok(Err(_)) | Ok(Ok(_))) {
                refused += 1;
            }
        }
        refused
    });
    assert_eq!(refused, 10, "anonymous QUIC handshakes were kept");
    assert!(
        control_answers(&b),
        "the control socket did not answer during the flood"
    );

    procs.0.push(process::spawn(&a));
    wait_for("alice's control socket", Duration::from_secs(20), || {
        metric(&a, "pending").is_some()
    });
    let sent = json(&[
        "send",
        "--dir",
        d(&a),
        "--kind",
        "anumati.consent",
        "--target",
        "bob",
        "--payload",
        r#"{"decision": "revoke", "scope": "email.read"}"#,
        "--deadline",
        "15",
        "--id",
        "during-quic-flood",
        "--wait",
        "--json",
    ]);
    assert!(control_answers(&b), "the control socket stopped answering");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let started = rt.block_on(flood).unwrap();
    eprintln!("C-PA-1 QUIC: {started} half-open handshakes started, 10 anonymous refused; {sent}");
    assert_eq!(sent["outcome"]["state"], "applied", "{sent}");
    assert_eq!(metric(&b, "receiver_applied"), Some(1));
}

fn control_answers(dir: &Path) -> bool {
    let Ok(mut s) = std::os::unix::net::UnixStream::connect(dir.join("control.sock")) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = std::io::Write::write_all(&mut s, b"{\"op\": \"metrics\"}\n");
    let mut line = String::new();
    let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(s), &mut line);
    serde_json::from_str::<Value>(&line).is_ok_and(|v| v["ok"] == true)
}
