//! Custody throughput and latency over loopback QUIC, durable on both ends.
//!
//! ```sh
//! cargo run --release -p abhyasa --example throughput             # every embedded store
//! cargo run --release -p abhyasa --example throughput -- --store redb --count 100000
//! ```
//!
//! Two nodes in one process (alice the custodian, bob the receiver), each
//! with its own store in a temporary directory and its own QUIC endpoint
//! with mutual TLS and pinned keys. For each store it prints:
//!
//! - **custody saturation**: `--count` Phala corrective updates (custody
//!   mode) offered by `--concurrency` concurrent callers; obligations/s is
//!   `count` over the time from the first offer until alice has been told
//!   of every application (the custody acks are durable on both sides);
//! - **best-effort saturation**: the same number of Phala reinforcing
//!   updates (same kind, same payload size, benign side: sent once, never
//!   under custody); obligations/s is `count` over the time until bob has
//!   applied them all. The ratio of the two is the custody overhead;
//! - **latency at a paced load**: custody obligations offered at `--rate`
//!   per second for `--seconds`; p50/p99/max from the caller's `offer` to
//!   alice's `Applied` event (offer commit, QUIC round trip, bob's commit,
//!   ack, alice's close commit).
//!
//! Both nodes share the machine's cores with the benchmark itself.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use abhyasa::{Node, NodeEvent, NodeOptions};
use abhyasa_core::custody::CustodianEvent;
use abhyasa_core::{AgentId, Obligation, ObligationId};
use abhyasa_identity::generate_identity;
use abhyasa_quic::QuicConfig;
use abhyasa_store::{StoreKind, StoreOptions};
use clap::Parser;
use serde_json::json;

