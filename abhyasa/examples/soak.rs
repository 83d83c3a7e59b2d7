//! Soak: resident memory of a node pair over a long run with a short
//! retention (C-ND-5). A benchmark, not a test: it prints figures.
//!
//! ```sh
//! cargo run --release -p abhyasa --example soak
//! cargo run --release -p abhyasa --example soak -- --count 1000000 --retention-ms 1000
//! ```
//!
//! Two nodes in one process (alice the custodian, bob the receiver) over
//! the in-memory transport, each durable on its own redb store in a
//! temporary directory, both compacting on a short schedule. Alice offers
//! `--count` Anumati revocations (custody) over `--keys` governed keys in
//! windows of `--window` concurrent transfers and waits for each outcome.
//! Every `--report-every` obligations it prints the process's resident
//! memory (`VmRSS` from `/proc/self/status`) and what the stores still hold.
//! With compaction bounding the terminal records, the ledger and the log,
//! resident memory must plateau once the driver's fixed-size caches (recent
//! outcomes, event ring) have filled; the last line compares the second half
//! of the run with the first.

use std::time::{Duration, Instant};

use abhyasa::{CompactionPolicy, Node, NodeOptions};
use abhyasa_core::custody::TerminalState;
use abhyasa_core::{AgentId, Obligation};
use abhyasa_store::{StoreKind, StoreOptions};
use abhyasa_transport::mem::MemNetwork;
use abhyasa_transport::LinkConfig;
use clap::Parser;
use serde_json::json;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Resident memory of a node pair under a long run.
#[derive(Debug, Parser)]
struct Args {
    /// Obligations in the run.
    #[arg(long, default_value_t = 300_000)]
    count: usize,
    /// Concurrent transfers per window.
    #[arg(long, default_value_t = 2_000)]
    window: usize,
    /// Governed keys the obligations cycle through (per-key principal and
    /// sequence state is bounded by keys, not by obligations).
    #[arg(long, default_value_t = 1_000)]
    keys: usize,
    /// Custody deadline of each obligation, seconds.
    #[arg(long, default_value_t = 10)]
    deadline: i64,
    /// Retention past the deadline, milliseconds. Keep it above the time a
    /// caller may take to ask for an outcome: see the `unknown` column.
    #[arg(long, default_value_t = 5_000)]
    retention_ms: u64,
    /// Compaction interval, milliseconds.
    #[arg(long, default_value_t = 500)]
    interval_ms: u64,
    /// Print a line every this many obligations.
    #[arg(long, default_value_t = 25_000)]
    report_every: usize,
}

/// `VmRSS` in KiB, from `/proc/self/status`.
fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn options(agent: &AgentId, policy: CompactionPolicy) -> NodeOptions {
    let mut o = NodeOptions::new(agent.clone());
    o.compaction = policy;
    // The deadlines are short; keep the receiver's safe-side margin below.
    o.receiver.skew_margin = Duration::from_millis(200);
    o
}

// The node's allocator, as `abhyasa node run` has it (see `abhyasa_alloc`).
#[global_allocator]
static ALLOC: abhyasa_alloc::Allocator = abhyasa_alloc::Allocator;

fn main() -> Result<(), BoxError> {
    abhyasa_alloc::tune();
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(soak(args))
}

async fn soak(args: Args) -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let policy = CompactionPolicy::new(
        Duration::from_millis(args.retention_ms),
        Duration::from_millis(args.interval_ms),
    );
    let (a_id, b_id) = (AgentId::new("alice")?, AgentId::new("bob")?);
    let net = MemNetwork::new(1);
    let open = |name: &str| {
        StoreKind::Redb.open(
            dir.path().join(format!("{name}.redb")),
            &StoreOptions::default(),
        )
    };
    let bob = Node::builder(b_id.clone())
        .options(options(&b_id, policy))
        .boxed_store(open("bob")?)
        .transport(net.join(b_id.clone(), LinkConfig::default()).await?)
        .open()
        .await?;
    let alice = Node::builder(a_id.clone())
        .options(options(&a_id, policy))
        .boxed_store(open("alice")?)
        .transport(net.join(a_id.clone(), LinkConfig::default()).await?)
        .open()
        .await?;

    println!(
        "soak: {} obligations, windows of {}, {} keys, deadline {} s, retention {} ms, compaction every {} ms (redb, in-memory transport)",
        args.count, args.window, args.keys, args.deadline, args.retention_ms, args.interval_ms
    );
    println!(
        "{:>10} {:>8} {:>10} {:>10} {:>8} {:>12} {:>12}",
        "done", "secs", "rss_kib", "applied", "unknown", "alice_terms", "bob_ledger"
    );
    let start = Instant::now();
    let mut samples: Vec<(usize, u64)> = Vec::new();
    let mut applied = 0usize;
    let mut unknown = 0usize;
    let mut done = 0usize;
    let mut next_report = args.report_every;
    while done < args.count {
        let n = args.window.min(args.count - done);
        let mut set = tokio::task::JoinSet::new();
        for i in done..done + n {
            let ob = Obligation::builder()
                .id(format!("soak-{i}"))
                .kind("anumati.consent")
                .target(b_id.as_str())
                .payload(json!({"decision": "revoke", "scope": format!("scope-{}", i % args.keys.max(1))}))
                .deadline_seconds(args.deadline)
                .max_retries(64)
                .created_at(alice.now())
                .build()?;
            let alice = alice.clone();
            set.spawn(async move {
                let id = ob.id().clone();
                alice.offer(ob).await?;
                match alice.outcome(&id).await {
                    Ok(o) => Ok(Some(o.state)),
                    // Compacted before the caller asked (retention shorter
                    // than the caller's delay): counted, not fatal.
                    Err(abhyasa::NodeError::UnknownObligation(_)) => Ok(None),
                    Err(e) => Err(e),
                }
            });
        }
        while let Some(r) = set.join_next().await {
            match r?? {
                Some(TerminalState::Applied) => applied += 1,
                Some(_) => {}
                None => unknown += 1,
            }
        }
        done += n;
        if done >= next_report || done == args.count {
            next_report += args.report_every;
            let rss = rss_kib().unwrap_or(0);
            let terms = alice.durable_state().await?.custodian.terminal.len();
            let ledger = bob.durable_state().await?.receiver.ledger.len();
            println!(
                "{done:>10} {:>8.1} {rss:>10} {applied:>10} {unknown:>8} {terms:>12} {ledger:>12}",
                start.elapsed().as_secs_f64()
            );
            samples.push((done, rss));
        }
    }
    let half = samples.len() / 2;
    if half > 0 {
        let first = samples[..half].iter().map(|s| s.1).max().unwrap_or(0);
        let second = samples[half..].iter().map(|s| s.1).max().unwrap_or(0);
        println!(
            "peak rss first half {first} KiB, second half {second} KiB ({:+.1} %)",
            (second as f64 - first as f64) / first.max(1) as f64 * 100.0
        );
    }
    alice.shutdown().await?;
    bob.shutdown().await?;
    Ok(())
}
