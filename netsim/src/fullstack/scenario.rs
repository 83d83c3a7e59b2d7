//! Scenario files: hosts, link profile, partitions, crashes, workload and
//! receiver behaviour, read from TOML and validated before anything runs.
//! The format is documented in netsim/README.md ("Scenario files").

use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A duration written as `"250ms"`, `"30s"`, `"5m"`, `"2h"` (decimals
/// allowed: `"1.5s"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Dur(pub Duration);

impl TryFrom<String> for Dur {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        parse_duration(&s).map(Dur)
    }
}

impl From<Dur> for String {
    fn from(d: Dur) -> String {
        d.to_string()
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms % 1000 == 0 {
            write!(f, "{}s", ms / 1000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

/// Parses a number and a unit: `"250ms"`, `"30s"`, `"1.5m"` (or
/// `"min"`), `"2h"`, `"1d"`. The one duration syntax of scenario files and
/// the command line.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("{s:?} has no unit (ms, s, m, h or d)"))?;
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a number followed by a unit"))?;
    let secs = match unit.trim() {
        "ms" => v / 1000.0,
        "s" => v,
        "m" | "min" => v * 60.0,
        "h" => v * 3600.0,
        "d" => v * 86_400.0,
        u => return Err(format!("{s:?}: unknown unit {u:?} (ms, s, m, h or d)")),
    };
    if !secs.is_finite() || !(0.0..=1.0e7).contains(&secs) {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Which transport the nodes use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    /// QUIC (quinn) over turmoil UDP through the seeded dropper.
    #[default]
    Quic,
    /// WebSocket (tokio-tungstenite) over turmoil TCP; partitions hold
    /// the link both ways (TCP buffers across an outage).
    Ws,
}

/// How many hosts of each role. Hosts are named `custodian-0..` and
/// `receiver-0..`; every custodian sends to every receiver.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hosts {
    /// Custodian hosts (they offer the workload).
    pub custodians: u32,
    /// Receiver hosts (they apply, decline or defer).
    pub receivers: u32,
}

/// The link profile of every custodian–receiver link.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LinkProfile {
    /// Least one-way latency.
    pub latency_min: Dur,
    /// Greatest one-way latency (drawn between min and max, skewed
    /// towards min by turmoil's exponential curve).
    pub latency_max: Dur,
    /// Probability a datagram is dropped (QUIC only: our seeded dropper).
    pub loss: f64,
    /// Probability a datagram is sent twice (QUIC only).
    pub duplicate: f64,
    /// Probability a datagram is held back behind the next one (QUIC only).
    pub reorder: f64,
}

impl Default for LinkProfile {
    fn default() -> Self {
        Self {
            latency_min: Dur(Duration::from_millis(1)),
            latency_max: Dur(Duration::from_millis(5)),
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
        }
    }
}

/// Which directions a partition cuts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Direction {
    /// Both directions.
    #[default]
    Both,
    /// Only from the first side of `between` to the second.
    Forward,
    /// Only from the second side to the first.
    Backward,
}

/// A partition between two sets of hosts, optionally flapping.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Partition {
    /// The two sides: a host name (`receiver-0`) or a group (`custodians`,
    /// `receivers`).
    pub between: [String; 2],
    /// When it starts (from the start of the run).
    pub at: Dur,
    /// How long it lasts.
    pub duration: Dur,
    /// Directions cut.
    #[serde(default)]
    pub direction: Direction,
    /// Flapping: within `[at, at + duration)` the link is down for `down`,
    /// then up for `up`, repeatedly (absent: down throughout).
    #[serde(default)]
    pub flap: Option<Flap>,
}

/// A flapping cycle.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Flap {
    /// Down time per cycle.
    pub down: Dur,
    /// Up time per cycle.
    pub up: Dur,
}

/// Crashes of one host: at `at`, then every `every`, `count` times; each
/// time down for `down_for`, then restarted from its store (what was not
/// committed is gone).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Crash {
    /// The host (`custodian-0`, `receiver-1`, ...).
    pub host: String,
    /// First crash.
    pub at: Dur,
    /// Time down before the restart.
    pub down_for: Dur,
    /// Interval between crashes (with `count` > 1).
    #[serde(default)]
    pub every: Option<Dur>,
    /// Number of crashes (default 1).
    #[serde(default = "one")]
    pub count: u32,
}

