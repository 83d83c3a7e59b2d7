//! The invariants of `tla/Abhyasa.tla` and `tla/AbhyasaCrash.tla`, stated
//! over the composed state, plus coverage examples.
//!
//! Each invariant is a function returning `Err(why)` when it is broken, so
//! a counterexample trace can say what went wrong; the stateright property
//! wraps it.

use abhyasa_core::custody::{LedgerOutcome, TerminalState};
use abhyasa_core::principal::{Authorization, PrincipalWrite};
use abhyasa_core::{DeclinePolicy, DeclineReason, GuardOutcome};
use stateright::Property;

use crate::encode::fold_principal_in;
use crate::model::AbhyasaModel;
use crate::system::{flag, State};

type Check = fn(&AbhyasaModel, &State) -> Result<(), String>;
type Predicate = fn(&AbhyasaModel, &State) -> bool;

/// The safety invariants: (stateright name, check).
pub const INVARIANTS: [(&str, Check); 11] = [
    ("bounded retries", bounded_retries),
    ("effectively-once application", effectively_once),
    ("escalation has its fail-safe", escalation_fail_safe),
    ("decline never ignored", decline_never_ignored),
    (
        "deliver-or-report at quiescence",
        deliver_or_report_quiescent,
    ),
    ("benign never under custody", benign_never_in_custody),
    ("no application at/after the deadline", no_late_application),
    ("supersession never regresses", supersession_never_regresses),
    ("custodian agrees with receiver ledger", custodian_truthful),
    ("deadline never moves", deadline_never_moves),
    ("custody records never regress", records_never_regress),
];

/// Name of the liveness property.
pub const LIVENESS: &str = "every admissible obligation eventually terminal";

/// Coverage examples: states the exploration is expected to reach.
pub const EXAMPLES: [(&str, Predicate); 8] = [
    ("example: applied", |m, s| {
        any_terminal(m, s, TerminalState::Applied)
    }),
    ("example: declined", |m, s| {
        any_terminal(m, s, TerminalState::Declined)
    }),
    ("example: escalated", |m, s| {
        any_terminal(m, s, TerminalState::Escalated)
    }),
    ("example: late applied ack reconciled", |_, s| {
        !s.custodian.durable.reconciliations.is_empty()
    }),
    ("example: receiver declined superseded", |_, s| {
        receiver_declined(s, DeclineReason::Superseded)
    }),
    ("example: receiver declined expired", |_, s| {
        receiver_declined(s, DeclineReason::Expired)
    }),
    (
        "example: custody resumed after a custodian crash",
        |m, s| {
            s.custodian.crashes_left < m.config().custodian_crashes
                && s.custodian.live.pending_len() > 0
                && s.ghost.frames_sent.iter().any(|n| *n > 1)
        },
    ),
    ("example: receiver restarted after applying", |m, s| {
        s.receiver.crashes_left < m.config().receiver_crashes
            && s.receiver
                .durable
                .ledger
                .values()
                .any(|l| l.outcome == LedgerOutcome::Applied)
    }),
];

macro_rules! invariant {
    ($i:expr) => {
        Property::always(INVARIANTS[$i].0, |m, s| (INVARIANTS[$i].1)(m, s).is_ok())
    };
}

/// Every property, in a fixed order.
pub fn all() -> Vec<Property<AbhyasaModel>> {
    let mut p = vec![
        invariant!(0),
        invariant!(1),
        invariant!(2),
        invariant!(3),
        invariant!(4),
        invariant!(5),
        invariant!(6),
        invariant!(7),
        invariant!(8),
        invariant!(9),
        invariant!(10),
        Property::eventually(LIVENESS, all_admissible_terminal),
    ];
    for (name, f) in EXAMPLES {
        p.push(Property::sometimes(name, f));
    }
    p
}

/// Every broken invariant of a state, with the reason.
pub fn broken(m: &AbhyasaModel, s: &State) -> Vec<(&'static str, String)> {
    INVARIANTS
        .iter()
        .filter_map(|(name, f)| f(m, s).err().map(|why| (*name, why)))
        .collect()
}

