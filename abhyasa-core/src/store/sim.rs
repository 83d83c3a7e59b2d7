//! The simulated store: in memory, same contract as the disk stores, with
//! injectable crash points for crash-point enumeration.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::{
    past_retention, Committed, Compacted, DurableState, EventId, LogEvent, PrincipalFold, Store,
    StoreError, StoredEvent, FORMAT_VERSION,
};
use crate::custody::{
    CustodianSnapshot, LedgerOutcome, ReceiverSnapshot, Reconciliation, Record, TerminalSummary,
};
use crate::model::{Digest, Escalation, ObligationId, Timestamp};

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

    fn apply(&mut self, now: Timestamp, r: &Record) {
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
                    principal.iter().for_each(|w| self.principal.apply(w));
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
                c.principal.iter().for_each(|w| self.principal.apply(w));
                let escalation = c.escalation.as_ref().map(|e| {
                    self.escalations.insert(event, e.clone());
                    event
                });
                self.terminal.insert(
                    c.obligation_id.clone(),
                    Terminal {
                        summary: TerminalSummary {
                            obligation_id: c.obligation_id.clone(),
                            digest: c.digest,
                            target: c.target.clone(),
                            state: c.outcome.state(),
                            deadline_at: c.deadline_at,
                            closed_at: c.closed_at,
                            late_ack_recorded: false,
                        },
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
                    principal.iter().for_each(|w| self.principal.apply(w));
                }
            }
            Record::Principal { writes, .. } => writes.iter().for_each(|w| self.principal.apply(w)),
            Record::LateAck(rec) => {
                if let Some(t) = self.terminal.get_mut(&rec.obligation_id) {
                    if !t.summary.late_ack_recorded {
                        t.summary.late_ack_recorded = true;
                        t.reconciliation = Some(event);
                        self.reconciliations.insert(event, rec.clone());
                    }
                }
            }
            Record::Ledger(_) | Record::Intent(_) => self.receiver.apply(r),
        }
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
            },
            receiver: d.receiver.clone(),
            next_event: EventId(d.next_event),
        })
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
            if let Some(t) = d.terminal.remove(&id) {
                out.terminal += 1;
                if let Some(e) = t.escalation {
                    out.escalations += u64::from(d.escalations.remove(&e).is_some());
                }
                if let Some(r) = t.reconciliation {
                    out.reconciliations += u64::from(d.reconciliations.remove(&r).is_some());
                }
            }
        }
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
