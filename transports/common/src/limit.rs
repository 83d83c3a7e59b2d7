//! Bounds on what unauthenticated peers can make a transport hold, and on
//! how loudly their faults are logged (C-ND-5).
//!
//! [`HandshakeSlots`] caps the connections a listener holds before the peer
//! is authenticated: each inbound handshake takes a slot for as long as it
//! is in flight, and one arriving while every slot is taken is refused at
//! once instead of queued. [`WarnLimiter`] lets a peer-caused warning through
//! at most `burst` times per window and counts the rest, so a flood of bad
//! handshakes or frames cannot flood the log.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Default cap on handshakes in flight per listener: 64.
pub const DEFAULT_MAX_HANDSHAKES: usize = 64;

/// Slots for inbound handshakes in flight. Cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct HandshakeSlots {
    slots: Arc<Semaphore>,
    max: usize,
}

/// A taken slot; dropping it frees the slot (when the peer is
/// authenticated or the handshake failed).
#[derive(Debug)]
pub struct HandshakeSlot(#[allow(dead_code)] OwnedSemaphorePermit);

impl HandshakeSlots {
    /// `max` slots (at least one).
    pub fn new(max: usize) -> Self {
        let max = max.max(1);
        Self {
            slots: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    /// A slot if one is free; `None` means refuse the connection now.
    pub fn try_take(&self) -> Option<HandshakeSlot> {
        self.slots
            .clone()
            .try_acquire_owned()
            .ok()
            .map(HandshakeSlot)
    }

    /// The cap.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Slots taken now.
    pub fn in_flight(&self) -> usize {
        self.max - self.slots.available_permits()
    }
}

/// Lets a warning through at most `burst` times per `window`; counts the
/// ones it held back and reports them with the next one let through.
#[derive(Debug)]
pub struct WarnLimiter {
    burst: u32,
    window: Duration,
    state: Mutex<WarnState>,
}

#[derive(Debug)]
struct WarnState {
    window_start: Option<Instant>,
    in_window: u32,
    suppressed: u64,
}

impl WarnLimiter {
    /// At most `burst` warnings per `window`.
    pub fn new(burst: u32, window: Duration) -> Self {
        Self {
            burst,
            window,
            state: Mutex::new(WarnState {
                window_start: None,
                in_window: 0,
                suppressed: 0,
            }),
        }
    }

    /// Whether to log now (at `now`): `Some(n)` with the number held back
    /// since the last one logged, `None` to stay quiet.
    pub fn allow_at(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = s
            .window_start
            .is_none_or(|t| now.saturating_duration_since(t) >= self.window);
        if fresh {
            s.window_start = Some(now);
            s.in_window = 0;
        }
        if s.in_window < self.burst {
            s.in_window += 1;
            Some(std::mem::take(&mut s.suppressed))
        } else {
            s.suppressed += 1;
            None
        }
    }

    /// [`allow_at`](Self::allow_at) with the current time.
    pub fn allow(&self) -> Option<u64> {
        self.allow_at(Instant::now())
    }
}

impl Default for WarnLimiter {
    /// 10 warnings per 10 s.
    fn default() -> Self {
        Self::new(10, Duration::from_secs(10))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // C-ND-5: slots are bounded and freed on drop.
    #[test]
    fn c_nd_5_handshake_slots_are_bounded_and_freed() {
        let s = HandshakeSlots::new(2);
        let a = s.try_take().expect("slot 1");
        let _b = s.try_take().expect("slot 2");
        assert!(s.try_take().is_none(), "a third is refused");
        assert_eq!(s.in_flight(), 2);
        drop(a);
        assert!(s.try_take().is_some(), "a freed slot is reused");
    }

    // C-ND-5: peer-caused warnings are rate-limited and the rest counted.
    #[test]
    fn c_nd_5_warnings_are_rate_limited_and_counted() {
        let w = WarnLimiter::new(3, Duration::from_secs(10));
        let t0 = Instant::now();
        let let_through: Vec<_> = (0..100).filter_map(|_| w.allow_at(t0)).collect();
        assert_eq!(let_through, vec![0, 0, 0]);
        let later = t0 + Duration::from_secs(11);
        assert_eq!(
            w.allow_at(later),
            Some(97),
            "the held-back count is reported"
        );
        assert_eq!(w.allow_at(later), Some(0));
    }
}