fn durable_terminal(s: &State, m: &AbhyasaModel, i: usize) -> Option<TerminalState> {
    let id = m.obligations()[i].id();
    s.custodian.durable.terminal.get(id).map(|t| t.state)
}

fn receiver_durable(s: &State, m: &AbhyasaModel, i: usize) -> Option<LedgerOutcome> {
    let key = (m.custodian_id().clone(), m.obligations()[i].id().clone());
    s.receiver.durable.ledger.get(&key).map(|l| l.outcome)
}

fn any_terminal(m: &AbhyasaModel, s: &State, state: TerminalState) -> bool {
    (0..m.obligations().len()).any(|i| durable_terminal(s, m, i) == Some(state))
}

fn receiver_declined(s: &State, reason: DeclineReason) -> bool {
    s.receiver
        .durable
        .ledger
        .values()
        .any(|l| l.outcome == LedgerOutcome::Declined && l.reason == Some(reason))
}

/// AB-2: at most `1 + max_retries` transmissions, over every incarnation.
fn bounded_retries(m: &AbhyasaModel, s: &State) -> Result<(), String> {
    let max = 1 + m.config().max_retries;
    for (i, ob) in m.obligations().iter().enumerate() {
        let sent = u32::from(s.ghost.frames_sent[i]);
        let live = s.custodian.live.attempts(ob.id()).unwrap_or(0);
        let durable = s
            .custodian
            .durable
            .pending
            .get(ob.id())
            .map_or(0, |p| p.attempts);
        if sent > max || live > max || durable > max {
            return Err(format!(
                "{}: {sent} frames sent, {live} attempts live, {durable} durable; bound {max}",
                m.label(i)
            ));
        }
    }
    Ok(())
}

/// AB-3: every effect takes effect at most once (ground truth).
fn effectively_once(m: &AbhyasaModel, s: &State) -> Result<(), String> {
    for (i, n) in s.ghost.applications.iter().enumerate() {
        if *n > 1 {
            return Err(format!("{} applied {n} times", m.label(i)));
        }
    }
    Ok(())
}

/// Whether the principal state restored from the durable records protects
/// the key of obligation `i`: withheld at its sequence, or something newer
/// stands.
fn protected(m: &AbhyasaModel, s: &State, i: usize) -> bool {
    let p = fold_principal_in(&s.custodian.durable, m.weight_range());
    let seq = Some(abhyasa_core::Sequence(m.sequence(i)));
    p.authorization(m.key(i)).is_some_and(|e| {
        e.sequence > seq || (e.sequence == seq && e.state == Authorization::Withheld)
    })
}

/// AB-4: an escalation is recorded once, and its fail-safe is in force or
/// was dropped by the guard because something newer stands.
fn escalation_fail_safe(m: &AbhyasaModel, s: &State) -> Result<(), String> {
    let d = &s.custodian.durable;
    for (i, ob) in m.obligations().iter().enumerate() {
        let escalations: Vec<_> = d
            .escalations
            .iter()
            .filter(|e| e.obligation_id == *ob.id())
            .collect();
        let escalated = durable_terminal(s, m, i) == Some(TerminalState::Escalated);
        if escalated != (escalations.len() == 1) {
            return Err(format!(
                "{}: terminal {:?} with {} escalation records",
                m.label(i),
                durable_terminal(s, m, i),
                escalations.len()
            ));
        }
        if let Some(e) = escalations.first() {
            let guard_ok = match e.guard {
                GuardOutcome::Applied | GuardOutcome::AlreadyInEffect => true,
                GuardOutcome::Superseded { newest } => newest.0 >= m.sequence(i),
            };
            if !guard_ok || !protected(m, s, i) {
                return Err(format!(
                    "{} escalated (guard {:?}) but safe(O) is not in force",
                    m.label(i),
                    e.guard
                ));
            }
        }
    }
    Ok(())
}

