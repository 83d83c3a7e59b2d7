//! Paged reads of a store (C-ND-5): `list` by state, the
//! escalations and the open decisions, each answered one bounded page at a
//! time behind a cursor, so a read never holds or scans every record.
//!
//! The types here are what every backend returns; the `DurableState`
//! versions of the reads ([`DurableState::list`], ...) fold a full
//! [`Store::load`](super::Store::load) and serve as the default of the trait
//! methods (third-party stores keep compiling) and as the oracle the
//! storage suite compares every indexed answer against.

use std::fmt;
use std::str::FromStr;

use crate::custody::{TerminalState, TerminalSummary};
use crate::model::{AgentId, Escalation, Kind, ObligationId, Timestamp};
use crate::principal::DecisionItem;

use super::{DurableState, EventId};

/// Most items one page may carry: a larger `limit` is clamped to it, so a
/// caller can never make the store materialise an unbounded answer.
pub const MAX_PAGE: usize = 10_000;

/// Clamps a requested page size to `1..=MAX_PAGE`.
pub fn page_limit(limit: usize) -> usize {
    limit.clamp(1, MAX_PAGE)
}

/// Where an obligation this node is custodian of stands, as `list` filters
/// it.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum ListState {
    /// Under custody.
    Pending,
    /// Applied by the receiver.
    Applied,
    /// Declined by the receiver.
    Declined,
    /// Escalated with the fail-safe applied.
    Escalated,
    /// Sent best-effort (never under custody).
    BestEffort,
}

impl ListState {
    /// Every state, in the order `list` documents them.
    pub const ALL: [ListState; 5] = [
        ListState::Pending,
        ListState::Applied,
        ListState::Declined,
        ListState::Escalated,
        ListState::BestEffort,
    ];

    /// The list state of a terminal state.
    pub fn of(state: TerminalState) -> Self {
        match state {
            TerminalState::Applied => ListState::Applied,
            TerminalState::Declined => ListState::Declined,
            TerminalState::Escalated => ListState::Escalated,
            TerminalState::BestEffort => ListState::BestEffort,
        }
    }

    /// The spelling used by the CLI and the control socket.
    pub fn as_str(self) -> &'static str {
        match self {
            ListState::Pending => "pending",
            ListState::Applied => "applied",
            ListState::Declined => "declined",
            ListState::Escalated => "escalated",
            ListState::BestEffort => "best_effort",
        }
    }
}

impl fmt::Display for ListState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown list state.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown state {0:?} (one of pending, applied, declined, escalated, best_effort)")]
pub struct UnknownListState(pub String);

impl FromStr for ListState {
    type Err = UnknownListState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ListState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| UnknownListState(s.to_string()))
    }
}

/// One obligation of a listing.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Listed {
    /// The obligation.
    pub obligation_id: ObligationId,
    /// Where it stands.
    pub state: ListState,
    /// Its target.
    pub target: AgentId,
    /// Its kind (pending only: a terminal summary does not keep it).
    pub kind: Option<Kind>,
    /// Attempts so far, or in all when it ended (absent for a terminal
    /// row stored before the count was kept).
    pub attempts: Option<u32>,
    /// Its absolute deadline.
    pub deadline_at: Timestamp,
    /// When custody ended (terminal only).
    pub closed_at: Option<Timestamp>,
}

impl Listed {
    /// The row of a finished transfer.
    pub fn terminal(t: &TerminalSummary) -> Self {
        Self {
            obligation_id: t.obligation_id.clone(),
            state: ListState::of(t.state),
            target: t.target.clone(),
            kind: None,
            attempts: t.known_attempts(),
            deadline_at: t.deadline_at,
            closed_at: Some(t.closed_at),
        }
    }
}

/// One escalation, with its position in the event log (the cursor of
/// [`Store::escalations`](super::Store::escalations)).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EscalationEntry {
    /// Log position of the record that escalated it.
    pub position: EventId,
    /// The escalation.
    pub escalation: Escalation,
}

/// One page of a paged read: its items in cursor order, and the cursor of
/// the next page (`None` when this page is the last).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Page<T, C> {
    /// The items.
    pub items: Vec<T>,
    /// Pass as `after` to read the next page; `None` at the end.
    pub next: Option<C>,
}

impl<T, C> Page<T, C> {
    /// Builds a page from up to `limit + 1` items read in order: the extra
    /// one only says that another page exists.
    pub fn from_overfull(mut items: Vec<T>, limit: usize, cursor: impl Fn(&T) -> C) -> Self {
        let more = items.len() > limit;
        items.truncate(limit);
        let next = if more { items.last().map(cursor) } else { None };
        Page { items, next }
    }
}

impl DurableState {
    /// The obligations in `state` (all when `None`) with id `> after`, in
    /// id order, one page of at most `limit` (clamped by [`page_limit`]).
    /// Folds the whole state: the default for stores without indexes.
    pub fn list(
        &self,
        state: Option<ListState>,
        after: Option<&ObligationId>,
        limit: usize,
    ) -> Page<Listed, ObligationId> {
        let limit = page_limit(limit);
        let mut rows: Vec<Listed> = Vec::new();
        if state.is_none_or(|s| s == ListState::Pending) {
            rows.extend(self.custodian.pending.values().map(|p| Listed {
                obligation_id: p.obligation.id().clone(),
                state: ListState::Pending,
                target: p.obligation.target().clone(),
                kind: Some(p.obligation.kind().clone()),
                attempts: Some(p.attempts),
                deadline_at: p.obligation.deadline_at(),
                closed_at: None,
            }));
        }
        rows.extend(
            self.custodian
                .terminal
                .values()
                .filter(|t| state.is_none_or(|s| s == ListState::of(t.state)))
                .map(Listed::terminal),
        );
        rows.retain(|r| after.is_none_or(|a| r.obligation_id > *a));
        rows.sort_by(|a, b| a.obligation_id.cmp(&b.obligation_id));
        rows.truncate(limit + 1);
        Page::from_overfull(rows, limit, |r| r.obligation_id.clone())
    }

    /// Escalations after position `after`, in commit order. Without the
    /// log positions a loaded state lacks, an escalation's position here is
    /// its ordinal among the retained ones: the default for stores without
    /// indexes, stable only while nothing is compacted.
    pub fn escalation_page(
        &self,
        after: Option<EventId>,
        limit: usize,
    ) -> Page<EscalationEntry, EventId> {
        let limit = page_limit(limit);
        let start = after.map_or(0, |a| a.0.saturating_add(1));
        let items: Vec<EscalationEntry> = self
            .custodian
            .escalations
            .iter()
            .enumerate()
            .skip(usize::try_from(start).unwrap_or(usize::MAX))
            .take(limit + 1)
            .map(|(i, e)| EscalationEntry {
                position: EventId(i as u64),
                escalation: e.clone(),
            })
            .collect();
        Page::from_overfull(items, limit, |e| e.position)
    }

    /// Open decision items with obligation id `> after`, in id order.
    pub fn decision_page(
        &self,
        after: Option<&ObligationId>,
        limit: usize,
    ) -> Page<DecisionItem, ObligationId> {
        let limit = page_limit(limit);
        let mut items = self.decisions();
        items.retain(|d| after.is_none_or(|a| d.obligation_id > *a));
        items.sort_by(|a, b| a.obligation_id.cmp(&b.obligation_id));
        items.truncate(limit + 1);
        Page::from_overfull(items, limit, |d| d.obligation_id.clone())
    }
}
