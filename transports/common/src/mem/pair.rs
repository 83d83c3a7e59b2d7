//! The task that carries frames between two in-memory endpoints.

use std::hash::Hasher as _;
use std::sync::{Arc, Mutex};

use abhyasa_core::AgentId;
use bytes::Bytes;
use rand::{Rng as _, SeedableRng as _};
use rand_chacha::ChaCha8Rng;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::{lock, Direction};
use crate::link::Link;

#[derive(Debug)]
pub(super) enum Control {
    Settle(oneshot::Sender<()>),
}

/// One side of a pair: its link, its shutdown token, and the direction
/// *from* it.
type Side = (Link, CancellationToken, Arc<Mutex<Direction>>);

struct Lane {
    dir: Arc<Mutex<Direction>>,
    rng: ChaCha8Rng,
    held: Option<Bytes>,
}

pub(super) struct Pair {
    links: [Link; 2],
    tokens: [CancellationToken; 2],
    /// `lanes[0]` carries a → b, `lanes[1]` b → a.
    lanes: [Lane; 2],
    ctl: mpsc::UnboundedReceiver<Control>,
}

/// FNV-1a: a hash that is stable across processes, unlike `DefaultHasher`
/// with a random key, so seeds replay.
struct Fnv(u64);

impl std::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

fn lane_seed(seed: u64, generation: u64, from: &AgentId, to: &AgentId) -> u64 {
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    h.write_u64(seed);
    h.write_u64(generation);
    h.write(from.as_str().as_bytes());
    h.write_u8(0xff);
    h.write(to.as_str().as_bytes());
    h.finish()
}

enum Fate {
    Drop,
    Deliver { copies: u8, release_held: bool },
    Hold { copies: u8 },
}

impl Pair {
    pub(super) fn new(
        seed: u64,
        generation: u64,
        (a_link, a_token, ab): Side,
        (b_link, b_token, ba): Side,
        ctl: mpsc::UnboundedReceiver<Control>,
    ) -> Self {
        // Each link names the *other* side as its peer.
        let agent_a = b_link.guard.peer().clone();
        let agent_b = a_link.guard.peer().clone();
        Self {
            lanes: [
                Lane {
                    dir: ab,
                    rng: ChaCha8Rng::seed_from_u64(lane_seed(seed, generation, &agent_a, &agent_b)),
                    held: None,
                },
                Lane {
                    dir: ba,
                    rng: ChaCha8Rng::seed_from_u64(lane_seed(seed, generation, &agent_b, &agent_a)),
                    held: None,
                },
            ],
            links: [a_link, b_link],
            tokens: [a_token, b_token],
            ctl,
        }
    }

    pub(super) async fn run(mut self) {
        let [t0, t1] = self.tokens.clone();
        let stop = async move {
            tokio::select! {
                _ = t0.cancelled() => {}
                _ = t1.cancelled() => {}
            }
        };
        tokio::select! {
            _ = stop => {}
            _ = self.carry() => {}
        }
        let [l0, l1] = self.links;
        l0.guard.close().await;
        l1.guard.close().await;
    }

    async fn carry(&mut self) {
        loop {
            // Biased: frames already queued are carried before a control
            // message that was sent after them, which makes `settle` a
            // barrier.
            let [l0, l1] = &mut self.links;
            let (lane, bytes) = tokio::select! {
                biased;
                Some(bytes) = l0.outbound.recv() => (0, bytes),
                Some(bytes) = l1.outbound.recv() => (1, bytes),
                ctl = self.ctl.recv() => match ctl {
                    Some(Control::Settle(done)) => {
                        if self.release_held().await.is_err() {
                            return;
                        }
                        let _ = done.send(());
                        continue;
                    }
                    None => return,
                },
                else => return,
            };
            if self.carry_one(lane, bytes).await.is_err() {
                return;
            }
        }
    }

    fn fate(&mut self, lane: usize) -> Fate {
        let l = &mut self.lanes[lane];
        // Always three draws, so the sequence depends on frame order only.
        let (loss, dup, reorder): (f64, f64, f64) =
            (l.rng.random(), l.rng.random(), l.rng.random());
        let mut dir = lock(&l.dir);
        dir.stats.sent += 1;
        if dir.partitioned {
            dir.stats.partitioned += 1;
            return Fate::Drop;
        }
        if loss < dir.faults.loss {
            dir.stats.lost += 1;
            return Fate::Drop;
        }
        let copies = if dup < dir.faults.duplicate {
            dir.stats.duplicated += 1;
            2
        } else {
            1
        };
        if reorder < dir.faults.reorder && l.held.is_none() {
            dir.stats.reordered += 1;
            return Fate::Hold { copies };
        }
        Fate::Deliver {
            copies,
            release_held: l.held.is_some(),
        }
    }

    async fn carry_one(
        &mut self,
        lane: usize,
        bytes: Bytes,
    ) -> Result<(), crate::link::ReceiverGone> {
        match self.fate(lane) {
            Fate::Drop => Ok(()),
            Fate::Hold { copies } => {
                // A duplicated frame that is held: one copy now, one later.
                if copies == 2 {
                    self.deliver(lane, &bytes).await?;
                }
                self.lanes[lane].held = Some(bytes);
                Ok(())
            }
            Fate::Deliver {
                copies,
                release_held,
            } => {
                for _ in 0..copies {
                    self.deliver(lane, &bytes).await?;
                }
                if release_held {
                    if let Some(held) = self.lanes[lane].held.take() {
                        self.deliver(lane, &held).await?;
                    }
                }
                Ok(())
            }
        }
    }

    async fn release_held(&mut self) -> Result<(), crate::link::ReceiverGone> {
        for lane in 0..2 {
            if let Some(held) = self.lanes[lane].held.take() {
                self.deliver(lane, &held).await?;
            }
        }
        Ok(())
    }

    async fn deliver(
        &mut self,
        lane: usize,
        bytes: &[u8],
    ) -> Result<(), crate::link::ReceiverGone> {
        lock(&self.lanes[lane].dir).stats.delivered += 1;
        // Lane 0 (a → b) arrives through b's link, lane 1 through a's.
        self.links[1 - lane].inbound.push_message(bytes).await
    }
}
