//! A custody run driven through real node processes, and its verdict read
//! from the stores themselves (not from anything the nodes said). Shared
//! by `kill_nine.rs` (C-ND-1) and `pg_failover.rs` (C-FL-2).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use abhyasa_core::custody::{LedgerOutcome, TerminalState};
use abhyasa_core::store::{EventId, LogEvent, Store};
use abhyasa_core::{AgentId, ObligationId, Timestamp};
use serde_json::{json, Value};

use super::Control;

/// The id of the `i`th obligation of a run.
pub(crate) fn id(prefix: &str, i: usize) -> String {
    format!("{prefix}-{i:06}")
}

/// The `i`th obligation for `target`: a mix of the three kinds, mostly
/// under custody, every tenth a benign one (best-effort), each on its own
/// governed key.
pub(crate) fn obligation(prefix: &str, i: usize, target: &str, created_at: &str) -> Value {
    let (kind, payload) = match i % 10 {
        0 => (
            "anumati.consent",
            json!({"decision": "grant", "scope": format!("s{i}")}),
        ),
        1 | 4 | 7 => (
            "anumati.consent",
            json!({"decision": "revoke", "scope": format!("s{i}")}),
        ),
        2 | 5 | 8 => (
            "phala.belief_update",
            json!({"weight_delta": -0.25, "weight_key": format!("w{i}")}),
        ),
        _ => (
            "oauth.token",
            json!({"action": "revoke", "token_id": format!("t{i}")}),
        ),
    };
    json!({
        "obligation_id": id(prefix, i),
        "kind": kind,
        "target": target,
        "payload": payload,
        "deadline_seconds": 600,
        "max_retries": 2_000,
        "created_at": created_at,
    })
}

/// One creation time for a run: a re-offer is then byte-identical, has
/// the same digest and is recognised as the same obligation.
pub(crate) fn created_at_now() -> Arc<str> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs();
    Timestamp::from_unix_seconds(i64::try_from(secs).expect("seconds fit i64"))
        .to_rfc3339()
        .into()
}

/// What the offer threads saw.
#[derive(Debug, Default)]
pub(crate) struct Offered {
    /// The first confirmed answer's mode, by obligation index.
    pub(crate) modes: BTreeMap<usize, String>,
    /// Answers lost to a kill (the offer was then made again).
    pub(crate) re_offered: usize,
}

impl Offered {
    /// How many first answers said `mode`.
    pub(crate) fn count(&self, mode: &str) -> usize {
        self.modes.values().filter(|m| *m == mode).count()
    }
}

/// Offers obligations `0..n` from `threads` threads through the control
/// socket of whichever node directory `at` names at the moment (a test
/// may point it at a standby), each until an answer confirms it durable.
/// An answer lost to a kill means the offer may or may not be durable: it
/// is offered again, which offers' idempotence by digest makes safe.
/// `confirmed` counts confirmations as they come.
pub(crate) fn offer_all(
    at: Arc<Mutex<PathBuf>>,
    n: usize,
    threads: usize,
    make: Arc<dyn Fn(usize) -> Value + Send + Sync>,
    confirmed: Arc<AtomicUsize>,
) -> Offered {
    let re_offered = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (at, make, confirmed, re_offered) = (
                at.clone(),
                make.clone(),
                confirmed.clone(),
                re_offered.clone(),
            );
            std::thread::spawn(move || {
                let mut modes = BTreeMap::new();
                let mut conn: Option<(PathBuf, Control)> = None;
                for i in (t..n).step_by(threads) {
                    let req = json!({"op": "offer", "obligation": make(i)});
                    let mut tries = 0;
                    loop {
                        tries += 1;
                        assert!(tries < 10_000, "obligation {i} never confirmed");
                        let dir = at.lock().expect("target lock").clone();
                        if conn.as_ref().is_some_and(|(d, _)| *d != dir) {
                            conn = None;
                        }
                        let c = match conn.as_mut() {
                            Some((_, c)) => c,
                            None => match Control::connect(&dir) {
                                Ok(c) => &mut conn.insert((dir, c)).1,
                                Err(_) => {
                                    std::thread::sleep(Duration::from_millis(20));
                                    continue;
                                }
                            },
                        };
                        match c.call(&req) {
                            Ok(v) if v["ok"] == true => {
                                let mode = v["result"]["mode"].as_str().unwrap_or("").to_string();
                                modes.insert(i, mode);
                                confirmed.fetch_add(1, Ordering::SeqCst);
                                break;
                            }
                            Ok(v) if v["error"]["code"] == "not_sent" => {
                                // A best-effort obligation whose one send
                                // the transport refused (the target was
                                // down or still reconnecting after a
                                // kill): its terminal state is durable and
                                // reported, which is its whole promise.
                                modes.insert(i, "not_sent".to_string());
                                confirmed.fetch_add(1, Ordering::SeqCst);
                                break;
                            }
                            Ok(v) => {
                                // Only "the node is going away" is retryable.
                                let code = v["error"]["code"].as_str().unwrap_or("");
                                assert!(
                                    matches!(code, "stopped" | "internal" | "refused"),
                                    "offer {i} refused: {v}"
                                );
                                conn = None;
                                std::thread::sleep(Duration::from_millis(20));
                            }
                            Err(_) => {
                                conn = None;
                                re_offered.fetch_add(1, Ordering::Relaxed);
                                std::thread::sleep(Duration::from_millis(20));
                            }
                        }
                    }
                }
                modes
            })
        })
        .collect();
    let mut out = Offered::default();
    for w in workers {
        out.modes.extend(w.join().expect("offer thread"));
    }
    out.re_offered = re_offered.load(Ordering::Relaxed);
    assert_eq!(out.modes.len(), n);
    out
}

