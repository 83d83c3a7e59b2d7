//! What the HTTP binding's server and transport share: the peers, the
//! state every request handler reads (credentials, waiting requests, the
//! peers' inbound sinks, counters) and the answers handed between them.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use abhyasa_core::wire::{Envelope, Message, ProtocolError};
use abhyasa_core::{AgentId, CustodyAck, Obligation, ObligationId};
use abhyasa_identity::Fingerprint;
use abhyasa_transport::link::{InboundSink, Registry};
use bytes::Bytes;
use tokio::sync::oneshot;

use crate::client::JsonClient;

/// One peer of the HTTP binding: who it is, how it proves it, and where
/// its endpoints are.
#[derive(Clone, PartialEq, Eq)]
pub struct HttpPeer {
    /// The peer's agent id: the custodian AB-3 keys idempotency on for
    /// everything this peer's credential sends.
    pub agent: AgentId,
    /// The bearer credential the peer presents to us (declared in the
    /// card's security schemes), for A2A clients that cannot do mTLS.
    /// Unique per peer. `None`: only its pinned certificate authenticates it.
    pub token: Option<String>,
    /// SHA-256 fingerprint of the peer's node certificate: with
    /// [`HttpConfig::tls`](crate::transport::HttpConfig::tls), a client presenting it is this peer (mTLS), and
    /// our POSTs to its `https://` endpoints accept only it.
    pub fingerprint: Option<Fingerprint>,
    /// Where this peer, as custodian, receives asynchronous final acks.
    pub custody_ack_endpoint: Option<String>,
    /// Where we POST obligations for this peer (we as custodian).
    pub obligation_endpoint: Option<String>,
    /// The credential we present on our POSTs to the peer.
    pub outbound_token: Option<String>,
}

impl std::fmt::Debug for HttpPeer {
    // Credentials never reach logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpPeer")
            .field("agent", &self.agent)
            .field("fingerprint", &self.fingerprint)
            .field("custody_ack_endpoint", &self.custody_ack_endpoint)
            .field("obligation_endpoint", &self.obligation_endpoint)
            .finish_non_exhaustive()
    }
}

/// What the node answered a waiting request with.
#[derive(Debug, Clone)]
pub(crate) enum Answer {
    Ack(CustodyAck),
    Error(ProtocolError),
}

/// Why an obligation could not be handed to the node.
#[derive(Debug)]
pub(crate) enum SubmitError {
    /// Too many requests are waiting.
    Busy,
    /// The node dropped its incoming receiver.
    Gone,
}

/// Counters of the binding.
#[derive(Debug, Default)]
pub struct HttpStats {
    /// Requests refused 401.
    pub unauthenticated: AtomicU64,
    /// Final acks POSTed to a custodian's endpoint.
    pub acks_pushed: AtomicU64,
    /// Final acks that could not be pushed (the custodian's retry will
    /// get them re-acked).
    pub push_failures: AtomicU64,
    /// Obligations POSTed to peers.
    pub obligations_posted: AtomicU64,
    /// Requests refused 503 because `max_inflight` were being served.
    pub overloaded: AtomicU64,
    /// TLS connections refused: unpinned or wrong client certificate, a
    /// failed or timed-out handshake, or too many handshakes at once.
    pub tls_refused: AtomicU64,
    /// Connections closed at accept: no pre-authentication slot (in total
    /// or for the source) or no descriptor left in the budget (C-PA-1).
    pub connections_refused: AtomicU64,
    /// Connections closed because they were not authenticated within
    /// `handshake_timeout`, TLS handshake included (C-PA-1).
    pub unauthenticated_closed: AtomicU64,
}

pub(crate) struct PeerSide {
    pub(crate) config: HttpPeer,
    /// The pinned client configuration for this peer's `https://`
    /// endpoints.
    pub(crate) client_tls: Option<Arc<rustls::ClientConfig>>,
    pub(crate) sink: tokio::sync::Mutex<InboundSink>,
}

pub(crate) type WaitKey = (AgentId, ObligationId);

