//! The full-stack run's adapter to the one invariant checker: the ground
//! truth of [`super::truth`] — what the receivers' appliers decided and
//! what every store committed, not what the nodes report about themselves —
//! becomes an [`abhyasa_check::Trace`], checked by [`abhyasa_check::check`]
//! like every other model. The contact-window rule (C-TR-6) is the
//! scenario's own and stays here.

use std::collections::BTreeMap;

use abhyasa_check::{
    Application, AppliedByApplier, Offer, Outcome, PrincipalSequence, Terminal, Trace,
};
use abhyasa_core::{AgentId, ObligationId, Timestamp};
use serde::{Deserialize, Serialize};

use super::host::is_best_effort;
use super::scenario::Scenario;
use super::truth::{CloseState, Inner, Verdict};

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// Which invariant, as [`abhyasa_check::Invariant::name`] spells it
    /// (`AB-1`, `AB-2`, `AB-3`, `AB-4`, `deadline`, `supersession`,
    /// `applied-means-applied`, ...), or `C-TR-6`.
    pub invariant: String,
    /// The obligation (`custodian/obligation-id`), when there is one.
    pub obligation: Option<String>,
    /// What was seen.
    pub detail: String,
}

impl From<abhyasa_check::Violation> for Violation {
    fn from(v: abhyasa_check::Violation) -> Self {
        Self {
            invariant: v.invariant.name().to_string(),
            obligation: v.obligation_name(),
            detail: v.detail,
        }
    }
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

/// The run's ground truth as the checker's trace. Best-effort sends are
/// not under custody and are left out, as the run's rules always did;
/// `pending_at_end` names (`custodian/id`) that match no committed custody
/// open are returned apart, to be reported as they are.
fn trace(s: &Scenario, t: &Inner, pending_at_end: &[String]) -> (Trace, Vec<String>) {
    let max_retries = u64::from(s.max_retries());
    let offers: Vec<Offer> = t
        .opened
        .iter()
        .filter(|(_, o)| !is_best_effort(o))
        .map(|(a, o)| Offer {
            custodian: a.clone(),
            id: o.id().clone(),
            admissible: true,
            deadline_at: o.deadline_at(),
            max_retries,
            sequence: o.sequence(),
        })
        .collect();
    let mut pending = Vec::new();
    let mut unmatched = Vec::new();
    for p in pending_at_end {
        match offers
            .iter()
            .find(|o| format!("{}/{}", o.custodian, o.id) == *p)
        {
            Some(o) if !pending.contains(&o.key()) => pending.push(o.key()),
            Some(_) => {}
            None => unmatched.push(p.clone()),
        }
    }
    let trace = Trace {
        offers,
        applier_applies: t
            .decisions
            .iter()
            .filter(|d| d.verdict == Verdict::Apply)
            .map(|d| AppliedByApplier {
                receiver: d.receiver.clone(),
                custodian: d.custodian.clone(),
                id: d.id.clone(),
                at: d.at,
                deadline_at: d.deadline_at,
            })
            .collect(),
        applications: Some(
            t.applications
                .iter()
                .map(|a| Application {
                    receiver: a.receiver.clone(),
                    custodian: a.custodian.clone(),
                    id: a.id.clone(),
                    at: a.at,
                    key_sequence: a.key_sequence.clone(),
                })
                .collect(),
        ),
        ledger: None,
        terminals: t
            .closes
            .iter()
            .map(|c| Terminal {
                custodian: c.custodian.clone(),
                id: c.id.clone(),
                outcome: match c.state {
                    CloseState::Applied => Outcome::Applied,
                    CloseState::Declined(r) => Outcome::Declined(r),
                    CloseState::Escalated => Outcome::Escalated,
                },
                attempts: u64::from(c.attempts),
                escalation: c.guard.filter(|_| c.has_escalation),
                principal_writes: Some(c.principal_writes),
            })
            .collect(),
        probes: BTreeMap::new(),
        principal_writes: t
            .principal
            .iter()
            .map(|(a, key, sequence)| PrincipalSequence {
                custodian: a.clone(),
                key: key.clone(),
                sequence: *sequence,
            })
            .collect(),
        pending_at_end: pending,
        authority_writes: t.authority_writes.clone(),
        latest_withholds: t.latest_withholds.clone(),
        latest_decisions: t.latest_decisions.clone(),
        superseded: t.superseded.clone(),
    };
    (trace, unmatched)
}

/// Checks every invariant with the one checker; returns the violations in
/// a stable order.
pub(crate) fn check(s: &Scenario, t: &Inner, pending_at_end: &[String]) -> Vec<Violation> {
    let (trace, unmatched) = trace(s, t, pending_at_end);
    let mut out = Vec::new();
    for p in unmatched {
        v(
            &mut out,
            abhyasa_check::Invariant::Ab1.name(),
            Some(p),
            "still pending after its deadline and the grace period".into(),
        );
    }
    out.extend(
        abhyasa_check::check(&trace)
            .into_iter()
            .map(Violation::from),
    );
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