/// Declined ≠ applied: a decline applies `safe(O)` or surfaces the decline.
fn decline_never_ignored(m: &AbhyasaModel, s: &State) -> Result<(), String> {
    for (i, ob) in m.obligations().iter().enumerate() {
        if durable_terminal(s, m, i) != Some(TerminalState::Declined) {
            continue;
        }
        let ok = match m.config().decline_policy {
            DeclinePolicy::ApplySafe => protected(m, s, i),
            DeclinePolicy::Surface => s.custodian.durable.principal.iter().any(|w| {
                matches!(w, PrincipalWrite::DecisionRaised(item) if item.obligation_id == *ob.id())
            }),
        };
        if !ok {
            return Err(format!(
                "{} declined but neither protected nor surfaced",
                m.label(i)
            ));
        }
    }
    Ok(())
}

/// No timer, nothing in flight, nothing uncommitted, nothing left to offer.
pub fn quiescent(m: &AbhyasaModel, s: &State) -> bool {
    s.network.is_empty()
        && s.custodian.buffer.is_empty()
        && s.receiver.buffer.is_empty()
        && s.custodian.live.poll_timeout().is_none()
        && (s.now >= m.config().offer_window_seconds
            || (0..m.obligations().len()).all(|i| m.known(s, i)))
}

fn discharged(t: Option<TerminalState>) -> bool {
    matches!(
        t,
        Some(TerminalState::Applied | TerminalState::Declined | TerminalState::Escalated)
    )
}

/// Deliver-or-report: once quiescent, every admissible obligation the
/// custodian took is applied, declined or escalated, live and durably.
fn deliver_or_report_quiescent(m: &AbhyasaModel, s: &State) -> Result<(), String> {
    if !quiescent(m, s) {
        return Ok(());
    }
    for (i, ob) in m.obligations().iter().enumerate() {
        if !m.admissible(i) || !m.known(s, i) {
            continue;
        }
        let live = s.custodian.live.terminal(ob.id()).map(|t| t.state);
        if !discharged(live) || !discharged(durable_terminal(s, m, i)) {
            return Err(format!(
                "{} ends live {live:?}, durable {:?} at quiescence",
                m.label(i),
                durable_terminal(s, m, i)
            ));
        }
    }
    Ok(())
}

/// AC-1: the benign obligation is sent once and never under custody.
fn benign_never_in_custody(m: &AbhyasaModel, s: &State) -> Result<(), String> {
    for (i, ob) in m.obligations().iter().enumerate() {
        if m.admissible(i) {
            continue;
        }
        let live = s.custodian.live.terminal(ob.id()).map(|t| t.state);
        let durable = durable_terminal(s, m, i);
        let best_effort =
            |t: Option<TerminalState>| matches!(t, None | Some(TerminalState::BestEffort));
        if s.custodian.live.is_pending(ob.id())
            || s.custodian.durable.pending.contains_key(ob.id())
            || !best_effort(live)
            || !best_effort(durable)
            || s.ghost.frames_sent[i] > 1
        {
            return Err(format!(
                "benign {}: live {live:?}, durable {durable:?}, {} frames sent",
                m.label(i),
                s.ghost.frames_sent[i]
            ));
        }
    }
    Ok(())
}

/// Deadlines bind the receiver: no application at or after
/// `deadline - skew`.
fn no_late_application(_: &AbhyasaModel, s: &State) -> Result<(), String> {
    match s.ghost.late_applications {
        0 => Ok(()),
        n => Err(format!("{n} application(s) at or after deadline - skew")),
    }
}

/// Supersession, two-sided: the newest sequence in force never goes down
/// (checked on every step), and whatever the receiver applied or declined
/// `superseded` is covered by its key's newest sequence.
fn supersession_never_regresses(m: &AbhyasaModel, s: &State) -> Result<(), String> {
    if s.ghost.flags & flag::PRINCIPAL_REGRESSED != 0 {
        return Err("the principal's newest sequence on a key went down".into());
    }
    if s.ghost.flags & flag::RECEIVER_REGRESSED != 0 {
        return Err("the receiver's newest applied sequence on a key went down".into());
    }
    for (i, ob) in m.obligations().iter().enumerate() {
        let key = (m.custodian_id().clone(), ob.id().clone());
        let Some(l) = s.receiver.durable.ledger.get(&key) else {
            continue;
        };
        let covered = s
            .receiver
            .durable
            .key_sequences
            .get(&m.key(i).issued_by(m.custodian_id()))
            .is_some_and(|(newest, _)| newest.0 >= m.sequence(i));
        let needs = l.outcome == LedgerOutcome::Applied
            || (l.outcome == LedgerOutcome::Declined
                && l.reason == Some(DeclineReason::Superseded));
        if needs && !covered {
            return Err(format!(
                "receiver {:?} {} but the key's newest sequence is below it",
                l.outcome,
                m.label(i)
            ));
        }
    }
    Ok(())
}

