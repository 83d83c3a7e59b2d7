//! Readable traces: each step's action and the relevant state after it.

use std::fmt::Write as _;

use abhyasa_core::custody::{CustodyOutcome, Record, TerminalState};
use stateright::Path;

use crate::model::{AbhyasaModel, Action, Decision};
use crate::properties;
use crate::system::State;

fn decision(d: Decision) -> &'static str {
    match d {
        Decision::Apply => "apply",
        Decision::Decline => "decline",
        Decision::Defer => "defer",
    }
}

/// One action in words.
pub fn describe_action(m: &AbhyasaModel, a: &Action) -> String {
    match a {
        Action::Offer(i) => format!("principal offers {} to the custodian", m.label(*i)),
        Action::CustodianTimeout => "custodian handle_timeout(now)".into(),
        Action::CustodianCommit => "custodian commits its records, releases what waited".into(),
        Action::CustodianCrash => "CUSTODIAN CRASH: volatile state lost, restore()".into(),
        Action::Resolve(i, apply) => format!(
            "principal resolves the surfaced decline of {}: {}",
            m.label(*i),
            if *apply { "apply safe(O)" } else { "dismiss" }
        ),
        Action::DeliverToCustodian(k) => format!("network delivers to custodian: {k}"),
        Action::DeliverToReceiver(k, d) => format!(
            "network delivers to receiver: {k} (applier would {})",
            decision(*d)
        ),
        Action::CompleteDeferred(i, d) => format!(
            "receiver completes deferred {}: {}",
            m.label(*i),
            decision(*d)
        ),
        Action::ReceiverCommit => "receiver commits its records, releases what waited".into(),
        Action::ReceiverCrash => "RECEIVER CRASH: volatile state lost, restore()".into(),
        Action::Drop(k) => format!("network loses: {k}"),
        Action::Duplicate(k) => format!("network duplicates: {k}"),
        Action::Tick => "clock +1s".into(),
        Action::AdvanceToTimeout => "clock jumps to the custodian's next timer".into(),
    }
}

fn terminal(t: TerminalState) -> &'static str {
    match t {
        TerminalState::Applied => "applied",
        TerminalState::Declined => "declined",
        TerminalState::Escalated => "escalated",
        TerminalState::BestEffort => "best-effort",
    }
}

fn record(m: &AbhyasaModel, r: &Record) -> String {
    let label = |id: &abhyasa_core::ObligationId| {
        m.index_of(id)
            .map_or_else(|| id.to_string(), |i| m.label(i).to_string())
    };
    match r {
        Record::CustodyOpened { pending, .. } => {
            format!("opened {}", label(pending.obligation.id()))
        }
        Record::AttemptMade {
            obligation_id,
            attempts,
            ..
        } => format!("attempt {attempts} of {}", label(obligation_id)),
        Record::DeferralSeen { obligation_id } => format!("deferral of {}", label(obligation_id)),
        Record::CustodyClosed(c) => {
            let outcome = match &c.outcome {
                CustodyOutcome::Applied => "applied".to_string(),
                CustodyOutcome::Declined { reason, .. } => format!("declined({reason:?})"),
                CustodyOutcome::Escalated => "escalated".to_string(),
            };
            format!("closed {} {outcome}", label(&c.obligation_id))
        }
        Record::BestEffortSent { summary, .. } => {
            format!("best-effort {}", label(&summary.obligation_id))
        }
        Record::Principal { .. } => "principal write".into(),
        Record::LateAck(rec) => format!("late ack {}", label(&rec.obligation_id)),
        Record::Ledger(l) => format!("ledger {} {:?}", label(&l.obligation_id), l.outcome),
        Record::Intent(i) => format!("intent {}", label(i.obligation.id())),
    }
}

