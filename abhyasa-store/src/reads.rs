//! The paged reads, answered from the indexes and counters of
//! [`crate::index`]: each reads at most one page of rows (plus one to know
//! whether another page exists), never every record.

use abhyasa_core::custody::PendingRecord;
use abhyasa_core::principal::{DecisionItem, PrincipalWrite};
use abhyasa_core::store::{
    page_limit, EscalationEntry, EventId, Inbox, ListState, Listed, Page, StoreError,
};
use abhyasa_core::{Escalation, ObligationId, Timestamp};

use crate::codec::{corrupt, from_json, parse_u64_key, u64_key, PendingRow, TerminalRow};
use crate::engine::{read_principal, Table, View};
use crate::index::{
    counter, state_key, state_prefix, time_key, Counter, CUSTODY_DEFERRED, LEDGER_DEFERRED,
};

fn pending_listed(k: &[u8], b: &[u8]) -> Result<Listed, StoreError> {
    const T: &str = "custody_pending";
    let p: PendingRecord = PendingRow::load(T, k, b)?;
    Ok(Listed {
        obligation_id: p.obligation.id().clone(),
        state: ListState::Pending,
        target: p.obligation.target().clone(),
        kind: Some(p.obligation.kind().clone()),
        attempts: Some(p.attempts),
        deadline_at: p.obligation.deadline_at(),
        closed_at: None,
    })
}

fn terminal_listed(k: &[u8], b: &[u8]) -> Result<Listed, StoreError> {
    const T: &str = "custody_terminal";
    Ok(Listed::terminal(
        &TerminalRow::decode(T, k, b)?.build(T, k)?,
    ))
}

/// Up to `n` rows of table `t` with key `> after`, decoded by `f`.
fn scan_after(
    v: &dyn View,
    t: Table,
    after: Option<&ObligationId>,
    n: usize,
    f: fn(&[u8], &[u8]) -> Result<Listed, StoreError>,
) -> Result<Vec<Listed>, StoreError> {
    let from = after.map_or(&[][..], |a| a.as_str().as_bytes());
    let mut out = Vec::new();
    v.scan(t, from, &mut |k, b| {
        if k == from {
            return Ok(true);
        }
        out.push(f(k, b)?);
        Ok(out.len() < n)
    })?;
    Ok(out)
}

/// See `Store::list`.
pub(crate) fn list(
    v: &dyn View,
    state: Option<ListState>,
    after: Option<&ObligationId>,
    limit: usize,
) -> Result<Page<Listed, ObligationId>, StoreError> {
    let limit = page_limit(limit);
    let n = limit + 1;
    let rows = match state {
        Some(ListState::Pending) => scan_after(v, Table::Pending, after, n, pending_listed)?,
        None => {
            // Both tables are keyed by id: merge one page of each.
            let mut rows = scan_after(v, Table::Pending, after, n, pending_listed)?;
            rows.extend(scan_after(v, Table::Terminal, after, n, terminal_listed)?);
            rows.sort_by(|a, b| a.obligation_id.cmp(&b.obligation_id));
            rows.truncate(n);
            rows
        }
        Some(st) => {
            let prefix = state_prefix(st);
            let from = state_key(st, after.map_or(&[][..], |a| a.as_str().as_bytes()));
            let mut ids = Vec::new();
            v.scan(Table::Index, &from, &mut |k, _| {
                if !k.starts_with(&prefix) {
                    return Ok(false);
                }
                if k != from.as_slice() || after.is_none() {
                    ids.push(k[prefix.len()..].to_vec());
                }
                Ok(ids.len() < n)
            })?;
            let mut rows = Vec::with_capacity(ids.len());
            for k in ids {
                let b = v.get(Table::Terminal, &k)?.ok_or_else(|| {
                    corrupt("index", &k, "indexes a terminal summary that is not stored")
                })?;
                rows.push(terminal_listed(&k, &b)?);
            }
            rows
        }
    };
    Ok(Page::from_overfull(rows, limit, |r: &Listed| {
        r.obligation_id.clone()
    }))
}

/// See `Store::escalations`.
pub(crate) fn escalations(
    v: &dyn View,
    after: Option<EventId>,
    limit: usize,
) -> Result<Page<EscalationEntry, EventId>, StoreError> {
    let limit = page_limit(limit);
    let from = match after {
        None => 0,
        Some(a) => match a.0.checked_add(1) {
            Some(f) => f,
            None => {
                return Ok(Page {
                    items: Vec::new(),
                    next: None,
                })
            }
        },
    };
    let mut items = Vec::new();
    v.scan(Table::Escalations, &u64_key(from), &mut |k, b| {
        items.push(EscalationEntry {
            position: EventId(parse_u64_key("escalations", k)?),
            escalation: from_json::<Escalation>("escalations", k, b)?,
        });
        Ok(items.len() <= limit)
    })?;
    Ok(Page::from_overfull(items, limit, |e: &EscalationEntry| {
        e.position
    }))
}

/// See `Store::decisions`.
pub(crate) fn decisions(
    v: &dyn View,
    after: Option<&ObligationId>,
    limit: usize,
) -> Result<Page<DecisionItem, ObligationId>, StoreError> {
    let limit = page_limit(limit);
    let mut from = vec![b'd'];
    if let Some(a) = after {
        from.extend_from_slice(a.as_str().as_bytes());
    }
    let mut items = Vec::new();
    v.scan(Table::Principal, &from, &mut |k, b| {
        if k.first() != Some(&b'd') {
            return Ok(false);
        }
        if after.is_some() && k == from.as_slice() {
            return Ok(true);
        }
        match read_principal(k, b)? {
            PrincipalWrite::DecisionRaised(item) => items.push(item),
            _ => return Err(corrupt("principal", k, "a `d` row that is not a decision")),
        }
        Ok(items.len() <= limit)
    })?;
    Ok(Page::from_overfull(items, limit, |d: &DecisionItem| {
        d.obligation_id.clone()
    }))
}

/// Index entries under `prefix` whose deadline is at or before `now`.
fn overdue(v: &dyn View, prefix: u8, now: Timestamp) -> Result<u64, StoreError> {
    let limit = time_key(now.unix_micros());
    let mut n = 0u64;
    v.scan(Table::Index, &[prefix], &mut |k, _| {
        if k.first() != Some(&prefix) {
            return Ok(false);
        }
        let at = k
            .get(1..9)
            .ok_or_else(|| corrupt("index", k, "deadline key shorter than 9 bytes"))?;
        if at > &limit[..] {
            return Ok(false);
        }
        n += 1;
        Ok(true)
    })?;
    Ok(n)
}

/// See `Store::inbox`: durable counters, plus the overdue part of the
/// deadline indexes.
pub(crate) fn inbox(v: &dyn View, now: Timestamp) -> Result<Inbox, StoreError> {
    Ok(Inbox {
        pending: counter(v, Counter::Pending)?,
        decision_required: counter(v, Counter::Decisions)?,
        escalated: counter(v, Counter::Escalated)?,
        deferred_overdue: overdue(v, CUSTODY_DEFERRED, now)?.saturating_add(overdue(
            v,
            LEDGER_DEFERRED,
            now,
        )?),
        late_applied: counter(v, Counter::LateApplied)?,
        outcome_unknown: counter(v, Counter::OutcomeUnknown)?,
    })
}
