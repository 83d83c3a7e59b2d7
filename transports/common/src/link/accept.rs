//! Accept loops: the admission every listener applies before a peer is
//! authenticated (C-ND-5, C-PA-1), around the transport's own handshake.
//!
//! A transport hands [`Admission::run`] its inbound connection attempts
//! ([`Attempt`]) and a handshake to run on each admitted one. The loop
//! refuses at once, rather than holds, an attempt beyond the cap of
//! handshakes in flight (in total, or from one validated source address),
//! one past the process's descriptor budget (listeners that hold a
//! descriptor per connection), and asks an attempt from an unproven source
//! address to prove it (a QUIC Retry) once a quarter of the slots are
//! taken. Every refusal, at admission or in the handshake, is counted in
//! the transport's stats and logged rate-limited.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::{DialError, Registry};
use crate::limit::{
    DescriptorPermit, Descriptors, HandshakeSlot, HandshakeSlots, SlotRefusal, WarnLimiter,
};

/// How long the loop waits after the listener failed to accept (out of
/// file descriptors, say) before it tries again, instead of spinning.
const ACCEPT_RETRY_PAUSE: Duration = Duration::from_millis(100);

/// One inbound connection attempt, before any handshake.
pub trait Attempt: Send + 'static {
    /// Where it comes from.
    fn remote(&self) -> SocketAddr;
    /// Whether the source address is proven (a completed TCP handshake, a
    /// QUIC address validation); only a proven one is counted per source,
    /// so a forged address cannot use up a real peer's share.
    fn source_validated(&self) -> bool;
    /// Asks the peer to prove its source address instead of giving it a
    /// slot. `None` when that was done (or the attempt was dropped trying);
    /// the attempt back when the transport cannot ask.
    fn retry(self) -> Option<Self>
    where
        Self: Sized,
    {
        Some(self)
    }
    /// Refuses the attempt at once.
    fn refuse(self);
}

/// What a listener yields next.
#[derive(Debug)]
pub enum Accepted<A> {
    /// An inbound connection attempt.
    Attempt(A),
    /// Accepting failed; the listener stays open.
    Failed(std::io::Error),
    /// The listener is closed: the loop ends.
    Closed,
}

/// What an admitted attempt holds while its handshake runs: a handshake
/// slot until [`authenticated`](Self::authenticated), and, on listeners
/// that count descriptors, a descriptor until it is dropped.
#[derive(Debug)]
pub struct Admitted {
    slot: Option<HandshakeSlot>,
    _descriptor: Option<DescriptorPermit>,
}

impl Admitted {
    /// The peer is authenticated: the handshake no longer counts against
    /// the caps. The descriptor, if any, stays held.
    pub fn authenticated(&mut self) {
        self.slot = None;
    }
}

/// A listener's pre-authentication admission. Cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct Admission {
    registry: Registry,
    slots: HandshakeSlots,
    refusals: Arc<WarnLimiter>,
    transport: &'static str,
    descriptors: bool,
}

impl Admission {
    /// Admission for a listener of `registry`'s transport (`transport`
    /// names it in logs: "QUIC", "WebSocket"): at most `max_handshakes`
    /// in flight, `max_per_source` of them from one source address.
    pub fn new(
        registry: Registry,
        transport: &'static str,
        max_handshakes: usize,
        max_per_source: usize,
    ) -> Self {
        Self {
            registry,
            slots: HandshakeSlots::with_per_source(max_handshakes, max_per_source),
            refusals: Arc::new(WarnLimiter::default()),
            transport,
            descriptors: false,
        }
    }

    /// Each accepted connection also holds a descriptor of the process's
    /// budget ([`Descriptors`]) until it ends; past the budget an attempt
    /// is refused at once (C-PA-1).
    pub fn with_descriptors(mut self) -> Self {
        self.descriptors = true;
        self
    }

    /// The handshake slots (for their counts).
    pub fn slots(&self) -> &HandshakeSlots {
        &self.slots
    }

    /// Counts a refused inbound connection and warns, rate-limited.
    pub fn refused(&self, remote: SocketAddr, why: &str) {
        self.registry.count_refused();
        if let Some(held_back) = self.refusals.allow() {
            tracing::warn!(
                %remote,
                error = %why,
                held_back,
                "refused inbound {} connection",
                self.transport
            );
        }
    }

    /// Admits `attempt`, or refuses it (counted and logged) and returns
    /// `None`.
    fn admit<A: Attempt>(&self, attempt: A) -> Option<(A, Admitted)> {
        let remote = attempt.remote();
        let validated = attempt.source_validated();
        // C-PA-1: a UDP source address can be forged. Once a quarter of the
        // slots are taken, an attempt from an address not yet validated is
        // asked to prove it instead of given a slot.
        let attempt = if !validated && self.slots.in_flight() >= self.slots.max().div_ceil(4) {
            attempt.retry()?
        } else {
            attempt
        };
        // C-PA-1: the process keeps descriptors back for the control
        // socket; past the budget, close at once.
        let descriptor = if self.descriptors {
            let Some(fd) = Descriptors::take() else {
                attempt.refuse();
                self.refused(remote, "descriptor budget spent");
                return None;
            };
            Some(fd)
        } else {
            None
        };
        // C-ND-5, C-PA-1: beyond the cap of handshakes in flight, in total
        // or from this source, refuse at once rather than hold another
        // one. Only a validated address is counted per source.
        let slot = if validated {
            self.slots.try_take_from(remote.ip())
        } else {
            self.slots
                .try_take()
                .ok_or(SlotRefusal::Full(self.slots.max()))
        };
        match slot {
            Ok(slot) => Some((
                attempt,
                Admitted {
                    slot: Some(slot),
                    _descriptor: descriptor,
                },
            )),
            Err(why) => {
                attempt.refuse();
                self.refused(remote, &why.to_string());
                None
            }
        }
    }

