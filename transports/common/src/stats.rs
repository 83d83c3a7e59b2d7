//! Counters a transport keeps for the runtime's metrics.

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of a transport's counters since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransportStats {
    /// Authenticated connections attached (both directions).
    pub connections: u64,
    /// Inbound connections refused (handshake, authentication, timeout).
    pub refused: u64,
    /// Dial attempts that produced no authenticated connection.
    pub dial_failures: u64,
    /// Frames queued by `send`.
    pub frames_sent: u64,
    /// Frames delivered to the runtime as `Incoming::Frame`.
    pub frames_received: u64,
    /// Frames reported as `Incoming::Malformed`.
    pub malformed: u64,
    /// Frames reported as `Incoming::Unauthorized`.
    pub unauthorized: u64,
}

impl TransportStats {
    /// Field-by-field sum (several transports seen as one).
    pub(crate) fn plus(&self, o: &Self) -> Self {
        Self {
            connections: self.connections + o.connections,
            refused: self.refused + o.refused,
            dial_failures: self.dial_failures + o.dial_failures,
            frames_sent: self.frames_sent + o.frames_sent,
            frames_received: self.frames_received + o.frames_received,
            malformed: self.malformed + o.malformed,
            unauthorized: self.unauthorized + o.unauthorized,
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) connections: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) dial_failures: AtomicU64,
    pub(crate) frames_sent: AtomicU64,
    pub(crate) frames_received: AtomicU64,
    pub(crate) malformed: AtomicU64,
    pub(crate) unauthorized: AtomicU64,
}

pub(crate) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    pub(crate) fn snapshot(&self) -> TransportStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        TransportStats {
            connections: get(&self.connections),
            refused: get(&self.refused),
            dial_failures: get(&self.dial_failures),
            frames_sent: get(&self.frames_sent),
            frames_received: get(&self.frames_received),
            malformed: get(&self.malformed),
            unauthorized: get(&self.unauthorized),
        }
    }
}
