use abhyasa_core::PeerError;
use abhyasa_transport::SendError;
use futures_util::SinkExt as _;
use tokio_tungstenite::tungstenite::Message as WsMessage;

use super::*;
use crate::StartError;

/// `b` listens; `a` dials it.
async fn pair() -> (Transport, Server) {
    let mut s = server(None).await;
    let a_cfg = config(&id("a"), &s.a_id, None).with_peer(s.b_id.pin(id("b")), Some(url(s.addr)));
    let mut a = start(a_cfg).await.expect("a starts");
    assert_eq!(next(&mut a).await, Incoming::Connected(id("b")));
    assert_eq!(next(&mut s.b).await, Incoming::Connected(id("a")));
    (a, s)
}

#[tokio::test]
async fn frames_round_trip_both_ways() {
    let (mut a, Server { mut b, .. }) = pair().await;
    a.handle
        .send(&id("b"), &query(&id("a"), 1))
        .expect("queued");
    b.handle
        .send(&id("a"), &query(&id("b"), 2))
        .expect("queued");
    assert_eq!(
        next(&mut b).await,
        Incoming::Frame {
            peer: id("a"),
            envelope: query(&id("a"), 1)
        }
    );
    assert_eq!(
        next(&mut a).await,
        Incoming::Frame {
            peer: id("b"),
            envelope: query(&id("b"), 2)
        }
    );
    let big = Envelope::new(
        id("a"),
        Message::StatusQuery(
            (0..8_000)
                .map(|i| ObligationId::new(format!("obligation-{i}")).expect("id"))
                .collect(),
        ),
    );
    a.handle.send(&id("b"), &big).expect("queued");
    for n in 0..200 {
        a.handle
            .send(&id("b"), &query(&id("a"), n))
            .expect("queued");
    }
    assert_eq!(
        next(&mut b).await,
        Incoming::Frame {
            peer: id("a"),
            envelope: big
        }
    );
    for n in 0..200 {
        assert_eq!(
            next(&mut b).await,
            Incoming::Frame {
                peer: id("a"),
                envelope: query(&id("a"), n)
            }
        );
    }
    a.handle.shutdown().await;
    assert_eq!(next(&mut b).await, Incoming::Disconnected(id("a")));
}

// C-T-4 over WebSocket: every bad message is reported and consumed; the
// connection carries the next good frame.
#[tokio::test]
async fn bad_messages_are_reported_and_the_connection_survives() {
    let Server {
        mut b,
        a_id,
        b_id,
        addr,
    } = server(Some(1024)).await;
    let mut ws = raw_connect(addr).await;
    let pins = PinSet::new(&id("a"), &[b_id.pin(id("b"))]).expect("pins");
    raw_hello(&mut ws, &a_id, &id("a"), &id("b"), &pins)
        .await
        .expect("hello accepted");
    assert_eq!(next(&mut b).await, Incoming::Connected(id("a")));

    let mut v2 = frame(&query(&id("a"), 0));
    assert_eq!(&v2[1..3], &[0x08, 0x01], "version is the first field");
    v2[2] = 0x02;
    let mut oversize = vec![0x81, 0x08]; // length 1025 > 1024
    oversize.extend_from_slice(&[0u8; 1025]);
    let mut two = frame(&query(&id("a"), 8));
    two.extend_from_slice(&frame(&query(&id("a"), 9)));
    let good = frame(&query(&id("a"), 2));
    let messages = vec![
        WsMessage::Binary(vec![3u8, 0xff, 0xff, 0xff].into()),
        WsMessage::Binary(v2.into()),
        WsMessage::Binary(oversize.into()),
        WsMessage::Binary(good[..good.len() - 1].to_vec().into()),
        WsMessage::Binary(two.into()),
        WsMessage::Text("hello".into()),
        WsMessage::Binary(frame(&query(&id("mallory"), 1)).into()),
        WsMessage::Binary(good.into()),
    ];
    for m in messages {
        ws.send(m).await.expect("sent");
    }
    let malformed = |i: Incoming| match i {
        Incoming::Malformed { peer, error } if peer == id("a") => error,
        other => panic!("expected Malformed from a, got {other:?}"),
    };
    assert!(matches!(
        malformed(next(&mut b).await),
        PeerError::Malformed { .. }
    ));
    assert!(matches!(
        malformed(next(&mut b).await),
        PeerError::UnsupportedVersion { found: 2, .. }
    ));
    assert!(matches!(
        malformed(next(&mut b).await),
        PeerError::FrameTooLarge {
            size: 1025,
            max: 1024
        }
    ));
    for detail in ["ends inside a frame", "after the frame", "text message"] {
        match malformed(next(&mut b).await) {
            PeerError::Malformed { detail: d, .. } => assert!(d.contains(detail), "{d}"),
            other => panic!("expected Malformed, got {other:?}"),
        }
    }
    assert_eq!(
        next(&mut b).await,
        Incoming::Unauthorized {
            peer: id("a"),
            claimed: id("mallory")
        }
    );
    assert_eq!(
        next(&mut b).await,
        Incoming::Frame {
            peer: id("a"),
            envelope: query(&id("a"), 2)
        }
    );
}