    /// The accept loop, until the transport shuts down or `next` reports
    /// the listener closed: admits each attempt `next` yields and spawns
    /// `handshake` on it (a refusal it returns is counted and logged like
    /// one at admission). The handshake calls
    /// [`Admitted::authenticated`] once the peer is authenticated.
    pub async fn run<A, N, NF, H, HF>(&self, mut next: N, mut handshake: H)
    where
        A: Attempt,
        N: FnMut() -> NF,
        NF: Future<Output = Accepted<A>>,
        H: FnMut(A, Admitted) -> HF,
        HF: Future<Output = Result<(), DialError>> + Send + 'static,
    {
        let token = self.registry.shutdown_token();
        loop {
            // Biased: a fixed poll order keeps a run under a seeded
            // simulated runtime reproducible; no branch can starve.
            let accepted = tokio::select! {
                biased;
                _ = token.cancelled() => break,
                a = next() => a,
            };
            let attempt = match accepted {
                Accepted::Attempt(a) => a,
                Accepted::Closed => break,
                Accepted::Failed(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_RETRY_PAUSE).await;
                    continue;
                }
            };
            let remote = attempt.remote();
            let Some((attempt, admitted)) = self.admit(attempt) else {
                continue;
            };
            let shake = handshake(attempt, admitted);
            let admission = self.clone();
            self.registry.spawn(async move {
                if let Err(e) = shake.await {
                    admission.refused(remote, &e.to_string());
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::Mutex;

    use abhyasa_core::AgentId;

    use super::*;
    use crate::{LinkConfig, Transport};

    /// What happened to the fake attempts, in order.
    type Log = Arc<Mutex<Vec<String>>>;

    struct Fake {
        remote: SocketAddr,
        validated: bool,
        can_retry: bool,
        log: Log,
    }

    impl Attempt for Fake {
        fn remote(&self) -> SocketAddr {
            self.remote
        }
        fn source_validated(&self) -> bool {
            self.validated
        }
        fn retry(self) -> Option<Self> {
            if !self.can_retry {
                return Some(self);
            }
            self.log
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(format!("retry {}", self.remote));
            None
        }
        fn refuse(self) {
            self.log
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(format!("refuse {}", self.remote));
        }
    }

    fn setup(max: usize, per_source: usize) -> (Admission, Transport, Log) {
        let agent = AgentId::new("listener").expect("valid agent id");
        let (registry, transport) = Registry::new(agent, LinkConfig::default());
        let admission = Admission::new(registry, "test", max, per_source);
        (admission, transport, Log::default())
    }

    fn from(log: &Log, last_octet: u8, validated: bool, can_retry: bool) -> Fake {
        Fake {
            remote: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(192, 0, 2, last_octet)), 4000),
            validated,
            can_retry,
            log: log.clone(),
        }
    }

    fn entries(log: &Log) -> Vec<String> {
        log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    // C-ND-5, C-PA-1: the cap in total and per validated source; each
    // refusal is counted; an authenticated handshake frees its slot.
    #[tokio::test]
    async fn c_nd_5_admission_caps_handshakes_in_total_and_per_source() {
        let (admission, transport, log) = setup(3, 2);
        let a1 = admission.admit(from(&log, 1, true, false)).expect("first");
        let _a2 = admission.admit(from(&log, 1, true, false)).expect("second");
        assert!(admission.admit(from(&log, 1, true, false)).is_none());
        assert_eq!(entries(&log), ["refuse 192.0.2.1:4000"]);
        let _b1 = admission
            .admit(from(&log, 2, true, false))
            .expect("other source");
        assert!(admission.admit(from(&log, 3, true, false)).is_none());
        assert_eq!(transport.handle.stats().refused, 2);
        let (_, mut admitted) = a1;
        admitted.authenticated();
        assert_eq!(admission.slots().in_flight(), 2);
        assert!(admission.admit(from(&log, 3, true, false)).is_some());
    }

    // C-PA-1: an unproven source address is asked to prove it once a
    // quarter of the slots are taken, and is never counted per source.
    #[tokio::test]
    async fn c_pa_1_unvalidated_sources_are_retried_and_not_counted_per_source() {
        let (admission, transport, log) = setup(8, 1);
        // Below a quarter (2 of 8): slots, even beyond the per-source cap.
        let _u1 = admission.admit(from(&log, 9, false, true)).expect("first");
        let _u2 = admission.admit(from(&log, 9, false, true)).expect("second");
        assert!(entries(&log).is_empty());
        // A quarter taken: a Retry instead of a slot, not a refusal.
        assert!(admission.admit(from(&log, 9, false, true)).is_none());
        assert_eq!(entries(&log), ["retry 192.0.2.9:4000"]);
        assert_eq!(transport.handle.stats().refused, 0);
        // One that cannot be retried still gets a slot from the total.
        let _u3 = admission
            .admit(from(&log, 9, false, false))
            .expect("no retry possible");
        assert_eq!(admission.slots().in_flight(), 3);
    }
}
