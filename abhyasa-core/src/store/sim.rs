//! The simulated store: in memory, same contract as the disk stores, with
//! injectable crash points for crash-point enumeration.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use super::{
    page_limit, past_retention, Committed, Compacted, DurableState, EscalationEntry, EventId,
    Inbox, ListState, Listed, LogEvent, Page, PrincipalFold, Store, StoreError, StoredEvent,
    FORMAT_VERSION,
};
use crate::custody::{
    CustodianSnapshot, LedgerOutcome, ReceiverSnapshot, Reconciliation, Record, TerminalSummary,
};
use crate::model::{AckStatus, AgentId, Digest, Escalation, ObligationId, Timestamp};
use crate::principal::{DecisionItem, PrincipalWrite};

/// When an injected crash hits a commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CrashTiming {
    /// The process dies before the batch reaches the disk: it is lost.
    BeforeDurable,
    /// The process dies after the batch is durable but before the caller
    /// learns it: it survives, yet nothing behind it was released.
    AfterDurable,
}

#[derive(Clone, Debug)]
struct Terminal {
    summary: TerminalSummary,
    escalation: Option<u64>,
    reconciliation: Option<u64>,
}

/// What the simulated disk holds.
#[derive(Clone, Debug, Default)]
struct Disk {
    /// Only its `pending` map is used; terminal records, principal state,
    /// escalations and reconciliations are kept below with their links.
    custody: CustodianSnapshot,
    terminal: HashMap<ObligationId, Terminal>,
    principal: PrincipalFold,
    escalations: BTreeMap<u64, Escalation>,
    reconciliations: BTreeMap<u64, Reconciliation>,
    receiver: ReceiverSnapshot,
    events: BTreeMap<u64, StoredEvent>,
    next_event: u64,
    /// The indexes of the paged reads, kept in step with the maps above
    /// by every change: what `list`, `escalations`,
    /// `decisions` and `inbox` answer from.
    index: Index,
}

/// Secondary indexes of the simulated disk.
#[derive(Clone, Debug, Default)]
struct Index {
    /// Every obligation held (pending or terminal) and its list state.
    all: BTreeMap<ObligationId, ListState>,
    /// The same, by state.
    by_state: BTreeMap<ListState, BTreeSet<ObligationId>>,
    /// Open decision items by id.
    decisions: BTreeMap<ObligationId, DecisionItem>,
    /// Deferred transfers under custody, by deadline.
    custody_deferred: BTreeSet<(Timestamp, ObligationId)>,
    /// Receiver ledger entries still `deferred` without an intent, by
    /// deadline.
    ledger_deferred: BTreeSet<(Timestamp, (AgentId, ObligationId))>,
    /// Ledger entries `outcome_unknown`.
    outcome_unknown: u64,
    /// Reconciliation items whose late status is `applied`.
    late_applied: u64,
}

/// An in-memory [`Store`] for the simulator and the model checker.
///
/// A commit is atomic and synchronous: what a `commit` call that returned
/// `Ok` wrote is durable, anything else is not. [`SimStore::crash_at`] arms
/// a crash at commit number `k` (1-based, counted over the store's life):
/// that call fails with [`StoreError::Crashed`], its batch lost
/// ([`CrashTiming::BeforeDurable`]) or kept ([`CrashTiming::AfterDurable`]),
/// and every later call fails the same way until [`SimStore::crash`]
/// restarts the simulated process.
#[derive(Clone, Debug, Default)]
pub struct SimStore {
    disk: Disk,
    commits: u64,
    armed: Option<(u64, CrashTiming)>,
    down: Option<u64>,
    crashes: u64,
}