#[tokio::test]
async fn reconnects_after_either_peer_restarts() {
    let (mut a, s) = pair().await;
    let Server {
        b,
        a_id,
        b_id,
        addr,
    } = s;

    // The listener restarts on the same port: the dialler re-dials.
    b.handle.shutdown().await;
    assert_eq!(next(&mut a).await, Incoming::Disconnected(id("b")));
    assert_eq!(
        a.handle.send(&id("b"), &query(&id("a"), 1)),
        Err(SendError::NotConnected(id("b")))
    );
    let b_cfg = config(&id("b"), &b_id, Some(addr)).with_peer(a_id.pin(id("a")), None);
    let mut b = start(b_cfg).await.expect("b restarts on its port");
    assert_eq!(next(&mut a).await, Incoming::Connected(id("b")));
    assert_eq!(next(&mut b).await, Incoming::Connected(id("a")));
    a.handle
        .send(&id("b"), &query(&id("a"), 2))
        .expect("queued");
    assert_eq!(
        next(&mut b).await,
        Incoming::Frame {
            peer: id("a"),
            envelope: query(&id("a"), 2)
        }
    );

    // The dialler restarts: the listener sees it leave and come back.
    a.handle.shutdown().await;
    assert_eq!(next(&mut b).await, Incoming::Disconnected(id("a")));
    let a_cfg = config(&id("a"), &a_id, None).with_peer(b_id.pin(id("b")), Some(url(addr)));
    let mut a = start(a_cfg).await.expect("a restarts");
    assert_eq!(next(&mut a).await, Incoming::Connected(id("b")));
    assert_eq!(next(&mut b).await, Incoming::Connected(id("a")));
    b.handle
        .send(&id("a"), &query(&id("b"), 3))
        .expect("queued");
    assert_eq!(
        next(&mut a).await,
        Incoming::Frame {
            peer: id("b"),
            envelope: query(&id("b"), 3)
        }
    );
}

#[tokio::test]
async fn incoherent_configs_do_not_start() {
    let (a_id, b_id) = (identity(&id("a")), identity(&id("b")));
    let mut cfg = config(&id("a"), &a_id, None);
    cfg.keep_alive = cfg.idle_timeout;
    assert!(matches!(start(cfg).await, Err(StartError::Timeouts(_))));
    for bad in ["http://127.0.0.1:1/", "ws://", "not a url"] {
        let cfg = config(&id("a"), &a_id, None).with_peer(b_id.pin(id("b")), Some(bad.into()));
        assert!(
            matches!(start(cfg).await, Err(StartError::Url { .. })),
            "{bad}"
        );
    }
    let cfg = config(&id("a"), &a_id, None).with_peer(a_id.pin(id("a")), None);
    assert!(matches!(start(cfg).await, Err(StartError::Pins(_))));
}

