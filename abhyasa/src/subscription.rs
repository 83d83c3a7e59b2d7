//! Lag-safe event subscription: a subscriber never misses a
//! durable event silently.
//!
//! Every record a commit makes durable appends one [`StoredEvent`] to the
//! store's event log; right after the commit (before anything it released
//! is announced) the store thread broadcasts each as
//! [`NodeEvent::Logged`], carrying its [`EventId`]. A [`Subscription`]
//! yields those in id order, each exactly once: when its channel lagged
//! (the subscriber stopped reading while more than the channel's capacity
//! passed), or an id is missing for any other reason, it refills the gap
//! from the store's log ([`crate::Node::events`]) before it yields anything
//! newer, and skips what the channel repeats. Live events (peers up and
//! down, the state machines' own events) are best-effort: a lag may drop
//! some of them; their durable counterparts are in the log.
//!
//! Only when the missing events were compacted away (they are older than
//! the retention) does `recv` say so, with [`SubscriptionError::Compacted`]
//! naming where it resumes.

use std::collections::VecDeque;

use abhyasa_core::store::{EventId, StoreError, StoredEvent};
use tokio::sync::{broadcast, oneshot};

use crate::api::NodeEvent;
use crate::store_thread::{Job, Query, StoreJobs};

/// Log events read from the store per refill.
const REFILL: usize = 1024;

/// Why [`Subscription::recv`] returned no event.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SubscriptionError {
    /// The node has stopped; every durable event up to the stop was
    /// delivered.
    #[error("the node has stopped")]
    Stopped,
    /// Reading the log to refill a gap failed.
    #[error("refilling the event log failed: {0}")]
    Store(#[from] StoreError),
    /// Events `from..resume_from` were compacted from the log (older than
    /// the retention) before this subscriber read them; the next `recv`
    /// continues at `resume_from`.
    #[error("log events {from}..{resume_from} were compacted before they were read; resuming at {resume_from}")]
    Compacted {
        /// The first event that could not be delivered.
        from: EventId,
        /// The next event that will be.
        resume_from: EventId,
    },
}

/// A subscriber's view of a node's events: every durable event in order,
/// exactly once (see the module docs). Obtained from
/// [`crate::Node::subscribe`] or [`crate::Node::subscribe_from`].
pub struct Subscription {
    rx: broadcast::Receiver<NodeEvent>,
    store: StoreJobs,
    /// The id of the next durable event to yield.
    next: EventId,
    /// Events read from the store, not yet yielded.
    backlog: VecDeque<StoredEvent>,
    /// Reading the store until it has nothing at or after `next`.
    catching_up: bool,
    refills: u64,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("next", &self.next)
            .field("catching_up", &self.catching_up)
            .field("refills", &self.refills)
            .finish_non_exhaustive()
    }
}

impl Subscription {
    pub(crate) fn new(
        rx: broadcast::Receiver<NodeEvent>,
        store: StoreJobs,
        next: EventId,
        catch_up: bool,
    ) -> Self {
        Self {
            rx,
            store,
            next,
            backlog: VecDeque::new(),
            catching_up: catch_up,
            refills: 0,
        }
    }

    /// The id of the next durable event this subscription yields: store it
    /// to resume with [`crate::Node::subscribe_from`] after a restart.
    pub fn resume_from(&self) -> EventId {
        self.next
    }

    /// Reads of the store made to fill gaps so far (0 if the subscriber
    /// always kept up).
    pub fn refills(&self) -> u64 {
        self.refills
    }

    /// The next event. Durable events ([`NodeEvent::Logged`]) come in id
    /// order with none missing; live events as they happen. Cancel-safe:
    /// dropping the future loses no durable event (a refill that was
    /// interrupted is read again).
    pub async fn recv(&mut self) -> Result<NodeEvent, SubscriptionError> {
        loop {
            if let Some(e) = self.backlog.pop_front() {
                self.next = EventId(e.id.0 + 1);
                return Ok(NodeEvent::Logged(e));
            }
            if self.catching_up {
                self.refill().await?;
                continue;
            }
            match self.rx.recv().await {
                Ok(NodeEvent::Logged(e)) => {
                    if e.id < self.next {
                        // Already yielded from the store.
                        continue;
                    }
                    if e.id > self.next {
                        // A gap: the store has everything up to `e` (it
                        // was committed before it was broadcast).
                        self.catching_up = true;
                        continue;
                    }
                    self.next = EventId(e.id.0 + 1);
                    return Ok(NodeEvent::Logged(e));
                }
                Ok(other) => return Ok(other),
                Err(broadcast::error::RecvError::Lagged(_)) => self.catching_up = true,
                Err(broadcast::error::RecvError::Closed) => {
                    // The node stopped: what it committed last may not have
                    // reached the channel; the log still has it.
                    if self.refill().await.is_err() || self.backlog.is_empty() {
                        return Err(SubscriptionError::Stopped);
                    }
                }
            }
        }
    }

    /// Reads the next page of the log from `next` into the backlog; ends
    /// catching up when the log has nothing more.
    async fn refill(&mut self) -> Result<(), SubscriptionError> {
        let (tx, rx) = oneshot::channel();
        self.store
            .send(Job::Query(Query::Events(self.next, REFILL, tx)))
            .map_err(|_| SubscriptionError::Stopped)?;
        let page = rx.await.map_err(|_| SubscriptionError::Stopped)??;
        self.refills += 1;
        let Some(first) = page.first().map(|e| e.id) else {
            self.catching_up = false;
            return Ok(());
        };
        let from = self.next;
        self.backlog
            .extend(page.into_iter().filter(|e| e.id >= from));
        if first > from {
            self.next = first;
            return Err(SubscriptionError::Compacted {
                from,
                resume_from: first,
            });
        }
        Ok(())
    }
}
