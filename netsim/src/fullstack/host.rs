//! The host model: what runs on each simulated machine. A host has a
//! [`Role`]; its software opens the real node runtime on its simulated
//! disk over the real transport, then plays the role until the host is
//! crashed. A restart (turmoil `bounce`) runs the same software again on
//! the same disk, so the node recovers from what was committed.
//!
//! Roles: custodian (offers the workload), receiver (applies, declines or
//! defers) and, in relayed scenarios, the store-and-forward relay: the
//! real relay daemon (`abhyasa_spool`) on its own redb spool over turmoil
//! UDP in simulated time, which forwards sealed frames and never takes
//! custody (DESIGN §2 "End-to-end custody"). With a relay, custodians and
//! receivers both dial out to it and reach each other only through it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use abhyasa::clock::{Clock, TokioClock};
use abhyasa::{Node, NodeOptions};
use abhyasa_core::custody::{CustodyProfile, Offered, StandardApplier};
use abhyasa_core::wire::Message;
use abhyasa_core::{AgentId, Obligation, RetryBackoff};
use abhyasa_quic::QuicConfig;
use abhyasa_spool::{relayed, RelayParts, RelayedConfig, SpoolLimits};
use abhyasa_transport::{Incoming, LinkConfig, Transport};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::ctx::{start_err, HostCtx, HostError, Role, PORT};
use super::scenario::{HostileLink, TransportKind, RELAY_HOST};
use super::truth::{RecordingApplier, RecordingStore, Truth};
use super::udp::SimUdp;

/// Link knobs for the simulation. The reconnect delay is drawn in
/// `[max/2, max]` with a per-process random seed (`abhyasa_transport`);
/// with `max` = 1 ms every draw lands on the same millisecond tick of
/// tokio's timer wheel, so redials happen at the same simulated instant
/// on every run.
fn link_config() -> LinkConfig {
    LinkConfig {
        backoff: abhyasa_transport::Backoff {
            initial: Duration::from_millis(1),
            max: Duration::from_millis(1),
        },
        ..LinkConfig::default()
    }
}

/// Runs one incarnation of a host until it is crashed.
pub(crate) async fn run_host(ctx: Arc<HostCtx>) -> Result<(), Box<dyn std::error::Error>> {
    let now = ctx
        .t0
        .saturating_add(turmoil::sim_elapsed().unwrap_or_default());
    let incarnation = ctx.truth.with(|t| {
        let n = t.incarnations.entry(ctx.name.clone()).or_insert(0);
        *n += 1;
        *n
    });
    let clock = TokioClock::starting_at(now);
    let transport = start_transport(&ctx, incarnation).await?;
    if ctx.role == Role::Relay {
        return run_relay(&ctx, transport, clock).await;
    }
    let transport = match &ctx.relay {
        Some(relay) => {
            let mut c = RelayedConfig::new(
                relay.agent.clone(),
                ctx.peers.iter().map(|(_, p)| p.clone()).collect(),
                ctx.identity.clone(),
            );
            c.clock = Arc::new(move || clock.now());
            relayed(transport, c).0
        }
        None => transport,
    };
    let transport = match &ctx.scenario.hostile {
        Some(h) => hostile_link(
            transport,
            h.clone(),
            super::truth::splitmix(ctx.seed ^ host_index(&ctx.name) ^ incarnation.rotate_left(32)),
            ctx.truth.clone(),
        ),
        None => transport,
    };
    let transport = count_frames(transport, ctx.truth.clone());
    let mut o = NodeOptions::new(ctx.agent.clone());
    o.inline_store = true;
    o.clock = Arc::new(clock);
    o.custodian.seed =
        super::truth::splitmix(ctx.seed ^ super::truth::splitmix(host_index(&ctx.name)));
    let w = &ctx.scenario.workload;
    o.custodian.default_profile = CustodyProfile {
        backoff: RetryBackoff {
            base: w.backoff_base.0,
            cap: w.backoff_cap.0,
            jitter: w.jitter,
        },
        ..CustodyProfile::default()
    };
    o.receiver.skew_margin = Duration::from_millis(500);
    let r = &ctx.scenario.receiver;
    o.applier = Box::new(RecordingApplier {
        agent: ctx.agent.clone(),
        seed: ctx.seed,
        apply: r.apply,
        decline: r.decline,
        defer_for: r.defer_for.0,
        first_deferred: Default::default(),
        inner: StandardApplier::default(),
        truth: ctx.truth.clone(),
    });
    let store = RecordingStore {
        disk: ctx.disk.clone(),
        agent: ctx.agent.clone(),
        truth: ctx.truth.clone(),
    };
    let node = Node::open(o, Box::new(store), transport)
        .await
        .map_err(|e| start_err(&ctx.name, e))?;
    if ctx.role == Role::Custodian {
        offer_workload(&ctx, &node).await;
    }
    // Serve until crashed or the simulation ends.
    std::future::pending::<()>().await;
    Ok(())
}

