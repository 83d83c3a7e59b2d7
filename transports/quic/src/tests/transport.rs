use std::sync::Arc;

use abhyasa_core::PeerError;
use abhyasa_identity::Fingerprint;
use abhyasa_transport::SendError;

use super::*;
use crate::tls;
use crate::{start, StartError};

struct Pair {
    a: Transport,
    b: Transport,
    a_id: Identity,
    b_id: Identity,
    b_addr: SocketAddr,
}

/// B listens and knows A by pin only; A dials B.
async fn pair(b_link: Option<LinkConfig>) -> Pair {
    let (a_id, b_id) = (identity(&id("a")), identity(&id("b")));
    let mut b_cfg = config(&id("b"), &b_id, loopback()).with_peer(a_id.pin(id("a")), None);
    if let Some(link) = b_link {
        b_cfg.link = link;
    }
    let mut b = start(b_cfg).await.expect("b starts");
    let b_addr = b.handle.local_addr().expect("b listens");
    let a_cfg = config(&id("a"), &a_id, loopback()).with_peer(b_id.pin(id("b")), Some(b_addr));
    let mut a = start(a_cfg).await.expect("a starts");
    assert_eq!(next(&mut a).await, Incoming::Connected(id("b")));
    assert_eq!(next(&mut b).await, Incoming::Connected(id("a")));
    Pair {
        a,
        b,
        a_id,
        b_id,
        b_addr,
    }
}

/// A bare quinn client presenting `me`, pinning `expected` for the server.
async fn raw_client(
    me: &Identity,
    server: &AgentId,
    expected: Fingerprint,
    addr: SocketAddr,
) -> (
    quinn::Endpoint,
    Result<quinn::Connection, quinn::ConnectionError>,
) {
    let ep = quinn::Endpoint::client(loopback()).expect("client endpoint");
    let cfg = tls::dangerous_pinned_client_config(
        me,
        server,
        expected,
        Arc::new(quinn::TransportConfig::default()),
    )
    .expect("client config");
    let connecting = ep
        .connect_with(cfg, addr, tls::SERVER_NAME)
        .expect("connect");
    let conn = tokio::time::timeout(Duration::from_secs(5), connecting)
        .await
        .expect("handshake settles within 5 s");
    (ep, conn)
}

fn frame(env: &Envelope) -> Vec<u8> {
    let mut v = Vec::new();
    env.encode_frame(&mut v);
    v
}

#[tokio::test]
async fn frames_round_trip_both_ways() {
    let Pair { mut a, mut b, .. } = pair(None).await;
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
    // A frame larger than one read chunk, then many small ones, in order.
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
    assert_eq!(
        a.handle.send(&id("zed"), &query(&id("a"), 1)),
        Err(SendError::UnknownPeer(id("zed")))
    );
    a.handle.shutdown().await;
    assert_eq!(next(&mut b).await, Incoming::Disconnected(id("a")));
    b.handle.shutdown().await;
}