impl Crash {
    /// Each outage of this schedule: (crash time, restart time), in order.
    pub fn outages(&self) -> impl Iterator<Item = (Duration, Duration)> + '_ {
        let every = self.every.map(|e| e.0).unwrap_or_default();
        (0..self.count).map(move |i| {
            let down = self.at.0 + every * i;
            (down, down + self.down_for.0)
        })
    }
}

fn one() -> u32 {
    1
}

/// A store-and-forward relay (the host `relay`) between every custodian
/// and every receiver: custodians and receivers reach each other only
/// through it, and both dial out to it (QUIC only).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelaySetup {
    /// The relay's longest hold, whatever a frame's deadline.
    #[serde(default = "default_max_hold")]
    pub max_hold: Dur,
    /// Contact windows: when given, the relay <-> edge links named in them
    /// are up only inside their windows (down from the start otherwise).
    #[serde(default, rename = "window")]
    pub windows: Vec<Window>,
}

fn default_max_hold() -> Dur {
    Dur(Duration::from_secs(24 * 3600))
}

/// A contact-window schedule of relay <-> edge links: open for `open`
/// from `at`, and again every `every` if given (`"2s"` every `"20s"`; one
/// nightly window has no `every`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Window {
    /// The edges: a receiver (`receiver-0`) or `receivers`.
    #[serde(default = "default_edges")]
    pub edges: String,
    /// The first opening (from the start of the run).
    pub at: Dur,
    /// How long each opening lasts.
    pub open: Dur,
    /// The period of the openings (absent: a single window).
    #[serde(default)]
    pub every: Option<Dur>,
}

fn default_edges() -> String {
    "receivers".into()
}

impl Window {
    /// The openings `[start, end)` that begin before `until`, in order.
    pub fn openings(&self, until: Duration) -> Vec<(Duration, Duration)> {
        let mut v = Vec::new();
        let mut t = self.at.0;
        while t < until {
            v.push((t, t + self.open.0));
            match self.every {
                Some(e) if !e.0.is_zero() => t += e.0,
                _ => break,
            }
        }
        v
    }
}

/// The relay host's name.
pub const RELAY_HOST: &str = "relay";

/// A hostile transport in front of every node's inbound queue: it may hold
/// a frame back (so later frames overtake it), deliver it twice, and put an
/// earlier frame it carried back in flight (a replay). It never forges: a
/// frame is always delivered as coming from the peer that sent it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostileLink {
    /// Probability a frame (or a copy of it) is held back.
    #[serde(default)]
    pub hold: f64,
    /// Longest hold; each hold is drawn uniformly in `[0, hold_max]`.
    pub hold_max: Dur,
    /// Probability a frame is delivered twice.
    #[serde(default)]
    pub duplicate: f64,
    /// Probability, per frame, that an earlier frame to the same node is
    /// replayed after it.
    #[serde(default)]
    pub replay: f64,
}

/// A grant/revoke race, in place of the kind mix: each round `custodian-0`
/// (alice) decides a fresh consent scope at a receiver, `alice` in order,
/// `gap` apart (by default she grants, then revokes: her latest decision
/// withdraws), each without a caller-given sequence (what `abhyasa send`
/// does: whatever sequence they carry is her node's); every other
/// custodian (a second pinned peer, such as a relay's own identity) grants
/// the same scope in its own name `gap` after alice's last decision,
/// claiming `rival_sequence`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Race {
    /// Time between alice's grant and her revoke.
    pub gap: Dur,
    /// The sequence the other custodians put on their grants (absent:
    /// none given; their node assigns one).
    #[serde(default)]
    pub rival_sequence: Option<u64>,
    /// Alice's decisions each round, in order: `grant` or `revoke`.
    #[serde(default = "default_alice")]
    pub alice: Vec<String>,
}

fn default_alice() -> Vec<String> {
    vec!["grant".into(), "revoke".into()]
}

/// Relative weights of the obligation kinds offered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KindMix {
    /// `anumati.consent` revoke (binary, sequence-guarded).
    pub anumati_revoke: f64,
    /// `oauth.token` revoke (binary, sequence-guarded).
    pub oauth_revoke: f64,
    /// `phala.belief_update` corrective (signed, unguarded, clipped).
    pub phala_corrective: f64,
    /// `anumati.consent` grant: benign, best-effort (AC-1).
    pub benign: f64,
}

impl Default for KindMix {
    fn default() -> Self {
        Self {
            anumati_revoke: 1.0,
            oauth_revoke: 1.0,
            phala_corrective: 1.0,
            benign: 0.0,
        }
    }
}

