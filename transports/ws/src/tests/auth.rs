//! Peer authentication: the signed hello refuses unknown agents, keys that
//! are not the pinned ones and bad signatures, on both sides.

use futures_util::{SinkExt as _, StreamExt as _};
use prost::Message as _;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message as WsMessage;

use super::*;
use crate::hello::{self as h, Challenge, Hello};
use crate::HelloError;

/// The server's refusal: a close frame with the policy code.
async fn expect_refused(ws: &mut RawWs) {
    let msg = tokio::time::timeout(Duration::from_secs(5), ws.next())
        .await
        .expect("server answers within 5 s");
    match msg {
        Some(Ok(WsMessage::Close(Some(c)))) => assert_eq!(c.code, CloseCode::Policy),
        other => panic!("expected a policy close, got {other:?}"),
    }
}

fn pins_for_b(b: &Identity) -> PinSet {
    PinSet::new(&id("a"), &[b.pin(id("b"))]).expect("pins")
}

#[tokio::test]
async fn an_unpinned_agent_is_refused() {
    let Server {
        mut b, b_id, addr, ..
    } = server(None).await;
    let rogue = identity(&id("rogue"));
    let mut ws = raw_connect(addr).await;
    let err = raw_hello(&mut ws, &rogue, &id("rogue"), &id("b"), &pins_for_b(&b_id))
        .await
        .expect_err("refused");
    assert!(
        matches!(err, HelloError::Closed(ref why) if why.contains("1008")),
        "{err}"
    );
    assert!(
        b.incoming.try_recv().is_err(),
        "nothing reported for a refused peer"
    );
}

#[tokio::test]
async fn a_pinned_agent_with_another_key_is_refused() {
    let Server {
        mut b, b_id, addr, ..
    } = server(None).await;
    let impostor = identity(&id("a")); // says "a", holds another key
    let mut ws = raw_connect(addr).await;
    let err = raw_hello(&mut ws, &impostor, &id("a"), &id("b"), &pins_for_b(&b_id))
        .await
        .expect_err("refused");
    assert!(matches!(err, HelloError::Closed(_)), "{err}");
    assert!(b.incoming.try_recv().is_err());
}

#[tokio::test]
async fn a_wrong_hello_signature_is_refused() {
    let Server {
        mut b, a_id, addr, ..
    } = server(None).await;
    let mut ws = raw_connect(addr).await;
    let challenge = match ws.next().await {
        Some(Ok(WsMessage::Binary(b))) => Challenge::decode(&b[..]).expect("challenge"),
        other => panic!("expected the challenge, got {other:?}"),
    };
    let client_nonce = h::nonce().expect("nonce");
    // The right key and certificate, but a signature over another server
    // nonce: what a replay from an earlier connection would carry.
    let stale = h::transcript("client", &id("b"), &id("a"), &[7u8; 32], &client_nonce);
    let hello = Hello {
        version: h::HELLO_VERSION,
        agent: "a".into(),
        nonce: client_nonce,
        cert: a_id.cert_der.to_vec(),
        signature: a_id.sign(&stale).expect("sign"),
    };
    assert_eq!(challenge.agent, "b");
    ws.send(WsMessage::Binary(hello.encode_to_vec().into()))
        .await
        .expect("sent");
    expect_refused(&mut ws).await;
    assert!(b.incoming.try_recv().is_err());
}

#[tokio::test]
async fn frames_before_the_hello_are_refused() {
    let Server { mut b, addr, .. } = server(None).await;
    let mut ws = raw_connect(addr).await;
    let _challenge = ws.next().await;
    ws.send(WsMessage::Binary(frame(&query(&id("a"), 1)).into()))
        .await
        .expect("sent");
    expect_refused(&mut ws).await;
    assert!(b.incoming.try_recv().is_err());
}

#[tokio::test]
async fn the_client_refuses_a_server_that_is_not_the_pinned_one() {
    let Server {
        b: _b,
        b_id,
        a_id,
        addr,
    } = server(None).await;
    // Dialling "c" but reaching b: b names itself, and the hello stops.
    let c_id = identity(&id("c"));
    let pins = PinSet::new(&id("a"), &[c_id.pin(id("c"))]).expect("pins");
    let mut ws = raw_connect(addr).await;
    let err = raw_hello(&mut ws, &a_id, &id("a"), &id("c"), &pins)
        .await
        .expect_err("refused");
    assert!(matches!(err, HelloError::WrongAgent { .. }), "{err}");

    // Dialling "b" with c's key pinned for it: b's welcome does not verify.
    let pins = PinSet::new(&id("a"), &[c_id.pin(id("b"))]).expect("pins");
    let mut ws = raw_connect(addr).await;
    let err = raw_hello(&mut ws, &a_id, &id("a"), &id("b"), &pins)
        .await
        .expect_err("refused");
    assert!(matches!(err, HelloError::KeyMismatch { .. }), "{err}");

    // The right pin works.
    let mut ws = raw_connect(addr).await;
    raw_hello(&mut ws, &a_id, &id("a"), &id("b"), &pins_for_b(&b_id))
        .await
        .expect("accepted");
}

#[tokio::test]
async fn a_transport_with_the_wrong_key_never_connects_but_the_right_one_does() {
    let Server {
        mut b,
        a_id,
        b_id,
        addr,
    } = server(None).await;
    // A full node claiming "a" with a key b has not pinned: b refuses every
    // hello and reports nothing; the impostor counts failed dials.
    let impostor = identity(&id("a"));
    let cfg = config(&id("a"), &impostor, None).with_peer(b_id.pin(id("b")), Some(url(addr)));
    let bad = start(cfg).await.expect("starts");
    wait_for("two refusals", || b.handle.stats().refused >= 2).await;
    wait_for("a failed dial", || bad.handle.stats().dial_failures >= 1).await;
    assert!(
        b.incoming.try_recv().is_err(),
        "nothing reported for the impostor"
    );
    assert!(!bad.handle.is_connected(&id("b")));
    bad.handle.shutdown().await;

    let cfg = config(&id("a"), &a_id, None).with_peer(b_id.pin(id("b")), Some(url(addr)));
    let mut good = start(cfg).await.expect("starts");
    assert_eq!(next(&mut good).await, Incoming::Connected(id("b")));
    assert_eq!(next(&mut b).await, Incoming::Connected(id("a")));
}
