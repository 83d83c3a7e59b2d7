//! Where the node's `now` comes from. The core never reads a clock; the
//! node reads exactly one, here.

use std::time::{SystemTime, UNIX_EPOCH};

use abhyasa_core::Timestamp;

/// A source of `now`.
pub trait Clock: Send + Sync + 'static {
    /// The current instant.
    fn now(&self) -> Timestamp;
}

/// The system wall clock (the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        Timestamp::from_unix_micros(us)
    }
}

/// A clock that advances with tokio's time from a fixed start: under a
/// paused or simulated tokio clock (tests, turmoil) the node sees simulated
/// time.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    start: Timestamp,
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// Starts at `start` now.
    pub fn starting_at(start: Timestamp) -> Self {
        Self {
            start,
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        self.start.saturating_add(self.origin.elapsed())
    }
}