/// What each custodian offers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Obligations offered by each custodian (across its receivers).
    pub obligations: u32,
    /// First offer.
    #[serde(default = "default_start")]
    pub start: Dur,
    /// Time between offer rounds (the rate is `burst / interval`).
    pub interval: Dur,
    /// Obligations per round. A burst offers them at the same instant on
    /// one governed key with increasing sequences (a supersession race
    /// when the link reorders).
    #[serde(default = "one")]
    pub burst: u32,
    /// Distinct governed keys per custodian (each round picks one).
    #[serde(default = "default_keys")]
    pub keys: u32,
    /// Obligation deadline (whole seconds).
    pub deadline: Dur,
    /// Retry bound; default: the least that spans the deadline, plus 2.
    #[serde(default)]
    pub max_retries: Option<u32>,
    /// Backoff base.
    pub backoff_base: Dur,
    /// Backoff cap.
    pub backoff_cap: Dur,
    /// Backoff jitter fraction in [0, 1].
    #[serde(default = "default_jitter")]
    pub jitter: f64,
    /// Kind weights.
    #[serde(default)]
    pub kinds: KindMix,
}

fn default_start() -> Dur {
    Dur(Duration::from_secs(1))
}
fn default_keys() -> u32 {
    8
}
fn default_jitter() -> f64 {
    0.1
}

/// How receivers decide (probabilities summing to 1).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReceiverBehaviour {
    /// Apply.
    pub apply: f64,
    /// Decline (`policy`).
    pub decline: f64,
    /// Defer, then decide (apply or decline as above) after `defer_for`.
    pub defer: f64,
    /// How long a deferral lasts before the receiver completes it.
    pub defer_for: Dur,
}

impl Default for ReceiverBehaviour {
    fn default() -> Self {
        Self {
            apply: 1.0,
            decline: 0.0,
            defer: 0.0,
            defer_for: Dur(Duration::from_secs(2)),
        }
    }
}

/// A full-stack scenario (see netsim/README.md, "Scenario files").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name (used in reports and replay commands).
    pub name: String,
    /// What it shows.
    #[serde(default)]
    pub description: String,
    /// Transport.
    #[serde(default)]
    pub transport: TransportKind,
    /// Simulation step (turmoil tick); latencies are multiples of it.
    #[serde(default = "default_tick")]
    pub tick: Dur,
    /// Extra simulated time after the last deadline before the run ends
    /// (late acks, reconciliation).
    #[serde(default = "default_grace")]
    pub grace: Dur,
    /// Hosts.
    pub hosts: Hosts,
    /// Link profile.
    #[serde(default)]
    pub link: LinkProfile,
    /// Partition schedule.
    #[serde(default, rename = "partition")]
    pub partitions: Vec<Partition>,
    /// Crash/restart schedule.
    #[serde(default, rename = "crash")]
    pub crashes: Vec<Crash>,
    /// Workload.
    pub workload: Workload,
    /// Receiver behaviour.
    #[serde(default)]
    pub receiver: ReceiverBehaviour,
    /// A store-and-forward relay between custodians and receivers, with
    /// its contact windows (absent: direct links).
    #[serde(default)]
    pub relay: Option<RelaySetup>,
    /// A hostile transport in front of every node (absent: none).
    #[serde(default)]
    pub hostile: Option<HostileLink>,
    /// The grant/revoke race workload (absent: the kind mix).
    #[serde(default)]
    pub race: Option<Race>,
}

fn default_tick() -> Dur {
    Dur(Duration::from_millis(5))
}
fn default_grace() -> Dur {
    Dur(Duration::from_secs(10))
}

/// A scenario that cannot be run, naming the bad key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("cannot read {path}: {message}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        message: String,
    },
    /// Not TOML, an unknown key, or a value of the wrong type.
    #[error("{source_name}: {message}")]
    Parse {
        /// File name or `<string>`.
        source_name: String,
        /// The TOML error (names the key and line).
        message: String,
    },
    /// A value out of range or inconsistent with another.
    #[error("{key}: {problem}")]
    Invalid {
        /// The key, dotted (`link.loss`, `partition[0].between`).
        key: String,
        /// What is wrong.
        problem: String,
    },
}

fn invalid(key: impl Into<String>, problem: impl Into<String>) -> ScenarioError {
    ScenarioError::Invalid {
        key: key.into(),
        problem: problem.into(),
    }
}