/// The verdict of a run, from the stores.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    /// Custodian-side terminal states by name.
    pub(crate) states: BTreeMap<&'static str, usize>,
    pub(crate) pending: usize,
    /// Offered, but unknown to the custodian's store.
    pub(crate) missing: Vec<String>,
    /// More than one `Applied` ledger entry at the receiver.
    pub(crate) applied_twice: Vec<String>,
    /// The custodian's verdict contradicts the receiver's ledger.
    pub(crate) disagreements: Vec<String>,
    /// Escalated although the receiver applied (allowed, counted).
    pub(crate) spurious_escalations: usize,
    /// The receiver's `Applied` ledger entries in all.
    pub(crate) receiver_applied: usize,
}

impl Verdict {
    /// The deliver-or-report assertions every run makes: nothing pending,
    /// nothing lost, nothing applied twice, the two sides agree, every
    /// obligation terminal exactly once, and the receiver's applications
    /// account for every custody `applied`, any spurious escalations and
    /// at most one per best-effort send.
    pub(crate) fn assert_deliver_or_report(&self, n: usize) {
        assert_eq!(self.pending, 0, "{self:?}");
        assert_eq!(self.missing, Vec::<String>::new(), "lost obligations");
        assert_eq!(self.applied_twice, Vec::<String>::new(), "applied twice");
        assert_eq!(
            self.disagreements,
            Vec::<String>::new(),
            "verdicts disagree"
        );
        assert_eq!(
            self.states.values().sum::<usize>(),
            n,
            "every obligation is terminal exactly once"
        );
        assert_eq!(self.states.get("best_effort").copied(), Some(n / 10));
        let applied = self.states.get("applied").copied().unwrap_or(0);
        assert!(self.receiver_applied >= applied + self.spurious_escalations);
        assert!(self.receiver_applied <= applied + self.spurious_escalations + n / 10);
    }
}

/// Reads the verdict on `offered` from the custodian's and the
/// receiver's stores (after both processes are gone).
pub(crate) fn verdict(
    custodian: &dyn Store,
    receiver: &dyn Store,
    custodian_id: &AgentId,
    offered: &BTreeSet<ObligationId>,
) -> Verdict {
    let ds_a = custodian.load().expect("the custodian's state loads");
    let ds_b = receiver.load().expect("the receiver's state loads");

    let mut applied_at_b: BTreeMap<ObligationId, usize> = BTreeMap::new();
    let mut from = EventId(0);
    loop {
        let page = receiver
            .events(from, 10_000)
            .expect("the receiver's event log reads");
        let Some(last) = page.last() else { break };
        from = EventId(last.id.0 + 1);
        for e in &page {
            if let LogEvent::Ledger {
                custodian,
                obligation_id,
                outcome: LedgerOutcome::Applied,
            } = &e.event
            {
                assert_eq!(custodian, custodian_id);
                *applied_at_b.entry(obligation_id.clone()).or_default() += 1;
            }
        }
    }

    let mut v = Verdict {
        pending: ds_a.custodian.pending.len(),
        receiver_applied: applied_at_b.values().sum(),
        ..Verdict::default()
    };
    v.applied_twice = applied_at_b
        .iter()
        .filter(|(_, &c)| c > 1)
        .map(|(id, c)| format!("{id} ×{c}"))
        .collect();
    for id in offered {
        let Some(t) = ds_a.custodian.terminal.get(id) else {
            if !ds_a.custodian.pending.contains_key(id) {
                v.missing.push(id.to_string());
            }
            continue;
        };
        let ledger = ds_b
            .receiver
            .ledger
            .get(&(custodian_id.clone(), id.clone()));
        let b_says = ledger.map(|l| l.outcome);
        let name = match t.state {
            TerminalState::Applied => "applied",
            TerminalState::Declined => "declined",
            TerminalState::Escalated => "escalated",
            TerminalState::BestEffort => "best_effort",
        };
        *v.states.entry(name).or_default() += 1;
        let agrees = match t.state {
            TerminalState::Applied => b_says == Some(LedgerOutcome::Applied),
            TerminalState::Declined => b_says == Some(LedgerOutcome::Declined),
            TerminalState::Escalated => {
                if b_says == Some(LedgerOutcome::Applied) {
                    v.spurious_escalations += 1;
                }
                true
            }
            // Best-effort may be lost; if it arrived, it was applied once
            // (checked above).
            TerminalState::BestEffort => true,
        };
        if !agrees {
            v.disagreements
                .push(format!("{id}: custodian {name}, receiver {b_says:?}"));
        }
    }
    let strangers: Vec<_> = applied_at_b
        .keys()
        .filter(|id| !offered.contains(*id))
        .collect();
    assert!(
        strangers.is_empty(),
        "the receiver applied unknown ids {strangers:?}"
    );
    v
}
