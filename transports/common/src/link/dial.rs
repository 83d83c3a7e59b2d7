//! Dial loops: keep a connection to a configured peer, re-dialling with
//! capped exponential backoff.

use std::collections::hash_map::RandomState;
use std::fmt::Display;
use std::future::Future;
use std::hash::BuildHasher as _;

use abhyasa_core::AgentId;

use super::Registry;

/// A dial attempt that produced no authenticated connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DialError(pub String);

impl DialError {
    /// Wraps any displayable error.
    pub fn new(e: impl Display) -> Self {
        Self(e.to_string())
    }
}

impl Registry {
    /// Spawns the dial loop for `peer`. While no connection to the peer is
    /// up it calls `attempt`, which dials, authenticates, attaches and runs
    /// the connection to its end: `Ok(())` once an authenticated connection
    /// has come and gone (the backoff resets), `Err` when none could be
    /// made (the failure is logged and the backoff grows). A connection the
    /// peer dialled in counts as up: no redundant dial is made.
    pub fn spawn_dialer<F, Fut>(&self, peer: AgentId, mut attempt: F)
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), DialError>> + Send,
    {
        let registry = self.clone();
        // Jitter seed: a randomly keyed hash (per process) of the pair, so
        // that nodes restarted together do not share a schedule.
        let seed = RandomState::new().hash_one((registry.local().as_str(), peer.as_str()));
        let mut schedule = registry.config().backoff.schedule(seed);
        let token = registry.shutdown_token();
        self.spawn(async move {
            loop {
                registry.wait_disconnected(&peer).await;
                let outcome = tokio::select! {
                    _ = token.cancelled() => return,
                    r = attempt() => r,
                };
                match outcome {
                    Ok(()) => {
                        tracing::info!(%peer, "connection ended; re-dialling");
                        schedule.reset();
                    }
                    Err(e) => {
                        registry.count_dial_failure();
                        tracing::warn!(%peer, error = %e, "dial failed");
                    }
                }
                let delay = schedule.next_delay();
                tokio::select! {
                    _ = token.cancelled() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        });
    }
}
