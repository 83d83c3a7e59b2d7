//! Capped exponential reconnect backoff with jitter.

use std::time::Duration;

use rand::{Rng as _, SeedableRng as _};
use rand_chacha::ChaCha8Rng;

/// Reconnect schedule: `initial`, doubling per failed attempt up to `max`,
/// each delay drawn uniformly from its upper half (`[d/2, d]`) so that
/// peers that lost each other at the same moment do not redial in
/// lock-step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Delay before the first redial. Default 100 ms.
    pub initial: Duration,
    /// Cap on the delay. Default 10 s.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(10),
        }
    }
}

impl Backoff {
    /// A schedule whose jitter is drawn from `seed`.
    pub fn schedule(&self, seed: u64) -> BackoffSchedule {
        BackoffSchedule {
            backoff: *self,
            attempt: 0,
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }
}

/// The state of one peer's reconnect schedule.
#[derive(Debug, Clone)]
pub struct BackoffSchedule {
    backoff: Backoff,
    attempt: u32,
    rng: ChaCha8Rng,
}

impl BackoffSchedule {
    /// The delay before the next attempt; each call doubles the base until
    /// the cap.
    pub fn next_delay(&mut self) -> Duration {
        let Backoff { initial, max } = self.backoff;
        let base = initial
            .checked_mul(1u32 << self.attempt.min(31))
            .unwrap_or(max)
            .min(max);
        self.attempt = self.attempt.saturating_add(1);
        let half = base / 2;
        let spread = u64::try_from((base - half).as_micros()).unwrap_or(u64::MAX);
        let extra = if spread == 0 {
            0
        } else {
            self.rng.random_range(0..=spread)
        };
        half + Duration::from_micros(extra)
    }

    /// Back to the initial delay (after a connection was established).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_with_jitter_in_the_upper_half() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        let mut s = b.schedule(7);
        let bases = [100u64, 200, 400, 800, 1000, 1000, 1000];
        for base in bases {
            let d = s.next_delay();
            let base = Duration::from_millis(base);
            assert!(
                d >= base / 2 && d <= base,
                "{d:?} not in [{:?}, {base:?}]",
                base / 2
            );
        }
        s.reset();
        assert!(s.next_delay() <= Duration::from_millis(100));
    }

    #[test]
    fn jitter_is_seeded() {
        let b = Backoff::default();
        let run = |seed| {
            let mut s = b.schedule(seed);
            (0..10).map(|_| s.next_delay()).collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
    }

    #[test]
    fn huge_attempt_counts_saturate_at_the_cap() {
        let b = Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(5),
        };
        let mut s = b.schedule(0);
        for _ in 0..100 {
            assert!(s.next_delay() <= Duration::from_secs(5));
        }
    }
}
