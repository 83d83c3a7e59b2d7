//! The store-and-forward relay as a turmoil host: the real relay daemon
//! (its redb spool, simulated time) between real nodes over QUIC on
//! turmoil UDP, with contact-window schedules of the relay <-> edge links.
//! Both C-TR-6 runs fail when the edge never pulls on connect, when it
//! never answers `Delivered` (the spool does not end empty), or when the
//! relayed link stamps ack holds on the wall clock instead of simulated
//! time (the relay refuses the acks as expired).
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::Duration;

use abhyasa_netsim::fullstack::{run_scenario, RunReport, Scenario};

fn scenario(name: &str) -> Scenario {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(format!("{name}.toml"));
    Scenario::from_file(&p).unwrap()
}

fn run(s: &Scenario, seed: u64) -> RunReport {
    let r = run_scenario(s, seed).unwrap();
    assert!(r.passed(), "{r}\n{:#?}", r.violations);
    let o = &r.outcomes;
    assert_eq!(o.pending_at_end, 0, "{r}");
    assert_eq!(o.applied + o.declined + o.escalated, r.custody, "{r}");
    r
}

// C-TR-6 (seeds 1-3): an edge up 2 s every 20 s gets every obligation that outlasts
// the next window exactly once inside it (the checker reads the receiver's
// applications against the window schedule); the rest escalate with their
// fail-safe (AB-4); the relay's spool ends empty.
#[test]
fn c_tr_6_contact_windows_deliver_inside_the_next_window_or_escalate() {
    let s = scenario("contact-windows");
    for seed in 1..=3 {
        let r = run(&s, seed);
        let o = &r.outcomes;
        assert!(o.applied >= 15, "delivered in the window: {r}");
        assert!(o.escalated >= 15, "expired before the window: {r}");
        assert_eq!(r.spurious_escalations, 0, "{r}");
        let relay = r.relay.as_ref().unwrap();
        assert!(relay.spool_peak >= 10, "the relay held them: {r}");
        assert_eq!(relay.spool_at_end, 0, "{r}");
    }
}

// C-TR-6, the reverse cut: relay -> custodian down for 8 s while the edge
// stays connected. The edge's acks wait in the spool and drain when the
// path heals: nothing escalates (every deadline outlasts the cut), nothing
// is applied twice, the spool ends empty.
#[test]
fn c_tr_6_reverse_cut_spools_acks_and_drains_them_without_spurious_escalation() {
    let r = run(&scenario("relay-reverse-cut"), 1);
    let o = &r.outcomes;
    assert_eq!(o.escalated, 0, "{r}");
    assert_eq!(r.spurious_escalations, 0, "{r}");
    assert_eq!(o.applied, r.custody, "{r}");
    let relay = r.relay.as_ref().unwrap();
    assert!(
        relay.spool_peak_to_custodians > 0,
        "acks were spooled during the cut: {r}"
    );
    assert_eq!(relay.spool_at_end, 0, "{r}");
}

#[test]
fn window_schedules_parse_and_validate() {
    let s = scenario("contact-windows");
    let w = s.windows_of("receiver-0").unwrap();
    assert_eq!(
        &w[..2],
        &[
            (Duration::from_secs(20), Duration::from_secs(22)),
            (Duration::from_secs(40), Duration::from_secs(42))
        ]
    );
    assert!(s.host_names().iter().any(|h| h == "relay"));
    // One nightly window: a single opening two hours in.
    let n = scenario("nightly-uplink");
    assert_eq!(
        n.windows_of("receiver-0").unwrap(),
        vec![(Duration::from_secs(7200), Duration::from_secs(7800))]
    );
    // No relay: no windows, no relay host.
    let plain = scenario("clean-lan");
    assert!(plain.windows_of("receiver-0").is_none());
    assert!(!plain.host_names().iter().any(|h| h == "relay"));

    let base = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios/contact-windows.toml"),
    )
    .unwrap();
    let err = |from: &str, to: &str| {
        Scenario::from_toml(&base.replace(from, to))
            .unwrap_err()
            .to_string()
    };
    let e = err("every = \"20s\"", "every = \"2s\"");
    assert!(e.contains("relay.window[0].every"), "{e}");
    let e = err("edges = \"receivers\"", "edges = \"custodian-0\"");
    assert!(e.contains("relay.window[0].edges"), "{e}");
    let e = err("transport = \"quic\"", "transport = \"ws\"");
    assert!(e.contains("relay"), "{e}");
}