impl SimStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Arms a crash at commit number `commit` (see the type docs).
    pub fn crash_at(&mut self, commit: u64, timing: CrashTiming) {
        self.armed = Some((commit, timing));
    }

    /// Commit calls made so far (including failed ones).
    pub fn commits(&self) -> u64 {
        self.commits
    }

    /// Crashes performed so far.
    pub fn crashes(&self) -> u64 {
        self.crashes
    }

    /// True after an injected crash, until [`SimStore::crash`].
    pub fn is_down(&self) -> bool {
        self.down.is_some()
    }

    /// Crashes the simulated process: everything not committed is
    /// discarded (a commit is synchronous, so that is any batch whose
    /// `commit` did not return `Ok`, including one an injected crash hit
    /// before it was durable), a pending injected crash is disarmed, and the
    /// store accepts calls again. Restore the state machines from
    /// [`Store::load`].
    pub fn crash(&mut self) {
        self.down = None;
        self.armed = None;
        self.crashes += 1;
    }

    fn check_up(&self) -> Result<(), StoreError> {
        match self.down {
            Some(commit) => Err(StoreError::Crashed { commit }),
            None => Ok(()),
        }
    }
}

/// Refuses an offer of an id already held with another digest.
fn check_offers(disk: &Disk, batches: &[&[Record]]) -> Result<(), StoreError> {
    let mut seen: HashMap<&ObligationId, Digest> = HashMap::new();
    for r in batches.iter().flat_map(|b| b.iter()) {
        let (id, digest) = match r {
            Record::CustodyOpened { pending, .. } => {
                (pending.obligation.id(), pending.obligation.digest())
            }
            Record::BestEffortSent { summary, .. } => (&summary.obligation_id, summary.digest),
            Record::CustodyClosed(c) => {
                seen.entry(&c.obligation_id).or_insert(c.digest);
                continue;
            }
            _ => continue,
        };
        let existing = seen.get(id).copied().or_else(|| {
            disk.custody
                .pending
                .get(id)
                .map(|p| p.obligation.digest())
                .or_else(|| disk.terminal.get(id).map(|t| t.summary.digest))
        });
        match existing {
            Some(e) if e != digest => {
                return Err(StoreError::OfferConflict {
                    obligation_id: id.clone(),
                    existing: e,
                    offered: digest,
                })
            }
            Some(_) => {}
            None => {
                seen.insert(id, digest);
            }
        }
    }
    Ok(())
}

impl Disk {
    fn held(&self, id: &ObligationId) -> bool {
        self.custody.pending.contains_key(id) || self.terminal.contains_key(id)
    }

    /// What the indexes hold for custody entry `id`: its list state and,
    /// for a deferred transfer under custody, its deadline.
    fn custody_entry(&self, id: &ObligationId) -> Option<(ListState, Option<Timestamp>)> {
        if let Some(p) = self.custody.pending.get(id) {
            let deferred = p.deferred.then(|| p.obligation.deadline_at());
            return Some((ListState::Pending, deferred));
        }
        self.terminal
            .get(id)
            .map(|t| (ListState::of(t.summary.state), None))
    }

    /// Brings the indexes of custody entry `id` in line with the maps,
    /// given what they held before the change.
    fn reindex_custody(
        &mut self,
        id: &ObligationId,
        before: Option<(ListState, Option<Timestamp>)>,
    ) {
        let after = self.custody_entry(id);
        if before == after {
            return;
        }
        if let Some((state, deferred)) = before {
            self.index.all.remove(id);
            if let Some(ids) = self.index.by_state.get_mut(&state) {
                ids.remove(id);
            }
            if let Some(d) = deferred {
                self.index.custody_deferred.remove(&(d, id.clone()));
            }
        }
        if let Some((state, deferred)) = after {
            self.index.all.insert(id.clone(), state);
            self.index
                .by_state
                .entry(state)
                .or_default()
                .insert(id.clone());
            if let Some(d) = deferred {
                self.index.custody_deferred.insert((d, id.clone()));
            }
        }
    }

    /// What the indexes hold for ledger entry `key`: its deadline when
    /// it is deferred without an intent, and whether it is
    /// `outcome_unknown`.
    fn ledger_entry(&self, key: &(AgentId, ObligationId)) -> (Option<Timestamp>, bool) {
        match self.receiver.ledger.get(key) {
            None => (None, false),
            Some(l) => (
                (l.outcome == LedgerOutcome::Deferred && !self.receiver.intents.contains_key(key))
                    .then_some(l.deadline_at),
                l.outcome == LedgerOutcome::OutcomeUnknown,
            ),
        }
    }