fn prob(key: &str, v: f64) -> Result<(), ScenarioError> {
    if (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(invalid(key, format!("{v} is not a probability in [0, 1]")))
    }
}

/// Upper bound on hosts, obligations and crashes a scenario may ask for,
/// so a typo cannot ask for a run that never ends.
const MAX_HOSTS: u32 = 64;
const MAX_OBLIGATIONS: u32 = 1_000_000;
const MAX_CRASHES: u32 = 10_000;

impl Scenario {
    /// Reads and validates a scenario file.
    pub fn from_file(path: &Path) -> Result<Self, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|e| ScenarioError::Read {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Self::from_toml_named(&text, &path.display().to_string())
    }

    /// Parses and validates a scenario from TOML text.
    pub fn from_toml(text: &str) -> Result<Self, ScenarioError> {
        Self::from_toml_named(text, "<string>")
    }

    fn from_toml_named(text: &str, name: &str) -> Result<Self, ScenarioError> {
        let s: Scenario = toml::from_str(text).map_err(|e| ScenarioError::Parse {
            source_name: name.to_string(),
            message: e.to_string().trim_end().to_string(),
        })?;
        s.validate()?;
        Ok(s)
    }

    /// Host names, custodians first.
    pub fn host_names(&self) -> Vec<String> {
        let mut v: Vec<String> = (0..self.hosts.custodians)
            .map(|i| format!("custodian-{i}"))
            .collect();
        v.extend((0..self.hosts.receivers).map(|i| format!("receiver-{i}")));
        if self.relay.is_some() {
            v.push(RELAY_HOST.to_string());
        }
        v
    }

    /// The contact windows of `edge`'s link to the relay, `[start, end)`
    /// in order, over the run; `None` when that link has no windows
    /// (always up, or no relay).
    pub fn windows_of(&self, edge: &str) -> Option<Vec<(Duration, Duration)>> {
        let r = self.relay.as_ref()?;
        let until = self.run_length();
        let mut v: Vec<(Duration, Duration)> = r
            .windows
            .iter()
            .filter(|w| self.resolve_side(&w.edges).iter().any(|e| e == edge))
            .flat_map(|w| w.openings(until))
            .collect();
        if v.is_empty() {
            return None;
        }
        v.sort();
        Some(v)
    }

    /// Hosts named by one side of a partition (a host or a group).
    pub fn resolve_side(&self, side: &str) -> Vec<String> {
        match side {
            "custodians" => (0..self.hosts.custodians)
                .map(|i| format!("custodian-{i}"))
                .collect(),
            "receivers" => (0..self.hosts.receivers)
                .map(|i| format!("receiver-{i}"))
                .collect(),
            h if self.host_names().iter().any(|n| n == h) => vec![h.to_string()],
            _ => Vec::new(),
        }
    }

    /// The same scenario with every partition lasting `d` (for the
    /// partition-duration study). A flapping partition keeps its cycle.
    /// A zero `d` removes the partitions: a partition of no length is no
    /// partition (and would not validate).
    pub fn with_partition_duration(&self, d: Duration) -> Self {
        let mut s = self.clone();
        if d.is_zero() {
            s.partitions.clear();
        }
        for p in &mut s.partitions {
            p.duration = Dur(d);
        }
        s
    }

    /// The retry bound used: the configured one, or the least that spans
    /// the deadline (AB-2 sizing rule) plus 2.
    pub fn max_retries(&self) -> u32 {
        let w = &self.workload;
        w.max_retries.unwrap_or_else(|| {
            let min = abhyasa_core::min_retries_to_span(
                w.deadline.0.as_secs(),
                w.backoff_base.0.as_secs_f64(),
                w.backoff_cap.0.as_secs_f64(),
            );
            u32::try_from(min).unwrap_or(u32::MAX).saturating_add(2)
        })
    }

    /// When the last offer round is made.
    pub fn last_offer_at(&self) -> Duration {
        let w = &self.workload;
        let rounds = w.obligations.div_ceil(w.burst.max(1));
        w.start.0 + w.interval.0 * rounds.saturating_sub(1)
    }

    /// When every partition and crash schedule has ended.
    pub fn faults_end(&self) -> Duration {
        let p = self.partitions.iter().map(|p| p.at.0 + p.duration.0);
        let c = self
            .crashes
            .iter()
            .filter_map(|c| c.outages().last().map(|(_, up)| up));
        p.chain(c).max().unwrap_or_default()
    }

