//! Bounds on what unauthenticated peers can make a transport hold, and on
//! how loudly their faults are logged (C-ND-5, C-PA-1).
//!
//! [`HandshakeSlots`] caps the connections a listener holds before the peer
//! is authenticated, in total and per source address: each inbound
//! handshake takes a slot for as long as it is in flight, and one arriving
//! while every slot (or every slot its source may take) is taken is refused
//! at once instead of queued. [`Descriptors`] keeps file descriptors in
//! reserve for the operator: listeners hold at most the process's limit
//! minus a reserve, so the control socket can still accept during a flood.
//! [`WarnLimiter`] lets a peer-caused warning through at most `burst` times
//! per window and counts the rest, so a flood of bad handshakes or frames
//! cannot flood the log.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Default cap on handshakes in flight per listener: 64.
pub const DEFAULT_MAX_HANDSHAKES: usize = 64;
/// Default cap on handshakes in flight per listener from one source
/// address (an IPv4 address, or an IPv6 /64): 8.
pub const DEFAULT_MAX_HANDSHAKES_PER_SOURCE: usize = 8;
/// Default number of file descriptors kept back from the listeners for the
/// control socket, store files and outbound connections: 64.
pub const DEFAULT_DESCRIPTOR_RESERVE: usize = 64;

type SourceCounts = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// Slots for inbound handshakes in flight. Cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct HandshakeSlots {
    slots: Arc<Semaphore>,
    max: usize,
    per_source: usize,
    sources: SourceCounts,
}

/// A taken slot; dropping it frees the slot (when the peer is
/// authenticated or the handshake failed).
#[derive(Debug)]
pub struct HandshakeSlot {
    _permit: OwnedSemaphorePermit,
    source: Option<(IpAddr, SourceCounts)>,
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        if let Some((ip, sources)) = self.source.take() {
            let mut m = sources.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = m.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    m.remove(&ip);
                }
            }
        }
    }
}

/// Why an inbound connection got no handshake slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SlotRefusal {
    /// Every slot of the listener is taken.
    #[error("{0} handshakes already in flight (max_handshakes)")]
    Full(usize),
    /// Every slot this source address may take is taken.
    #[error("{0} handshakes already in flight from this source (max_handshakes_per_source)")]
    PerSource(usize),
}

/// The key a source address is counted under: the IPv4 address (an
/// IPv4-mapped IPv6 address counts as its IPv4 one), or the IPv6 /64, since
/// one IPv6 host usually holds a whole /64.
pub fn source_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

impl HandshakeSlots {
    /// `max` slots (at least one), with no cap per source.
    pub fn new(max: usize) -> Self {
        Self::with_per_source(max, max)
    }

    /// `max` slots (at least one), at most `per_source` (at least one) of
    /// them taken from one source address (see [`source_key`]).
    pub fn with_per_source(max: usize, per_source: usize) -> Self {
        let max = max.max(1);
        Self {
            slots: Arc::new(Semaphore::new(max)),
            max,
            per_source: per_source.clamp(1, max),
            sources: Arc::default(),
        }
    }

    /// A slot if one is free; `None` means refuse the connection now.
    /// Counts against no source: for streams without an address.
    pub fn try_take(&self) -> Option<HandshakeSlot> {
        let permit = self.slots.clone().try_acquire_owned().ok()?;
        Some(HandshakeSlot {
            _permit: permit,
            source: None,
        })
    }

    /// A slot for a connection from `ip` if the listener and that source
    /// both have one free; the refusal says which cap was reached.
    pub fn try_take_from(&self, ip: IpAddr) -> Result<HandshakeSlot, SlotRefusal> {
        let key = source_key(ip);
        let mut m = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.get(&key).copied().unwrap_or(0);
        if n >= self.per_source {
            return Err(SlotRefusal::PerSource(self.per_source));
        }
        let permit = self
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| SlotRefusal::Full(self.max))?;
        m.insert(key, n + 1);
        Ok(HandshakeSlot {
            _permit: permit,
            source: Some((key, self.sources.clone())),
        })
    }

    /// The cap.
    pub fn max(&self) -> usize {
        self.max
    }

    /// The cap per source address.
    pub fn max_per_source(&self) -> usize {
        self.per_source
    }

    /// Slots taken now.
    pub fn in_flight(&self) -> usize {
        self.max - self.slots.available_permits()
    }
}

