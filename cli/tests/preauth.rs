//! Nothing unauthenticated holds a node (C-PA-1) and bad control input is
//! refused, never rewritten (C-PA-4), against real `abhyasa` processes.
//!
//! The floods are anonymous TCP connections from 127.0.0.0/8 source
//! addresses other than 127.0.0.1 (the pinned peers' address), bounded in
//! count and time. The node under attack runs under `prlimit` with a low
//! descriptor limit, as an operator's process may.

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod process;
use process::relay::relay_status;
use process::{
    free_port, init, json, node_log_level, ok, pin, set_config, wait_for, Children, BIN,
};
use serde_json::{json, Value};

/// `abhyasa node run` (or `relay run`) under `prlimit --nofile=N:N`: the
/// process cannot raise its descriptor limit past `nofile`.
fn spawn_limited(args: &[&str], dir: &Path, nofile: u32) -> Child {
    Command::new("prlimit")
        .arg(format!("--nofile={nofile}:{nofile}"))
        .arg(BIN)
        .args(args)
        .args(["--dir", dir.to_str().expect("utf-8 path")])
        .env("RUST_LOG", node_log_level())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("prlimit runs the abhyasa binary")
}

/// One request on a fresh control connection, with a short read timeout:
/// `None` if the node did not answer (it could not accept, or is gone).
fn control(dir: &Path, req: &Value, timeout: Duration) -> Option<Value> {
    let mut s = UnixStream::connect(dir.join("control.sock")).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    let mut line = req.to_string();
    line.push('\n');
    s.write_all(line.as_bytes()).ok()?;
    read_line(&mut s)
}

fn read_line(s: &mut UnixStream) -> Option<Value> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match s.read(&mut byte) {
            Ok(1) if byte[0] == b'\n' => break,
            Ok(1) => buf.push(byte[0]),
            _ => return None,
        }
    }
    serde_json::from_slice(&buf).ok()
}

fn metric(dir: &Path, name: &str) -> Option<u64> {
    control(dir, &json!({"op": "metrics"}), Duration::from_secs(5))?["result"][name].as_u64()
}

/// Opens `n` idle TCP connections to `to`, each from a loopback source
/// address in `sources` (round robin). Connections the server closes at
/// once still count as opened.
fn flood(to: SocketAddr, n: usize, sources: &[Ipv4Addr]) -> Vec<TcpStream> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let src = sources[i % sources.len()];
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        s.bind(&SocketAddr::V4(SocketAddrV4::new(src, 0)).into())
            .expect("bind a loopback source");
        if s.connect_timeout(&to.into(), Duration::from_secs(2))
            .is_ok()
        {
            let t: TcpStream = s.into();
            t.set_nonblocking(true).expect("nonblocking");
            out.push(t);
        }
    }
    out
}

