//! Full-stack scenarios under turmoil (`abhyasa-sim run`): simulated
//! hosts run the real node runtime ([`abhyasa::Node`]) over the real
//! transports — QUIC over turmoil UDP through a seeded per-datagram
//! dropper, WebSocket over turmoil TCP — on simulated disks
//! ([`abhyasa_core::store::SimStore`]) that keep only what was committed
//! across a crash. An invariant checker reads ground truth (the receivers'
//! applier verdicts and every committed record), not the nodes' reports.
//!
//! ```no_run
//! use abhyasa_netsim::fullstack::{run_scenario, Scenario};
//! let s = Scenario::from_file("netsim/scenarios/clean-lan.toml".as_ref())?;
//! let report = run_scenario(&s, 7)?;
//! assert!(report.passed(), "{report}");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod check;
mod ctx;
mod host;
mod report;
mod run;
mod scenario;
mod truth;
mod udp;
mod ws;

pub use check::Violation;
pub use report::{Count, HostileReport, Outcomes, Overhead, Percentiles, RelayReport, RunReport};
pub use run::{run_scenario, RunError, T0_UNIX_SECONDS};
pub use scenario::{
    parse_duration, Crash, Direction, Dur, Flap, HostileLink, Hosts, KindMix, LinkProfile,
    Partition, Race, ReceiverBehaviour, RelaySetup, Scenario, ScenarioError, TransportKind, Window,
    Workload, RELAY_HOST,
};