/// The process-wide budget of descriptors the listeners may hold for
/// accepted connections (authenticated or not), so that a flood on any
/// listener stops short of the process's descriptor limit and the control
/// socket, the store and outbound dials keep theirs.
///
/// Until [`Descriptors::reserve`] is called the budget is unlimited (a
/// library embedding the transports keeps its own policy).
#[derive(Debug)]
pub struct Descriptors {
    budget: Arc<Semaphore>,
    /// The descriptor limit in force (the soft `RLIMIT_NOFILE`) after
    /// raising it, when it could be read.
    pub limit: Option<u64>,
    /// Descriptors kept back from the listeners.
    pub reserve: usize,
    /// Connections the listeners may hold at once.
    pub connections: usize,
}

/// A descriptor held for one accepted connection; dropping it returns it
/// to the budget.
#[derive(Debug)]
pub struct DescriptorPermit {
    _permit: Option<OwnedSemaphorePermit>,
}

static DESCRIPTORS: OnceLock<Descriptors> = OnceLock::new();

/// Raises the soft `RLIMIT_NOFILE` to the hard one where the OS allows and
/// returns the soft limit in force.
#[cfg(unix)]
fn raise_nofile() -> Option<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut l = getrlimit(Resource::Nofile);
    if let (Some(cur), max) = (l.current, l.maximum) {
        let target = max.unwrap_or(cur.max(1 << 16));
        if target > cur {
            l.current = Some(target);
            // Not allowed (a container's policy): keep the limit as is.
            let _ = setrlimit(Resource::Nofile, l);
        }
    }
    getrlimit(Resource::Nofile).current
}

#[cfg(not(unix))]
fn raise_nofile() -> Option<u64> {
    None
}

impl Descriptors {
    /// Sets the process-wide budget once: raises the descriptor limit
    /// (soft to hard) and lets the listeners hold the limit minus
    /// `reserve` connections. Later calls return the budget set first.
    pub fn reserve(reserve: usize) -> &'static Descriptors {
        DESCRIPTORS.get_or_init(|| {
            let limit = raise_nofile();
            let connections = match limit {
                Some(l) => usize::try_from(l)
                    .unwrap_or(usize::MAX)
                    .saturating_sub(reserve)
                    .clamp(1, Semaphore::MAX_PERMITS),
                None => Semaphore::MAX_PERMITS,
            };
            Descriptors {
                budget: Arc::new(Semaphore::new(connections)),
                limit,
                reserve,
                connections,
            }
        })
    }

    /// The budget, if one was set.
    pub fn get() -> Option<&'static Descriptors> {
        DESCRIPTORS.get()
    }

    /// A descriptor for one accepted connection; `None` means the budget
    /// is spent: close the connection at once. Always granted when no
    /// budget was set.
    pub fn take() -> Option<DescriptorPermit> {
        match DESCRIPTORS.get() {
            None => Some(DescriptorPermit { _permit: None }),
            Some(d) => d
                .budget
                .clone()
                .try_acquire_owned()
                .ok()
                .map(|p| DescriptorPermit { _permit: Some(p) }),
        }
    }

    /// Connections held now under the budget.
    pub fn in_use(&self) -> usize {
        self.connections - self.budget.available_permits()
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

    // C-PA-1: one source address cannot take more than its share of the
    // slots; other sources still get theirs, and a freed slot returns to
    // its source.
    #[test]
    fn c_pa_1_handshake_slots_are_capped_per_source() {
        let s = HandshakeSlots::with_per_source(4, 2);
        let flood: IpAddr = "127.0.0.2".parse().expect("ip");
        let a = s.try_take_from(flood).expect("flood 1");
        let _b = s.try_take_from(flood).expect("flood 2");
        assert_eq!(
            s.try_take_from(flood).err(),
            Some(SlotRefusal::PerSource(2))
        );
        let peer: IpAddr = "127.0.0.1".parse().expect("ip");
        let _c = s.try_take_from(peer).expect("another source gets in");
        // The same IPv6 /64 is one source; an IPv4-mapped address is its
        // IPv4 one.
        let mapped: IpAddr = "::ffff:127.0.0.2".parse().expect("ip");
        assert_eq!(
            s.try_take_from(mapped).err(),
            Some(SlotRefusal::PerSource(2))
        );
        let v6a: IpAddr = "2001:db8::1".parse().expect("ip");
        let v6b: IpAddr = "2001:db8::2".parse().expect("ip");
        let _d = s.try_take_from(v6a).expect("v6 1");
        assert_eq!(s.try_take_from(v6b).err(), Some(SlotRefusal::Full(4)));
        drop(a);
        assert!(
            s.try_take_from(flood).is_ok(),
            "a freed slot returns to its source"
        );
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