    fn reindex_ledger(&mut self, key: &(AgentId, ObligationId), before: (Option<Timestamp>, bool)) {
        let after = self.ledger_entry(key);
        if let Some(d) = before.0 {
            self.index.ledger_deferred.remove(&(d, key.clone()));
        }
        if let Some(d) = after.0 {
            self.index.ledger_deferred.insert((d, key.clone()));
        }
        self.index.outcome_unknown =
            self.index.outcome_unknown + u64::from(after.1) - u64::from(before.1);
    }

    fn apply_principal(&mut self, w: &PrincipalWrite) {
        self.principal.apply(w);
        match w {
            PrincipalWrite::DecisionRaised(item) => {
                self.index
                    .decisions
                    .insert(item.obligation_id.clone(), item.clone());
            }
            PrincipalWrite::DecisionClosed { obligation_id } => {
                self.index.decisions.remove(obligation_id);
            }
            _ => {}
        }
    }

    fn apply(&mut self, now: Timestamp, r: &Record) {
        let custody_id = match r {
            Record::CustodyOpened { pending, .. } => Some(pending.obligation.id().clone()),
            Record::AttemptMade { obligation_id, .. } | Record::DeferralSeen { obligation_id } => {
                Some(obligation_id.clone())
            }
            Record::CustodyClosed(c) => Some(c.obligation_id.clone()),
            Record::BestEffortSent { summary, .. } => Some(summary.obligation_id.clone()),
            _ => None,
        };
        let ledger_key = match r {
            Record::Ledger(l) => Some((l.custodian.clone(), l.obligation_id.clone())),
            Record::Intent(i) => Some((i.custodian.clone(), i.obligation.id().clone())),
            _ => None,
        };
        let custody_before = custody_id.as_ref().and_then(|id| self.custody_entry(id));
        let ledger_before = ledger_key.as_ref().map(|k| self.ledger_entry(k));
        self.apply_record(now, r);
        if let Some(id) = &custody_id {
            self.reindex_custody(id, custody_before);
        }
        if let (Some(k), Some(before)) = (&ledger_key, ledger_before) {
            self.reindex_ledger(k, before);
        }
    }

    fn apply_record(&mut self, now: Timestamp, r: &Record) {
        let event = self.next_event;
        self.next_event += 1;
        self.events.insert(
            event,
            StoredEvent {
                id: EventId(event),
                at: now,
                event: LogEvent::of(r),
            },
        );
        match r {
            Record::CustodyOpened { pending, principal } => {
                let id = pending.obligation.id();
                if !self.held(id) {
                    self.custody.pending.insert(id.clone(), pending.clone());
                    principal.iter().for_each(|w| self.apply_principal(w));
                }
            }
            // They touch only pending transfers: the core's own fold.
            Record::AttemptMade { .. } | Record::DeferralSeen { .. } => self.custody.apply(r),
            Record::CustodyClosed(c) => {
                self.custody.pending.remove(&c.obligation_id);
                if self.terminal.contains_key(&c.obligation_id) {
                    // Terminal is final: no second fail-safe or escalation.
                    return;
                }
                c.principal.iter().for_each(|w| self.apply_principal(w));
                let escalation = c.escalation.as_ref().map(|e| {
                    self.escalations.insert(event, Escalation::clone(e));
                    event
                });
                self.terminal.insert(
                    c.obligation_id.clone(),
                    Terminal {
                        summary: c.summary(),
                        escalation,
                        reconciliation: None,
                    },
                );
            }
            Record::BestEffortSent { summary, principal } => {
                if !self.held(&summary.obligation_id) {
                    self.terminal.insert(
                        summary.obligation_id.clone(),
                        Terminal {
                            summary: summary.clone(),
                            escalation: None,
                            reconciliation: None,
                        },
                    );
                    principal.iter().for_each(|w| self.apply_principal(w));
                }
            }
            Record::Principal { writes, .. } => writes.iter().for_each(|w| self.apply_principal(w)),
            Record::LateAck(rec) => {
                if let Some(t) = self.terminal.get_mut(&rec.obligation_id) {
                    if !t.summary.late_ack_recorded {
                        t.summary.late_ack_recorded = true;
                        t.reconciliation = Some(event);
                        self.index.late_applied += u64::from(rec.status == AckStatus::Applied);
                        self.reconciliations.insert(event, rec.clone());
                    }
                }
            }
            Record::Ledger(_) | Record::Intent(_) => self.receiver.apply(r),
        }
    }
}

