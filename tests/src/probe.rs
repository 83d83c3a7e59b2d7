//! Stores seen from the harness: alice's store wrapped to record what each
//! commit made durable, and a SimStore that outlives its node.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use abhyasa_core::custody::Record;
use abhyasa_core::principal::DecisionItem;
use abhyasa_core::store::SimStore;
use abhyasa_core::store::{
    Committed, Compacted, DurableState, EscalationEntry, EventId, Inbox, ListState, Listed, Page,
    Store, StoreError, StoredEvent,
};
use abhyasa_core::{ObligationId, Timestamp};

use crate::common::lock;

/// One custody attempt as alice's store made it durable: the record that
/// counted it (`CustodyOpened` for attempt 1, `AttemptMade` after), the
/// `now` its commit was stamped with, and the next attempt's due time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurableAttempt {
    /// The obligation.
    pub id: ObligationId,
    /// Attempts made, this one included.
    pub attempts: u32,
    /// When the custodian scheduled the next attempt.
    pub next_at: Timestamp,
    /// The `now` passed to the commit that made it durable (taken by the
    /// driver when it started the commit, so never before the attempt was
    /// decided).
    pub commit_now: Timestamp,
    /// When custody was opened (attempt 1 only).
    pub offered_at: Option<Timestamp>,
}

#[derive(Debug, Default)]
struct ProbeState {
    delay: Duration,
    durable: HashMap<ObligationId, u32>,
    attempts: Vec<DurableAttempt>,
}

/// What alice's store has made durable, seen from a wrapper around it
/// ([`Probed`]; every [`Disk`](crate::Disk) of a world's custodian is wrapped).
///
/// The wrapper records a commit's custody attempts only after the inner
/// store's `commit` returned `Ok`: whatever the probe holds was durable
/// (AB-1). It can also slow each commit down ([`Probe::delay_commits`]),
/// so a driver that released a transmit before its commit returned would
/// show that transmit arriving before the probe holds its attempt
/// (C-AB1-2).
#[derive(Debug, Clone, Default)]
pub struct Probe(Arc<Mutex<ProbeState>>);

impl Probe {
    /// Sleeps `d` at the start of every commit, before the inner store
    /// commits (`Duration::ZERO`: no delay).
    pub fn delay_commits(&self, d: Duration) {
        lock(&self.0).delay = d;
    }

    /// The attempts of `id` that are durable (0: custody not yet durable).
    pub fn durable_attempts(&self, id: &ObligationId) -> u32 {
        lock(&self.0).durable.get(id).copied().unwrap_or(0)
    }

    /// Every custody attempt made durable so far, in commit order.
    pub fn attempts(&self) -> Vec<DurableAttempt> {
        lock(&self.0).attempts.clone()
    }

    /// Forgets everything (the store it watched was lost).
    pub(crate) fn clear(&self) {
        let mut s = lock(&self.0);
        s.durable.clear();
        s.attempts.clear();
    }

    /// Notes what a successful commit of `batches` at `now` made durable,
    /// folding as the stores do: a replayed open changes nothing, attempt
    /// counts only grow.
    fn committed(&self, now: Timestamp, batches: &[&[Record]]) {
        let mut s = lock(&self.0);
        for r in batches.iter().flat_map(|b| b.iter()) {
            let a = match r {
                Record::CustodyOpened { pending, .. } => {
                    let id = pending.obligation.id();
                    if s.durable.contains_key(id) {
                        continue;
                    }
                    DurableAttempt {
                        id: id.clone(),
                        attempts: pending.attempts,
                        next_at: pending.next_at,
                        commit_now: now,
                        offered_at: Some(pending.offered_at),
                    }
                }
                Record::AttemptMade {
                    obligation_id,
                    attempts,
                    next_at,
                } => DurableAttempt {
                    id: obligation_id.clone(),
                    attempts: *attempts,
                    next_at: *next_at,
                    commit_now: now,
                    offered_at: None,
                },
                _ => continue,
            };
            let n = s.durable.entry(a.id.clone()).or_insert(0);
            *n = (*n).max(a.attempts);
            s.attempts.push(a);
        }
    }
}

/// A store wrapped by a [`Probe`]: forwards every method of the trait
/// (the defaulted ones too, so an indexed backend keeps answering from
/// its indexes), delaying and observing commits.
pub struct Probed {
    pub(crate) inner: Box<dyn Store>,
    pub(crate) probe: Probe,
}

impl Store for Probed {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn format_version(&self) -> u32 {
        self.inner.format_version()
    }
    fn commit(&mut self, now: Timestamp, batches: &[&[Record]]) -> Result<Committed, StoreError> {
        let delay = lock(&self.probe.0).delay;
        if !delay.is_zero() {
            // The store thread is blocking by design; so is this sleep.
            std::thread::sleep(delay);
        }
        let c = self.inner.commit(now, batches)?;
        self.probe.committed(now, batches);
        Ok(c)
    }
    fn load(&self) -> Result<DurableState, StoreError> {
        self.inner.load()
    }
    fn inbox(&self, now: Timestamp) -> Result<Inbox, StoreError> {
        self.inner.inbox(now)
    }
    fn list(
        &self,
        state: Option<ListState>,
        after: Option<&ObligationId>,
        limit: usize,
    ) -> Result<Page<Listed, ObligationId>, StoreError> {
        self.inner.list(state, after, limit)
    }
    fn escalations(
        &self,
        after: Option<EventId>,
        limit: usize,
    ) -> Result<Page<EscalationEntry, EventId>, StoreError> {
        self.inner.escalations(after, limit)
    }
    fn decisions(
        &self,
        after: Option<&ObligationId>,
        limit: usize,
    ) -> Result<Page<DecisionItem, ObligationId>, StoreError> {
        self.inner.decisions(after, limit)
    }
    fn events(&self, from: EventId, limit: usize) -> Result<Vec<StoredEvent>, StoreError> {
        self.inner.events(from, limit)
    }
    fn compact(&mut self, now: Timestamp, retention: Duration) -> Result<Compacted, StoreError> {
        self.inner.compact(now, retention)
    }
    fn health(&self) -> Result<(), StoreError> {
        self.inner.health()
    }
    fn idle(&mut self) -> Result<(), StoreError> {
        self.inner.idle()
    }
}

/// A SimStore that outlives the node using it (restarts reopen it).
#[derive(Clone, Default)]
pub struct SharedSim(Arc<Mutex<SimStore>>);

impl Store for SharedSim {
    fn backend(&self) -> &'static str {
        "sim"
    }
    fn format_version(&self) -> u32 {
        lock(&self.0).format_version()
    }
    fn commit(&mut self, now: Timestamp, batches: &[&[Record]]) -> Result<Committed, StoreError> {
        lock(&self.0).commit(now, batches)
    }
    fn load(&self) -> Result<DurableState, StoreError> {
        lock(&self.0).load()
    }
    fn events(&self, from: EventId, limit: usize) -> Result<Vec<StoredEvent>, StoreError> {
        lock(&self.0).events(from, limit)
    }
    fn compact(&mut self, now: Timestamp, retention: Duration) -> Result<Compacted, StoreError> {
        lock(&self.0).compact(now, retention)
    }
}
