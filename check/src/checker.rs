//! The invariant rules (shared/DESIGN.md §2, spec/protocol.md), read off a
//! [`Trace`]. This is the union of the three checkers the project had (the
//! core's abstract sweep, netsim's reference-v1 checker and its full-stack
//! checker); every rule any of them had is here, once.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use abhyasa_core::custody::LedgerOutcome;
use abhyasa_core::{AgentId, GuardOutcome};

use crate::trace::{Key, Offer, Outcome, Terminal, Trace};

/// The invariant a [`Violation`] breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Invariant {
    /// AC-1 admissibility: admissible obligations go under custody, the
    /// others travel best-effort (one attempt, no custody).
    Ac1,
    /// AB-1 custody / deliver-or-report: every custody opened ends exactly
    /// once, applied, declined or escalated; none silently lost.
    Ab1,
    /// AB-2 persistence: no more than `1 + max_retries` transmissions.
    Ab2,
    /// AB-3 idempotent application: applied at most once, the effect and
    /// the ledger record in one commit.
    Ab3,
    /// AB-4 fail-safe: an escalation is recorded with `safe(O)` applied to
    /// principal state (and no fail-safe lands when the receiver applied).
    Ab4,
    /// Declined ≠ applied: a decline discharges delivery, not protection;
    /// the custodian applies `safe(O)`.
    DeclinedNotApplied,
    /// Deadlines bind both sides: no application at or after the deadline.
    Deadline,
    /// A custodian's discharge agrees with the receiver: `applied` means
    /// applied exactly once, `declined` means not applied.
    AppliedMeansApplied,
    /// Supersession never regresses, receiver side or principal side.
    Supersession,
    /// C-OR-2: once a receiver applied a withhold that was its issuer's
    /// latest decision on the key, no later write grants that key again
    /// (whatever a relay or transport held, reordered or replayed).
    WithdrawnStaysWithdrawn,
    /// C-AZ-2: one issuer never writes a governed key another issuer
    /// wrote at the same receiver: the key carries its issuer.
    IssuersApart,
    /// C-OR-1: a receiver never declines an issuer's latest decision on a
    /// key `superseded` (nothing it issued there is newer, and no one else
    /// governs its key): the sequences its node assigns order its
    /// decisions whatever the delivery order.
    NewestHonoured,
    /// The harness could not run or observe the transfer (not a protocol
    /// rule, but a run that cannot be checked is not a pass).
    Harness,
}

impl Invariant {
    /// The name used in reports (`AB-3`, `supersession`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Invariant::Ac1 => "AC-1",
            Invariant::Ab1 => "AB-1",
            Invariant::Ab2 => "AB-2",
            Invariant::Ab3 => "AB-3",
            Invariant::Ab4 => "AB-4",
            Invariant::DeclinedNotApplied => "declined-not-applied",
            Invariant::Deadline => "deadline",
            Invariant::AppliedMeansApplied => "applied-means-applied",
            Invariant::Supersession => "supersession",
            Invariant::WithdrawnStaysWithdrawn => "C-OR-2",
            Invariant::IssuersApart => "C-AZ-2",
            Invariant::NewestHonoured => "C-OR-1",
            Invariant::Harness => "harness",
        }
    }
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One broken invariant.
#[derive(Clone, Debug, PartialEq)]
pub struct Violation {
    /// Which invariant.
    pub invariant: Invariant,
    /// The obligation, when the rule is about one.
    pub obligation: Option<Key>,
    /// What was seen.
    pub detail: String,
}

impl Violation {
    /// The obligation as `custodian/id`, when there is one.
    pub fn obligation_name(&self) -> Option<String> {
        self.obligation.as_ref().map(name)
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.obligation {
            Some(k) => write!(f, "{}: {}: {}", self.invariant, name(k), self.detail),
            None => write!(f, "{}: {}", self.invariant, self.detail),
        }
    }
}

fn name(k: &Key) -> String {
    format!("{}/{}", k.0, k.1)
}

struct Out(Vec<Violation>);

impl Out {
    fn push(&mut self, invariant: Invariant, k: Option<&Key>, detail: impl Into<String>) {
        self.0.push(Violation {
            invariant,
            obligation: k.cloned(),
            detail: detail.into(),
        });
    }
}