fn tune(mut c: WsConfig) -> WsConfig {
    c.idle_timeout = Duration::from_millis(600);
    c.keep_alive = Duration::from_millis(100);
    c
}

// Pings hold an idle connection open well past the idle timeout.
#[tokio::test]
async fn keep_alive_holds_an_idle_connection_open() {
    let (a_id, b_id) = (identity(&id("a")), identity(&id("b")));
    let b_cfg = tune(config(&id("b"), &b_id, Some(loopback())).with_peer(a_id.pin(id("a")), None));
    let mut b = start(b_cfg).await.expect("b starts");
    let addr = b.handle.local_addr().expect("addr");
    let a_cfg = tune(config(&id("a"), &a_id, None).with_peer(b_id.pin(id("b")), Some(url(addr))));
    let mut a = start(a_cfg).await.expect("a starts");
    assert_eq!(next(&mut a).await, Incoming::Connected(id("b")));
    assert_eq!(next(&mut b).await, Incoming::Connected(id("a")));
    // Three idle timeouts with no traffic but pings.
    tokio::time::sleep(Duration::from_millis(1_800)).await;
    assert!(a.incoming.try_recv().is_err() && b.incoming.try_recv().is_err());
    assert_eq!(a.handle.stats().connections, 1, "never reconnected");
    a.handle
        .send(&id("b"), &query(&id("a"), 1))
        .expect("queued");
    assert_eq!(
        next(&mut b).await,
        Incoming::Frame {
            peer: id("a"),
            envelope: query(&id("a"), 1)
        }
    );
}

// A peer that stops answering (no frames, no pongs) is dropped after the
// idle timeout.
#[tokio::test]
async fn a_silent_peer_is_dropped_after_the_idle_timeout() {
    let (a_id, b_id) = (identity(&id("a")), identity(&id("b")));
    let b_cfg = tune(config(&id("b"), &b_id, Some(loopback())).with_peer(a_id.pin(id("a")), None));
    let mut b = start(b_cfg).await.expect("b starts");
    let addr = b.handle.local_addr().expect("addr");
    let mut ws = raw_connect(addr).await;
    let pins = PinSet::new(&id("a"), &[b_id.pin(id("b"))]).expect("pins");
    raw_hello(&mut ws, &a_id, &id("a"), &id("b"), &pins)
        .await
        .expect("hello accepted");
    assert_eq!(next(&mut b).await, Incoming::Connected(id("a")));
    // `ws` is never read again, so b's pings go unanswered.
    let started = tokio::time::Instant::now();
    assert_eq!(next(&mut b).await, Incoming::Disconnected(id("a")));
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "dropped only after the idle timeout"
    );
    drop(ws);
}

