//! Several transports as one, routed by peer.
//!
//! A node takes one [`Transport`]. When it reaches some peers over QUIC and
//! others over the A2A HTTP binding, [`compose`] joins the started
//! transports: `send` goes to the transport that has the peer in its
//! table, and the incoming channels are merged into one. Each part keeps
//! its own authentication, so `Incoming::Frame::peer` is still the peer
//! *that part* authenticated (AB-3 keys on it), and a peer can only be
//! reached through the part that pins it.
//!
//! Routing is by the parts' peer tables, checked in order: a peer two parts
//! both accept is refused at composition ([`ComposeError::AmbiguousPeer`]);
//! if one is added to a second part later, the first part keeps it.

use std::sync::Arc;

use abhyasa_core::AgentId;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::{Transport, TransportHandle};

/// Why transports could not be composed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ComposeError {
    /// No transport to compose.
    #[error("no transport to compose")]
    Empty,
    /// The parts belong to different nodes.
    #[error("transport for {found} cannot join transports of {expected}")]
    LocalMismatch {
        /// The first part's agent id.
        expected: AgentId,
        /// The mismatching part's agent id.
        found: AgentId,
    },
    /// Two parts accept the same peer: which one authenticates it would be
    /// a matter of timing.
    #[error("peer {0} is configured on more than one transport")]
    AmbiguousPeer(AgentId),
}

/// The routing table behind a composed [`TransportHandle`].
#[derive(Debug)]
pub(crate) struct Routed {
    local: AgentId,
    parts: Vec<TransportHandle>,
    forwarders: TaskTracker,
    stop: CancellationToken,
}

impl Routed {
    pub(crate) fn local(&self) -> &AgentId {
        &self.local
    }

    pub(crate) fn parts(&self) -> &[TransportHandle] {
        &self.parts
    }

    /// The first part whose peer table holds `peer`.
    pub(crate) fn route(&self, peer: &AgentId) -> Option<&TransportHandle> {
        self.parts.iter().find(|h| h.is_known(peer))
    }

    /// Stops forwarding (the parts are shut down) and waits for it.
    pub(crate) async fn wait_forwarders(&self) {
        self.stop.cancel();
        self.forwarders.close();
        self.forwarders.wait().await;
    }
}