/// The custodian's terminal record never contradicts the receiver's
/// durable ledger.
fn custodian_truthful(m: &AbhyasaModel, s: &State) -> Result<(), String> {
    for (i, ob) in m.obligations().iter().enumerate() {
        if !m.admissible(i) {
            continue;
        }
        let ledger = receiver_durable(s, m, i);
        let live = s.custodian.live.terminal(ob.id());
        let durable = s.custodian.durable.terminal.get(ob.id());
        for t in [live, durable].into_iter().flatten() {
            let ok = match t.state {
                TerminalState::Applied => ledger == Some(LedgerOutcome::Applied),
                TerminalState::Declined => ledger == Some(LedgerOutcome::Declined),
                TerminalState::Escalated => {
                    !t.late_ack_recorded || ledger == Some(LedgerOutcome::Applied)
                }
                TerminalState::BestEffort => false,
            };
            if !ok {
                return Err(format!(
                    "custodian says {} {:?}{} but the receiver's durable ledger says {ledger:?}",
                    m.label(i),
                    t.state,
                    if t.late_ack_recorded {
                        " (late applied)"
                    } else {
                        ""
                    }
                ));
            }
        }
    }
    Ok(())
}

/// AB-2: the deadline is absolute: recorded terminal and escalation
/// deadlines are `created_at + deadline`, and no retry is scheduled at or
/// after it.
fn deadline_never_moves(m: &AbhyasaModel, s: &State) -> Result<(), String> {
    if s.ghost.flags & flag::RETRY_AFTER_DEADLINE != 0 {
        return Err("a retry was scheduled at or after the absolute deadline".into());
    }
    let d = &s.custodian.durable;
    for (i, ob) in m.obligations().iter().enumerate() {
        let want = m.deadline_at(i);
        let recorded = d
            .terminal
            .get(ob.id())
            .map(|t| t.deadline_at)
            .into_iter()
            .chain(
                d.escalations
                    .iter()
                    .filter(|e| e.obligation_id == *ob.id())
                    .map(|e| e.deadline_at),
            );
        for got in recorded {
            if got != want {
                return Err(format!(
                    "{} closed with deadline {got}, not {want}",
                    m.label(i)
                ));
            }
        }
    }
    Ok(())
}

/// Durable terminal states are final and durable attempt counts only grow.
fn records_never_regress(_: &AbhyasaModel, s: &State) -> Result<(), String> {
    if s.ghost.flags & flag::TERMINAL_REOPENED != 0 {
        return Err("a durable terminal state changed".into());
    }
    if s.ghost.flags & flag::ATTEMPTS_RESET != 0 {
        return Err("a durable attempt count went down".into());
    }
    Ok(())
}

/// Liveness target: nothing uncommitted, nothing left to offer, and every
/// admissible obligation the custodian durably took is discharged (and,
/// with the surface policy, no decision is left open).
pub fn all_admissible_terminal(m: &AbhyasaModel, s: &State) -> bool {
    let settled = s.custodian.buffer.is_empty()
        && s.receiver.buffer.is_empty()
        && (s.now >= m.config().offer_window_seconds
            || (0..m.obligations().len()).all(|i| m.known(s, i)));
    settled
        && (0..m.obligations().len()).all(|i| {
            let id = m.obligations()[i].id();
            let taken = s.custodian.durable.pending.contains_key(id)
                || s.custodian.durable.terminal.contains_key(id);
            !m.admissible(i) || !taken || discharged(durable_terminal(s, m, i))
        })
        && fold_principal_in(&s.custodian.durable, m.weight_range())
            .decisions()
            .next()
            .is_none()
}