// C-ND-5: pre-authentication connections are capped. Two idle TCP
// connections (no upgrade, no hello) hold both handshake slots; a third
// is closed at once and counted; when the idle ones time out their slots
// are free again.
#[tokio::test]
async fn c_nd_5_handshakes_in_flight_are_capped() {
    use tokio::io::AsyncReadExt as _;
    let (a_id, b_id) = (identity(&id("a")), identity(&id("b")));
    let mut b_cfg = config(&id("b"), &b_id, Some(loopback())).with_peer(a_id.pin(id("a")), None);
    b_cfg.max_handshakes = 2;
    b_cfg.handshake_timeout = Duration::from_secs(1);
    let b = start(b_cfg).await.expect("b starts");
    let addr = b.handle.local_addr().expect("b listens");
    // Open, then wait until b has taken the connection (or closed it).
    async fn open(addr: SocketAddr) -> TcpStream {
        TcpStream::connect(addr).await.expect("tcp connect")
    }
    async fn closed_within(s: &mut TcpStream, d: Duration) -> bool {
        let mut buf = [0u8; 64];
        matches!(
            tokio::time::timeout(d, s.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        )
    }
    let mut held = vec![open(addr).await, open(addr).await];
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut third = open(addr).await;
    assert!(
        closed_within(&mut third, Duration::from_millis(500)).await,
        "beyond the cap a connection is closed at once"
    );
    assert_eq!(b.handle.stats().refused, 1);
    for s in &mut held {
        assert!(
            !closed_within(s, Duration::from_millis(100)).await,
            "the first two are held"
        );
    }
    // The held handshakes time out (1 s) and free their slots.
    for s in &mut held {
        assert!(closed_within(s, Duration::from_secs(3)).await, "timed out");
    }
    let mut again = open(addr).await;
    assert!(
        !closed_within(&mut again, Duration::from_millis(300)).await,
        "a freed slot holds a new handshake"
    );
    assert_eq!(
        b.handle.stats().refused,
        3,
        "the cap refusal and two timeouts"
    );
}

// C-PA-1: one source address holds at most its share of the handshake
// slots; a pinned peer dialling from another loopback address still gets
// in while that source's idle connections are held.
#[tokio::test]
async fn c_pa_1_handshakes_are_capped_per_source() {
    use tokio::io::AsyncReadExt as _;
    let (a_id, b_id) = (identity(&id("a")), identity(&id("b")));
    let mut b_cfg = config(&id("b"), &b_id, Some(loopback())).with_peer(a_id.pin(id("a")), None);
    b_cfg.max_handshakes = 16;
    b_cfg.max_handshakes_per_source = 3;
    let mut b = start(b_cfg).await.expect("b starts");
    let addr = b.handle.local_addr().expect("b listens");
    let mut flood = Vec::new();
    for _ in 0..10 {
        let s = tokio::net::TcpSocket::new_v4().expect("socket");
        s.bind(SocketAddr::from(([127, 0, 0, 2], 0)))
            .expect("bind 127.0.0.2");
        flood.push(s.connect(addr).await.expect("tcp connect"));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut open = 0;
    for s in &mut flood {
        let mut buf = [0u8; 16];
        if tokio::time::timeout(Duration::from_millis(20), s.read(&mut buf))
            .await
            .is_err()
        {
            open += 1;
        }
    }
    assert_eq!(open, 3, "one source held {open} handshake slots");
    assert_eq!(b.handle.stats().refused, 7);
    let a = start(config(&id("a"), &a_id, None).with_peer(b_id.pin(id("b")), Some(url(addr))))
        .await
        .expect("a starts");
    assert_eq!(next(&mut b).await, Incoming::Connected(id("a")));
    drop(a);
}

// C-PA-3: plaintext ws:// off loopback is refused at start unless
// explicitly allowed, for the listener and for peer URLs alike.
#[tokio::test]
async fn c_pa_3_plaintext_off_loopback_is_refused_unless_allowed() {
    let (a_id, b_id) = (identity(&id("a")), identity(&id("b")));
    let open = SocketAddr::from(([0, 0, 0, 0], 0));
    let refused = start(config(&id("b"), &b_id, Some(open))).await;
    assert!(
        matches!(refused, Err(crate::StartError::PlaintextRemote(_))),
        "{:?}",
        refused.err()
    );
    let remote = config(&id("a"), &a_id, None)
        .with_peer(b_id.pin(id("b")), Some("ws://192.0.2.7:7501/".into()));
    assert!(matches!(
        start(remote.clone()).await,
        Err(crate::StartError::PlaintextRemote(_))
    ));
    let mut allowed = remote;
    allowed.allow_plaintext_remote = true;
    assert!(start(allowed).await.is_ok());
    let local = config(&id("a"), &a_id, None)
        .with_peer(b_id.pin(id("b")), Some("ws://localhost:7501/".into()));
    assert!(start(local).await.is_ok());
    let mut listen = config(&id("b"), &b_id, Some(open));
    listen.allow_plaintext_remote = true;
    assert!(start(listen).await.is_ok());
}
