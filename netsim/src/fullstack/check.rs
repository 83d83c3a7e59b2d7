//! The invariant checker over ground truth: what the receivers' appliers
//! decided and what every store committed (see [`super::truth`]), not
//! what the nodes report about themselves.

use std::collections::{BTreeMap, BTreeSet};

use abhyasa_core::{AgentId, GuardOutcome, ObligationId, Timestamp};
use serde::{Deserialize, Serialize};

use super::host::is_best_effort;
use super::scenario::Scenario;
use super::truth::{CloseState, Inner, Verdict};

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// Which invariant (`deliver-or-report`, `effectively-once`, `AB-4`,
    /// `supersession`, `deadline`, `AB-2`, `applied-means-applied`).
    pub invariant: String,
    /// The obligation (`custodian/obligation-id`), when there is one.
    pub obligation: Option<String>,
    /// What was seen.
    pub detail: String,
}

fn v(out: &mut Vec<Violation>, inv: &str, ob: Option<String>, detail: String) {
    out.push(Violation {
        invariant: inv.to_string(),
        obligation: ob,
        detail,
    });
}

type Key = (AgentId, ObligationId);

/// `items` grouped by their (custodian, obligation) key, in key order.
fn by_key<'a, T>(
    items: impl IntoIterator<Item = &'a T>,
    key: impl Fn(&T) -> Key,
) -> BTreeMap<Key, Vec<&'a T>> {
    let mut m: BTreeMap<Key, Vec<&'a T>> = BTreeMap::new();
    for i in items {
        m.entry(key(i)).or_default().push(i);
    }
    m
}

