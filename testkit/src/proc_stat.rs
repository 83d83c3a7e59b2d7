//! What a benchmark reads of its own process from `/proc` (Linux), for
//! `abhyasa-store`'s `store_bench` and the node's `throughput` example.

/// CPU time (user + system) of this process so far, in seconds, from
/// `/proc/self/stat` (10 ms ticks); NaN where there is none.
pub fn cpu_secs() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
            Some(ticks as f64 / 100.0)
        })
        .unwrap_or(f64::NAN)
}