pub(crate) struct State {
    pub(crate) local: AgentId,
    pub(crate) tokens: HashMap<String, AgentId>,
    /// With TLS on: the peers whose credential is taken on a connection
    /// without a certificate. `None`: plain HTTP, every credential is.
    pub(crate) bearer_only: Option<std::collections::HashSet<AgentId>>,
    pub(crate) peers: HashMap<AgentId, PeerSide>,
    pub(crate) waiting: Mutex<HashMap<WaitKey, Vec<oneshot::Sender<Answer>>>>,
    pub(crate) card: Bytes,
    pub(crate) max_body: usize,
    pub(crate) sync_wait: Duration,
    pub(crate) max_waiting: usize,
    pub(crate) max_frame: usize,
    pub(crate) client: JsonClient,
    pub(crate) registry: Registry,
    pub(crate) stats: Arc<HttpStats>,
    pub(crate) inflight: Arc<tokio::sync::Semaphore>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Each critical section is a single map operation; ignore poisoning.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl State {
    /// Hands an obligation from `peer` to the node and waits (bounded) for
    /// the node's answer. `Ok(None)`: no answer within `sync_wait`; the
    /// final ack will be pushed to the peer's `custody_ack_endpoint`.
    pub(crate) async fn submit(
        &self,
        peer: &AgentId,
        obligation: Obligation,
    ) -> Result<Option<Answer>, SubmitError> {
        let Some(side) = self.peers.get(peer) else {
            return Err(SubmitError::Gone);
        };
        let key = (peer.clone(), obligation.id().clone());
        let (tx, rx) = oneshot::channel();
        {
            // Registered before the frame is pushed, so the ack cannot
            // overtake its waiter.
            let mut w = lock(&self.waiting);
            let total: usize = w.values().map(Vec::len).sum();
            if total >= self.max_waiting {
                return Err(SubmitError::Busy);
            }
            w.entry(key.clone()).or_default().push(tx);
        }
        let mut frame = Vec::new();
        Envelope::new(peer.clone(), Message::Obligation(obligation)).encode_frame(&mut frame);
        let pushed = side.sink.lock().await.push_message(&frame).await;
        if pushed.is_err() {
            self.forget(&key);
            return Err(SubmitError::Gone);
        }
        let answer = tokio::time::timeout(self.sync_wait, rx).await;
        self.forget(&key);
        Ok(answer.ok().and_then(Result::ok))
    }

    /// Drops waiters whose request is gone (answered or timed out).
    pub(crate) fn forget(&self, key: &WaitKey) {
        let mut w = lock(&self.waiting);
        if let Some(v) = w.get_mut(key) {
            v.retain(|s| !s.is_closed());
            if v.is_empty() {
                w.remove(key);
            }
        }
    }

    /// Feeds acks a peer POSTed (or answered) to the node, as a frame from
    /// that peer.
    pub(crate) async fn deliver_acks(&self, peer: &AgentId, acks: Vec<CustodyAck>) -> bool {
        let Some(side) = self.peers.get(peer) else {
            return false;
        };
        let mut frame = Vec::new();
        Envelope::new(peer.clone(), Message::Acks(acks)).encode_frame(&mut frame);
        side.sink.lock().await.push_message(&frame).await.is_ok()
    }

    pub(crate) fn take_waiters(&self, key: &WaitKey) -> Vec<oneshot::Sender<Answer>> {
        lock(&self.waiting).remove(key).unwrap_or_default()
    }
}

/// The agent a connection's pinned client certificate proved (mTLS); the
/// routes bind every request on that connection to it (C-A2A-3).
#[derive(Clone, Debug)]
pub(crate) struct TlsPeer(pub(crate) AgentId);

impl State {
    /// The peer a request's bearer credential names, if it is taken on a
    /// connection without a client certificate (C-A2A-3).
    pub(crate) fn bearer_peer(&self, headers: &hyper::HeaderMap) -> Option<&AgentId> {
        let agent = self.token_agent(headers)?;
        match &self.bearer_only {
            Some(listed) if !listed.contains(agent) => None,
            _ => Some(agent),
        }
    }

    /// The peer a request's bearer credential belongs to, if any.
    pub(crate) fn token_agent(&self, headers: &hyper::HeaderMap) -> Option<&AgentId> {
        let token = headers
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, rest) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
            })?;
        self.tokens.get(token)
    }
}