/// Checks every invariant; returns the violations in a stable order.
pub(crate) fn check(s: &Scenario, t: &Inner, pending_at_end: &[String]) -> Vec<Violation> {
    let mut out = Vec::new();
    let name = |k: &Key| format!("{}/{}", k.0, k.1);
    let max_retries = s.max_retries();

    // Deliver-or-report: nothing still pending once every deadline passed.
    for p in pending_at_end {
        v(
            &mut out,
            "deliver-or-report",
            Some(p.clone()),
            "still pending after its deadline and the grace period".into(),
        );
    }
    // Every custody opened closes exactly once, applied/declined/escalated.
    let mut opened: BTreeMap<Key, &abhyasa_core::Obligation> = BTreeMap::new();
    for (a, o) in &t.opened {
        if is_best_effort(o) {
            continue;
        }
        opened.entry((a.clone(), o.id().clone())).or_insert(o);
    }
    let closes = by_key(&t.closes, |c| (c.custodian.clone(), c.id.clone()));
    for k in opened.keys() {
        match closes.get(k).map(Vec::len).unwrap_or(0) {
            1 => {}
            0 if pending_at_end.contains(&name(k)) => {}
            0 => v(
                &mut out,
                "deliver-or-report",
                Some(name(k)),
                "custody opened but neither closed nor pending: silently lost".into(),
            ),
            n => v(
                &mut out,
                "deliver-or-report",
                Some(name(k)),
                format!("custody closed {n} times"),
            ),
        }
    }
    for k in closes.keys() {
        if !opened.contains_key(k) {
            v(
                &mut out,
                "deliver-or-report",
                Some(name(k)),
                "closed without a committed custody open".into(),
            );
        }
    }

    // Ground truth of the receivers: applier verdicts and committed
    // applications, keyed (custodian, id).
    let decided_apply = by_key(
        t.decisions.iter().filter(|d| d.verdict == Verdict::Apply),
        |d| (d.custodian.clone(), d.id.clone()),
    );
    let applied = by_key(&t.applications, |a| (a.custodian.clone(), a.id.clone()));
    let keys: BTreeSet<&Key> = decided_apply.keys().chain(applied.keys()).collect();
    for k in keys {
        let n_dec = decided_apply.get(k).map(Vec::len).unwrap_or(0);
        let n_app = applied.get(k).map(Vec::len).unwrap_or(0);
        if n_dec > 1 || n_app > 1 {
            v(
                &mut out,
                "effectively-once",
                Some(name(k)),
                format!(
                    "applied {n_dec} times by the receiver's applier, {n_app} committed \
                     applications (AB-3: at most once)"
                ),
            );
        }
        if n_dec != n_app {
            v(
                &mut out,
                "effectively-once",
                Some(name(k)),
                format!(
                    "the applier applied {n_dec} times but {n_app} applications were \
                     committed with the ledger (AB-3: effect and ledger in one commit)"
                ),
            );
        }
        // Deadlines bind both sides: never applied at or after the deadline.
        for d in decided_apply.get(k).into_iter().flatten() {
            if d.at >= d.deadline_at {
                v(
                    &mut out,
                    "deadline",
                    Some(name(k)),
                    format!(
                        "applied at {} at or after its deadline {}",
                        d.at, d.deadline_at
                    ),
                );
            }
        }
    }

    // Custodian closes against ground truth.
    for (k, cs) in &closes {
        let Some(c) = cs.first() else { continue };
        let n_app = applied.get(k).map(Vec::len).unwrap_or(0);
        if c.attempts > max_retries + 1 {
            v(
                &mut out,
                "AB-2",
                Some(name(k)),
                format!(
                    "{} attempts exceed 1 + max_retries = {}",
                    c.attempts,
                    max_retries + 1
                ),
            );
        }
        match c.state {
            CloseState::Applied if n_app != 1 => v(
                &mut out,
                "applied-means-applied",
                Some(name(k)),
                format!("custodian closed applied but the receiver applied {n_app} times"),
            ),
            CloseState::Declined(_) if n_app != 0 => v(
                &mut out,
                "applied-means-applied",
                Some(name(k)),
                format!("custodian closed declined but the receiver applied {n_app} times"),
            ),
            CloseState::Escalated => {
                // AB-4: the escalation is recorded with the fail-safe.
                if !c.has_escalation {
                    v(
                        &mut out,
                        "AB-4",
                        Some(name(k)),
                        "escalated without an escalation record".into(),
                    );
                }
                let seq = opened.get(k).and_then(|o| o.sequence());
                match c.guard {
                    Some(GuardOutcome::Applied) if c.principal_writes == 0 => v(
                        &mut out,
                        "AB-4",
                        Some(name(k)),
                        "fail-safe reported applied but no principal-side write was committed"
                            .into(),
                    ),
                    Some(GuardOutcome::Superseded { newest })
                        if seq.is_some_and(|s| newest < s) =>
                    {
                        v(
                            &mut out,
                            "AB-4",
                            Some(name(k)),
                            format!(
                                "fail-safe dropped as superseded by an older sequence {newest}"
                            ),
                        )
                    }
                    None => v(
                        &mut out,
                        "AB-4",
                        Some(name(k)),
                        "escalated with no fail-safe outcome".into(),
                    ),
                    _ => {}
                }
            }
            _ => {}
        }
    }

    // Supersession never regresses: receiver side, applications on a key
    // in commit order carry strictly increasing sequences; principal side,
    // authorization writes on a key never go back.
    let mut recv_seq: BTreeMap<(AgentId, String), u64> = BTreeMap::new();
    for a in &t.applications {
        if let Some((key, seq)) = &a.key_sequence {
            let e = recv_seq
                .entry((a.receiver.clone(), key.to_string()))
                .or_insert(0);
            if seq.0 <= *e {
                v(
                    &mut out,
                    "supersession",
                    Some(format!("{}/{}", a.custodian, a.id)),
                    format!(
                        "receiver {} applied sequence {} on {key} after {}",
                        a.receiver, seq.0, *e
                    ),
                );
            } else {
                *e = seq.0;
            }
        }
    }
    let mut prin_seq: BTreeMap<(AgentId, String), u64> = BTreeMap::new();
    for (a, key, seq) in &t.principal {
        if let Some(seq) = seq {
            let e = prin_seq.entry((a.clone(), key.to_string())).or_insert(0);
            if seq.0 < *e {
                v(
                    &mut out,
                    "supersession",
                    None,
                    format!(
                        "principal of {a} wrote sequence {} on {key} after {}",
                        seq.0, *e
                    ),
                );
            } else {
                *e = seq.0;
            }
        }
    }
    out
}

