//! The write-ahead gate: transmits and events wait behind the records they
//! depend on.

use std::collections::VecDeque;

use super::record::Record;

/// Proof that a batch of records was polled; hand it back to
/// `handle_committed` once the batch is durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[must_use = "a commit token must be handed back once its batch is durable"]
pub struct CommitToken(pub(crate) u64);

/// Records to make durable, in order, in one commit.
#[derive(Debug)]
#[must_use = "records must be committed before dependent transmits are released"]
pub struct RecordBatch {
    /// The records, in emission order.
    pub records: Vec<Record>,
    token: CommitToken,
}

impl RecordBatch {
    /// The token that releases what depends on this batch.
    pub fn token(&self) -> CommitToken {
        self.token
    }
}

/// Most records a new batch reserves room for (see `poll_records`).
const BATCH_ROOM_MAX: usize = 4096;

/// Orders records, transmits and events. A transmit or event is released
/// only once every record emitted before it is committed.
#[derive(Debug, Clone)]
pub(crate) struct Outbox<T, E> {
    emitted: u64,
    polled: u64,
    committed: u64,
    records: Vec<Record>,
    transmits: VecDeque<(u64, T)>,
    events: VecDeque<(u64, E)>,
}

impl<T, E> Default for Outbox<T, E> {
    fn default() -> Self {
        Self {
            emitted: 0,
            polled: 0,
            committed: 0,
            records: Vec::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
        }
    }
}

impl<T, E> Outbox<T, E> {
    pub(crate) fn record(&mut self, r: Record) {
        self.records.push(r);
        self.emitted += 1;
    }

    pub(crate) fn transmit(&mut self, t: T) {
        self.transmits.push_back((self.emitted, t));
    }

    pub(crate) fn event(&mut self, e: E) {
        self.events.push_back((self.emitted, e));
    }

    pub(crate) fn poll_records(&mut self) -> Option<RecordBatch> {
        if self.records.is_empty() {
            return None;
        }
        self.polled = self.emitted;
        // The next batch starts with room for one like this one: grown
        // from empty, a batch of a few hundred records is copied over in
        // eight reallocations.
        let room = Vec::with_capacity(self.records.len().min(BATCH_ROOM_MAX));
        Some(RecordBatch {
            records: std::mem::replace(&mut self.records, room),
            token: CommitToken(self.emitted),
        })
    }

    /// Marks records up to `token` durable. Batches must be committed in
    /// the order they were polled; a token from the future is ignored.
    pub(crate) fn committed(&mut self, token: CommitToken) {
        if token.0 <= self.polled {
            self.committed = self.committed.max(token.0);
        }
    }

    pub(crate) fn poll_transmit(&mut self) -> Option<T> {
        match self.transmits.front() {
            Some((needs, _)) if *needs <= self.committed => {
                self.transmits.pop_front().map(|(_, t)| t)
            }
            _ => None,
        }
    }

    pub(crate) fn peek_transmit(&self) -> Option<&T> {
        match self.transmits.front() {
            Some((needs, t)) if *needs <= self.committed => Some(t),
            _ => None,
        }
    }

    pub(crate) fn poll_event(&mut self) -> Option<E> {
        match self.events.front() {
            Some((needs, _)) if *needs <= self.committed => self.events.pop_front().map(|(_, e)| e),
            _ => None,
        }
    }

    pub(crate) fn uncommitted(&self) -> u64 {
        self.emitted - self.committed
    }

    pub(crate) fn held_transmits(&self) -> usize {
        self.transmits.len()
    }
}
