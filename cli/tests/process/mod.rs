//! Helpers for tests that run the `abhyasa` binary as real processes:
//! node directories, spawning and killing nodes, and a control-socket
//! client. Shared by `cli.rs` and `kill_nine.rs`.
#![allow(dead_code)] // each test binary uses a different subset

pub(crate) mod custody;
pub(crate) mod relay;
pub(crate) mod wsproxy;

use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_abhyasa");

/// Kills and reaps the node processes however the test ends.
pub(crate) struct Children(pub(crate) Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub(crate) fn abhyasa(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("the abhyasa binary runs")
}

pub(crate) fn ok(args: &[&str]) -> String {
    let out = abhyasa(args);
    assert!(
        out.status.success(),
        "abhyasa {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

pub(crate) fn json(args: &[&str]) -> Value {
    let out = ok(args);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {out}"))
}

/// A loopback port free for both UDP (QUIC) and TCP (HTTP, WebSocket),
/// below the kernel's ephemeral range (see `abhyasa_testkit`).
pub(crate) use abhyasa_testkit::loopback_port as free_port;

/// `init`, returning the `[[peers]]` snippet it printed.
pub(crate) fn init(dir: &Path, agent: &str, port: u16) -> String {
    let listen = format!("127.0.0.1:{port}");
    let out = ok(&[
        "init",
        "--dir",
        dir.to_str().expect("utf-8 path"),
        "--agent",
        agent,
        "--listen",
        &listen,
    ]);
    assert!(out.contains("fingerprint: "), "{out}");
    let at = out.find("[[peers]]").expect("init prints a peers snippet");
    out[at..].to_string()
}

/// Appends a peer's `[[peers]]` snippet to a node's config.
pub(crate) fn pin(dir: &Path, snippet: &str) {
    let path = dir.join("config.toml");
    let mut text = std::fs::read_to_string(&path).expect("config.toml");
    text.push('\n');
    text.push_str(snippet);
    std::fs::write(&path, text).expect("config.toml written");
}

/// Replaces the value of a top-level `key = …` line of a node's config
/// (`init` writes every key, so the line exists).
pub(crate) fn set_config(dir: &Path, key: &str, value: &str) {
    let path = dir.join("config.toml");
    let text = std::fs::read_to_string(&path).expect("config.toml");
    let prefix = format!("{key} = ");
    assert!(
        text.lines().any(|l| l.starts_with(&prefix)),
        "config.toml has no `{key}` line:\n{text}"
    );
    let out: Vec<String> = text
        .lines()
        .map(|l| {
            if l.starts_with(&prefix) {
                format!("{prefix}{value}")
            } else {
                l.to_string()
            }
        })
        .collect();
    std::fs::write(&path, out.join("\n") + "\n").expect("config.toml written");
}

/// Starts `abhyasa node run` on a node directory.
pub(crate) fn spawn(dir: &Path) -> Child {
    Command::new(BIN)
        .args(["node", "run", "--dir", dir.to_str().expect("utf-8 path")])
        .env("RUST_LOG", node_log_level())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("node run starts")
}

/// The log level the spawned processes run at: `warn`, or what
/// `ABHYASA_TEST_NODE_LOG` says (for instance `info` or
/// `abhyasa=debug` when a process test needs diagnosing).
pub(crate) fn node_log_level() -> String {
    std::env::var("ABHYASA_TEST_NODE_LOG").unwrap_or_else(|_| "warn".to_string())
}

/// Waits until the node in `dir` answers on its control socket.
pub(crate) fn serving(dir: &Path) {
    wait_for("a node to serve", Duration::from_secs(30), || {
        Control::connect(dir)
            .and_then(|mut c| c.call(&serde_json::json!({"op": "metrics"})))
            .is_ok()
    });
}

/// Serving and connected to at least one peer. A test offers only once
/// the link is up when what it counts depends on it: a best-effort
/// obligation is sent once or refused `not_sent`, and a node asks its
/// peers about whatever it holds when a link comes up (a status query, a
/// frame a relay spools too). The first dial may come before the peer
/// listens and wait out a backoff.
pub(crate) fn linked(dir: &Path) {
    serving(dir);
    wait_for("a node to reach a peer", Duration::from_secs(30), || {
        Control::connect(dir)
            .and_then(|mut c| c.call(&serde_json::json!({"op": "metrics"})))
            .is_ok_and(|v| v["result"]["peers_connected"].as_u64() >= Some(1))
    });
}

/// Polls `f` every 50 ms until it holds; panics after `timeout`.
pub(crate) fn wait_for(what: &str, timeout: Duration, f: impl FnMut() -> bool) {
    wait_for_or(what, timeout, f, String::new);
}

/// As [`wait_for`], and on a timeout the panic message carries what
/// `state` says about the processes at that moment.
pub(crate) fn wait_for_or(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> bool,
    state: impl FnOnce() -> String,
) {
    let start = Instant::now();
    while !f() {
        if start.elapsed() >= timeout {
            panic!("timed out waiting for {what}\n{}", state());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A connection to a node's control socket (newline-delimited JSON).
pub(crate) struct Control {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Control {
    /// Connects to `DIR/control.sock`.
    pub(crate) fn connect(dir: &Path) -> std::io::Result<Self> {
        let stream = UnixStream::connect(socket(dir))?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(Self {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        })
    }

    /// Sends one request and reads its response line. An I/O error means
    /// the node went away (or never answered): the request's effect is
    /// unknown.
    pub(crate) fn call(&mut self, request: &Value) -> std::io::Result<Value> {
        let mut line = request.to_string();
        line.push('\n');
        self.writer.write_all(line.as_bytes())?;
        let mut answer = String::new();
        if self.reader.read_line(&mut answer)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        serde_json::from_str(&answer)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }
}

/// The control socket of a node directory.
pub(crate) fn socket(dir: &Path) -> PathBuf {
    dir.join("control.sock")
}