// C-T-4 over QUIC: bad frames are reported and consumed; the connection
// carries the next good frame.
#[tokio::test]
async fn bad_frames_are_reported_and_the_connection_survives() {
    let (a_id, b_id) = (identity(&id("a")), identity(&id("b")));
    let mut b_cfg = config(&id("b"), &b_id, loopback()).with_peer(a_id.pin(id("a")), None);
    b_cfg.link.max_frame = 1024;
    let mut b = start(b_cfg).await.expect("b starts");
    let addr = b.handle.local_addr().expect("addr");
    let (_ep, conn) = raw_client(&a_id, &id("b"), b_id.fingerprint, addr).await;
    let conn = conn.expect("a pinned client connects");
    let mut send = conn.open_uni().await.expect("stream");
    let mut recv = conn.accept_uni().await.expect("b's stream");
    let mut preamble = [0u8; 8];
    recv.read_exact(&mut preamble).await.expect("b's preamble");
    assert_eq!(&preamble, b"abhyasa1");

    let mut bytes = b"abhyasa1".to_vec();
    bytes.extend_from_slice(&[3u8, 0xff, 0xff, 0xff]); // complete frame, junk body
    let mut v2 = frame(&query(&id("a"), 0));
    assert_eq!(&v2[1..3], &[0x08, 0x01], "version is the first field");
    v2[2] = 0x02;
    bytes.extend_from_slice(&v2);
    bytes.extend_from_slice(&[0x81, 0x08]); // length 1025 > 1024
    bytes.extend_from_slice(&[0u8; 1025]);
    bytes.extend_from_slice(&frame(&query(&id("mallory"), 1)));
    bytes.extend_from_slice(&frame(&query(&id("a"), 2)));
    send.write_all(&bytes).await.expect("written");

    assert_eq!(next(&mut b).await, Incoming::Connected(id("a")));
    assert!(matches!(
        next(&mut b).await,
        Incoming::Malformed { peer, error: PeerError::Malformed { .. } } if peer == id("a")
    ));
    assert!(matches!(
        next(&mut b).await,
        Incoming::Malformed {
            error: PeerError::UnsupportedVersion { found: 2, .. },
            ..
        }
    ));
    assert!(matches!(
        next(&mut b).await,
        Incoming::Malformed {
            error: PeerError::FrameTooLarge {
                size: 1025,
                max: 1024
            },
            ..
        }
    ));
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
    b.handle.shutdown().await;
}

// Peer authentication: a client whose certificate nobody pinned is refused
// during the handshake and never reported as connected.
#[tokio::test]
async fn an_unknown_client_certificate_is_refused() {
    let Pair {
        a: _a,
        mut b,
        b_id,
        b_addr,
        ..
    } = pair(None).await;
    let rogue = identity(&id("a")); // claims to be "a", but with its own key
    let (_ep, conn) = raw_client(&rogue, &id("b"), b_id.fingerprint, b_addr).await;
    // In TLS 1.3 the client may finish before the server has checked its
    // certificate; the server's refusal then closes the connection.
    let closed = match conn {
        Err(e) => e,
        Ok(conn) => tokio::time::timeout(Duration::from_secs(5), conn.closed())
            .await
            .expect("server closes the connection within 5 s"),
    };
    assert!(
        matches!(
            closed,
            quinn::ConnectionError::TransportError(_) | quinn::ConnectionError::ConnectionClosed(_)
        ),
        "refused by the peer, got {closed:?}"
    );
    assert!(
        b.incoming.try_recv().is_err(),
        "nothing reported for a refused peer"
    );
}

// Peer authentication: a server presenting a key other than the one pinned
// for the peer being dialled is refused by the client.
#[tokio::test]
async fn a_mismatched_server_certificate_is_refused() {
    let Pair {
        a_id,
        b_id,
        mut b,
        b_addr,
        ..
    } = pair(None).await;
    let c_id = identity(&id("c"));
    // "a" dials b's address believing it is "c": b's certificate does not
    // match c's pin.
    let (_ep, conn) = raw_client(&a_id, &id("c"), c_id.fingerprint, b_addr).await;
    let err = conn.expect_err("pin mismatch refuses the handshake");
    assert!(err.to_string().contains("certificate"), "{err}");
    // And a correct pin for the right server still works.
    let (_ep2, ok) = raw_client(&a_id, &id("b"), b_id.fingerprint, b_addr).await;
    ok.expect("right pin connects");
    assert!(
        !matches!(b.incoming.try_recv(), Ok(Incoming::Frame { .. })),
        "no frame from the refused attempt"
    );
}