/// C-TR-6, contact windows: an edge reachable only in windows receives
/// every obligation whose deadline outlasts the next window exactly once,
/// inside a window no later than that one (the relay pushes on connect; it
/// does not wait for the custodian's backoff); an obligation whose deadline
/// passes before the next window opens escalates (its fail-safe is checked
/// by AB-4 above); and the relay's spool ends empty.
pub(crate) fn check_windows(
    s: &Scenario,
    t0: Timestamp,
    t: &Inner,
    spool_at_end: Option<u64>,
) -> Vec<Violation> {
    let mut out = Vec::new();
    if let Some(n) = spool_at_end.filter(|n| *n > 0) {
        v(
            &mut out,
            "C-TR-6",
            None,
            format!("the relay's spool holds {n} frames at the end"),
        );
    }
    let applied = by_key(&t.applications, |a| (a.custodian.clone(), a.id.clone()));
    let closes = by_key(&t.closes, |c| (c.custodian.clone(), c.id.clone()));
    // A frame in flight when a window shuts may still land one latency
    // later; nothing lands after that.
    let slack = s.link.latency_max.0 * 2 + s.tick.0;
    for (a, o) in &t.opened {
        if is_best_effort(o) {
            continue;
        }
        let Some(windows) = s.windows_of(o.target().as_str()) else {
            continue;
        };
        let at = |d: std::time::Duration| t0.saturating_add(d);
        let offered = o.created_at();
        let deadline = o.deadline_at();
        let inside = windows
            .iter()
            .any(|(open, close)| at(*open) <= offered && offered < at(*close));
        let next = windows.iter().find(|(open, _)| at(*open) >= offered);
        let k = (a.clone(), o.id().clone());
        let name = format!("{}/{}", k.0, k.1);
        let apps = applied.get(&k).map(Vec::as_slice).unwrap_or_default();
        let state = closes.get(&k).and_then(|c| c.first()).map(|c| c.state);
        match next {
            Some((open, close)) if deadline >= at(*close) => {
                let received = match state {
                    Some(CloseState::Applied) => apps.len() == 1,
                    Some(CloseState::Declined(_)) => apps.is_empty(),
                    _ => false,
                };
                if !received {
                    v(
                        &mut out,
                        "C-TR-6",
                        Some(name.clone()),
                        format!(
                            "its deadline outlasts the next window (opens {}s) but it was \
                             applied {} times and closed {state:?}",
                            open.as_secs_f64(),
                            apps.len()
                        ),
                    );
                }
                for ap in apps {
                    let in_window = windows
                        .iter()
                        .any(|(o, c)| at(*o) <= ap.at && ap.at <= at(*c).saturating_add(slack));
                    if !in_window || ap.at > at(*close).saturating_add(slack) {
                        v(
                            &mut out,
                            "C-TR-6",
                            Some(name.clone()),
                            format!(
                                "applied at {} s, not inside a window up to the next one \
                                 ({}-{} s)",
                                ap.at.saturating_duration_since(t0).as_secs_f64(),
                                open.as_secs_f64(),
                                close.as_secs_f64()
                            ),
                        );
                    }
                }
            }
            Some((open, _))
                if !inside
                    && deadline <= at(*open)
                    && (!apps.is_empty() || state != Some(CloseState::Escalated)) =>
            {
                v(
                    &mut out,
                    "C-TR-6",
                    Some(name),
                    format!(
                        "its deadline passes before the next window opens ({} s) yet it \
                         was applied {} times and closed {state:?}",
                        open.as_secs_f64(),
                        apps.len()
                    ),
                );
            }
            _ => {}
        }
    }
    out
}
