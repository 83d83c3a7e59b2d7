//! The longest single insert into a map that grows with traffic: one
//! `HashMap` (`abhyasa_core::Map`) against the [`ShardedMap`] the state
//! machines keep their growing state in.
//!
//! Entries are the size of a receiver's ledger entry (a key of two ids, a
//! 152-byte value); each step reads one key and inserts a new one, as a
//! receiver's deduplication does. Prints, per map, the total time, the
//! mean per step, the longest step and how many steps took over 1 ms and
//! over 5 ms.
//!
//! ```text
//! cargo run --release -p abhyasa --example map_growth -- --count 1000000
//! ```

use std::time::{Duration, Instant};

use abhyasa_core::{Map, ShardedMap};
use clap::Parser;

#[global_allocator]
static ALLOC: abhyasa_alloc::Allocator = abhyasa_alloc::Allocator;

#[derive(Parser)]
#[command(about = "Longest insert into a growing map: HashMap against ShardedMap")]
struct Args {
    /// Entries inserted into each map.
    #[arg(long, default_value_t = 1_000_000)]
    count: usize,
    /// Which map: `sharded`, `hash`, or `both` (sharded first, then the
    /// plain map on the heap the first left: run one per process for a
    /// fair comparison).
    #[arg(long, default_value = "both")]
    map: String,
    /// One JSON object per map instead of a line of text.
    #[arg(long)]
    json: bool,
}

/// A ledger entry's size (`size_of` of the receiver's `Entry`).
type Value = [u64; 19];
type Key = (String, String);

/// Grows one map by `step` (look `seen` up, insert the new key; whether
/// `seen` was there) `count` times, timing each step.
fn run(name: &str, count: usize, json: bool, mut step: impl FnMut(&Key, Key, Value) -> bool) {
    let (mut worst, mut over_1ms, mut over_5ms, mut hits) = (Duration::ZERO, 0u64, 0u64, 0u64);
    let mut in_map = Duration::ZERO;
    for i in 0..count {
        // Build the keys outside the timed step: only the map is measured.
        let k = ("alice".to_string(), format!("obligation-{i:012}"));
        let seen = ("alice".to_string(), format!("obligation-{:012}", i / 2));
        let t = Instant::now();
        hits += u64::from(step(&seen, k, [i as u64; 19]));
        let took = t.elapsed();
        in_map += took;
        worst = worst.max(took);
        over_1ms += u64::from(took > Duration::from_millis(1));
        over_5ms += u64::from(took > Duration::from_millis(5));
    }
    let mean_ns = in_map.as_nanos() as f64 / count.max(1) as f64;
    let worst_ms = worst.as_secs_f64() * 1e3;
    if json {
        println!(
            "{{\"map\":\"{}\",\"count\":{count},\"total_ms\":{:.1},\"mean_ns\":{mean_ns:.0},\"worst_ms\":{worst_ms:.3},\"over_1ms\":{over_1ms},\"over_5ms\":{over_5ms},\"hits\":{hits}}}",
            name,
            in_map.as_secs_f64() * 1e3
        );
    } else {
        println!(
            "{:<10} {count} entries: {:>8.1} ms in the map, {mean_ns:>5.0} ns per step, longest step {worst_ms:>8.3} ms, {over_1ms} over 1 ms, {over_5ms} over 5 ms",
            name,
            in_map.as_secs_f64() * 1e3
        );
    }
}

fn main() {
    abhyasa_alloc::tune();
    let args = Args::parse();
    // With `both` the sharded map runs first, on a cold heap; the plain
    // map after it reuses the memory the first one freed, so the
    // comparison leans, if anything, towards the plain map.
    if matches!(args.map.as_str(), "sharded" | "both") {
        let mut m = ShardedMap::<Key, Value>::new();
        run("ShardedMap", args.count, args.json, |seen, k, v| {
            let hit = m.contains_key(seen);
            m.insert(k, v);
            hit
        });
    }
    if matches!(args.map.as_str(), "hash" | "both") {
        let mut m = Map::<Key, Value>::default();
        run("HashMap", args.count, args.json, |seen, k, v| {
            let hit = m.contains_key(seen);
            m.insert(k, v);
            hit
        });
    }
    if !matches!(args.map.as_str(), "sharded" | "hash" | "both") {
        eprintln!("--map: sharded, hash or both, not {:?}", args.map);
        std::process::exit(2);
    }
}
