//! Faults and hooks at a node's edge, the same on every transport.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use abhyasa_core::wire::Message;
use abhyasa_core::ObligationId;
use abhyasa_transport::{Incoming, Transport};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::mpsc;

use crate::common::lock;

struct PlugState {
    drop: f64,
    duplicate: f64,
    cut: bool,
    hold: bool,
    held: Vec<Incoming>,
    injected: Vec<Incoming>,
    rng: ChaCha8Rng,
    passed: u64,
    dropped: u64,
    duplicated: u64,
    /// Obligation frames dropped, by id: what [`Plug::lost`] reports.
    lost: HashMap<ObligationId, u64>,
    observer: Option<Observer>,
}

/// A hook that sees every item a [`Plug`] receives, before its faults.
pub type Observer = Arc<dyn Fn(&Incoming) + Send + Sync>;

/// Inbound faults at a node's edge: each received frame is dropped with
/// probability `drop`, else delivered twice with probability `duplicate`;
/// `cut` drops every frame. Connection events always pass (the transport
/// is up; only frames are lost), so custody sees loss, not a dead peer.
/// Seeded: the same seed makes the same choices for the same frames.
///
/// `hold` delays instead of dropping: frames are kept, in order, until the
/// hold is released, then delivered once each (a late ack, a redelivery
/// that arrives past its deadline).
///
/// An observer ([`Plug::observe`]) sees every item the transport hands
/// the plug, before any fault: what crossed the wire to this node's edge,
/// whatever the plug then does with it (C-AB1-2 checks each obligation
/// frame against what the custodian had made durable).
///
/// [`Plug::inject`] hands the node an item no transport produced, at the
/// same edge: a frame "from" any peer, as if that peer's authenticated
/// link had carried it. So a forged or misrouted ack (C-TR-2) reaches the
/// node the same way on every transport, past the transport's own checks,
/// and exercises the node's binding of acks rather than the transport's
/// authentication. Injected items bypass the plug's faults.
#[derive(Clone)]
pub struct Plug(Arc<Mutex<PlugState>>, Arc<tokio::sync::Notify>);

impl Plug {
    /// A plug that passes everything, with a seed for later faults.
    pub fn new(seed: u64) -> Self {
        Self(
            Arc::new(Mutex::new(PlugState {
                drop: 0.0,
                duplicate: 0.0,
                cut: false,
                hold: false,
                held: Vec::new(),
                injected: Vec::new(),
                rng: ChaCha8Rng::seed_from_u64(seed),
                passed: 0,
                dropped: 0,
                duplicated: 0,
                lost: HashMap::new(),
                observer: None,
            })),
            Arc::new(tokio::sync::Notify::new()),
        )
    }

    /// Calls `f` on every item the transport delivers to this plug from
    /// now on (frames and connection events), before drops, duplicates,
    /// cuts or holds. `f` runs on the plug's task: keep it short.
    pub fn observe(&self, f: impl Fn(&Incoming) + Send + Sync + 'static) {
        lock(&self.0).observer = Some(Arc::new(f));
    }

    /// Delivers `item` to the node behind this plug, after the faults
    /// (see the type's docs), in order with the frames the plug passes.
    pub fn inject(&self, item: Incoming) {
        lock(&self.0).injected.push(item);
        self.1.notify_one();
    }

    /// Holds every frame from now on (`true`), or delivers what was held
    /// and stops holding (`false`).
    pub fn hold(&self, on: bool) {
        lock(&self.0).hold = on;
        if !on {
            self.1.notify_one();
        }
    }

    /// Frames held so far and not yet released.
    pub fn held(&self) -> usize {
        lock(&self.0).held.len()
    }

    /// Sets the drop and duplicate probabilities.
    pub fn set(&self, drop: f64, duplicate: f64) {
        let mut s = lock(&self.0);
        s.drop = drop;
        s.duplicate = duplicate;
    }

    /// Drops every frame (`true`) or none beyond the probabilities (`false`).
    pub fn cut(&self, on: bool) {
        lock(&self.0).cut = on;
    }

    /// Frames delivered, dropped and duplicated so far.
    pub fn counts(&self) -> (u64, u64, u64) {
        let s = lock(&self.0);
        (s.passed, s.dropped, s.duplicated)
    }

    /// Copies of obligation `id` this plug dropped so far. Unlike
    /// [`Plug::counts`], which counts every frame (a status query sent on
    /// connect is one too), this says that attempt was lost: a scenario
    /// that waits on it knows the first copy can no longer arrive late.
    pub fn lost(&self, id: &ObligationId) -> u64 {
        lock(&self.0).lost.get(id).copied().unwrap_or(0)
    }

    /// How many copies of the next frame to deliver; `ob` is the id when
    /// the frame is an obligation.
    fn copies(&self, ob: Option<&ObligationId>) -> usize {
        let mut s = lock(&self.0);
        let (drop, dup) = (s.drop, s.duplicate);
        if s.cut || (drop > 0.0 && s.rng.random_bool(drop.min(1.0))) {
            s.dropped += 1;
            if let Some(id) = ob {
                *s.lost.entry(id.clone()).or_insert(0) += 1;
            }
            return 0;
        }
        s.passed += 1;
        if dup > 0.0 && s.rng.random_bool(dup.min(1.0)) {
            s.duplicated += 1;
            return 2;
        }
        1
    }

    /// Puts the plug between `t`'s incoming channel and whoever reads it.
    pub fn wrap(&self, t: Transport) -> Transport {
        let Transport {
            handle,
            mut incoming,
        } = t;
        let (tx, rx) = mpsc::channel(1024);
        let plug = self.clone();
        tokio::spawn(async move {
            loop {
                let item = tokio::select! {
                    item = incoming.recv() => match item {
                        Some(item) => item,
                        None => return,
                    },
                    () = plug.1.notified() => {
                        // Injections always; what was held only once the
                        // hold is off (both wake this task).
                        let released = {
                            let mut s = lock(&plug.0);
                            let mut v = std::mem::take(&mut s.injected);
                            if !s.hold {
                                v.extend(std::mem::take(&mut s.held));
                            }
                            v
                        };
                        for item in released {
                            if tx.send(item).await.is_err() {
                                return;
                            }
                        }
                        continue;
                    }
                };
                let observer = lock(&plug.0).observer.clone();
                if let Some(f) = observer {
                    f(&item);
                }
                let n = match &item {
                    Incoming::Frame { envelope, .. } => {
                        let mut s = lock(&plug.0);
                        if s.hold {
                            s.held.push(item);
                            continue;
                        }
                        drop(s);
                        let ob = match &envelope.message {
                            Message::Obligation(o) => Some(o.id()),
                            _ => None,
                        };
                        plug.copies(ob)
                    }
                    _ => 1,
                };
                for _ in 0..n {
                    if tx.send(item.clone()).await.is_err() {
                        return;
                    }
                }
            }
        });
        Transport {
            handle,
            incoming: rx,
        }
    }
}