/// The relay's software: the daemon over the host's transport, its clock
/// simulated time, until the host is crashed.
async fn run_relay(
    ctx: &HostCtx,
    transport: Transport,
    clock: TokioClock,
) -> Result<(), Box<dyn std::error::Error>> {
    let spool_path = ctx
        .spool_path
        .clone()
        .ok_or_else(|| start_err(&ctx.name, "relay without a spool path"))?;
    let max_hold = ctx
        .scenario
        .relay
        .as_ref()
        .map_or(Duration::from_secs(24 * 3600), |r| r.max_hold.0);
    let mut limits = SpoolLimits::default();
    limits.max_hold = max_hold;
    let relay = abhyasa_spool::start_with(RelayParts {
        transport,
        serves: ctx.peers.iter().map(|(_, p)| p.agent.clone()).collect(),
        spool_path,
        limits,
        status_path: None,
        clock: Arc::new(move || clock.now()),
    })
    .await
    .map_err(|e| start_err(&ctx.name, e))?;
    // Sample the spool's depth for the report (its status is refreshed on
    // every change).
    let custodians: Vec<&AgentId> = ctx
        .peers
        .iter()
        .filter(|(h, _)| h.starts_with("custodian-"))
        .map(|(_, p)| &p.agent)
        .collect();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let st = relay.status();
        let back: usize = st
            .destinations
            .iter()
            .filter(|d| custodians.contains(&&d.destination))
            .map(|d| d.depth)
            .sum();
        ctx.truth.with(|t| {
            t.relay_spool_peak = t.relay_spool_peak.max(st.frames as u64);
            t.relay_back_peak = t.relay_back_peak.max(back as u64);
        });
    }
}

fn host_index(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

async fn start_transport(ctx: &HostCtx, incarnation: u64) -> Result<Transport, HostError> {
    match ctx.scenario.transport {
        TransportKind::Quic => {
            let socket = turmoil::net::UdpSocket::bind(("0.0.0.0", PORT))
                .await
                .map_err(|e| start_err(&ctx.name, format!("bind udp: {e}")))?;
            let listen = socket.local_addr().map_err(|e| start_err(&ctx.name, e))?;
            let mut config = QuicConfig::new(ctx.agent.clone(), ctx.identity.clone(), listen);
            config.link = link_config();
            config.idle_timeout = Duration::from_secs(10);
            config.keep_alive = Duration::from_secs(2);
            config.connect_timeout = Duration::from_secs(3);
            // turmoil has no path MTU; a jumbo fixed MTU keeps datagram
            // counts independent of ECDSA signature lengths.
            config.fixed_mtu = Some(8_192);
            // Seeded per host and incarnation, so a run replays exactly.
            let mut rng_seed = [0u8; 32];
            let base = super::truth::splitmix(ctx.seed ^ host_index(&ctx.name) ^ incarnation);
            for (i, chunk) in rng_seed.chunks_mut(8).enumerate() {
                chunk.copy_from_slice(&super::truth::splitmix(base + i as u64).to_le_bytes());
            }
            config.dangerous_rng_seed = Some(rng_seed);
            match (&ctx.relay, ctx.role) {
                // Relayed: every node dials out to the relay (an edge needs
                // no public address); the relay dials no one.
                (Some(relay), _) => {
                    let addr = SocketAddr::new(turmoil::lookup(RELAY_HOST), PORT);
                    config = config.with_peer(relay.clone(), Some(addr));
                    // A dial that began while the contact window was shut
                    // gives up soon, so the next one lands inside the window
                    // (the handshake's own retransmission timer starts near
                    // 1 s).
                    config.connect_timeout = Duration::from_millis(500);
                }
                (None, Role::Relay) => {
                    for (_, pin) in &ctx.peers {
                        config = config.with_peer(pin.clone(), None);
                    }
                }
                (None, _) => {
                    for (host, pin) in &ctx.peers {
                        // Custodians dial their receivers; receivers wait.
                        let addr = (ctx.role == Role::Custodian)
                            .then(|| SocketAddr::new(turmoil::lookup(host.as_str()), PORT));
                        config = config.with_peer(pin.clone(), addr);
                    }
                }
            }
            let udp = SimUdp::new(
                socket,
                ctx.dropper.clone(),
                ctx.name.clone(),
                ctx.truth.clone(),
            );
            abhyasa_quic::start_with_socket(config, Arc::new(udp), Arc::new(quinn::TokioRuntime))
                .await
                .map_err(|e| start_err(&ctx.name, e))
        }
        TransportKind::Ws => super::ws::start(ctx, link_config()).await,
    }
}

/// Most earlier frames the hostile transport keeps for replay; past it a
/// random kept frame gives way to the new one.
const REPLAY_MEMORY: usize = 256;

/// Interposes the hostile transport ([`HostileLink`]) on the incoming
/// queue: each frame may be duplicated and followed by a replay of an
/// earlier one, and each copy may be held back for up to `hold_max` while
/// later frames pass. Frames keep the authenticated peer they came from.
fn hostile_link(t: Transport, h: HostileLink, seed: u64, truth: Truth) -> Transport {
    let Transport {
        handle,
        mut incoming,
    } = t;
    let (tx, rx) = tokio::sync::mpsc::channel(4096);
    tokio::spawn(async move {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut seen: Vec<Incoming> = Vec::new();
        while let Some(i) = incoming.recv().await {
            if !matches!(i, Incoming::Frame { .. }) {
                if tx.send(i).await.is_err() {
                    return;
                }
                continue;
            }
            let mut out = vec![i.clone()];
            if rng.random::<f64>() < h.duplicate {
                out.push(i.clone());
                truth.with(|t| t.hostile.duplicated += 1);
            }
            if !seen.is_empty() && rng.random::<f64>() < h.replay {
                out.push(seen[rng.random_range(0..seen.len())].clone());
                truth.with(|t| t.hostile.replayed += 1);
            }
            if seen.len() < REPLAY_MEMORY {
                seen.push(i);
            } else {
                let k = rng.random_range(0..seen.len());
                seen[k] = i;
            }
            for f in out {
                if rng.random::<f64>() < h.hold {
                    let d = h.hold_max.0.mul_f64(rng.random::<f64>());
                    truth.with(|t| t.hostile.held += 1);
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(d).await;
                        let _ = tx.send(f).await;
                    });
                } else if tx.send(f).await.is_err() {
                    return;
                }
            }
        }
    });
    Transport {
        handle,
        incoming: rx,
    }
}