/// `items` grouped by key, in key order.
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

/// Checks every invariant over `t`; returns the violations in a stable
/// order (empty: every rule held).
pub fn check(t: &Trace) -> Vec<Violation> {
    let mut out = Out(Vec::new());
    let mut offers: BTreeMap<Key, &Offer> = BTreeMap::new();
    for o in &t.offers {
        offers.entry(o.key()).or_insert(o);
    }
    let terminals = by_key(&t.terminals, Terminal::key);
    check_application(t, &mut out);
    check_custody(t, &offers, &terminals, &mut out);
    check_terminals(t, &offers, &terminals, &mut out);
    check_supersession(t, &mut out);
    check_authority(t, &terminals, &mut out);
    out.0
}

/// AB-3 and the deadline rule, over the receivers' ground truth.
fn check_application(t: &Trace, out: &mut Out) {
    let applies = by_key(&t.applier_applies, |a| (a.custodian.clone(), a.id.clone()));
    let committed = t
        .applications
        .as_ref()
        .map(|a| by_key(a, |a| (a.custodian.clone(), a.id.clone())));
    let keys: BTreeSet<&Key> = applies
        .keys()
        .chain(committed.iter().flat_map(|c| c.keys()))
        .collect();
    for k in keys {
        let n_dec = applies.get(k).map_or(0, Vec::len);
        let n_app = committed.as_ref().map(|c| c.get(k).map_or(0, Vec::len));
        if n_dec > 1 || n_app.is_some_and(|n| n > 1) {
            let committed =
                n_app.map_or(String::new(), |n| format!(", {n} committed applications"));
            out.push(
                Invariant::Ab3,
                Some(k),
                format!(
                    "applied {n_dec} times by the receiver's applier{committed} (at most once)"
                ),
            );
        }
        if let Some(n_app) = n_app.filter(|n| *n != n_dec) {
            out.push(
                Invariant::Ab3,
                Some(k),
                format!(
                    "the applier applied {n_dec} times but {n_app} applications were committed \
                     with the ledger (effect and ledger in one commit)"
                ),
            );
        }
        if let Some(a) = applies
            .get(k)
            .into_iter()
            .flatten()
            .find(|a| a.at >= a.deadline_at)
        {
            out.push(
                Invariant::Deadline,
                Some(k),
                format!(
                    "applied at {}, at or after its deadline {}",
                    a.at, a.deadline_at
                ),
            );
        }
    }
}

/// AC-1 and AB-1: every offer ends the way its admissibility says, once.
fn check_custody(
    t: &Trace,
    offers: &BTreeMap<Key, &Offer>,
    terminals: &BTreeMap<Key, Vec<&Terminal>>,
    out: &mut Out,
) {
    for k in &t.pending_at_end {
        out.push(
            Invariant::Ab1,
            Some(k),
            "still pending after its deadline and the grace period",
        );
    }
    for (k, o) in offers {
        let ends = terminals.get(k).map(Vec::as_slice).unwrap_or_default();
        if !o.admissible {
            match ends {
                [e] if e.outcome == Outcome::BestEffort => {
                    if e.attempts != 1 {
                        out.push(
                            Invariant::Ac1,
                            Some(k),
                            format!("best-effort sent {} times (one attempt)", e.attempts),
                        );
                    }
                }
                _ => out.push(
                    Invariant::Ac1,
                    Some(k),
                    format!(
                        "benign obligation ended {:?} (best-effort, no custody)",
                        ends.iter().map(|e| e.outcome).collect::<Vec<_>>()
                    ),
                ),
            }
            continue;
        }
        match ends {
            [] if t.pending_at_end.contains(k) => {}
            [] => out.push(
                Invariant::Ab1,
                Some(k),
                "admissible obligation neither closed nor pending: silently lost \
                 (deliver-or-report)",
            ),
            [e] if e.outcome == Outcome::BestEffort => out.push(
                Invariant::Ac1,
                Some(k),
                "admissible obligation sent best-effort, without custody",
            ),
            [_] => {}
            many => out.push(
                Invariant::Ab1,
                Some(k),
                format!("custody closed {} times", many.len()),
            ),
        }
    }
    for (k, ends) in terminals {
        if !offers.contains_key(k) && ends.iter().any(|e| e.outcome != Outcome::BestEffort) {
            out.push(Invariant::Ab1, Some(k), "closed without a custody open");
        }
    }
}