/// Whether the server has not closed `c` (a read would block).
fn is_open(mut c: &TcpStream) -> bool {
    let mut b = [0u8; 64];
    matches!(c.read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// How many of `conns` the server has not closed.
fn still_open(conns: &[TcpStream]) -> usize {
    conns.iter().filter(|c| is_open(c)).count()
}

fn send(dir: &Path, target: &str, id: &str) -> Value {
    json(&[
        "send",
        "--dir",
        dir.to_str().expect("utf-8"),
        "--kind",
        "anumati.consent",
        "--target",
        target,
        "--payload",
        r#"{"decision": "revoke", "scope": "email.read"}"#,
        "--deadline",
        "30",
        "--id",
        id,
        "--wait",
        "--json",
    ])
}

/// A `[[peers]]` snippet turned into an HTTP peer at `url`.
fn over_http(snippet: &str, url: &str) -> String {
    snippet
        .lines()
        .filter(|l| !l.starts_with("addr = "))
        .map(str::to_string)
        .chain(["transport = \"http\"".into(), format!("url = \"{url}\"")])
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

fn flood_sources(from: u8, n: u8) -> Vec<Ipv4Addr> {
    (0..n).map(|i| Ipv4Addr::new(127, 0, from, 2 + i)).collect()
}

/// alice reaches bob over HTTPS (mutual TLS); bob runs under a descriptor
/// limit of `nofile`, closes unauthenticated connections after
/// `handshake_ms` and has `limits` as its `[limits]` section.
fn https_pair(
    root: &Path,
    nofile: u32,
    handshake_ms: u64,
    limits: &str,
) -> (std::path::PathBuf, std::path::PathBuf, SocketAddr, Children) {
    let (a, b) = (root.join("alice"), root.join("bob"));
    let (ha, hb) = (free_port(), free_port());
    let snip_a = init(&a, "alice", free_port());
    let snip_b = init(&b, "bob", free_port());
    pin(&a, &format!("[http]\nlisten = \"127.0.0.1:{ha}\"\n"));
    pin(
        &b,
        &format!(
            "[http]\nlisten = \"127.0.0.1:{hb}\"\nhandshake_timeout_ms = {handshake_ms}\nheader_read_timeout_ms = {handshake_ms}\n\n[limits]\n{limits}\n"
        ),
    );
    pin(&a, &over_http(&snip_b, &format!("https://127.0.0.1:{hb}")));
    pin(&b, &over_http(&snip_a, &format!("https://127.0.0.1:{ha}")));
    for d in [&a, &b] {
        set_config(d, "backoff_base_ms", "200");
        set_config(d, "backoff_cap_ms", "1000");
    }
    let bob = spawn_limited(&["node", "run"], &b, nofile);
    let alice = process::spawn(&a);
    let children = Children(vec![bob, alice]);
    for d in [&a, &b] {
        wait_for("a control socket", Duration::from_secs(20), || {
            metric(d, "pending").is_some()
        });
    }
    (a, b, SocketAddr::from(([127, 0, 0, 1], hb)), children)
}

// C-PA-1 on the A2A HTTPS listener: 200 anonymous idle connections from one
// source hold at most its share of the pre-authentication slots (the rest
// are closed at once), the held ones are closed by the handshake timeout,
// the control socket answers throughout, and the pinned peer's obligation
// is applied meanwhile (nothing accepted is lost).
#[test]
fn c_pa_1_https_flood_is_bounded_and_the_pinned_peer_gets_in() {
    let root = tempfile::tempdir().expect("tempdir");
    let (a, b, http, _children) = https_pair(
        root.path(),
        256,
        1500,
        "max_handshakes = 64\nmax_handshakes_per_source = 8",
    );
    let started = Instant::now();
    let conns = flood(http, 200, &[Ipv4Addr::new(127, 0, 0, 2)]);
    std::thread::sleep(Duration::from_millis(300));
    let held = still_open(&conns);
    eprintln!(
        "C-PA-1 HTTPS: {} connections opened, {held} held after 300 ms",
        conns.len()
    );
    assert!(
        held <= 8,
        "one source held {held} unauthenticated connections"
    );
    assert!(
        control(&b, &json!({"op": "metrics"}), Duration::from_secs(5)).is_some(),
        "the control socket did not answer during the flood"
    );
    let sent = send(&a, "bob", "during-https-flood");
    assert_eq!(sent["outcome"]["state"], "applied", "{sent}");
    // The handshake timeout (1.5 s) closes the slow ones.
    wait_for(
        "the held connections to be closed",
        Duration::from_secs(8),
        || still_open(&conns) == 0,
    );
    eprintln!(
        "C-PA-1 HTTPS: all closed {:?} after the flood began",
        started.elapsed()
    );
    assert_eq!(metric(&b, "receiver_applied"), Some(1));
}

// C-PA-1, the descriptor case: with the per-source caps out of the way, a
// flood from 64 source addresses runs the node's listeners into their
// descriptor budget (a 160-descriptor limit minus the 64 kept back); the
// control socket still accepts and answers, and once the flood is gone the
// pinned peer gets in.
#[test]
fn c_pa_1_control_socket_answers_when_listeners_reach_the_descriptor_limit() {
    let root = tempfile::tempdir().expect("tempdir");
    let (a, b, http, _children) = https_pair(
        root.path(),
        160,
        // Longer than the test: only the descriptor reserve lets the
        // control socket accept, no timeout frees descriptors meanwhile.
        20_000,
        "max_handshakes = 100000\nmax_handshakes_per_source = 100000\ndescriptor_reserve = 64",
    );
    let conns = flood(http, 240, &flood_sources(1, 64));
    std::thread::sleep(Duration::from_millis(300));
    let held = still_open(&conns);
    eprintln!(
        "C-PA-1 descriptors: {} connections opened, {held} held (limit 160, reserve 64)",
        conns.len()
    );
    for _ in 0..5 {
        let v = control(&b, &json!({"op": "metrics"}), Duration::from_secs(2));
        assert!(
            v.is_some_and(|v| v["ok"] == true),
            "the control socket did not answer at the descriptor limit"
        );
    }
    // Beyond its budget (160 - 64) the listener closes what it accepts.
    assert!(held <= 96, "the listener held {held} connections");
    drop(conns);
    let sent = send(&a, "bob", "after-descriptor-flood");
    assert_eq!(sent["outcome"]["state"], "applied", "{sent}");
}

// C-PA-1 on the relay's WebSocket listener: 120 idle connections from one
// source, re-opened as they are closed, do not keep a pinned node out; the
// held ones are closed by the hello timeout, and the relay keeps serving.
#[test]
fn c_pa_1_ws_relay_flood_does_not_keep_a_pinned_node_out() {
    let root = tempfile::tempdir().expect("tempdir");
    let (r, a) = (root.path().join("relay"), root.path().join("alice"));
    let ws_port = free_port();
    let out = ok(&[
        "relay",
        "init",
        "--dir",
        r.to_str().expect("utf-8"),
        "--agent",
        "relay-1",
        "--transport",
        "ws",
        "--listen",
        &format!("127.0.0.1:{ws_port}"),
    ]);
    let relay_pin = out[out.find("[[peers]]").expect("a peers snippet")..].to_string();
    let alice_pin = init(&a, "alice", free_port());
    for (key, value) in [
        ("handshake_timeout_ms", "1500"),
        ("max_handshakes", "64"),
        ("max_handshakes_per_source", "8"),
    ] {
        set_config(&r, key, value);
    }
    pin(&r, &alice_pin);
    pin(&a, &relay_pin);
    set_config(&a, "backoff_base_ms", "200");
    set_config(&a, "backoff_cap_ms", "1000");
    let mut procs = Children(vec![spawn_limited(&["relay", "run"], &r, 256)]);
    wait_for(
        "the relay to write its status",
        Duration::from_secs(20),
        || relay_status(&r).is_some(),
    );
    let to = SocketAddr::from(([127, 0, 0, 1], ws_port));
    let src = [Ipv4Addr::new(127, 0, 0, 2)];
    let mut conns = flood(to, 120, &src);
    std::thread::sleep(Duration::from_millis(300));
    let held = still_open(&conns);
    eprintln!("C-PA-1 WS relay: {} opened, {held} held", conns.len());
    assert!(
        held <= 8,
        "one source held {held} unauthenticated connections"
    );
    // The pinned node starts during the flood and gets in, while the flood
    // keeps re-opening whatever the relay closes.
    procs.0.push(process::spawn(&a));
    let start = Instant::now();
    let mut connected = false;
    while start.elapsed() < Duration::from_secs(15) {
        conns.retain(is_open);
        let missing = 120 - conns.len();
        conns.extend(flood(to, missing, &src));
        if metric(&a, "peers_connected").is_some_and(|n| n >= 1) {
            connected = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "C-PA-1 WS relay: pinned node connected after {:?} of flood",
        start.elapsed()
    );
    assert!(connected, "the flood kept the pinned node out");
    wait_for(
        "the held connections to be closed",
        Duration::from_secs(8),
        || still_open(&conns) == 0,
    );
    assert!(relay_status(&r).is_some(), "the relay stopped serving");
}

// C-PA-4: a control request that is not UTF-8 is refused `bad_request`,
// never repaired into a key the caller did not name; the connection stays
// up and nothing was opened.
#[test]
fn c_pa_4_non_utf8_control_request_is_refused() {
    let root = tempfile::tempdir().expect("tempdir");
    let a = root.path().join("alice");
    let b = root.path().join("bob");
    let snip_b = init(&b, "bob", free_port());
    init(&a, "alice", free_port());
    pin(&a, &snip_b);
    let _children = Children(vec![process::spawn(&a)]);
    wait_for("a control socket", Duration::from_secs(20), || {
        metric(&a, "pending").is_some()
    });
    let mut s = UnixStream::connect(a.join("control.sock")).expect("control socket");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut req = br#"{"op": "decide", "key": "anumati.consent/bob/scope-"#.to_vec();
    req.extend_from_slice(&[0xff, 0xfe]);
    req.extend_from_slice(b"\", \"decision\": \"withheld\"}\n");
    s.write_all(&req).expect("write");
    let v = read_line(&mut s).expect("an answer");
    assert_eq!(v["ok"], false, "{v}");
    assert_eq!(v["error"]["code"], "bad_request", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("UTF-8")),
        "{v}"
    );
    // The same connection still serves, and nothing was opened.
    s.write_all(b"{\"op\": \"authorizations\"}\n")
        .expect("write");
    let v = read_line(&mut s).expect("an answer");
    assert_eq!(v["ok"], true, "{v}");
    assert!(
        !v.to_string().contains('\u{fffd}'),
        "a repaired key was stored: {v}"
    );
    assert_eq!(metric(&a, "pending"), Some(0));
}
