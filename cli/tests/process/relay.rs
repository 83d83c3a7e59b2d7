//! The relay daemon as a real process: spawning `abhyasa relay run`,
//! turning a node's `[[peers]]` snippet into a relayed entry, and reading
//! `abhyasa relay status --json`. Shared by `relay_kill.rs` and
//! `relay_enrol.rs`.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use super::{abhyasa, BIN};

/// Starts `abhyasa relay run --dir DIR` (logs at warn to stderr).
pub(crate) fn relay_spawn(dir: &Path) -> Child {
    Command::new(BIN)
        .args(["relay", "run", "--dir", dir.to_str().expect("a UTF-8 path")])
        .env("RUST_LOG", super::node_log_level())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("relay run starts")
}

/// A `[[peers]]` snippet turned into a relayed entry: no address, `via`.
pub(crate) fn via_relay(snippet: &str) -> String {
    snippet
        .lines()
        .map(|l| {
            if l.starts_with("addr = ") {
                "via = \"relay-1\"".to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// `abhyasa relay status --dir DIR --json`, if it answers.
pub(crate) fn relay_status(dir: &Path) -> Option<Value> {
    let out = abhyasa(&[
        "relay",
        "status",
        "--dir",
        dir.to_str().expect("a UTF-8 path"),
        "--json",
    ]);
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}