// The same refusals seen from full transports: neither side reports a
// connection, the refusing side counts it, the dialler keeps failing.
#[tokio::test]
async fn transports_with_unpinned_or_mismatched_keys_never_connect() {
    let Pair {
        a: _a,
        mut b,
        b_id,
        b_addr,
        ..
    } = pair(None).await;
    let impostor = identity(&id("a"));
    let cfg = config(&id("a"), &impostor, loopback()).with_peer(b_id.pin(id("b")), Some(b_addr));
    let bad = start(cfg).await.expect("starts");
    wait_for("two refusals", || b.handle.stats().refused >= 2).await;
    wait_for("a failed dial", || bad.handle.stats().dial_failures >= 1).await;
    assert!(
        b.incoming.try_recv().is_err(),
        "nothing reported for the impostor"
    );
    assert!(!bad.handle.is_connected(&id("b")));
    bad.handle.shutdown().await;

    // A node that pins someone else's key for "b" refuses b's certificate.
    let (x, other) = (identity(&id("x")), identity(&id("b")));
    let cfg = config(&id("x"), &x, loopback()).with_peer(other.pin(id("b")), Some(b_addr));
    let confused = start(cfg).await.expect("starts");
    wait_for("a failed dial", || {
        confused.handle.stats().dial_failures >= 2
    })
    .await;
    assert!(!confused.handle.is_connected(&id("b")));
    assert!(b.incoming.try_recv().is_err());
}

#[tokio::test]
async fn reconnects_after_either_peer_restarts() {
    let Pair {
        mut a,
        b,
        a_id,
        b_id,
        b_addr,
    } = pair(None).await;

    // B (the listener) restarts on the same address: A re-dials.
    b.handle.shutdown().await;
    assert_eq!(next(&mut a).await, Incoming::Disconnected(id("b")));
    assert_eq!(
        a.handle.send(&id("b"), &query(&id("a"), 1)),
        Err(SendError::NotConnected(id("b")))
    );
    let b_cfg = config(&id("b"), &b_id, b_addr).with_peer(a_id.pin(id("a")), None);
    let mut b = start(b_cfg).await.expect("b restarts");
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

    // A (the dialler) restarts: B sees it leave and come back.
    a.handle.shutdown().await;
    assert_eq!(next(&mut b).await, Incoming::Disconnected(id("a")));
    let a_cfg = config(&id("a"), &a_id, loopback()).with_peer(b_id.pin(id("b")), Some(b_addr));
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
    let a_id = identity(&id("a"));
    let mut cfg = config(&id("a"), &a_id, loopback());
    cfg.keep_alive = cfg.idle_timeout;
    assert!(matches!(start(cfg).await, Err(StartError::Timeouts(_))));
    let cfg = config(&id("a"), &a_id, loopback()).with_peer(a_id.pin(id("a")), None);
    assert!(matches!(start(cfg).await, Err(StartError::Pins(_))));
}

