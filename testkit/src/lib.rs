//! Support shared by the workspace's tests: free loopback ports (below),
//! what a benchmark reads of its own process ([`proc_stat`]) and, with the
//! `props` feature, the obligation strategies of the property tests
//! (`props`); with `store`, the storage tests' backends and two-node world
//! (`store_world`); with `pg`, the same on PostgreSQL (`pg_backend`) and
//! a throwaway PostgreSQL cluster (`pg_cluster`).
//!
//! Tests that fix a listening port before the listener exists (a node's
//! config names its peer's endpoint, a restarted node must come back on
//! the same port, PostgreSQL is told its port on the command line) need a
//! port that stays free between the asking and the binding. A port the
//! kernel handed out for `bind(…:0)` does not: once the probe closes it,
//! the kernel may hand the same port to any other socket — another test's
//! `:0` listener, or an outgoing connection's source port — and the node's
//! bind then fails with "Address already in use" (seen in CI: an HTTP
//! listener of the conformance suite).
//!
//! [`loopback_port`] therefore picks below the kernel's ephemeral range,
//! where the kernel never allocates on its own, and probes the port for
//! both TCP and UDP so a node can listen on it with QUIC, WebSocket or
//! HTTP. Within a process a counter keeps two callers from being given
//! the same port before either binds; across processes the starting point
//! is spread by process id and time, and the probe skips ports in use.

#[cfg(feature = "pg")]
pub mod pg_backend;
#[cfg(feature = "pg")]
pub mod pg_cluster;
pub mod proc_stat;
#[cfg(feature = "props")]
pub mod props;
#[cfg(feature = "store")]
pub mod store_world;

use std::net::{TcpListener, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The lowest port picked (1,024 instead where the ephemeral range starts
/// below `LOW + 1,000`).
const LOW: u16 = 20_000;
/// Linux's default lower bound of the ephemeral range.
const DEFAULT_EPHEMERAL_LOW: u16 = 32_768;

/// The lower bound of the kernel's ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`), or Linux's default when it
/// cannot be read.
pub fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(DEFAULT_EPHEMERAL_LOW)
}

/// A loopback port free for both TCP and UDP at the time of asking,
/// below the kernel's ephemeral range, and not given to another caller in
/// this process.
///
/// # Panics
///
/// When the ephemeral range leaves fewer than 1,000 ports below it above
/// 1,024 (a machine configured so cannot run these tests without
/// collisions), or when every candidate is in use.
pub fn loopback_port() -> u16 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    // One range and one starting point per process: every caller walks
    // the same sequence, each from its own step of it.
    static WALK: OnceLock<(u16, u64)> = OnceLock::new();
    let (high, start) = *WALK.get_or_init(|| {
        let seed = u64::from(std::process::id())
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::from(d.subsec_nanos()));
        (ephemeral_low(), seed.wrapping_mul(2_654_435_761))
    });
    pick(high, start, &NEXT)
}

/// The first port of the walk from `start` (counted by `next`) below
/// `high` that binds for both TCP and UDP.
fn pick(high: u16, start: u64, next: &AtomicU64) -> u16 {
    let low = if high >= LOW + 1_000 { LOW } else { 1_024 };
    assert!(
        high >= low + 1_000,
        "the ephemeral range starts at {high}: too few ports below it for tests"
    );
    let span = u64::from(high - low);
    let step = step(span);
    for _ in 0..span {
        let n = next.fetch_add(1, Ordering::Relaxed);
        let offset = start.wrapping_add(n.wrapping_mul(step)) % span;
        let port = low + u16::try_from(offset).unwrap_or(0);
        let udp = UdpSocket::bind(("127.0.0.1", port));
        let tcp = TcpListener::bind(("127.0.0.1", port));
        if udp.is_ok() && tcp.is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {low}..{high}")
}

/// A step of the walk over `span` ports: coprime with it, so the walk
/// visits every port before repeating.
fn step(span: u64) -> u64 {
    [7_919, 7_907, 7_901]
        .into_iter()
        .find(|s| gcd(*s, span) == 1)
        .unwrap_or(1)
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn ports_are_below_the_ephemeral_range_and_bindable() {
        let high = ephemeral_low();
        for _ in 0..50 {
            let p = loopback_port();
            assert!(p < high, "{p} is in the ephemeral range (from {high})");
            assert!(p >= 1_024, "{p} is privileged");
            TcpListener::bind(("127.0.0.1", p)).expect("tcp");
            UdpSocket::bind(("127.0.0.1", p)).expect("udp");
        }
    }

    #[test]
    fn callers_are_not_given_the_same_port() {
        let ports: Vec<u16> = (0..200).map(|_| loopback_port()).collect();
        let distinct: HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
    }

    #[test]
    fn a_port_in_use_is_skipped() {
        // The same walk twice: the second, finding the first's port held,
        // moves on to another.
        let start = 12_345;
        let first = pick(ephemeral_low(), start, &AtomicU64::new(0));
        let _held = TcpListener::bind(("127.0.0.1", first)).expect("free");
        let second = pick(ephemeral_low(), start, &AtomicU64::new(0));
        assert_ne!(first, second);
        let _held_udp = UdpSocket::bind(("127.0.0.1", second)).expect("free");
        let third = pick(ephemeral_low(), start, &AtomicU64::new(0));
        assert!(
            third != first && third != second,
            "{first} {second} {third}"
        );
    }

    #[test]
    fn the_walk_visits_every_port() {
        for span in [12_768u64, 7_919 * 2, 1_000] {
            let step = step(span);
            let seen: HashSet<u64> = (0..span).map(|n| (n * step) % span).collect();
            assert_eq!(seen.len() as u64, span);
        }
    }
}