/// Interposes on the incoming queue to count delivered frames by type.
fn count_frames(t: Transport, truth: Truth) -> Transport {
    let Transport {
        handle,
        mut incoming,
    } = t;
    let (tx, rx) = tokio::sync::mpsc::channel(4096);
    tokio::spawn(async move {
        while let Some(i) = incoming.recv().await {
            if let Incoming::Frame { envelope, .. } = &i {
                let kind = match &envelope.message {
                    Message::Obligation(o) if is_best_effort(o) => "obligation_best_effort",
                    Message::Obligation(_) => "obligation",
                    Message::Acks(_) => "acks",
                    Message::StatusQuery(_) => "status_query",
                    Message::StatusReply(_) => "status_reply",
                    Message::Error(_) => "error",
                    Message::Relay(_) => "relay",
                };
                truth.count_frame(kind, envelope.encode().len());
            }
            if tx.send(i).await.is_err() {
                break;
            }
        }
    });
    Transport {
        handle,
        incoming: rx,
    }
}

pub(crate) fn is_best_effort(o: &Obligation) -> bool {
    matches!(
        abhyasa_core::polarity::PolarityRegistry::standard()
            .classify(o)
            .map(|c| c.admission),
        Ok(abhyasa_core::polarity::Admission::BestEffort) | Err(_)
    )
}

/// Offers the host's planned obligations at their times. After a restart
/// it skips what the disk shows was already taken (custody opened or
/// best-effort sent) and offers the rest again: an offer whose commit was
/// lost in the crash was never accepted.
async fn offer_workload(ctx: &HostCtx, node: &Node) {
    for p in ctx.plan.iter() {
        let id = p.obligation.id();
        let taken = ctx.truth.with(|t| {
            t.opened
                .iter()
                .any(|(a, o)| a == &ctx.agent && o.id() == id)
                || t.best_effort
                    .iter()
                    .any(|(a, i)| a == &ctx.agent && i == id)
        });
        if taken {
            continue;
        }
        let elapsed = turmoil::sim_elapsed().unwrap_or_default();
        if p.at > elapsed {
            tokio::time::sleep(p.at - elapsed).await;
        }
        match node.offer(p.obligation.clone()).await {
            Ok(Offered::Custody { .. } | Offered::BestEffort) => {}
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(host = %ctx.name, %id, error = %e, "offer refused");
                ctx.truth.with(|t| t.offers_refused += 1);
            }
        }
    }
}
