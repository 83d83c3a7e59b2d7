//! quinn over turmoil's UDP: an [`AsyncUdpSocket`] on a
//! [`turmoil::net::UdpSocket`], with our own seeded per-datagram dropper
//! (turmoil's `fail_rate` partitions whole links instead).

use std::future::Future;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::truth::Truth;

type Readable = Pin<Box<dyn Future<Output = io::Result<()>> + Send>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Per-datagram faults of a host's outgoing datagrams.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct DatagramFaults {
    pub(crate) loss: f64,
    pub(crate) duplicate: f64,
    pub(crate) reorder: f64,
}

/// The dropper's state: three draws per datagram whatever the outcome, so
/// the fate sequence depends only on the seed and the datagram order.
#[derive(Debug)]
pub(crate) struct Dropper {
    faults: DatagramFaults,
    rng: ChaCha8Rng,
    held: Option<(Vec<u8>, SocketAddr)>,
}

impl Dropper {
    pub(crate) fn new(faults: DatagramFaults, seed: u64) -> Self {
        Self {
            faults,
            rng: ChaCha8Rng::seed_from_u64(seed),
            held: None,
        }
    }
}

/// A turmoil UDP socket as a quinn socket.
pub(crate) struct SimUdp {
    socket: Arc<turmoil::net::UdpSocket>,
    dropper: Arc<Mutex<Dropper>>,
    readable: Mutex<Option<Readable>>,
    host: String,
    truth: Truth,
}

impl std::fmt::Debug for SimUdp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimUdp")
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

impl SimUdp {
    /// Wraps `socket`; the dropper outlives restarts of the host (one
    /// stream per host for the whole run).
    pub(crate) fn new(
        socket: turmoil::net::UdpSocket,
        dropper: Arc<Mutex<Dropper>>,
        host: String,
        truth: Truth,
    ) -> Self {
        Self {
            socket: Arc::new(socket),
            dropper,
            readable: Mutex::new(None),
            host,
            truth,
        }
    }

    fn send_one(&self, buf: &[u8], to: SocketAddr) {
        // A partitioned or unknown destination drops the datagram, as a
        // real network would; quinn retransmits.
        if self.socket.try_send_to(buf, to).is_ok() {
            self.truth.count_datagram(&self.host, buf.len());
        }
    }
}

#[derive(Debug)]
struct AlwaysWritable;

impl UdpPoller for AlwaysWritable {
    fn poll_writable(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // turmoil's UDP has no backpressure: a send never blocks.
        Poll::Ready(Ok(()))
    }
}

impl AsyncUdpSocket for SimUdp {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(AlwaysWritable)
    }

    fn try_send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        let seg = transmit
            .segment_size
            .unwrap_or(transmit.contents.len())
            .max(1);
        for datagram in transmit.contents.chunks(seg) {
            let (lost, dup, reorder, released) = {
                let mut d = lock(&self.dropper);
                let f = d.faults;
                let lost = d.rng.random::<f64>() < f.loss;
                let dup = d.rng.random::<f64>() < f.duplicate;
                let reorder = d.rng.random::<f64>() < f.reorder;
                let released = if lost { None } else { d.held.take() };
                if !lost && reorder && released.is_none() {
                    d.held = Some((datagram.to_vec(), transmit.destination));
                    (lost, dup, true, None)
                } else {
                    (lost, dup, false, released)
                }
            };
            if lost {
                self.truth.count_dropped(&self.host);
                continue;
            }
            if !reorder {
                self.send_one(datagram, transmit.destination);
                if dup {
                    self.send_one(datagram, transmit.destination);
                }
            }
            // The held datagram goes right after the next one.
            if let Some((held, to)) = released {
                self.send_one(&held, to);
            }
        }
        Ok(())
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let (Some(buf), Some(m)) = (bufs.first_mut(), meta.first_mut()) else {
            return Poll::Ready(Ok(0));
        };
        loop {
            match self.socket.try_recv_from(buf) {
                Ok((len, addr)) => {
                    *m = RecvMeta::default();
                    m.addr = addr;
                    m.len = len;
                    m.stride = len;
                    return Poll::Ready(Ok(1));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
            let mut slot = lock(&self.readable);
            let fut = slot.get_or_insert_with(|| {
                let s = self.socket.clone();
                Box::pin(async move { s.readable().await })
            });
            match fut.as_mut().poll(cx) {
                Poll::Ready(r) => {
                    *slot = None;
                    r?;
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    fn may_fragment(&self) -> bool {
        false
    }
}