use abhyasa_testkit::proc_stat::cpu_secs;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Custody throughput and latency over loopback QUIC.
#[derive(Debug, Parser)]
struct Args {
    /// Store: redb, sled, log, fjall, all (those four) or postgres.
    #[arg(long, default_value = "all")]
    store: String,
    /// The database of `--store postgres` (default: env ABHYASA_PG_URL).
    #[arg(long)]
    postgres_url: Option<String>,
    /// Obligations per saturation run.
    #[arg(long, default_value_t = 50_000)]
    count: usize,
    /// Custody obligations run through a throwaway pair before anything is
    /// measured (0: none). A node that has been running has its heap:
    /// without this the first run pays for faulting in and zeroing every
    /// page the nodes grow into (~6% of its CPU in `clear_page` alone,
    /// perf), and the runs after it do not — the brokers of
    /// `benches/peers` are long-running processes, warm from their first
    /// round on. The warm-up's own rate is reported as `custody_cold_per_s`.
    /// Default: `--count`.
    #[arg(long)]
    warmup: Option<usize>,
    /// Concurrent callers of `offer` at saturation.
    #[arg(long, default_value_t = 512)]
    concurrency: usize,
    /// Offered load of the latency run, obligations/s.
    #[arg(long, default_value_t = 10_000)]
    rate: u64,
    /// Duration of the latency run, seconds.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Installs a log subscriber at this level (as `abhyasa node run
    /// --log-level` does), writing to a sink: what the node's own logging
    /// costs per obligation. Default: no subscriber.
    #[arg(long)]
    log: Option<String>,
    /// One JSON object per store instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, serde::Serialize)]
struct Figures {
    store: String,
    count: usize,
    custody_per_s: f64,
    /// The warm-up's custody rate (a fresh process's first run), or NaN
    /// without one.
    custody_cold_per_s: f64,
    best_effort_per_s: f64,
    custody_overhead: f64,
    /// CPU time of the whole process (both nodes, QUIC, the callers)
    /// during the custody run, per obligation, µs: steadier than the rate
    /// on a shared machine (Linux; NaN elsewhere).
    custody_cpu_us: f64,
    /// The same for the best-effort run.
    best_effort_cpu_us: f64,
    best_effort_applied: u64,
    latency_rate: u64,
    latency_offered: usize,
    latency_achieved_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    commits_alice: u64,
    mean_commit_records_alice: f64,
    /// Mean time of alice's store thread per commit (apply, write, sync), µs.
    mean_commit_us_alice: f64,
    commits_bob: u64,
    mean_commit_records_bob: f64,
    mean_commit_us_bob: f64,
    /// Frames the transport refused (queue full) during the custody run.
    frames_unsent_alice: u64,
    /// Custody retries sent during the custody run.
    retries_alice: u64,
}

/// Where the two nodes keep their custody.
#[derive(Debug, Clone)]
enum Backend {
    /// An embedded store in a temporary directory.
    Embedded(StoreKind),
    /// A PostgreSQL database (`--postgres-url` or `ABHYASA_PG_URL`): each
    /// run's two agents get fresh partitions.
    Postgres(String),
}

impl Backend {
    fn name(&self) -> &str {
        match self {
            Backend::Embedded(k) => k.as_str(),
            Backend::Postgres(_) => "postgres",
        }
    }
}

// The node's allocator, as `abhyasa node run` has it (see `abhyasa_alloc`).
#[global_allocator]
static ALLOC: abhyasa_alloc::Allocator = abhyasa_alloc::Allocator;

fn main() -> Result<(), BoxError> {
    abhyasa_alloc::tune();
    let args = Args::parse();
    if let Some(level) = &args.log {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::try_new(level)?)
            .with_writer(std::io::sink)
            .init();
    }
    let stores = match args.store.as_str() {
        "all" => vec![
            Backend::Embedded(StoreKind::Fjall),
            Backend::Embedded(StoreKind::Redb),
            Backend::Embedded(StoreKind::Sled),
            Backend::Embedded(StoreKind::Log),
        ],
        "postgres" => {
            let url = args
                .postgres_url
                .clone()
                .or_else(|| std::env::var(abhyasa_pg::URL_ENV).ok())
                .ok_or("--store postgres needs --postgres-url or ABHYASA_PG_URL")?;
            vec![Backend::Postgres(url)]
        }
        s => vec![Backend::Embedded(
            s.parse::<StoreKind>()
                .map_err(|e| format!("--store: {e} (or \"postgres\")"))?,
        )],
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    for kind in stores {
        let f = rt.block_on(bench(kind, &args))?;
        if args.json {
            println!("{}", serde_json::to_string(&f)?);
        } else {
            print(&f);
        }
    }
    Ok(())
}

fn print(f: &Figures) {
    println!(
        "store {} ({} obligations per saturation run)",
        f.store, f.count
    );
    println!(
        "  custody mode      {:>10.0} obligations/s",
        f.custody_per_s
    );
    if !f.custody_cold_per_s.is_nan() {
        println!(
            "  custody, cold     {:>10.0} obligations/s  (the warm-up: a fresh process's first run)",
            f.custody_cold_per_s
        );
    }
    println!(
        "  best-effort mode  {:>10.0} obligations/s  ({} of {} applied)",
        f.best_effort_per_s, f.best_effort_applied, f.count
    );
    println!("  custody overhead  {:>10.2}x", f.custody_overhead);
    println!(
        "  CPU per obligation (whole process): custody {:.1} µs, best-effort {:.1} µs",
        f.custody_cpu_us, f.best_effort_cpu_us
    );
    println!(
        "  latency at {}/s offered ({} offers, {:.0}/s achieved): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        f.latency_rate, f.latency_offered, f.latency_achieved_per_s, f.p50_ms, f.p99_ms, f.max_ms
    );
    println!(
        "  alice (custody run): {} commits, {:.1} records per commit, {} retries, {} frames refused by a full send queue",
        f.commits_alice, f.mean_commit_records_alice, f.retries_alice, f.frames_unsent_alice
    );
    println!(
        "  store commits (custody run): alice {:.0} µs each, bob {} commits of {:.1} records, {:.0} µs each",
        f.mean_commit_us_alice, f.commits_bob, f.mean_commit_records_bob, f.mean_commit_us_bob
    );
}

struct Pair {
    alice: Node,
    bob: Node,
    bob_id: AgentId,
    _dir: tempfile::TempDir,
}

async fn pair(backend: &Backend) -> Result<Pair, BoxError> {
    let dir = tempfile::tempdir()?;
    // On PostgreSQL every pair gets fresh partitions (the agent id is the
    // partition), so runs never see each other's rows.
    let suffix = match backend {
        Backend::Embedded(_) => String::new(),
        Backend::Postgres(_) => format!(
            "-{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_micros()
        ),
    };
    let (a_id, b_id) = (
        AgentId::new(format!("alice{suffix}"))?,
        AgentId::new(format!("bob{suffix}"))?,
    );
    let (a_ident, b_ident) = (generate_identity(&a_id)?, generate_identity(&b_id)?);
    let open = async |name: &AgentId| -> Result<Box<dyn abhyasa_core::store::Store>, BoxError> {
        Ok(match backend {
            Backend::Embedded(kind) => {
                let path = dir.path().join(format!("{name}.{}", kind.as_str()));
                kind.open(path, &StoreOptions::default())?
            }
            // The synchronous client runs its own runtime: off this one.
            Backend::Postgres(url) => {
                let (url, name) = (url.clone(), name.clone());
                Box::new(
                    tokio::task::spawn_blocking(move || {
                        abhyasa_pg::PgStore::open(&url, &name, &abhyasa_pg::PgOptions::default())
                    })
                    .await??,
                )
            }
        })
    };
    let b_cfg = QuicConfig::new(b_id.clone(), b_ident.clone(), "127.0.0.1:0".parse()?)
        .with_peer(a_ident.pin(a_id.clone()), None);
    let b_transport = abhyasa_quic::start(b_cfg).await?;
    let b_addr = b_transport
        .handle
        .local_addr()
        .ok_or("bob has no address")?;
    let bob = Node::open(
        NodeOptions::new(b_id.clone()),
        open(&b_id).await?,
        b_transport,
    )
    .await?;
    let a_cfg = QuicConfig::new(a_id.clone(), a_ident, "127.0.0.1:0".parse()?)
        .with_peer(b_ident.pin(b_id.clone()), Some(b_addr));
    let a_store = open(&a_id).await?;
    let alice = Node::open(
        NodeOptions::new(a_id),
        a_store,
        abhyasa_quic::start(a_cfg).await?,
    )
    .await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !alice.is_connected(&b_id) {
        if Instant::now() > deadline {
            return Err("the QUIC link did not come up within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(Pair {
        alice,
        bob,
        bob_id: b_id,
        _dir: dir,
    })
}

/// A Phala update on its own key: corrective (custody) when `delta < 0`,
/// reinforcing (best-effort) otherwise. Same size either way.
fn update(p: &Pair, id: String, delta: f64) -> Result<Obligation, BoxError> {
    let key = format!("k.{id}");
    Ok(Obligation::builder()
        .id(id)
        .kind("phala.belief_update")
        .target(p.bob_id.as_str())
        .payload(json!({"weight_delta": delta, "weight_key": key}))
        .deadline_seconds(600)
        .max_retries(64)
        .created_at(p.alice.now())
        .build()?)
}

/// Offers `count` obligations from `concurrency` callers; returns when
/// every offer has been accepted.
async fn offer_all(
    p: &Arc<Pair>,
    prefix: &'static str,
    count: usize,
    concurrency: usize,
    delta: f64,
) -> Result<(), BoxError> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (p, next) = (p.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return Ok::<(), BoxError>(());
                }
                let ob = update(&p, format!("{prefix}-{i}"), delta)?;
                p.alice.offer(ob).await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

async fn wait_until(
    what: &str,
    mut done: impl AsyncFnMut() -> Result<bool, BoxError>,
) -> Result<(), BoxError> {
    let limit = Instant::now() + Duration::from_secs(300);
    while !done().await? {
        if Instant::now() > limit {
            return Err(format!("timed out waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// Offers `count` custody obligations (ids `{prefix}-{i}`) and waits
/// until alice has seen every one applied: the seconds that took and the
/// process's CPU seconds over them.
async fn custody_run(
    p: &Arc<Pair>,
    prefix: &'static str,
    count: usize,
    concurrency: usize,
) -> Result<(f64, f64), BoxError> {
    let base = p.alice.metrics().await?.applied;
    let (t0, cpu0) = (Instant::now(), cpu_secs());
    offer_all(p, prefix, count, concurrency, -0.1).await?;
    let target = base + count as u64;
    wait_until("custody applications", async || {
        Ok(p.alice.metrics().await?.applied >= target)
    })
    .await?;
    Ok((t0.elapsed().as_secs_f64(), cpu_secs() - cpu0))
}

async fn bench(kind: Backend, args: &Args) -> Result<Figures, BoxError> {
    let n = args.count;

    // Warm-up: a custody run on a pair of its own, then shut down, so the
    // measured pairs below start on a warm heap (see `Args::warmup`).
    let warmup = args.warmup.unwrap_or(n);
    let custody_cold_per_s = if warmup > 0 {
        let p = Arc::new(pair(&kind).await?);
        let (secs, _) = custody_run(&p, "warm", warmup, args.concurrency).await?;
        shutdown(p).await?;
        warmup as f64 / secs
    } else {
        f64::NAN
    };

    // Custody saturation.
    let p = Arc::new(pair(&kind).await?);
    let (custody_s, custody_cpu_s) = custody_run(&p, "cu", n, args.concurrency).await?;
    let custody_cpu_us = custody_cpu_s * 1e6 / n as f64;
    let m = p.alice.metrics().await?;
    let b = p.bob.metrics().await?;
    let frames_unsent_alice = m.frames_unsent;
    let retries_alice = m.attempts_sent.saturating_sub(m.opened);
    shutdown(p).await?;

    // Best-effort saturation, on a fresh pair.
    let p = Arc::new(pair(&kind).await?);
    let base = p.bob.metrics().await?.receiver_applied;
    let (t0, cpu0) = (Instant::now(), cpu_secs());
    offer_all(&p, "be", n, args.concurrency, 0.1).await?;
    let target = base + n as u64;
    // Best-effort is fire-and-forget: stop waiting once bob stops moving.
    let mut last = (0, Instant::now());
    let mut cpu_at_last = cpu0;
    wait_until("best-effort applications", async || {
        let got = p.bob.metrics().await?.receiver_applied;
        if got != last.0 {
            last = (got, Instant::now());
            cpu_at_last = cpu_secs();
        }
        Ok(got >= target || last.1.elapsed() > Duration::from_secs(5))
    })
    .await?;
    let be_applied = p.bob.metrics().await?.receiver_applied - base;
    // Up to the last application, not the 5 s of quiet that confirmed it.
    let be_cpu_us = (cpu_at_last - cpu0) * 1e6 / be_applied.max(1) as f64;
    let be_s = last.1.duration_since(t0).as_secs_f64().max(1e-9);
    shutdown(p).await?;

    // Latency at a paced load, on a fresh pair.
    let p = Arc::new(pair(&kind).await?);
    let total = usize::try_from(args.rate * args.seconds)?;
    let started: Arc<Mutex<HashMap<ObligationId, Instant>>> = Arc::default();
    let mut events = p.alice.subscribe();
    let collector = {
        let started = started.clone();
        tokio::spawn(async move {
            let mut lat = Vec::with_capacity(total);
            while lat.len() < total {
                match events.recv().await {
                    Ok(NodeEvent::Custodian(CustodianEvent::Applied { obligation_id, .. })) => {
                        let t = started
                            .lock()
                            .map_err(|_| "poisoned")?
                            .remove(&obligation_id);
                        if let Some(t) = t {
                            lat.push(t.elapsed());
                        }
                    }
                    Ok(_) => {}
                    Err(e) => return Err::<Vec<Duration>, BoxError>(format!("events: {e}").into()),
                }
            }
            Ok(lat)
        })
    };
    let per_tick = (args.rate / 1000).max(1);
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 * per_tick / args.rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let t0 = Instant::now();
    let mut offers = Vec::with_capacity(total);
    let mut i = 0;
    while i < total {
        tick.tick().await;
        for _ in 0..per_tick {
            if i == total {
                break;
            }
            let ob = update(&p, format!("lat-{i}"), -0.1)?;
            started
                .lock()
                .map_err(|_| "poisoned")?
                .insert(ob.id().clone(), Instant::now());
            let p = p.clone();
            offers.push(tokio::spawn(async move { p.alice.offer(ob).await }));
            i += 1;
        }
    }
    let offered_s = t0.elapsed().as_secs_f64();
    for o in offers {
        o.await??;
    }
    let mut lat = tokio::time::timeout(Duration::from_secs(300), collector).await???;
    lat.sort();
    let pct = |q: f64| {
        let at = ((lat.len() as f64 * q).ceil() as usize).clamp(1, lat.len()) - 1;
        lat[at].as_secs_f64() * 1e3
    };
    let figures = Figures {
        store: kind.name().to_string(),
        count: n,
        custody_per_s: n as f64 / custody_s,
        custody_cold_per_s,
        best_effort_per_s: be_applied as f64 / be_s,
        custody_overhead: (be_applied as f64 / be_s) / (n as f64 / custody_s),
        custody_cpu_us,
        best_effort_cpu_us: be_cpu_us,
        best_effort_applied: be_applied,
        latency_rate: args.rate,
        latency_offered: total,
        latency_achieved_per_s: total as f64 / offered_s,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        max_ms: pct(1.0),
        commits_alice: m.commits,
        mean_commit_records_alice: m.commit_batch_records.mean(),
        mean_commit_us_alice: m.commit_latency_us.mean(),
        commits_bob: b.commits,
        mean_commit_records_bob: b.commit_batch_records.mean(),
        mean_commit_us_bob: b.commit_latency_us.mean(),
        frames_unsent_alice,
        retries_alice,
    };
    shutdown(p).await?;
    Ok(figures)
}

async fn shutdown(p: Arc<Pair>) -> Result<(), BoxError> {
    p.alice.shutdown().await?;
    p.bob.shutdown().await?;
    Ok(())
}
