//! [`run_scenario`]: builds the turmoil simulation (one host per node),
//! plays the fault schedule between simulation steps, then checks the
//! invariants on ground truth and builds the [`RunReport`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use abhyasa_core::store::{SimStore, Store};
use abhyasa_core::{AgentId, Obligation, ObligationId, Timestamp};
use abhyasa_identity::generate_identity;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use super::check::{check, check_windows};
use super::ctx::{HostCtx, Planned, Role};
use super::host::run_host;
use super::report::{RelayReport, RunReport};
use super::scenario::{Direction, Race, Scenario, TransportKind, RELAY_HOST};
use super::truth::{lock, splitmix, Truth};
use super::udp::{DatagramFaults, Dropper};

/// The simulated wall clock at the start of every run (2027-01-15).
pub const T0_UNIX_SECONDS: i64 = 1_800_000_000;

/// A run that could not be carried out (not an invariant violation: those
/// are in the report).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The scenario is invalid.
    #[error(transparent)]
    Scenario(#[from] super::scenario::ScenarioError),
    /// A host could not be set up (identity, ids).
    #[error("setup: {0}")]
    Setup(String),
    /// The simulation failed (a host's software returned an error).
    #[error("simulation: {0}")]
    Simulation(String),
    /// A simulated store could not be read at the end.
    #[error("store: {0}")]
    Store(#[from] abhyasa_core::store::StoreError),
}

#[derive(Debug, Clone)]
enum Action {
    Cut {
        from: Vec<String>,
        to: Vec<String>,
        dir: Direction,
        down: bool,
    },
    Crash(String),
    Restart(String),
}

fn agent(name: &str) -> Result<AgentId, RunError> {
    AgentId::new(name).map_err(|e| RunError::Setup(format!("agent id {name}: {e}")))
}

/// The workload of custodian `c`: obligations and their offer times, drawn
/// from the run seed.
fn plan(
    s: &Scenario,
    seed: u64,
    c: u32,
    t0: Timestamp,
    receivers: &[AgentId],
) -> Result<Vec<Planned>, RunError> {
    if let Some(r) = &s.race {
        return race_plan(s, r, c, t0, receivers);
    }
    let w = &s.workload;
    let mut rng = ChaCha8Rng::seed_from_u64(splitmix(seed ^ splitmix(0x706c_616e ^ u64::from(c))));
    let k = &w.kinds;
    let weights = [
        k.anumati_revoke,
        k.oauth_revoke,
        k.phala_corrective,
        k.benign,
    ];
    let total: f64 = weights.iter().sum();
    let mut seq: BTreeMap<u32, u64> = BTreeMap::new();
    let mut out = Vec::with_capacity(w.obligations as usize);
    let max_retries = s.max_retries();
    let mut round = 0u32;
    while out.len() < w.obligations as usize {
        let at = w.start.0 + w.interval.0 * round;
        round += 1;
        let key_ix = rng.random_range(0..w.keys);
        let target = &receivers[rng.random_range(0..receivers.len())];
        let mut u = rng.random::<f64>() * total;
        let mut kind = 0;
        for (i, wt) in weights.iter().enumerate() {
            if u < *wt {
                kind = i;
                break;
            }
            u -= wt;
            kind = i;
        }
        for _ in 0..w.burst {
            if out.len() >= w.obligations as usize {
                break;
            }
            let n = seq.entry(key_ix).or_insert(0);
            *n += 1;
            let key = format!("c{c}-k{key_ix}");
            let (kind_name, payload) = match kind {
                0 => (
                    "anumati.consent",
                    json!({"decision": "revoke", "scope": key}),
                ),
                1 => ("oauth.token", json!({"action": "revoke", "token_id": key})),
                2 => (
                    "phala.belief_update",
                    json!({"weight_key": key, "weight_delta": -0.1}),
                ),
                _ => (
                    "anumati.consent",
                    json!({"decision": "grant", "scope": key}),
                ),
            };
            let ob = Obligation::builder()
                .id(format!("c{c}-{:06}", out.len()))
                .kind(kind_name)
                .target(target.as_str())
                .payload(payload)
                .deadline_seconds(i64::try_from(w.deadline.0.as_secs()).unwrap_or(i64::MAX))
                .max_retries(i64::from(max_retries))
                .created_at(t0.saturating_add(at))
                .sequence(*n)
                .build()
                .map_err(|e| RunError::Setup(format!("workload obligation: {e}")))?;
            out.push(Planned { at, obligation: ob });
        }
    }
    Ok(out)
}

/// The grant/revoke race (`[race]`): round `r` is scope `race-r` at
/// receiver `r mod receivers`. Custodian 0 (alice) grants it at the round's
/// start and revokes it `gap` later, with no caller-given sequence; every
/// other custodian grants it in its own name `2 × gap` after the start,
/// with the scenario's rival sequence.
fn race_plan(
    s: &Scenario,
    race: &Race,
    c: u32,
    t0: Timestamp,
    receivers: &[AgentId],
) -> Result<Vec<Planned>, RunError> {
    let w = &s.workload;
    let max_retries = s.max_retries();
    let mut out = Vec::new();
    for r in 0..w.obligations {
        let start = w.start.0 + w.interval.0 * r;
        let target = &receivers[r as usize % receivers.len()];
        let scope = format!("race-{r}");
        let decisions: Vec<(&str, Duration, Option<u64>)> = if c == 0 {
            (0u32..)
                .zip(&race.alice)
                .map(|(n, d)| (d.as_str(), start + race.gap.0 * n, None))
                .collect()
        } else {
            let after = u32::try_from(race.alice.len()).unwrap_or(u32::MAX);
            vec![("grant", start + race.gap.0 * after, race.rival_sequence)]
        };
        for (k, (decision, at, sequence)) in decisions.into_iter().enumerate() {
            let mut b = Obligation::builder()
                .id(format!("c{c}-{r:04}-{k}-{decision}"))
                .kind("anumati.consent")
                .target(target.as_str())
                .payload(json!({"decision": decision, "scope": scope}))
                .deadline_seconds(i64::try_from(w.deadline.0.as_secs()).unwrap_or(i64::MAX))
                .max_retries(i64::from(max_retries))
                .created_at(t0.saturating_add(at));
            if let Some(q) = sequence {
                b = b.sequence(q);
            }
            let ob = b
                .build()
                .map_err(|e| RunError::Setup(format!("race obligation: {e}")))?;
            out.push(Planned { at, obligation: ob });
        }
    }
    Ok(out)
}

/// The obligations of `plan` that are their custodian's latest decision on
/// their (sequence-guarded) governed key, each with whether it withholds
/// (admissible: a revoke or a restriction), for C-OR-1 and C-OR-2.
fn latest_decisions(custodian: &AgentId, plan: &[Planned]) -> Vec<((AgentId, ObligationId), bool)> {
    let registry = abhyasa_core::polarity::PolarityRegistry::standard();
    let mut latest: BTreeMap<String, (Duration, usize, bool)> = BTreeMap::new();
    for (i, p) in plan.iter().enumerate() {
        let Ok(class) = registry.classify(&p.obligation) else {
            continue;
        };
        let withhold = class.is_admissible();
        let (Some(key), true) = (class.key, class.guarded) else {
            continue;
        };
        let e = latest.entry(key.to_string()).or_insert((p.at, i, withhold));
        if (p.at, i) >= (e.0, e.1) {
            *e = (p.at, i, withhold);
        }
    }
    latest
        .values()
        .map(|(_, i, withhold)| {
            (
                (custodian.clone(), plan[*i].obligation.id().clone()),
                *withhold,
            )
        })
        .collect()
}

fn schedule(s: &Scenario) -> Vec<(Duration, Action)> {
    let mut ev: Vec<(Duration, Action)> = Vec::new();
    for p in &s.partitions {
        let from = s.resolve_side(&p.between[0]);
        let to = s.resolve_side(&p.between[1]);
        let cut = |down| Action::Cut {
            from: from.clone(),
            to: to.clone(),
            dir: p.direction,
            down,
        };
        let end = p.at.0 + p.duration.0;
        match &p.flap {
            None => {
                ev.push((p.at.0, cut(true)));
                ev.push((end, cut(false)));
            }
            Some(f) => {
                let mut t = p.at.0;
                while t < end {
                    ev.push((t, cut(true)));
                    let up = (t + f.down.0).min(end);
                    ev.push((up, cut(false)));
                    t = up + f.up.0;
                }
            }
        }
    }
    // Contact windows: the relay <-> edge link is down from the start and
    // up only inside each opening.
    for edge in s.resolve_side("receivers") {
        let Some(openings) = s.windows_of(&edge) else {
            continue;
        };
        let cut = |down| Action::Cut {
            from: vec![RELAY_HOST.to_string()],
            to: vec![edge.clone()],
            dir: Direction::Both,
            down,
        };
        ev.push((Duration::ZERO, cut(true)));
        for (open, close) in openings {
            ev.push((open, cut(false)));
            ev.push((close, cut(true)));
        }
    }
    for c in &s.crashes {
        for (down, up) in c.outages() {
            ev.push((down, Action::Crash(c.host.clone())));
            ev.push((up, Action::Restart(c.host.clone())));
        }
    }
    // Stable: same-time actions keep their file order.
    ev.sort_by_key(|(t, _)| *t);
    ev
}

/// Runs `scenario` with `seed` and checks it. Deterministic: the same
/// scenario and seed give the same report (C-DOR-3). Invariant violations
/// are in [`RunReport::violations`], not an error.
pub fn run_scenario(scenario: &Scenario, seed: u64) -> Result<RunReport, RunError> {
    scenario.validate()?;
    let s = Arc::new(scenario.clone());
    let t0 = Timestamp::from_unix_seconds(T0_UNIX_SECONDS);
    let truth = Truth::default();
    let names = s.host_names();
    let mut agents = BTreeMap::new();
    let mut identities = BTreeMap::new();
    for n in &names {
        let a = agent(n)?;
        let id = generate_identity(&a).map_err(|e| RunError::Setup(e.to_string()))?;
        identities.insert(n.clone(), id);
        agents.insert(n.clone(), a);
    }
    let receivers: Vec<String> = s.resolve_side("receivers");
    let custodians: Vec<String> = s.resolve_side("custodians");
    let receiver_agents: Vec<AgentId> = receivers.iter().map(|r| agents[r].clone()).collect();

    let run_length = s.run_length();
    let mut b = turmoil::Builder::new();
    b.simulation_duration(run_length + Duration::from_secs(60))
        .tick_duration(s.tick.0)
        .min_message_latency(s.link.latency_min.0)
        .max_message_latency(s.link.latency_max.0)
        .udp_capacity(1 << 16)
        .tcp_capacity(1 << 16)
        .rng_seed(seed);
    let mut sim = b.build();

    let faults = DatagramFaults {
        loss: s.link.loss,
        duplicate: s.link.duplicate,
        reorder: s.link.reorder,
    };
    let mut disks: BTreeMap<String, (Role, Arc<Mutex<SimStore>>)> = BTreeMap::new();
    let mut planned = 0u64;
    let relay_pin = s
        .relay
        .as_ref()
        .map(|_| identities[RELAY_HOST].pin(agents[RELAY_HOST].clone()));
    let spool_path = s.relay.as_ref().map(|_| fresh_spool_path(seed));
    let everyone: Vec<String> = custodians.iter().chain(&receivers).cloned().collect();
    for (i, name) in names.iter().enumerate() {
        let role = if custodians.contains(name) {
            Role::Custodian
        } else if name == RELAY_HOST {
            Role::Relay
        } else {
            Role::Receiver
        };
        let peers = match role {
            Role::Custodian => &receivers,
            Role::Receiver => &custodians,
            Role::Relay => &everyone,
        };
        let peers = peers
            .iter()
            .map(|p| (p.clone(), identities[p].pin(agents[p].clone())))
            .collect();
        let plan = match role {
            Role::Custodian => {
                let c = u32::try_from(i).unwrap_or(u32::MAX);
                plan(&s, seed, c, t0, &receiver_agents)?
            }
            Role::Receiver | Role::Relay => Vec::new(),
        };
        planned += plan.len() as u64;
        let latest = latest_decisions(&agents[name], &plan);
        truth.with(|t| {
            for (k, withhold) in latest {
                if withhold {
                    t.latest_withholds.push(k.clone());
                }
                t.latest_decisions.push(k);
            }
        });
        let disk = Arc::new(Mutex::new(SimStore::new()));
        disks.insert(name.clone(), (role, disk.clone()));
        let ctx = Arc::new(HostCtx {
            name: name.clone(),
            role,
            agent: agents[name].clone(),
            identity: identities[name].clone(),
            peers,
            scenario: s.clone(),
            seed,
            t0,
            disk,
            dropper: Arc::new(Mutex::new(Dropper::new(
                faults,
                splitmix(seed ^ splitmix(0x6472_6f70 + i as u64)),
            ))),
            truth: truth.clone(),
            plan: Arc::new(plan),
            relay: relay_pin.clone().filter(|_| role != Role::Relay),
            spool_path: spool_path.clone().filter(|_| role == Role::Relay),
        });
        sim.host(name.as_str(), move || run_host(ctx.clone()));
    }

    let events = schedule(&s);
    let hold = s.transport == TransportKind::Ws;
    let mut next = 0;
    loop {
        let now = sim.elapsed();
        while next < events.len() && events[next].0 <= now {
            match &events[next].1 {
                Action::Cut {
                    from,
                    to,
                    dir,
                    down,
                } => {
                    for a in from {
                        for b in to {
                            if a == b {
                                continue;
                            }
                            let (x, y) = match dir {
                                Direction::Backward => (b.as_str(), a.as_str()),
                                _ => (a.as_str(), b.as_str()),
                            };
                            match (dir, down, hold) {
                                // TCP under turmoil loses what a partition
                                // drops; a WebSocket link is held instead
                                // (TCP buffering across an outage).
                                (_, true, true) => sim.hold(x, y),
                                (_, false, true) => sim.release(x, y),
                                (Direction::Both, true, false) => sim.partition(x, y),
                                (Direction::Both, false, false) => sim.repair(x, y),
                                (_, true, false) => sim.partition_oneway(x, y),
                                (_, false, false) => sim.repair_oneway(x, y),
                            }
                        }
                    }
                }
                Action::Crash(h) => {
                    if sim.is_host_running(h.as_str()) {
                        sim.crash(h.as_str());
                        if let Some((_, d)) = disks.get(h) {
                            lock(d).crash();
                        }
                        truth.with(|t| t.crashes += 1);
                    }
                }
                Action::Restart(h) => {
                    if !sim.is_host_running(h.as_str()) {
                        sim.bounce(h.as_str());
                        truth.with(|t| t.restarts += 1);
                    }
                }
            }
            next += 1;
        }
        if now >= run_length {
            break;
        }
        sim.step()
            .map_err(|e| RunError::Simulation(e.to_string()))?;
    }
    let simulated = sim.elapsed();
    drop(sim);

    let mut pending_at_end = Vec::new();
    for (name, (role, disk)) in &disks {
        if *role == Role::Custodian {
            let st = lock(disk).load()?;
            let mut ids: Vec<String> = st
                .custodian
                .pending
                .keys()
                .map(|k| format!("{name}/{k}"))
                .collect();
            ids.sort();
            pending_at_end.extend(ids);
        }
    }
    let spool_at_end = match &spool_path {
        Some(p) => {
            let n = abhyasa_spool::Spool::open(p, abhyasa_spool::SpoolLimits::default())
                .map(|sp| sp.len() as u64)
                .map_err(|e| RunError::Simulation(format!("relay spool at the end: {e}")));
            let _ = std::fs::remove_file(p);
            Some(n?)
        }
        None => None,
    };
    let inner = std::mem::take(&mut *lock(&truth.0));
    let mut violations = check(&s, &inner, &pending_at_end);
    violations.extend(check_windows(&s, t0, &inner, spool_at_end));
    let mut report = RunReport::build(
        &s,
        seed,
        simulated,
        planned,
        &inner,
        pending_at_end.len() as u64,
        violations,
    );
    report.relay = spool_at_end.map(|at_end| RelayReport {
        spool_peak: inner.relay_spool_peak,
        spool_peak_to_custodians: inner.relay_back_peak,
        spool_at_end: at_end,
    });
    Ok(report)
}

/// A spool file of its own for this run's relay (runs may go in parallel),
/// removed when the run ends.
fn fresh_spool_path(seed: u64) -> std::path::PathBuf {
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let p = std::env::temp_dir().join(format!(
        "abhyasa-sim-relay-{}-{seed}-{n}.redb",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&p);
    p
}
