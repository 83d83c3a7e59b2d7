//! The README's main command: `abhyasa demo --json` runs two nodes on
//! loopback QUIC with redb and reports every obligation's outcome.
#![allow(clippy::unwrap_used)]

use std::process::Command;

#[test]
fn demo_reports_every_obligation_with_no_silent_loss() {
    let out = Command::new(env!("CARGO_BIN_EXE_abhyasa"))
        .args(["demo", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["silent_losses"], 0);
    assert_eq!(v["obligations"], 11);
    // The partition outlasts the 3 s deadlines: those two escalate with
    // their fail-safe; the 25 s ones are applied after the heal.
    assert_eq!(v["escalated"], 2, "{v}");
    assert_eq!(v["declined"], 1, "the legal-hold token revocation");
    assert_eq!(v["best_effort"], 3);
    assert_eq!(v["applied"], 5);
    for o in v["outcomes"].as_array().unwrap() {
        if o["outcome"] == "escalated" {
            assert!(o["fail_safe"]["guard"].is_object(), "{o}");
        }
    }
    assert_eq!(v["inbox"]["pending"], 0);
}