    /// Simulated time the run lasts: every custody transfer has ended by
    /// then (last offer + deadline), every fault is over, plus grace.
    pub fn run_length(&self) -> Duration {
        let last_deadline = self.last_offer_at() + self.workload.deadline.0;
        last_deadline.max(self.faults_end()) + self.grace.0
    }

    /// Checks ranges and references; the error names the key.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        if self.name.trim().is_empty() {
            return Err(invalid("name", "must not be empty"));
        }
        if self.tick.0 < Duration::from_millis(1) || self.tick.0 > Duration::from_secs(1) {
            return Err(invalid("tick", "must be between 1ms and 1s"));
        }
        let h = &self.hosts;
        if h.custodians == 0 || h.custodians > MAX_HOSTS {
            return Err(invalid(
                "hosts.custodians",
                format!("must be 1..={MAX_HOSTS}"),
            ));
        }
        if h.receivers == 0 || h.receivers > MAX_HOSTS {
            return Err(invalid(
                "hosts.receivers",
                format!("must be 1..={MAX_HOSTS}"),
            ));
        }
        let l = &self.link;
        if l.latency_max < l.latency_min {
            return Err(invalid("link.latency_max", "is below link.latency_min"));
        }
        prob("link.loss", l.loss)?;
        prob("link.duplicate", l.duplicate)?;
        prob("link.reorder", l.reorder)?;
        if l.loss >= 1.0 {
            return Err(invalid(
                "link.loss",
                "1.0 loses every datagram: use a partition instead",
            ));
        }
        if self.transport == TransportKind::Ws
            && (l.loss > 0.0 || l.duplicate > 0.0 || l.reorder > 0.0)
        {
            return Err(invalid(
                "link.loss",
                "loss, duplicate and reorder apply to datagrams (transport = \"quic\"); \
                 WebSocket runs over turmoil TCP, which is reliable and ordered",
            ));
        }
        for (i, p) in self.partitions.iter().enumerate() {
            for (j, side) in p.between.iter().enumerate() {
                if self.resolve_side(side).is_empty() {
                    return Err(invalid(
                        format!("partition[{i}].between[{j}]"),
                        format!(
                            "{side:?} is neither a host (custodian-N, receiver-N) \
                             nor a group (custodians, receivers)"
                        ),
                    ));
                }
            }
            if self.transport == TransportKind::Ws && p.direction != Direction::Both {
                return Err(invalid(
                    format!("partition[{i}].direction"),
                    "WebSocket runs over turmoil TCP, whose partitions hold the link both \
                     ways (a one-way cut would drop bytes from a reliable stream); use \
                     direction = \"both\" or transport = \"quic\"",
                ));
            }
            if p.duration.0.is_zero() {
                return Err(invalid(format!("partition[{i}].duration"), "must be > 0"));
            }
            if let Some(f) = &p.flap {
                if f.down.0.is_zero() || f.up.0.is_zero() {
                    return Err(invalid(
                        format!("partition[{i}].flap"),
                        "down and up must be > 0",
                    ));
                }
            }
        }
        for (i, c) in self.crashes.iter().enumerate() {
            if !self.host_names().contains(&c.host) {
                return Err(invalid(
                    format!("crash[{i}].host"),
                    format!("{:?} is not a host (custodian-N, receiver-N)", c.host),
                ));
            }
            if c.count == 0 || c.count > MAX_CRASHES {
                return Err(invalid(
                    format!("crash[{i}].count"),
                    format!("must be 1..={MAX_CRASHES}"),
                ));
            }
            if c.down_for.0.is_zero() {
                return Err(invalid(format!("crash[{i}].down_for"), "must be > 0"));
            }
            if c.count > 1 {
                match c.every {
                    Some(e) if e.0 > c.down_for.0 => {}
                    _ => {
                        return Err(invalid(
                            format!("crash[{i}].every"),
                            "needed with count > 1, and longer than down_for",
                        ))
                    }
                }
            }
        }
        let w = &self.workload;
        if w.obligations == 0 || w.obligations > MAX_OBLIGATIONS {
            return Err(invalid(
                "workload.obligations",
                format!("must be 1..={MAX_OBLIGATIONS}"),
            ));
        }
        if w.burst == 0 {
            return Err(invalid("workload.burst", "must be >= 1"));
        }
        if w.keys == 0 {
            return Err(invalid("workload.keys", "must be >= 1"));
        }
        if w.interval.0.is_zero() {
            return Err(invalid("workload.interval", "must be > 0"));
        }
        if w.deadline.0.as_secs() == 0 || w.deadline.0.subsec_nanos() != 0 {
            return Err(invalid(
                "workload.deadline",
                "must be a whole number of seconds, at least 1s",
            ));
        }
        if w.backoff_base.0.is_zero() || w.backoff_cap.0 < w.backoff_base.0 {
            return Err(invalid(
                "workload.backoff_cap",
                "backoff_base must be > 0 and backoff_cap >= backoff_base",
            ));
        }
        prob("workload.jitter", w.jitter)?;
        let min = abhyasa_core::min_retries_to_span(
            w.deadline.0.as_secs(),
            w.backoff_base.0.as_secs_f64(),
            w.backoff_cap.0.as_secs_f64(),
        );
        if let Some(m) = w.max_retries {
            if u64::from(m) < min {
                return Err(invalid(
                    "workload.max_retries",
                    format!(
                        "{m} is too small: the capped schedule needs {min} retries to span \
                         the deadline (AB-2); set max_retries >= {min}"
                    ),
                ));
            }
        }
        let k = &w.kinds;
        for (key, v) in [
            ("workload.kinds.anumati_revoke", k.anumati_revoke),
            ("workload.kinds.oauth_revoke", k.oauth_revoke),
            ("workload.kinds.phala_corrective", k.phala_corrective),
            ("workload.kinds.benign", k.benign),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(invalid(key, "weights must be >= 0"));
            }
        }
        if k.anumati_revoke + k.oauth_revoke + k.phala_corrective + k.benign <= 0.0 {
            return Err(invalid("workload.kinds", "at least one weight must be > 0"));
        }
        if let Some(relay) = &self.relay {
            if self.transport != TransportKind::Quic {
                return Err(invalid(
                    "relay",
                    "the relay runs over QUIC: set transport = \"quic\"",
                ));
            }
            if relay.max_hold.0 < Duration::from_secs(1) {
                return Err(invalid("relay.max_hold", "must be at least 1s"));
            }
            for (i, w) in relay.windows.iter().enumerate() {
                let edges = self.resolve_side(&w.edges);
                if edges.is_empty() || edges.iter().any(|e| !e.starts_with("receiver-")) {
                    return Err(invalid(
                        format!("relay.window[{i}].edges"),
                        format!(
                            "{:?} is neither a receiver (receiver-N) nor receivers",
                            w.edges
                        ),
                    ));
                }
                if w.open.0.is_zero() {
                    return Err(invalid(format!("relay.window[{i}].open"), "must be > 0"));
                }
                if let Some(e) = w.every {
                    if e.0 <= w.open.0 {
                        return Err(invalid(
                            format!("relay.window[{i}].every"),
                            "must be longer than open (else the link is never down)",
                        ));
                    }
                }
            }
        }
        if let Some(h) = &self.hostile {
            prob("hostile.hold", h.hold)?;
            prob("hostile.duplicate", h.duplicate)?;
            prob("hostile.replay", h.replay)?;
            if h.hold > 0.0 && h.hold_max.0.is_zero() {
                return Err(invalid("hostile.hold_max", "must be > 0 when hold > 0"));
            }
        }
        if let Some(r) = &self.race {
            if r.gap.0.is_zero() {
                return Err(invalid("race.gap", "must be > 0"));
            }
            let steps = u32::try_from(r.alice.len()).unwrap_or(u32::MAX);
            if r.gap.0 * steps >= w.interval.0 {
                return Err(invalid(
                    "race.gap",
                    "times the number of alice's decisions must be under workload.interval \
                     (a round's offers stay in it)",
                ));
            }
            if r.alice.is_empty() || r.alice.iter().any(|d| d != "grant" && d != "revoke") {
                return Err(invalid(
                    "race.alice",
                    "must list one or more decisions, each \"grant\" or \"revoke\"",
                ));
            }
        }
        let r = &self.receiver;
        prob("receiver.apply", r.apply)?;
        prob("receiver.decline", r.decline)?;
        prob("receiver.defer", r.defer)?;
        if ((r.apply + r.decline + r.defer) - 1.0).abs() > 1e-9 {
            return Err(invalid(
                "receiver",
                format!(
                    "apply + decline + defer must be 1 (is {})",
                    r.apply + r.decline + r.defer
                ),
            ));
        }
        Ok(())
    }
}
