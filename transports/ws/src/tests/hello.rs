//! The hello exchange without sockets.

use super::*;
use crate::hello::*;

struct Side {
    agent: AgentId,
    identity: Identity,
}

fn side(name: &str) -> Side {
    Side {
        agent: id(name),
        identity: identity(&id(name)),
    }
}

fn pins(me: &Side, peer: &Side) -> PinSet {
    PinSet::new(&me.agent, &[peer.identity.pin(peer.agent.clone())]).expect("pins")
}

#[test]
fn an_honest_exchange_authenticates_both_sides() {
    let (server, client) = (side("s"), side("c"));
    let server_nonce = nonce().expect("nonce");
    let ch = challenge(&server.agent, &server_nonce);
    let (hello, state) = answer_challenge(&client.identity, &client.agent, &server.agent, &ch)
        .expect("challenge ok");
    let (who, welcome) = answer_hello(
        &server.identity,
        &server.agent,
        &pins(&server, &client),
        &server_nonce,
        &hello,
    )
    .expect("hello ok");
    assert_eq!(who, client.agent);
    check_welcome(
        &client.agent,
        &server.agent,
        &pins(&client, &server),
        &state,
        &welcome,
    )
    .expect("welcome ok");
}

#[test]
fn a_hello_cannot_be_replayed_against_a_fresh_nonce() {
    let (server, client) = (side("s"), side("c"));
    let first = nonce().expect("nonce");
    let (hello, _) = answer_challenge(
        &client.identity,
        &client.agent,
        &server.agent,
        &challenge(&server.agent, &first),
    )
    .expect("ok");
    let second = nonce().expect("nonce");
    let err = answer_hello(
        &server.identity,
        &server.agent,
        &pins(&server, &client),
        &second,
        &hello,
    )
    .expect_err("replay refused");
    assert_eq!(err, HelloError::BadSignature(client.agent.clone()));
}

#[test]
fn a_welcome_cannot_be_reflected_as_a_hello() {
    let (server, client) = (side("s"), side("c"));
    let server_nonce = nonce().expect("nonce");
    let (_, state) = answer_challenge(
        &client.identity,
        &client.agent,
        &server.agent,
        &challenge(&server.agent, &server_nonce),
    )
    .expect("ok");
    // The client's own hello signature presented back as a welcome: the
    // role label differs, so it does not verify.
    let t = transcript(
        "client",
        &server.agent,
        &client.agent,
        &server_nonce,
        &[0u8; 32],
    );
    let forged = prost::Message::encode_to_vec(&Welcome {
        cert: server.identity.cert_der.to_vec(),
        signature: server.identity.sign(&t).expect("sign"),
    });
    assert_eq!(
        check_welcome(
            &client.agent,
            &server.agent,
            &pins(&client, &server),
            &state,
            &forged
        ),
        Err(HelloError::BadSignature(server.agent.clone()))
    );
}

#[test]
fn malformed_and_foreign_hellos_are_typed_errors() {
    let (server, client) = (side("s"), side("c"));
    let server_nonce = nonce().expect("nonce");
    let p = pins(&server, &client);
    let answer =
        |bytes: &[u8]| answer_hello(&server.identity, &server.agent, &p, &server_nonce, bytes);
    assert!(matches!(
        answer(&[0xff, 0xff]),
        Err(HelloError::Malformed(_))
    ));
    let hello = |version, agent: &str, nonce: Vec<u8>| {
        prost::Message::encode_to_vec(&Hello {
            version,
            agent: agent.into(),
            nonce,
            cert: client.identity.cert_der.to_vec(),
            signature: vec![],
        })
    };
    assert_eq!(
        answer(&hello(2, "c", vec![0; 32])),
        Err(HelloError::Version(2))
    );
    assert!(matches!(
        answer(&hello(1, "c", vec![0; 3])),
        Err(HelloError::Malformed(_))
    ));
    assert_eq!(
        answer(&hello(1, "nobody", vec![0; 32])),
        Err(HelloError::UnknownAgent("nobody".into()))
    );
    assert_eq!(
        answer(&hello(1, "", vec![0; 32])),
        Err(HelloError::UnknownAgent(String::new()))
    );
    assert_eq!(
        answer(&hello(1, "c", vec![0; 32])),
        Err(HelloError::BadSignature(client.agent.clone()))
    );
}