impl Disk {
    /// The listing row of a held obligation.
    fn listed(&self, id: &ObligationId) -> Option<Listed> {
        if let Some(p) = self.custody.pending.get(id) {
            return Some(Listed {
                obligation_id: id.clone(),
                state: ListState::Pending,
                target: p.obligation.target().clone(),
                kind: Some(p.obligation.kind().clone()),
                attempts: Some(p.attempts),
                deadline_at: p.obligation.deadline_at(),
                closed_at: None,
            });
        }
        self.terminal.get(id).map(|t| Listed::terminal(&t.summary))
    }
}

impl Store for SimStore {
    fn backend(&self) -> &'static str {
        "sim"
    }

    fn format_version(&self) -> u32 {
        FORMAT_VERSION
    }

    fn commit(&mut self, now: Timestamp, batches: &[&[Record]]) -> Result<Committed, StoreError> {
        self.check_up()?;
        self.commits += 1;
        let n = self.commits;
        let crash = match self.armed {
            Some((k, timing)) if k == n => Some(timing),
            _ => None,
        };
        if crash == Some(CrashTiming::BeforeDurable) {
            self.down = Some(n);
            return Err(StoreError::Crashed { commit: n });
        }
        check_offers(&self.disk, batches)?;
        let first = self.disk.next_event;
        let mut records = 0;
        for r in batches.iter().flat_map(|b| b.iter()) {
            self.disk.apply(now, r);
            records += 1;
        }
        if crash == Some(CrashTiming::AfterDurable) {
            self.down = Some(n);
            return Err(StoreError::Crashed { commit: n });
        }
        Ok(Committed {
            records,
            first_event: EventId(first),
            end_event: EventId(self.disk.next_event),
        })
    }

    fn load(&self) -> Result<DurableState, StoreError> {
        self.check_up()?;
        let d = &self.disk;
        Ok(DurableState {
            custodian: CustodianSnapshot {
                pending: d.custody.pending.clone(),
                terminal: d
                    .terminal
                    .iter()
                    .map(|(k, t)| (k.clone(), t.summary.clone()))
                    .collect(),
                principal: d.principal.writes(),
                escalations: d.escalations.values().cloned().collect(),
                reconciliations: d.reconciliations.values().cloned().collect(),
                damaged: Default::default(),
            },
            receiver: d.receiver.clone(),
            next_event: EventId(d.next_event),
        })
    }

    fn inbox(&self, now: Timestamp) -> Result<Inbox, StoreError> {
        self.check_up()?;
        let d = &self.disk;
        let ix = &d.index;
        let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        // Only the overdue part of the deadline indexes is visited.
        let custody_overdue = ix
            .custody_deferred
            .iter()
            .take_while(|(at, _)| *at <= now)
            .count();
        let ledger_overdue = ix
            .ledger_deferred
            .iter()
            .take_while(|(at, _)| *at <= now)
            .count();
        Ok(Inbox {
            pending: count(d.custody.pending.len()),
            decision_required: count(ix.decisions.len()),
            escalated: count(d.escalations.len()),
            deferred_overdue: count(custody_overdue + ledger_overdue),
            late_applied: ix.late_applied,
            outcome_unknown: ix.outcome_unknown,
        })
    }

    fn list(
        &self,
        state: Option<ListState>,
        after: Option<&ObligationId>,
        limit: usize,
    ) -> Result<Page<Listed, ObligationId>, StoreError> {
        use std::ops::Bound::{Excluded, Unbounded};
        self.check_up()?;
        let d = &self.disk;
        let limit = page_limit(limit);
        let ids: Vec<ObligationId> = match state {
            None => {
                let from = after.map_or(Unbounded, |a| Excluded(a.clone()));
                d.index
                    .all
                    .range((from, Unbounded))
                    .take(limit + 1)
                    .map(|(id, _)| id.clone())
                    .collect()
            }
            Some(st) => {
                let from = after.map_or(Unbounded, |a| Excluded(a.clone()));
                d.index
                    .by_state
                    .get(&st)
                    .map(|ids| {
                        ids.range((from, Unbounded))
                            .take(limit + 1)
                            .cloned()
                            .collect()
                    })
                    .unwrap_or_default()
            }
        };
        let rows = ids.iter().filter_map(|id| d.listed(id)).collect();
        Ok(Page::from_overfull(rows, limit, |r: &Listed| {
            r.obligation_id.clone()
        }))
    }

    fn escalations(
        &self,
        after: Option<EventId>,
        limit: usize,
    ) -> Result<Page<EscalationEntry, EventId>, StoreError> {
        self.check_up()?;
        let limit = page_limit(limit);
        let from = after.map_or(0, |a| a.0.saturating_add(1));
        let items = self
            .disk
            .escalations
            .range(from..)
            .take(limit + 1)
            .map(|(k, e)| EscalationEntry {
                position: EventId(*k),
                escalation: e.clone(),
            })
            .collect();
        Ok(Page::from_overfull(items, limit, |e: &EscalationEntry| {
            e.position
        }))
    }

    fn decisions(
        &self,
        after: Option<&ObligationId>,
        limit: usize,
    ) -> Result<Page<DecisionItem, ObligationId>, StoreError> {
        use std::ops::Bound::{Excluded, Unbounded};
        self.check_up()?;
        let limit = page_limit(limit);
        let from = after.map_or(Unbounded, |a| Excluded(a.clone()));
        let items = self
            .disk
            .index
            .decisions
            .range((from, Unbounded))
            .take(limit + 1)
            .map(|(_, d)| d.clone())
            .collect();
        Ok(Page::from_overfull(items, limit, |d: &DecisionItem| {
            d.obligation_id.clone()
        }))
    }

    fn events(&self, from: EventId, limit: usize) -> Result<Vec<StoredEvent>, StoreError> {
        self.check_up()?;
        Ok(self
            .disk
            .events
            .range(from.0..)
            .take(limit)
            .map(|(_, e)| e.clone())
            .collect())
    }

    fn compact(&mut self, now: Timestamp, retention: Duration) -> Result<Compacted, StoreError> {
        self.check_up()?;
        let d = &mut self.disk;
        let mut out = Compacted::default();
        let expired: Vec<ObligationId> = d
            .terminal
            .iter()
            .filter(|(_, t)| past_retention(t.summary.deadline_at, now, retention))
            .map(|(k, _)| k.clone())
            .collect();
        for id in expired {
            let before = d.custody_entry(&id);
            if let Some(t) = d.terminal.remove(&id) {
                out.terminal += 1;
                if let Some(e) = t.escalation {
                    out.escalations += u64::from(d.escalations.remove(&e).is_some());
                }
                if let Some(r) = t.reconciliation {
                    if let Some(rec) = d.reconciliations.remove(&r) {
                        out.reconciliations += 1;
                        d.index.late_applied -= u64::from(rec.status == AckStatus::Applied);
                    }
                }
            }
            d.reindex_custody(&id, before);
        }
        // Decided entries are neither deferred nor in doubt: no index
        // holds them.
        let before = d.receiver.ledger.len();
        d.receiver.ledger.retain(|_, l| {
            !(matches!(l.outcome, LedgerOutcome::Applied | LedgerOutcome::Declined)
                && past_retention(l.deadline_at, now, retention))
        });
        out.ledger = (before - d.receiver.ledger.len()) as u64;
        let before = d.events.len();
        d.events
            .retain(|_, e| !past_retention(e.at, now, retention));
        out.events = (before - d.events.len()) as u64;
        Ok(out)
    }
}