/// Joins started transports of one node into one that routes each peer to
/// the part that accepts it. The merged incoming channel holds `queue`
/// items (at least 1); each part still bounds its own. Must be called
/// within a tokio runtime. Shutting the composite down shuts every part
/// down; dropping its last handle drops theirs.
pub fn compose(parts: Vec<Transport>, queue: usize) -> Result<Transport, ComposeError> {
    let Some(first) = parts.first() else {
        return Err(ComposeError::Empty);
    };
    let local = first.handle.local().clone();
    let mut seen = std::collections::HashSet::new();
    for p in &parts {
        if p.handle.local() != &local {
            return Err(ComposeError::LocalMismatch {
                expected: local,
                found: p.handle.local().clone(),
            });
        }
        for peer in p.handle.known_peers() {
            if !seen.insert(peer.clone()) {
                return Err(ComposeError::AmbiguousPeer(peer));
            }
        }
    }
    let (tx, rx) = mpsc::channel(queue.max(1));
    let forwarders = TaskTracker::new();
    let stop = CancellationToken::new();
    let mut handles = Vec::with_capacity(parts.len());
    for Transport {
        handle,
        mut incoming,
    } in parts
    {
        handles.push(handle);
        let (tx, stop) = (tx.clone(), stop.clone());
        // Order within each part is kept; parts interleave as items arrive.
        forwarders.spawn(async move {
            loop {
                let item = tokio::select! {
                    _ = stop.cancelled() => break,
                    i = incoming.recv() => match i { Some(i) => i, None => break },
                };
                let sent = tokio::select! {
                    _ = stop.cancelled() => break,
                    r = tx.send(item) => r,
                };
                if sent.is_err() {
                    break;
                }
            }
        });
    }
    let routed = Arc::new(Routed {
        local,
        parts: handles,
        forwarders,
        stop,
    });
    Ok(Transport {
        handle: TransportHandle::routed(routed),
        incoming: rx,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::time::Duration;

    use abhyasa_core::wire::{Envelope, Message};
    use abhyasa_core::{AgentId, ObligationId};

    use super::{compose, ComposeError};
    use crate::mem::MemNetwork;
    use crate::{Incoming, LinkConfig, SendError};

    fn agent(s: &str) -> AgentId {
        AgentId::new(s).unwrap()
    }

    fn query(from: &str, id: &str) -> Envelope {
        Envelope::new(
            agent(from),
            Message::StatusQuery(vec![ObligationId::new(id).unwrap()]),
        )
    }

    async fn next_frame(rx: &mut tokio::sync::mpsc::Receiver<Incoming>) -> (AgentId, Envelope) {
        loop {
            let item = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .expect("an item in time")
                .expect("channel open");
            if let Incoming::Frame { peer, envelope } = item {
                return (peer, envelope);
            }
        }
    }

    // Alice reaches bob on one network and carol on another through one
    // composed transport: sends are routed by peer, both peers' frames
    // arrive on one channel tagged with the peer the part authenticated,
    // and a peer neither part knows is refused.
    #[tokio::test]
    async fn routes_by_peer_and_merges_incoming() {
        let (n1, n2) = (MemNetwork::new(1), MemNetwork::new(2));
        let cfg = LinkConfig::default();
        let mut bob = n1.join(agent("bob"), cfg.clone()).await.unwrap();
        let mut carol = n2.join(agent("carol"), cfg.clone()).await.unwrap();
        let a1 = n1.join(agent("alice"), cfg.clone()).await.unwrap();
        let a2 = n2.join(agent("alice"), cfg.clone()).await.unwrap();
        let mut alice = compose(vec![a1, a2], 64).unwrap();
        let h = alice.handle.clone();
        assert_eq!(h.known_peers(), vec![agent("bob"), agent("carol")]);
        assert!(h.is_known(&agent("carol")) && !h.is_known(&agent("dave")));

        h.send(&agent("bob"), &query("alice", "to-bob")).unwrap();
        h.send(&agent("carol"), &query("alice", "to-carol"))
            .unwrap();
        let (p, e) = next_frame(&mut bob.incoming).await;
        assert_eq!((p, e), (agent("alice"), query("alice", "to-bob")));
        let (p, e) = next_frame(&mut carol.incoming).await;
        assert_eq!((p, e), (agent("alice"), query("alice", "to-carol")));
        assert_eq!(
            h.send(&agent("dave"), &query("alice", "x")),
            Err(SendError::UnknownPeer(agent("dave")))
        );

        bob.handle
            .send(&agent("alice"), &query("bob", "from-bob"))
            .unwrap();
        carol
            .handle
            .send(&agent("alice"), &query("carol", "from-carol"))
            .unwrap();
        let mut got = vec![
            next_frame(&mut alice.incoming).await,
            next_frame(&mut alice.incoming).await,
        ];
        got.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            got,
            vec![
                (agent("bob"), query("bob", "from-bob")),
                (agent("carol"), query("carol", "from-carol")),
            ]
        );
        assert!(h.is_connected(&agent("bob")) && h.is_connected(&agent("carol")));
        assert_eq!(h.stats().frames_sent, 2);
        assert_eq!(h.stats().frames_received, 2);

        tokio::time::timeout(Duration::from_secs(5), h.shutdown())
            .await
            .expect("every part shuts down");
        assert_eq!(
            h.send(&agent("bob"), &query("alice", "late")),
            Err(SendError::Closed)
        );
    }

    #[tokio::test]
    async fn refuses_ambiguous_peers_foreign_parts_and_nothing() {
        let n = MemNetwork::new(3);
        let cfg = LinkConfig::default();
        let _bob = n.join(agent("bob"), cfg.clone()).await.unwrap();
        let a1 = n.join(agent("alice"), cfg.clone()).await.unwrap();
        let n2 = MemNetwork::new(4);
        let _bob2 = n2.join(agent("bob"), cfg.clone()).await.unwrap();
        let a2 = n2.join(agent("alice"), cfg.clone()).await.unwrap();
        assert_eq!(
            compose(vec![a1, a2], 8).err(),
            Some(ComposeError::AmbiguousPeer(agent("bob")))
        );
        let n3 = MemNetwork::new(5);
        let x = n3.join(agent("x"), cfg.clone()).await.unwrap();
        let y = n3.join(agent("y"), cfg.clone()).await.unwrap();
        assert!(matches!(
            compose(vec![x, y], 8).err(),
            Some(ComposeError::LocalMismatch { .. })
        ));
        assert_eq!(compose(vec![], 8).err(), Some(ComposeError::Empty));
    }
}