// Lossy-link knobs: keep-alives hold an idle connection open well past the
// idle timeout.
#[tokio::test]
async fn keep_alive_holds_an_idle_connection_open() {
    let (a_id, b_id) = (identity(&id("a")), identity(&id("b")));
    let tune = |mut c: QuicConfig| {
        c.idle_timeout = Duration::from_millis(600);
        c.keep_alive = Duration::from_millis(100);
        c
    };
    let mut b = start(tune(
        config(&id("b"), &b_id, loopback()).with_peer(a_id.pin(id("a")), None),
    ))
    .await
    .expect("b starts");
    let b_addr = b.handle.local_addr().expect("addr");
    let mut a = start(tune(
        config(&id("a"), &a_id, loopback()).with_peer(b_id.pin(id("b")), Some(b_addr)),
    ))
    .await
    .expect("a starts");
    assert_eq!(next(&mut a).await, Incoming::Connected(id("b")));
    assert_eq!(next(&mut b).await, Incoming::Connected(id("a")));
    // Three idle timeouts with no traffic but keep-alives.
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

// C-ND-5: pre-authentication connections are capped. With one handshake
// slot held by a client whose answers never arrive (a relay that forwards
// its packets to the server and drops the server's), the next client is
// refused at once; once the stalled handshake times out the slot is free
// and a client connects.
#[tokio::test]
async fn c_nd_5_handshakes_in_flight_are_capped() {
    let (a_id, b_id) = (identity(&id("a")), identity(&id("b")));
    let mut b_cfg = config(&id("b"), &b_id, loopback()).with_peer(a_id.pin(id("a")), None);
    b_cfg.max_handshakes = 1;
    b_cfg.connect_timeout = Duration::from_secs(2);
    let b = start(b_cfg).await.expect("b starts");
    let b_addr = b.handle.local_addr().expect("b listens");

    // The black hole: client -> relay -> b; b's answers are dropped.
    let relay = tokio::net::UdpSocket::bind(loopback())
        .await
        .expect("relay");
    let relay_addr = relay.local_addr().expect("relay addr");
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_536];
        while let Ok((n, from)) = relay.recv_from(&mut buf).await {
            if from != b_addr {
                let _ = relay.send_to(&buf[..n], b_addr).await;
            }
        }
    });
    let stalled_ep = quinn::Endpoint::client(loopback()).expect("client endpoint");
    let cfg = tls::dangerous_pinned_client_config(
        &a_id,
        &id("b"),
        b_id.fingerprint,
        Arc::new(quinn::TransportConfig::default()),
    )
    .expect("client config");
    let stalled = stalled_ep
        .connect_with(cfg, relay_addr, tls::SERVER_NAME)
        .expect("connect");
    let _stalled = tokio::spawn(stalled);
    // Nothing announces that b holds it; give the Initial time to land.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(b.handle.stats().refused, 0);

    // Every slot is taken: refused at once, counted.
    let (_ep, conn) = raw_client(&a_id, &id("b"), b_id.fingerprint, b_addr).await;
    let refusal = conn.expect_err("refused while the slot is held");
    assert!(
        format!("{refusal:?}").contains("CONNECTION_REFUSED"),
        "a CONNECTION_REFUSED close, got {refusal:?}"
    );
    assert_eq!(b.handle.stats().refused, 1);

    // The stalled handshake times out (2 s) and frees its slot.
    wait_for("the stalled handshake to time out", || {
        b.handle.stats().refused >= 2
    })
    .await;
    let (_ep, conn) = raw_client(&a_id, &id("b"), b_id.fingerprint, b_addr).await;
    assert!(conn.is_ok(), "a free slot admits a handshake: {conn:?}");
}

// Enrolment while running: B starts pinning nobody; A's dials are refused
// until B enrols A's pin, then A connects. Unenrolled, A's connection is
// closed (Disconnected on both sides), sends to A fail `UnknownPeer`, and
// A's redials are refused again.
#[tokio::test]
async fn peers_enrol_and_unenrol_while_running() {
    let (a_id, b_id) = (identity(&id("a")), identity(&id("b")));
    let (mut b, enrol) = crate::start_enrollable(config(&id("b"), &b_id, loopback()))
        .await
        .expect("b starts");
    let b_addr = b.handle.local_addr().expect("b listens");
    let a_cfg = config(&id("a"), &a_id, loopback()).with_peer(b_id.pin(id("b")), Some(b_addr));
    let mut a = start(a_cfg).await.expect("a starts");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!b.handle.is_connected(&id("a")), "not enrolled: refused");

    assert_eq!(enrol.enrol(&a_id.pin(id("a"))), Ok(true));
    assert_eq!(enrol.enrol(&a_id.pin(id("a"))), Ok(false), "idempotent");
    let other = identity(&id("a"));
    assert!(
        enrol.enrol(&other.pin(id("a"))).is_err(),
        "another key under an enrolled name"
    );
    assert_eq!(enrol.peers(), vec![id("a")]);
    assert_eq!(next(&mut b).await, Incoming::Connected(id("a")));
    assert_eq!(next(&mut a).await, Incoming::Connected(id("b")));

    assert!(enrol.unenrol(&id("a")).await);
    assert_eq!(next(&mut b).await, Incoming::Disconnected(id("a")));
    assert_eq!(next(&mut a).await, Incoming::Disconnected(id("b")));
    assert_eq!(
        b.handle.send(&id("a"), &query(&id("b"), 1)),
        Err(SendError::UnknownPeer(id("a")))
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!b.handle.is_connected(&id("a")), "redials refused again");
    assert!(!enrol.unenrol(&id("a")).await, "already gone");
    a.handle.shutdown().await;
    b.handle.shutdown().await;
}