/// AB-2, AB-4, declined ≠ applied, and the custodian's discharge against
/// the receiver's ground truth.
fn check_terminals(
    t: &Trace,
    offers: &BTreeMap<Key, &Offer>,
    terminals: &BTreeMap<Key, Vec<&Terminal>>,
    out: &mut Out,
) {
    let applies = by_key(&t.applier_applies, |a| (a.custodian.clone(), a.id.clone()));
    let committed = t
        .applications
        .as_ref()
        .map(|a| by_key(a, |a| (a.custodian.clone(), a.id.clone())));
    for (k, ends) in terminals {
        let Some(e) = ends.first() else { continue };
        let offer = offers.get(k);
        // The receiver's applications: committed ones where the driver
        // sees commits, else the applier's.
        let n_app = match &committed {
            Some(c) => c.get(k).map_or(0, Vec::len),
            None => applies.get(k).map_or(0, Vec::len),
        };
        let ledger = t.ledger.as_ref().map(|l| l.get(k).copied());
        let probe = t.probes.get(k);
        if let Some(o) = offer.filter(|o| o.admissible) {
            if e.attempts > 1 + o.max_retries {
                out.push(
                    Invariant::Ab2,
                    Some(k),
                    format!(
                        "{} attempts exceed 1 + max_retries = {}",
                        e.attempts,
                        1 + o.max_retries
                    ),
                );
            }
        }
        match e.outcome {
            Outcome::Applied => {
                if n_app != 1 || ledger.is_some_and(|l| l != Some(LedgerOutcome::Applied)) {
                    out.push(
                        Invariant::AppliedMeansApplied,
                        Some(k),
                        format!(
                            "custodian discharged applied but the receiver applied {n_app} \
                             times (ledger {ledger:?})"
                        ),
                    );
                }
                if probe.is_some_and(|p| p.after != p.before) {
                    out.push(
                        Invariant::Ab4,
                        Some(k),
                        "fail-safe applied although the receiver applied",
                    );
                }
            }
            Outcome::Declined(_) => {
                if n_app != 0 || ledger.is_some_and(|l| l != Some(LedgerOutcome::Declined)) {
                    out.push(
                        Invariant::AppliedMeansApplied,
                        Some(k),
                        format!(
                            "custodian discharged declined but the receiver applied {n_app} \
                             times (ledger {ledger:?})"
                        ),
                    );
                }
                if probe.is_some_and(|p| !p.safe_applied()) {
                    out.push(
                        Invariant::DeclinedNotApplied,
                        Some(k),
                        "declined without the fail-safe on principal state",
                    );
                }
            }
            Outcome::Escalated => check_escalation(
                e,
                offer.copied(),
                probe.is_some_and(|p| !p.safe_applied()),
                out,
            ),
            Outcome::BestEffort => {}
        }
        if e.escalation.is_some() && e.outcome != Outcome::Escalated {
            out.push(
                Invariant::Ab4,
                Some(k),
                format!("escalation record but custody ended {:?}", e.outcome),
            );
        }
    }
}

/// AB-4 on one escalation: recorded, with its fail-safe applied (or
/// rightly superseded), and visible on principal state.
fn check_escalation(
    e: &Terminal,
    offer: Option<&Offer>,
    no_safe_on_principal: bool,
    out: &mut Out,
) {
    let k = e.key();
    let seq = offer.and_then(|o| o.sequence);
    match e.escalation {
        None => out.push(
            Invariant::Ab4,
            Some(&k),
            "escalated without an escalation record (no fail-safe outcome)",
        ),
        Some(GuardOutcome::Applied) if e.principal_writes == Some(0) => out.push(
            Invariant::Ab4,
            Some(&k),
            "fail-safe reported applied but no principal-side write was committed",
        ),
        Some(GuardOutcome::Superseded { newest }) => match seq {
            None => out.push(
                Invariant::Ab4,
                Some(&k),
                format!(
                    "fail-safe dropped as superseded (newest {newest}) for an obligation \
                     with no sequence"
                ),
            ),
            Some(s) if newest < s => out.push(
                Invariant::Ab4,
                Some(&k),
                format!("fail-safe dropped as superseded by an older sequence {newest}"),
            ),
            Some(_) => {}
        },
        Some(_) => {}
    }
    if no_safe_on_principal {
        out.push(
            Invariant::Ab4,
            Some(&k),
            "escalated but principal state shows no fail-safe",
        );
    }
}

