//! Readable traces of the hostile-relay model.

use std::fmt::Write as _;

use abhyasa_core::custody::TerminalState;
use stateright::Path;

use super::model::{HAction, HState, HostileModel};
use super::properties;

/// One action in words.
pub fn describe_action(m: &HostileModel, a: &HAction) -> String {
    match a {
        HAction::Offer(i) => format!(
            "{}'s caller offers {} ({}) to its node",
            m.issuer_id(m.issuer_of(*i)),
            m.label(*i),
            m.obligation(*i)
                .payload()
                .get("decision")
                .and_then(|d| d.as_str())
                .unwrap_or("?")
        ),
        HAction::IssuerTimeout(j) => format!("{} handle_timeout(now)", m.issuer_id(*j)),
        HAction::EdgeTimeout => "edge handle_timeout(now)".into(),
        HAction::Deliver(k) => format!("relay delivers {k}"),
        HAction::Drop(k) => format!("relay drops {k}"),
        HAction::Replay(k) => format!("relay replays {k}"),
        HAction::Tick => "clock +1s".into(),
        HAction::AdvanceToTimeout => "clock jumps to the next issuer timer".into(),
    }
}

fn terminal(t: Option<TerminalState>) -> &'static str {
    match t {
        None => "-",
        Some(TerminalState::Applied) => "applied",
        Some(TerminalState::Declined) => "declined",
        Some(TerminalState::Escalated) => "escalated",
        Some(TerminalState::BestEffort) => "best-effort",
    }
}

/// The state in a few lines.
pub fn describe_state(m: &HostileModel, s: &HState) -> String {
    let mut o = String::new();
    let mut custody = Vec::new();
    let mut ledger = Vec::new();
    for i in 0..m.obligation_count() {
        let id = m.obligation(i).id();
        let c = &s.issuers[m.issuer_of(i)].durable;
        let state = c.terminal.get(id).map(|t| t.state);
        let seq = c
            .pending
            .get(id)
            .map(|p| p.obligation.sequence())
            .or_else(|| {
                s.seen.values().find_map(|f| match &f.message {
                    abhyasa_core::wire::Message::Obligation(o) if o.id() == id => {
                        Some(o.sequence())
                    }
                    _ => None,
                })
            })
            .flatten();
        let pending = if c.pending.contains_key(id) {
            "pending"
        } else {
            terminal(state)
        };
        custody.push(format!(
            "{} {pending} seq {}",
            m.label(i),
            seq.map_or("none".into(), |q| q.0.to_string())
        ));
        ledger.push(format!("{} {:?}", m.label(i), m.ledger(s, i)));
    }
    let now = m.now(s);
    let auth: Vec<String> = s
        .ghost
        .writes
        .iter()
        .map(|(who, k)| {
            format!(
                "{k} (written by {who}): {:?}",
                s.edge.live.authority(k, now)
            )
        })
        .collect();
    let net: Vec<String> = s
        .in_flight
        .iter()
        .map(|(k, (_, n))| {
            if *n > 1 {
                format!("{k} x{n}")
            } else {
                k.clone()
            }
        })
        .collect();
    let _ = writeln!(
        o,
        "            t={}s  custody [{}]",
        s.now,
        custody.join(", ")
    );
    let _ = writeln!(o, "            edge ledger [{}]", ledger.join(", "));
    let _ = writeln!(o, "            edge authority [{}]", auth.join("; "));
    let _ = write!(
        o,
        "            in flight {{{}}}  replays left {}",
        net.join("; "),
        s.replays_left
    );
    o
}

/// A whole path: numbered actions, each followed by the state it led to,
/// then the invariants the last state breaks.
pub fn render(m: &HostileModel, path: &Path<HState, HAction>) -> String {
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
