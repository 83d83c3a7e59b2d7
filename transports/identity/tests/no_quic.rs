//! The transports that need only identities and pins do not depend on
//! QUIC: `cargo tree` (offline, from the lock file) over the normal
//! dependencies of WebSocket, the relay and the A2A HTTP binding finds no
//! quinn crate and no `abhyasa-quic`.

use std::path::Path;
use std::process::Command;

/// Crates whose presence means a package depends on QUIC.
const QUIC_CRATES: &[&str] = &["abhyasa-quic", "quinn", "quinn-proto", "quinn-udp"];

/// The package names in the normal-dependency tree of `package` with
/// `features`, as `cargo tree` resolves them for that package alone.
fn normal_dependencies(package: &str, features: &[&str]) -> Vec<String> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("tree")
        .arg("--offline")
        .arg("--manifest-path")
        .arg(&workspace)
        .args(["-p", package, "-e", "normal", "--prefix", "none"])
        .args(["--format", "{p}"]);
    if !features.is_empty() {
        cmd.arg("--features").arg(features.join(","));
    }
    let out = cmd.output().expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo tree -p {package} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

fn quic_crates_in(package: &str, features: &[&str]) -> Vec<String> {
    let mut found: Vec<String> = normal_dependencies(package, features)
        .into_iter()
        .filter(|name| QUIC_CRATES.contains(&name.as_str()))
        .collect();
    found.sort();
    found.dedup();
    found
}

#[test]
fn websocket_relay_and_a2a_do_not_depend_on_quic() {
    // The probe sees QUIC where it is, so an empty answer below means
    // something.
    assert!(
        quic_crates_in("abhyasa-quic", &[]).contains(&"quinn".to_string()),
        "cargo tree does not show quinn under abhyasa-quic"
    );
    for (package, features) in [
        ("abhyasa-identity", &[][..]),
        ("abhyasa-ws", &[][..]),
        ("abhyasa-spool", &[][..]),
        ("abhyasa-a2a", &["http"][..]),
    ] {
        let found = quic_crates_in(package, features);
        assert!(
            found.is_empty(),
            "{package} (features {features:?}) depends on QUIC through {found:?}"
        );
    }
}