/// Supersession never regresses: on the receiver side, applications on a
/// governed key in commit order carry strictly increasing sequences; on
/// the principal side, authorization writes on a key never go back.
fn check_supersession(t: &Trace, out: &mut Out) {
    let mut recv: BTreeMap<(AgentId, String), u64> = BTreeMap::new();
    for a in t.applications.iter().flatten() {
        if let Some((key, seq)) = &a.key_sequence {
            let newest = recv
                .entry((a.receiver.clone(), key.to_string()))
                .or_insert(0);
            if seq.0 <= *newest {
                out.push(
                    Invariant::Supersession,
                    Some(&(a.custodian.clone(), a.id.clone())),
                    format!(
                        "receiver {} applied sequence {} on {key} after {}",
                        a.receiver, seq.0, *newest
                    ),
                );
            } else {
                *newest = seq.0;
            }
        }
    }
    let mut prin: BTreeMap<(AgentId, String), u64> = BTreeMap::new();
    for w in &t.principal_writes {
        if let Some(seq) = w.sequence {
            let newest = prin
                .entry((w.custodian.clone(), w.key.to_string()))
                .or_insert(0);
            if seq.0 < *newest {
                out.push(
                    Invariant::Supersession,
                    None,
                    format!(
                        "principal of {} wrote sequence {} on {} after {}",
                        w.custodian, seq.0, w.key, *newest
                    ),
                );
            } else {
                *newest = seq.0;
            }
        }
    }
}

/// C-OR-2 and C-AZ-2 over the receivers' authorization writes in commit
/// order: a latest withhold, once written, is the last word on its key at
/// that receiver (and custody reporting it `applied` is then true at the
/// end); no key is written by two issuers.
fn check_authority(t: &Trace, terminals: &BTreeMap<Key, Vec<&Terminal>>, out: &mut Out) {
    let latest: BTreeSet<&Key> = t.latest_withholds.iter().collect();
    let mut last: BTreeMap<(&AgentId, &str), &crate::trace::AuthorityWrite> = BTreeMap::new();
    let mut writers: BTreeMap<(&AgentId, &str), BTreeSet<&AgentId>> = BTreeMap::new();
    for w in &t.authority_writes {
        last.insert((&w.receiver, w.key.as_str()), w);
        writers
            .entry((&w.receiver, w.key.as_str()))
            .or_default()
            .insert(&w.custodian);
    }
    let mut reported = BTreeSet::new();
    for w in &t.authority_writes {
        let k = (w.custodian.clone(), w.id.clone());
        if w.granted || !latest.contains(&k) || !reported.insert(k.clone()) {
            continue;
        }
        let Some(end) = last.get(&(&w.receiver, w.key.as_str())) else {
            continue;
        };
        if end.granted {
            let custody = terminals
                .get(&k)
                .and_then(|v| v.first())
                .map_or("no custody close".to_string(), |c| {
                    format!("custody {:?}", c.outcome)
                });
            out.push(
                Invariant::WithdrawnStaysWithdrawn,
                Some(&k),
                format!(
                    "receiver {} applied this latest withhold on {}, then {}/{} granted it \
                     again ({custody})",
                    w.receiver, w.key, end.custodian, end.id
                ),
            );
        }
    }
    let newest: BTreeSet<&Key> = t.latest_decisions.iter().collect();
    for (receiver, k) in &t.superseded {
        if newest.contains(k) {
            out.push(
                Invariant::NewestHonoured,
                Some(k),
                format!("receiver {receiver} declined this latest decision on its key superseded"),
            );
        }
    }
    for ((receiver, key), who) in writers {
        if who.len() > 1 {
            let names: Vec<&str> = who.iter().map(|a| a.as_str()).collect();
            out.push(
                Invariant::IssuersApart,
                None,
                format!("receiver {receiver}: issuers {names:?} all wrote governed key {key}"),
            );
        }
    }
}
