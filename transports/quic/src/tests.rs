//! Loopback tests of the QUIC transport (127.0.0.1 only, bounded in time).

mod transport;

use std::net::SocketAddr;
use std::time::Duration;

use abhyasa_core::wire::{Envelope, Message};
use abhyasa_core::{AgentId, ObligationId};
use abhyasa_transport::{Backoff, Incoming, LinkConfig, Transport};

use abhyasa_identity::{generate_identity, Identity};

use crate::QuicConfig;

pub(super) fn id(s: &str) -> AgentId {
    AgentId::new(s).expect("valid agent id")
}

pub(super) fn identity(agent: &AgentId) -> Identity {
    generate_identity(agent).expect("identity")
}

pub(super) fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// Tight knobs so failures show quickly: the suite must stay well under
/// 20 s.
pub(super) fn config(agent: &AgentId, identity: &Identity, listen: SocketAddr) -> QuicConfig {
    let mut c = QuicConfig::new(agent.clone(), identity.clone(), listen);
    c.idle_timeout = Duration::from_secs(5);
    c.keep_alive = Duration::from_millis(500);
    c.connect_timeout = Duration::from_secs(3);
    c.link = LinkConfig {
        backoff: Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(300),
        },
        ..LinkConfig::default()
    };
    c
}

pub(super) fn query(sender: &AgentId, n: usize) -> Envelope {
    let oid = ObligationId::new(format!("o-{n}")).expect("valid id");
    Envelope::new(sender.clone(), Message::StatusQuery(vec![oid]))
}

pub(super) async fn next(t: &mut Transport) -> Incoming {
    tokio::time::timeout(Duration::from_secs(10), t.incoming.recv())
        .await
        .expect("an incoming item within 10 s")
        .expect("incoming channel open")
}

/// Polls `cond` until it holds, for at most 10 s. For conditions no event
/// announces (counters).
pub(super) async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
