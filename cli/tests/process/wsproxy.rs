//! A hostile hop for WebSocket links: a TCP proxy in front of a real
//! listener that forwards the upgrade and every frame as it is, except
//! that while told to hold it keeps the client's data frames back and
//! later delivers them, in their order, as many times as asked (after
//! whatever passed meanwhile). It holds, reorders, duplicates and
//! replays; it cannot forge (the frames' bytes are never changed).

use std::io::{Read as _, Write as _};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// One connection's upstream write half, shared by its forwarding thread
/// and [`HoldingProxy::release`] so whole frames never interleave.
type Upstream = Arc<Mutex<TcpStream>>;

#[derive(Default)]
struct State {
    holding: bool,
    held: Vec<(Vec<u8>, Upstream)>,
    forwarded: usize,
}

/// The proxy; it runs until the test process ends.
pub(crate) struct HoldingProxy {
    pub(crate) addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

impl HoldingProxy {
    /// Listens on a free loopback port and forwards each connection to
    /// `upstream`.
    pub(crate) fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("the proxy binds");
        let addr = listener.local_addr().expect("the proxy's address");
        let state = Arc::new(Mutex::new(State::default()));
        let st = state.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(upstream) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let st = st.clone();
                std::thread::spawn(move || connection(client, server, &st));
            }
        });
        Self { addr, state }
    }

    /// From now on the client's data frames are kept back.
    pub(crate) fn hold(&self) {
        self.lock().holding = true;
    }

    /// From now on frames pass; those held stay held.
    pub(crate) fn pass(&self) {
        self.lock().holding = false;
    }

    /// How many data frames are held.
    pub(crate) fn held(&self) -> usize {
        self.lock().held.len()
    }

    /// How many data frames were forwarded as they came.
    pub(crate) fn forwarded(&self) -> usize {
        self.lock().forwarded
    }

    /// Delivers the held frames `times` times over, in the order they were
    /// held, and forgets them. Returns how many frames were written.
    pub(crate) fn release(&self, times: usize) -> usize {
        let held = std::mem::take(&mut self.lock().held);
        let mut written = 0;
        for _ in 0..times {
            for (frame, up) in &held {
                let mut up = up.lock().expect("upstream lock");
                if up.write_all(frame).is_ok() {
                    written += 1;
                }
            }
        }
        written
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("proxy state lock")
    }
}

fn connection(mut client: TcpStream, server: TcpStream, state: &Mutex<State>) {
    let (Ok(mut down_from), Ok(mut down_to)) = (server.try_clone(), client.try_clone()) else {
        return;
    };
    // Server to client: copied as it comes.
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut down_from, &mut down_to);
        let _ = down_to.shutdown(Shutdown::Both);
    });
    let up: Upstream = Arc::new(Mutex::new(server));
    let _ = pump(&mut client, &up, state);
    let _ = up.lock().expect("upstream lock").shutdown(Shutdown::Both);
}

/// Client to server: the upgrade, then frame by frame until either end
/// goes away.
fn pump(client: &mut TcpStream, up: &Upstream, state: &Mutex<State>) -> std::io::Result<()> {
    forward_upgrade(client, up)?;
    loop {
        let frame = read_frame(client)?;
        // Opcodes 0-7 are data (continuation, text, binary); 8+ control.
        if frame[0] & 0x0f < 8 {
            let mut st = state.lock().expect("proxy state lock");
            if st.holding {
                st.held.push((frame, up.clone()));
                continue;
            }
            st.forwarded += 1;
        }
        up.lock().expect("upstream lock").write_all(&frame)?;
    }
}

/// Forwards the client's HTTP upgrade request (through its blank line).
fn forward_upgrade(client: &mut TcpStream, up: &Upstream) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        client.read_exact(&mut b)?;
        head.push(b[0]);
        if head.len() > 16 * 1024 {
            return Err(std::io::ErrorKind::InvalidData.into());
        }
    }
    up.lock().expect("upstream lock").write_all(&head)
}

/// One whole WebSocket frame (RFC 6455 §5.2) as its raw bytes.
fn read_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut frame = vec![0u8; 2];
    s.read_exact(&mut frame)?;
    let (masked, len7) = (frame[1] & 0x80 != 0, frame[1] & 0x7f);
    let len = match len7 {
        126 => {
            let mut l = [0u8; 2];
            s.read_exact(&mut l)?;
            frame.extend_from_slice(&l);
            u64::from(u16::from_be_bytes(l))
        }
        127 => {
            let mut l = [0u8; 8];
            s.read_exact(&mut l)?;
            frame.extend_from_slice(&l);
            u64::from_be_bytes(l)
        }
        n => u64::from(n),
    };
    let rest = usize::try_from(len)
        .ok()
        .filter(|&l| l <= 64 * 1024 * 1024)
        .ok_or(std::io::ErrorKind::InvalidData)?
        + if masked { 4 } else { 0 };
    let at = frame.len();
    frame.resize(at + rest, 0);
    s.read_exact(&mut frame[at..])?;
    Ok(frame)
}