/// The state, in a few lines.
pub fn describe_state(m: &AbhyasaModel, s: &State) -> String {
    let mut o = String::new();
    let c = &s.custodian;
    let mut live = Vec::new();
    let mut durable = Vec::new();
    for (i, ob) in m.obligations().iter().enumerate() {
        let id = ob.id();
        live.push(match (c.live.attempts(id), c.live.terminal(id)) {
            (Some(a), _) => format!("{} pending({a})", m.label(i)),
            (None, Some(t)) => format!(
                "{} {}{}",
                m.label(i),
                terminal(t.state),
                if t.late_ack_recorded { "+late" } else { "" }
            ),
            (None, None) => format!("{} -", m.label(i)),
        });
        durable.push(
            match (c.durable.pending.get(id), c.durable.terminal.get(id)) {
                (Some(p), _) => format!("{} pending({})", m.label(i), p.attempts),
                (None, Some(t)) => format!("{} {}", m.label(i), terminal(t.state)),
                (None, None) => format!("{} -", m.label(i)),
            },
        );
    }
    let buf: Vec<String> = c.buffer.iter().map(|r| record(m, r)).collect();
    let _ = writeln!(
        o,
        "      t={}s custodian  live [{}]  durable [{}]  uncommitted {:?}  timer {}  crashes left {}",
        s.now,
        live.join(", "),
        durable.join(", "),
        buf,
        c.live
            .poll_timeout()
            .map_or_else(|| "-".to_string(), |t| format!("{}s", m.seconds(t))),
        c.crashes_left,
    );
    let principal: Vec<String> = m
        .distinct_keys()
        .iter()
        .filter_map(|k| {
            c.live
                .principal()
                .authorization(k)
                .map(|e| format!("{k}: {:?}@{:?}", e.state, e.sequence.map(|s| s.0)))
        })
        .collect();
    let _ = writeln!(o, "            principal  {}", principal.join(", "));
    let r = &s.receiver;
    let mut rl = Vec::new();
    let mut rd = Vec::new();
    for (i, ob) in m.obligations().iter().enumerate() {
        rl.push(format!(
            "{} {:?}",
            m.label(i),
            r.live.ledger_outcome(m.custodian_id(), ob.id())
        ));
        let key = (m.custodian_id().clone(), ob.id().clone());
        rd.push(format!(
            "{} {:?}",
            m.label(i),
            r.durable.ledger.get(&key).map(|l| (l.outcome, l.reason))
        ));
    }
    let rbuf: Vec<String> = r.buffer.iter().map(|x| record(m, x)).collect();
    let _ = writeln!(
        o,
        "            receiver   live [{}]  durable [{}]  uncommitted {:?}  crashes left {}",
        rl.join(", "),
        rd.join(", "),
        rbuf,
        r.crashes_left
    );
    let net: Vec<String> = s
        .network
        .frames
        .iter()
        .map(|(k, (_, n))| {
            if *n > 1 {
                format!("{k} x{n}")
            } else {
                k.clone()
            }
        })
        .collect();
    let _ = writeln!(o, "            network    {{{}}}", net.join("; "));
    let apps: Vec<String> = (0..m.obligations().len())
        .map(|i| {
            format!(
                "{} applied {}x sent {}x",
                m.label(i),
                s.ghost.applications[i],
                s.ghost.frames_sent[i]
            )
        })
        .collect();
    let _ = write!(o, "            truth      {}", apps.join(", "));
    o
}

/// A whole path: numbered actions, each followed by the state it led to,
/// then the invariants the last state breaks.
pub fn render(m: &AbhyasaModel, path: &Path<State, Action>) -> String {
    let steps = path.clone().into_vec();
    let mut o = String::new();
    let mut states = steps.iter().map(|(s, _)| s);
    if let Some(first) = states.next() {
        let _ = writeln!(o, "   0. initial state\n{}", describe_state(m, first));
    }
    for (k, ((_, a), next)) in steps.iter().zip(states).enumerate() {
        if let Some(a) = a {
            let _ = writeln!(
                o,
                "  {:>2}. {}\n{}",
                k + 1,
                describe_action(m, a),
                describe_state(m, next)
            );
        }
    }
    if let Some((last, _)) = steps.last() {
        for (name, why) in properties::broken(m, last) {
            let _ = writeln!(o, "  BROKEN: {name}: {why}");
        }
    }
    o
}
