//! The conformance suite (shared/CONFORMANCE.md) through the node, one
//! body per id, each run over every transport × store:
//! `{mem, quic, ws, relayed, http} × {sim, redb, sled, log, fjall, pg}` (the `pg`
//! cells need `ABHYASA_PG_URL`, which `.ci/run` sets; without it they say
//! SKIPPED). A failure names its cell (`c_ab4_1_total_loss::relayed_sled`).
//!
//! Ids shown: C-AB1-1, C-AB1-2, C-AB2-1, C-AB2-2, C-AB2-3, C-AB3-1,
//! C-AB3-2, C-AB3-3, C-AB3-4, C-AB4-1, C-AB4-2, C-AB4-3, C-AB4-4, C-AC-1,
//! C-DC-1, C-DC-2, C-DL-1, C-SS-1, C-SS-2, C-SS-3, C-SS-4, C-TR-2, and
//! C-TR-1 (the same bodies over every transport). Every body applies to
//! every transport: none is skipped.
//! Every body ends with the one invariant checker (`World::close`).
//!
//! ```sh
//! cargo test -p abhyasa-conformance                 # every id, every cell
//! cargo test -p abhyasa-conformance c_ab2_3         # one id, every cell
//! cargo test -p abhyasa-conformance quic_redb       # one cell, every id
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use abhyasa::CustodianState;
use abhyasa_conformance::agent;
use abhyasa_conformance::{
    Backend, Disk, Net, Schedule, World, DECLINE_DETAIL, SCRIPT, SURFACE_KIND,
};
use abhyasa_core::custody::{LedgerOutcome, Offered, TerminalState};
use abhyasa_core::principal::{Authorization, PrincipalWrite};
use abhyasa_core::wire::{Envelope, Message};
use abhyasa_core::{
    AckStatus, AgentId, CustodyAck, DeclineReason, Digest, EscalationCause, GuardOutcome,
    ObligationId, Sequence,
};
use abhyasa_store::StoreKind;
use abhyasa_transport::Incoming;

/// The transports and stores of the matrix, by name: every cell is one of
/// each (`quic_redb`).
const NETS: [(&str, Net); 5] = [
    ("mem", Net::Mem),
    ("quic", Net::Quic),
    ("ws", Net::Ws),
    ("relayed", Net::Relayed),
    ("http", Net::Http),
];
const DISKS: [(&str, Disk); 6] = [
    ("sim", Disk::Sim),
    ("redb", Disk::Embedded(StoreKind::Redb)),
    ("sled", Disk::Embedded(StoreKind::Sled)),
    ("log", Disk::Embedded(StoreKind::Log)),
    ("fjall", Disk::Embedded(StoreKind::Fjall)),
    ("pg", Disk::Postgres),
];

type Body = fn(Backend) -> Pin<Box<dyn Future<Output = ()> + Send>>;

/// Every body, by name.
macro_rules! bodies {
    ($($scenario:ident),* $(,)?) => {
        [$((stringify!($scenario), (|b| Box::pin($scenario(b))) as Body)),*]
    };
}

/// The cells wait on timers and sockets far more than they compute (the
/// whole suite takes ~4 s of CPU), so they run many at a time: 12 test
/// threads unless `--test-threads` (or `RUST_TEST_THREADS`) says otherwise.
const THREADS: usize = 12;

/// One test per body and cell, named `body::cell`, on `libtest-mimic` (the
/// same filters and output as libtest; each test runs on its own
/// two-worker tokio runtime).
fn main() -> std::process::ExitCode {
    let mut args = libtest_mimic::Arguments::from_args();
    if args.test_threads.is_none() {
        let env = std::env::var("RUST_TEST_THREADS").ok();
        args.test_threads = Some(env.and_then(|v| v.parse().ok()).unwrap_or(THREADS));
    }
    let bodies = bodies!(
        c_ab1_1_clean_link,
        c_ab2_1_drops_then_delivery,
        c_ab3_1_c_ab3_2_duplicates_and_lost_acks,
        c_ab4_1_total_loss,
        c_ab2_3_custodian_restart_mid_retry,
        c_ab3_3_receiver_restart_before_ack,
        c_ss2_c_ss3_c_dc1_superseded_is_declined,
        c_ab4_3_recovery_into_dead_link,
        c_ac_1_unknown_kind_is_best_effort,
        c_dc_2_decline_policies,
        c_ab4_2_c_dl_1_deferral_then_expiry,
        c_ab4_4_late_applied_after_escalation,
        c_ss_1_stale_fail_safe_applies_nothing,
        c_ss_4_phala_fail_safes_stay_in_range,
        c_ab1_2_durable_before_first_transmit,
        c_tr_2_unbound_acks_never_discharge,
        c_ab3_4_same_id_other_digest_is_a_conflict,
        c_ab2_2_backoff_doubles_caps_and_jitters,
    );
    let mut trials = Vec::new();
    for (scenario, body) in bodies {
        for ((net_name, net), (disk_name, disk)) in NETS
            .into_iter()
            .flat_map(|n| DISKS.into_iter().map(move |d| (n, d)))
        {
            trials.push(libtest_mimic::Trial::test(
                format!("{scenario}::{net_name}_{disk_name}"),
                move || {
                    if disk == Disk::Postgres && abhyasa_conformance::postgres_url().is_none() {
                        eprintln!("SKIPPED: no PostgreSQL (set ABHYASA_PG_URL; .ci/run does)");
                        return Ok(());
                    }
                    tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(2)
                        .enable_all()
                        .build()
                        .map_err(|e| format!("tokio runtime: {e}"))?
                        .block_on(body(Backend::new(net, disk)));
                    Ok(())
                },
            ));
        }
    }
    libtest_mimic::run(&args, trials).exit_code()
}

const WAIT: Duration = Duration::from_secs(30);

/// Waits until `f` holds (checked every 20 ms), at most `WAIT`.
async fn until<F, Fut>(what: &str, backend: Backend, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let t = tokio::time::Instant::now();
    while !f().await {
        assert!(
            t.elapsed() < WAIT,
            "{backend:?}: timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// C-AB1-1: on a clean link every obligation is applied on attempt 1,
/// custody is discharged and nothing stays pending; the receiver's durable
/// ledger holds each exactly once, applied.
async fn c_ab1_1_clean_link(b: Backend) {
    let w = World::new(b, Schedule::PATIENT).await.unwrap();
    let n = 20;
    let mut ids = Vec::new();
    for i in 0..n {
        let ob = w.revoke(&format!("clean-{i}"), &format!("s{i}"), 30, None);
        w.alice.offer(ob.clone()).await.unwrap();
        ids.push(ob.id().clone());
    }
    for id in &ids {
        let o = w.outcome(id, WAIT).await;
        assert_eq!(o.state, TerminalState::Applied, "{b:?} {id}");
        assert_eq!(o.attempts, Some(1), "{b:?} {id}: applied on attempt 1");
    }
    let st = w.alice.durable_state().await.unwrap();
    assert!(st.custodian.pending.is_empty(), "{b:?}: nothing pending");
    assert!(st.custodian.escalations.is_empty(), "{b:?}: no escalation");
    let ledger = w.bob_ledger().await;
    assert_eq!(ledger.len(), n, "{b:?}: one ledger entry each");
    assert!(
        ledger.iter().all(|(_, o)| *o == LedgerOutcome::Applied),
        "{b:?}"
    );
    assert_eq!(
        w.bob().metrics().await.unwrap().receiver_applied,
        n as u64,
        "{b:?}"
    );
    w.close().await.unwrap();
}

/// C-AB2-1: the receiver hears nothing for a while (every obligation
/// frame dropped), then the link clears: each obligation is applied on the
/// attempt that got through (a later one), exactly once.
async fn c_ab2_1_drops_then_delivery(b: Backend) {
    let w = World::new(b, Schedule::FAST).await.unwrap();
    w.bob_plug.cut(true);
    let n = 5;
    let mut ids = Vec::new();
    for i in 0..n {
        let ob = w.revoke(&format!("drop-{i}"), &format!("s{i}"), 30, None);
        w.alice.offer(ob.clone()).await.unwrap();
        ids.push(ob.id().clone());
    }
    // At least two attempts of each were sent and lost.
    until("two lost attempts each", b, || async {
        ids.iter().all(|id| w.bob_plug.lost(id) >= 2)
    })
    .await;
    w.bob_plug.cut(false);
    for id in &ids {
        let o = w.outcome(id, WAIT).await;
        assert_eq!(o.state, TerminalState::Applied, "{b:?} {id}");
        assert!(
            o.attempts.unwrap() >= 2,
            "{b:?} {id}: applied on a retry: {o:?}"
        );
    }
    let ledger = w.bob_ledger().await;
    assert_eq!(ledger.len(), n, "{b:?}");
    assert_eq!(
        w.bob().metrics().await.unwrap().receiver_applied,
        n as u64,
        "{b:?}: once each"
    );
    w.close().await.unwrap();
}

/// C-AB3-1, C-AB3-2: every obligation frame arrives twice and half the
/// acks are lost, so the custodian redelivers: each effect is applied
/// once, and the redeliveries are re-acked `applied` from the ledger.
async fn c_ab3_1_c_ab3_2_duplicates_and_lost_acks(b: Backend) {
    let w = World::new(b, Schedule::FAST).await.unwrap();
    w.bob_plug.set(0.0, 1.0);
    w.alice_plug.set(0.5, 0.0);
    let n = 12;
    let mut ids = Vec::new();
    for i in 0..n {
        let ob = w.revoke(&format!("dup-{i}"), &format!("s{i}"), 30, None);
        w.alice.offer(ob.clone()).await.unwrap();
        ids.push(ob.id().clone());
    }
    for id in &ids {
        let o = w.outcome(id, WAIT).await;
        assert_eq!(o.state, TerminalState::Applied, "{b:?} {id}");
    }
    let (_, _, duplicated) = w.bob_plug.counts();
    let (_, acks_lost, _) = w.alice_plug.counts();
    assert!(
        duplicated >= n as u64,
        "{b:?}: every obligation arrived twice"
    );
    assert!(
        acks_lost >= 1,
        "{b:?}: some acks were lost, so some were redelivered"
    );
    let m = w.bob().metrics().await.unwrap();
    assert_eq!(
        m.receiver_applied, n as u64,
        "{b:?}: applied once each despite {duplicated} duplicates"
    );
    let ledger = w.bob_ledger().await;
    assert_eq!(ledger.len(), n, "{b:?}");
    assert!(
        ledger.iter().all(|(_, o)| *o == LedgerOutcome::Applied),
        "{b:?}"
    );
    w.close().await.unwrap();
}

/// C-AB4-1: total loss. The obligation escalates at its deadline (not
/// before), with cause `unreachable`, the attempts it made, exactly one
/// escalation record, and `safe(O)` applied on the principal side (the
/// scope withheld); the receiver holds nothing.
async fn c_ab4_1_total_loss(b: Backend) {
    let w = World::new(b, Schedule::FAST).await.unwrap();
    w.bob_plug.cut(true);
    w.alice_plug.cut(true);
    let ob = w.revoke("lost", "email.read", 2, None);
    let offered_at = w.alice.now();
    w.alice.offer(ob.clone()).await.unwrap();
    let o = w.outcome(ob.id(), WAIT).await;
    assert_eq!(o.state, TerminalState::Escalated, "{b:?}");
    let esc = o.escalation.as_ref().expect("an escalation record");
    assert_eq!(esc.cause, EscalationCause::Unreachable, "{b:?}");
    assert!(esc.attempts >= 2, "{b:?}: it retried: {esc:?}");
    let closed_after = w.alice.now().saturating_duration_since(offered_at);
    assert!(
        closed_after >= Duration::from_millis(1_900),
        "{b:?}: escalated at the deadline, not {closed_after:?} in"
    );
    let st = w.alice.durable_state().await.unwrap();
    let mine: Vec<_> = st
        .custodian
        .escalations
        .iter()
        .filter(|e| e.obligation_id == *ob.id())
        .collect();
    assert_eq!(mine.len(), 1, "{b:?}: exactly one escalation record");
    assert!(
        st.custodian.principal.iter().any(|w| matches!(
            w,
            PrincipalWrite::Authorization { key, entry }
                if key.to_string().contains("email.read") && entry.state == Authorization::Withheld
        )),
        "{b:?}: the fail-safe withheld the scope principal-side: {:?}",
        st.custodian.principal
    );
    assert!(
        w.bob_ledger().await.is_empty(),
        "{b:?}: the receiver never saw it"
    );
    w.close().await.unwrap();
}

/// C-AB2-3: the custodian restarts mid-retry. After the restart the
/// obligation is pending with the same absolute deadline and the attempts
/// already made (the remaining window, not a fresh one), and it is applied
/// once the link clears, on a later attempt.
async fn c_ab2_3_custodian_restart_mid_retry(b: Backend) {
    let mut w = World::new(b, Schedule::FAST).await.unwrap();
    w.bob_plug.cut(true);
    let ob = w.revoke("restart", "s", 30, None);
    w.alice.offer(ob.clone()).await.unwrap();
    until("two lost attempts", b, || async {
        w.bob_plug.lost(ob.id()) >= 2
    })
    .await;
    let before = w.alice.durable_state().await.unwrap();
    let p0 = before
        .custodian
        .pending
        .get(ob.id())
        .expect("pending before the restart")
        .clone();
    w.restart_alice().await.unwrap();
    let after = w.alice.durable_state().await.unwrap();
    let p1 = after
        .custodian
        .pending
        .get(ob.id())
        .expect("still pending after the restart");
    assert_eq!(
        p1.obligation.deadline_at(),
        p0.obligation.deadline_at(),
        "{b:?}: the absolute deadline survives"
    );
    assert_eq!(p1.offered_at, p0.offered_at, "{b:?}: not re-offered as new");
    assert!(
        p1.attempts >= p0.attempts && p0.attempts >= 1,
        "{b:?}: attempts survive: {p0:?} then {p1:?}"
    );
    w.wait_connected().await.unwrap();
    w.bob_plug.cut(false);
    let o = w.outcome(ob.id(), WAIT).await;
    assert_eq!(o.state, TerminalState::Applied, "{b:?}");
    assert!(
        o.attempts.unwrap() > p0.attempts,
        "{b:?}: counting went on: {o:?} after {p0:?}"
    );
    assert_eq!(
        w.bob().metrics().await.unwrap().receiver_applied,
        1,
        "{b:?}"
    );
    w.close().await.unwrap();
}

/// C-AB3-3: the receiver applies, then crashes before any ack reaches the
/// custodian. After its restart the redeliveries are re-acked from the
/// durable ledger and nothing is applied again.
async fn c_ab3_3_receiver_restart_before_ack(b: Backend) {
    let mut w = World::new(b, Schedule::FAST).await.unwrap();
    w.alice_plug.cut(true);
    let n = 5;
    let mut ids = HashSet::new();
    for i in 0..n {
        let ob = w.revoke(&format!("rr-{i}"), &format!("s{i}"), 30, None);
        w.alice.offer(ob.clone()).await.unwrap();
        ids.insert(ob.id().clone());
    }
    until("bob's ledger holds all", b, || async {
        w.bob_ledger().await.len() == n
    })
    .await;
    w.stop_bob().await.unwrap();
    w.start_bob().await.unwrap();
    w.wait_connected().await.unwrap();
    w.alice_plug.cut(false);
    for id in &ids {
        let o = w.outcome(id, WAIT).await;
        assert_eq!(o.state, TerminalState::Applied, "{b:?} {id}");
    }
    assert_eq!(
        w.bob().metrics().await.unwrap().receiver_applied,
        0,
        "{b:?}: the restarted receiver re-acked from its ledger, applying nothing"
    );
    let ledger = w.bob_ledger().await;
    assert_eq!(
        ledger
            .iter()
            .map(|(id, _)| id.clone())
            .collect::<HashSet<_>>(),
        ids,
        "{b:?}"
    );
    w.close().await.unwrap();
}

/// C-SS-2, C-SS-3, C-DC-1: a revocation with an older sequence on a key that
/// already applied a newer one is declined `superseded`; the decline
/// discharges custody on its first attempt, with no retry and no
/// escalation.
async fn c_ss2_c_ss3_c_dc1_superseded_is_declined(b: Backend) {
    let w = World::new(b, Schedule::PATIENT).await.unwrap();
    let newer = w.revoke("newer", "calendar.write", 30, Some(5));
    w.alice.offer(newer.clone()).await.unwrap();
    assert_eq!(
        w.outcome(newer.id(), WAIT).await.state,
        TerminalState::Applied,
        "{b:?}"
    );
    let principal_before =
        authorization_entry(&w.alice.durable_state().await.unwrap(), "calendar.write");
    let older = w.revoke("older", "calendar.write", 30, Some(3));
    w.alice.offer(older.clone()).await.unwrap();
    let o = w.outcome(older.id(), WAIT).await;
    assert_eq!(o.state, TerminalState::Declined, "{b:?}: {o:?}");
    assert_eq!(o.reason, Some(DeclineReason::Superseded), "{b:?}");
    let st = w.alice.durable_state().await.unwrap();
    // C-SS-3: both guards compose. The receiver's guard declined the stale
    // obligation; the decline's safe(O) met the principal-side guard and
    // was dropped: neither side regressed to sequence 3.
    assert_eq!(
        authorization_entry(&st, "calendar.write"),
        principal_before,
        "{b:?}: the principal side still holds the sequence-5 decision"
    );
    let bob_st = w.bob().durable_state().await.unwrap();
    let on_key: Vec<_> = bob_st
        .receiver
        .key_sequences
        .iter()
        .filter(|(k, _)| k.to_string().contains("calendar.write"))
        .map(|(_, (seq, id))| (seq.0, id.to_string()))
        .collect();
    assert_eq!(
        on_key,
        vec![(5, "newer".to_string())],
        "{b:?}: the receiver's key still at sequence 5"
    );
    assert!(
        st.custodian.escalations.is_empty(),
        "{b:?}: a decline is not an escalation"
    );
    assert!(st.custodian.pending.is_empty(), "{b:?}");
    assert_eq!(
        w.bob().metrics().await.unwrap().receiver_applied,
        1,
        "{b:?}: only the newer applied"
    );
    // One attempt each: the decline was final on its first delivery.
    assert_eq!(
        w.alice.metrics().await.unwrap().attempts_sent,
        2,
        "{b:?}: no retry after a decline"
    );
    w.close().await.unwrap();
}

/// The principal-side authorization entry (state, sequence, source) alice
/// holds on the key naming `needle`, if any (later writes win).
fn authorization_entry(
    st: &abhyasa_core::store::DurableState,
    needle: &str,
) -> Option<abhyasa_core::principal::AuthorizationEntry> {
    st.custodian.principal.iter().rev().find_map(|w| match w {
        PrincipalWrite::Authorization { key, entry } if key.to_string().contains(needle) => {
            Some(entry.clone())
        }
        _ => None,
    })
}

/// The principal-side authorization alice holds on the key naming
/// `needle`, if any (later writes win).
fn authorization(st: &abhyasa_core::store::DurableState, needle: &str) -> Option<Authorization> {
    authorization_entry(st, needle).map(|e| e.state)
}

/// C-AB4-3: the custodian is down across the deadline of a transfer it
/// holds and comes back into a link that is still dead. The recovered
/// transfer keeps its absolute deadline, so it escalates at once (cause
/// `unreachable`, exactly one record, `safe(O)` applied principal-side),
/// with no attempt after the deadline; the receiver never saw it.
async fn c_ab4_3_recovery_into_dead_link(b: Backend) {
    let mut w = World::new(b, Schedule::FAST).await.unwrap();
    w.bob_plug.cut(true);
    w.alice_plug.cut(true);
    let ob = w.revoke("dead-restart", "files.write", 2, None);
    w.alice.offer(ob.clone()).await.unwrap();
    until("a lost attempt", b, || async {
        w.bob_plug.lost(ob.id()) >= 1
    })
    .await;
    // Down until well past the deadline (2 s).
    w.restart_alice_after(Duration::from_millis(2_500))
        .await
        .unwrap();
    let o = w.outcome(ob.id(), Duration::from_secs(5)).await;
    assert_eq!(o.state, TerminalState::Escalated, "{b:?}: {o:?}");
    let esc = o.escalation.as_ref().expect("an escalation record");
    assert_eq!(esc.cause, EscalationCause::Unreachable, "{b:?}");
    assert_eq!(
        esc.deadline_at,
        ob.deadline_at(),
        "{b:?}: the original deadline, not a fresh window"
    );
    let st = w.alice.durable_state().await.unwrap();
    assert_eq!(
        st.custodian
            .escalations
            .iter()
            .filter(|e| e.obligation_id == *ob.id())
            .count(),
        1,
        "{b:?}: exactly one escalation across the restart"
    );
    assert_eq!(
        authorization(&st, "files.write"),
        Some(Authorization::Withheld),
        "{b:?}: the fail-safe was applied: {:?}",
        st.custodian.principal
    );
    // The reopened node's counters start at zero: it made no attempt.
    // (It may ask bob what became of the transfer: a status query is not
    // an attempt, so frames at bob's edge are not counted here.)
    tokio::time::sleep(Duration::from_millis(300)).await;
    let m = w.alice.metrics().await.unwrap();
    assert_eq!(
        m.attempts_sent, 0,
        "{b:?}: no attempt after the deadline: {m:?}"
    );
    assert!(w.bob_ledger().await.is_empty(), "{b:?}");
    w.close().await.unwrap();
}

/// C-AC-1: an obligation of a kind the registry does not know is not
/// admissible: alice sends it once, best-effort, takes no custody and
/// never escalates, even on a dead link and past its deadline.
async fn c_ac_1_unknown_kind_is_best_effort(b: Backend) {
    let w = World::new(b, Schedule::FAST).await.unwrap();
    w.bob_plug.cut(true);
    w.alice_plug.cut(true);
    let ob = w.obligation("unknown", "acme.custom", serde_json::json!({"x": 1}), 1);
    let offered = w.alice.offer(ob.clone()).await.unwrap();
    assert_eq!(offered, Offered::BestEffort, "{b:?}");
    // Past the deadline (1 s) by many retry periods of the FAST schedule.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let m = w.alice.metrics().await.unwrap();
    assert_eq!(m.best_effort, 1, "{b:?}: {m:?}");
    assert_eq!(m.attempts_sent, 0, "{b:?}: no custody attempt: {m:?}");
    assert_eq!(m.escalated, 0, "{b:?}: no escalation: {m:?}");
    assert_eq!(w.bob_plug.counts().1, 1, "{b:?}: sent once, never retried");
    let st = w.alice.durable_state().await.unwrap();
    assert!(st.custodian.pending.is_empty(), "{b:?}: no custody");
    assert!(st.custodian.escalations.is_empty(), "{b:?}");
    w.close().await.unwrap();
}

/// C-DC-1, C-DC-2: bob declines (`policy`, with a detail). Under the
/// default policy alice applies `safe(O)` (the scope withheld); under the
/// "surface" policy (oauth.token here) she applies nothing and records a
/// decision item with the receiver's reason and detail. Neither retries
/// or escalates.
async fn c_dc_2_decline_policies(b: Backend) {
    let w = World::new(b, Schedule::PATIENT).await.unwrap();
    let def = w.obligation(
        "decline-default",
        "anumati.consent",
        serde_json::json!({"decision": "revoke", "scope": "drive.read", SCRIPT: "decline"}),
        30,
    );
    let sur = w.obligation(
        "decline-surface",
        SURFACE_KIND,
        serde_json::json!({"action": "revoke", "token_id": "tok-7", SCRIPT: "decline"}),
        30,
    );
    w.alice.offer(def.clone()).await.unwrap();
    w.alice.offer(sur.clone()).await.unwrap();
    for ob in [&def, &sur] {
        let o = w.outcome(ob.id(), WAIT).await;
        assert_eq!(o.state, TerminalState::Declined, "{b:?}: {o:?}");
        assert_eq!(o.reason, Some(DeclineReason::Policy), "{b:?}");
    }
    let st = w.alice.durable_state().await.unwrap();
    assert_eq!(
        authorization(&st, "drive.read"),
        Some(Authorization::Withheld),
        "{b:?}: default policy applied safe(O): {:?}",
        st.custodian.principal
    );
    assert_ne!(
        authorization(&st, "tok-7"),
        Some(Authorization::Withheld),
        "{b:?}: surface policy applied no fail-safe"
    );
    let items = st.decisions();
    let item = items
        .iter()
        .find(|i| i.obligation_id == *sur.id())
        .unwrap_or_else(|| panic!("{b:?}: a decision item for the surfaced decline: {items:?}"));
    assert_eq!(item.reason, DeclineReason::Policy, "{b:?}");
    assert_eq!(item.detail.as_deref(), Some(DECLINE_DETAIL), "{b:?}");
    assert!(
        !items.iter().any(|i| i.obligation_id == *def.id()),
        "{b:?}: the default policy raises no decision"
    );
    assert!(st.custodian.escalations.is_empty(), "{b:?}");
    assert_eq!(
        w.alice.metrics().await.unwrap().attempts_sent,
        2,
        "{b:?}: one attempt each"
    );
    assert_eq!(
        w.bob().metrics().await.unwrap().receiver_applied,
        0,
        "{b:?}"
    );
    w.close().await.unwrap();
}

/// C-AB4-2, C-DL-1: bob defers on every delivery. Alice keeps her
/// schedule (the deferral neither resets backoff nor extends the
/// deadline) and escalates at the deadline with cause "responsive but
/// deferring", fail-safe applied. A redelivery held back until past the
/// deadline (plus skew) then reaches bob: he declines it `expired`,
/// although he deferred it before, and never applies it.
async fn c_ab4_2_c_dl_1_deferral_then_expiry(b: Backend) {
    let w = World::new(b, Schedule::FAST).await.unwrap();
    let ob = w.obligation(
        "deferring",
        "anumati.consent",
        serde_json::json!({"decision": "revoke", "scope": "chat.send", SCRIPT: "defer"}),
        2,
    );
    let offered_at = w.alice.now();
    w.alice.offer(ob.clone()).await.unwrap();
    until("bob deferred it", b, || async {
        matches!(
            w.bob_entry(ob.id()).await,
            Some((LedgerOutcome::Deferred, _))
        )
    })
    .await;
    // Let a few deferred redeliveries through, then hold the rest back.
    until("redeliveries", b, || async { w.bob_plug.counts().0 >= 3 }).await;
    w.bob_plug.hold(true);
    let o = w.outcome(ob.id(), WAIT).await;
    let closed_after = w.alice.now().saturating_duration_since(offered_at);
    assert_eq!(o.state, TerminalState::Escalated, "{b:?}: {o:?}");
    let esc = o.escalation.as_ref().expect("an escalation record");
    assert_eq!(
        esc.cause,
        EscalationCause::ResponsiveButDeferring,
        "{b:?}: {esc:?}"
    );
    assert!(
        closed_after >= Duration::from_millis(1_900) && closed_after < Duration::from_secs(6),
        "{b:?}: escalated at the deadline, not extended: {closed_after:?}"
    );
    // FAST: 50 ms doubling to a 200 ms cap over 2 s is about a dozen
    // attempts; had each deferral reset the backoff to base, far more.
    assert!(
        (3..=25).contains(&esc.attempts),
        "{b:?}: the schedule went on as if no deferral: {esc:?}"
    );
    let st = w.alice.durable_state().await.unwrap();
    assert_eq!(
        authorization(&st, "chat.send"),
        Some(Authorization::Withheld),
        "{b:?}"
    );
    // C-DL-1: what was held back arrives past the deadline and its skew.
    assert!(w.bob_plug.held() >= 1, "{b:?}: a redelivery was held");
    tokio::time::sleep(Duration::from_millis(300)).await;
    w.bob_plug.hold(false);
    until("bob declined it expired", b, || async {
        w.bob_entry(ob.id()).await == Some((LedgerOutcome::Declined, Some(DeclineReason::Expired)))
    })
    .await;
    assert_eq!(
        w.bob().metrics().await.unwrap().receiver_applied,
        0,
        "{b:?}"
    );
    w.close().await.unwrap();
}

/// C-AB4-4: every ack bob sends is held back until alice has escalated
/// at the deadline; then they arrive. The late `applied` is recorded once
/// for reconciliation and the terminal state stays escalated.
async fn c_ab4_4_late_applied_after_escalation(b: Backend) {
    let w = World::new(b, Schedule::FAST).await.unwrap();
    w.alice_plug.hold(true);
    let ob = w.revoke("late", "photos.read", 2, None);
    w.alice.offer(ob.clone()).await.unwrap();
    until("bob applied it", b, || async {
        matches!(
            w.bob_entry(ob.id()).await,
            Some((LedgerOutcome::Applied, _))
        )
    })
    .await;
    let o = w.outcome(ob.id(), WAIT).await;
    assert_eq!(o.state, TerminalState::Escalated, "{b:?}: {o:?}");
    assert!(w.alice_plug.held() >= 1, "{b:?}: acks were held");
    w.alice_plug.hold(false);
    until("the late ack recorded", b, || async {
        !w.alice
            .durable_state()
            .await
            .unwrap()
            .custodian
            .reconciliations
            .is_empty()
    })
    .await;
    // Every held ack is in now; give any stragglers a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let st = w.alice.durable_state().await.unwrap();
    let late: Vec<_> = st
        .custodian
        .reconciliations
        .iter()
        .filter(|r| r.obligation_id == *ob.id())
        .collect();
    assert_eq!(late.len(), 1, "{b:?}: recorded once: {late:?}");
    assert_eq!(late[0].status, AckStatus::Applied, "{b:?}");
    assert_eq!(
        w.outcome(ob.id(), WAIT).await.state,
        TerminalState::Escalated,
        "{b:?}: the terminal state is unchanged"
    );
    assert_eq!(
        st.custodian
            .escalations
            .iter()
            .filter(|e| e.obligation_id == *ob.id())
            .count(),
        1,
        "{b:?}"
    );
    assert_eq!(w.alice.metrics().await.unwrap().late_acks, 1, "{b:?}");
    assert_eq!(
        w.bob().metrics().await.unwrap().receiver_applied,
        1,
        "{b:?}"
    );
    w.close().await.unwrap();
}

/// C-SS-1: principal side, a fail-safe older than the newest decision on
/// its key applies nothing, and the escalation still fires. Alice's
/// revocation of a scope at sequence 5 is applied; an older one (sequence
/// 3) on the same scope, offered into a dead link, escalates at its
/// deadline with its fail-safe reported superseded by 5, and the principal
/// side still holds the sequence-5 decision.
async fn c_ss_1_stale_fail_safe_applies_nothing(b: Backend) {
    let w = World::new(b, Schedule::FAST).await.unwrap();
    let newer = w.revoke("ss1-newer", "drive.read", 30, Some(5));
    w.alice.offer(newer.clone()).await.unwrap();
    assert_eq!(
        w.outcome(newer.id(), WAIT).await.state,
        TerminalState::Applied,
        "{b:?}"
    );
    let before = authorization_entry(&w.alice.durable_state().await.unwrap(), "drive.read");
    assert!(before.is_some(), "{b:?}: the newer decision is on the key");
    w.bob_plug.cut(true);
    w.alice_plug.cut(true);
    let older = w.revoke("ss1-older", "drive.read", 2, Some(3));
    w.alice.offer(older.clone()).await.unwrap();
    let o = w.outcome(older.id(), WAIT).await;
    assert_eq!(
        o.state,
        TerminalState::Escalated,
        "{b:?}: the escalation still fires"
    );
    let esc = o.escalation.as_ref().expect("an escalation record");
    assert_eq!(
        esc.guard,
        GuardOutcome::Superseded {
            newest: Sequence(5)
        },
        "{b:?}: the stale fail-safe applied nothing: {esc:?}"
    );
    let after = authorization_entry(&w.alice.durable_state().await.unwrap(), "drive.read");
    assert_eq!(after, before, "{b:?}: the sequence-5 decision still stands");
    w.alice_plug.cut(false);
    w.bob_plug.cut(false);
    w.close().await.unwrap();
}

/// C-SS-4: Phala deltas are unguarded and stay within the clip range under
/// repeated fail-safes. Four corrective signals of -0.4 on one weight key,
/// into a dead link, all escalate; each fail-safe is applied (no sequence
/// guard on an additive key), the weight steps down 1.0 → 0.6 → 0.2 and is
/// clipped at the floor, never below it.
async fn c_ss_4_phala_fail_safes_stay_in_range(b: Backend) {
    let w = World::new(b, Schedule::FAST).await.unwrap();
    w.bob_plug.cut(true);
    w.alice_plug.cut(true);
    let obs: Vec<_> = (0..4)
        .map(|i| {
            w.obligation(
                &format!("ss4-{i}"),
                abhyasa_core::polarity::PHALA_KIND,
                serde_json::json!({"weight_delta": -0.4, "weight_key": "route-ss4"}),
                2,
            )
        })
        .collect();
    for ob in &obs {
        w.alice.offer(ob.clone()).await.unwrap();
    }
    for ob in &obs {
        let o = w.outcome(ob.id(), WAIT).await;
        assert_eq!(o.state, TerminalState::Escalated, "{b:?} {}", ob.id());
        let esc = o.escalation.as_ref().expect("an escalation record");
        assert_eq!(
            esc.guard,
            GuardOutcome::Applied,
            "{b:?}: a Phala fail-safe is never superseded: {esc:?}"
        );
    }
    let st = w.alice.durable_state().await.unwrap();
    let weights: Vec<f64> = st
        .custodian
        .principal
        .iter()
        .filter_map(|p| match p {
            PrincipalWrite::Weight { key, value } if key.to_string().contains("route-ss4") => {
                Some(*value)
            }
            _ => None,
        })
        .collect();
    assert!(
        !weights.is_empty(),
        "{b:?}: the fail-safes wrote the weight"
    );
    assert!(
        weights.iter().all(|v| (0.0..=1.0).contains(v)),
        "{b:?}: every weight within [floor, ceiling]: {weights:?}"
    );
    assert!(
        weights.windows(2).all(|p| p[1] <= p[0]),
        "{b:?}: each corrective fail-safe lowers (or holds) the weight: {weights:?}"
    );
    assert_eq!(
        weights.last().copied(),
        Some(0.0),
        "{b:?}: 1.0 - 4 × 0.4 is clipped at the floor: {weights:?}"
    );
    w.alice_plug.cut(false);
    w.bob_plug.cut(false);
    w.close().await.unwrap();
}

/// What bob's edge saw of alice's obligations (C-AB1-2).
#[derive(Debug, Default)]
struct Arrivals {
    /// Obligation frames per id, as the transport delivered them.
    count: HashMap<ObligationId, u32>,
    /// Arrivals of an obligation whose custody was not yet durable.
    before_durable: Vec<String>,
    /// Arrivals beyond the attempts durable at the time.
    beyond_attempts: Vec<String>,
    /// Whether bob's edge saw a connection end (see below).
    disconnected: bool,
}

/// C-AB1-2: the obligation is durable before the first transmit, and so
/// is every retry's attempt count. Alice's commits are slowed (150 ms
/// each, before the inner store commits); bob's edge checks every
/// obligation frame that reaches it against what alice's store had
/// made durable at that moment: custody open, and at least as many
/// attempts as arrivals of that id so far. Drops at bob's edge force
/// retries (every id arrives at least twice).
///
/// One send is one arrival on every transport here (the HTTP client makes
/// one POST per send and never retries it; QUIC, WebSocket and the
/// in-memory network deliver a frame once), except that a relay pushes
/// again what it had pushed on a connection that ended (the destination
/// dedups, AB-3). So the per-id count is asserted only while bob's edge
/// saw no disconnect; "durable before the first transmit" always.
async fn c_ab1_2_durable_before_first_transmit(b: Backend) {
    let w = World::new(b, Schedule::FAST).await.unwrap();
    let probe = w.alice_probe().clone();
    probe.delay_commits(Duration::from_millis(150));
    let seen = Arc::new(Mutex::new(Arrivals::default()));
    {
        let seen = seen.clone();
        let probe = probe.clone();
        w.bob_plug.observe(move |i| {
            let mut s = seen.lock().unwrap_or_else(|p| p.into_inner());
            match i {
                Incoming::Frame { envelope, .. } => {
                    if let Message::Obligation(ob) = &envelope.message {
                        let k = {
                            let k = s.count.entry(ob.id().clone()).or_insert(0);
                            *k += 1;
                            *k
                        };
                        match probe.durable_attempts(ob.id()) {
                            0 => s.before_durable.push(format!(
                                "{}: arrival {k} before its custody was durable",
                                ob.id()
                            )),
                            d if k > d => s.beyond_attempts.push(format!(
                                "{}: arrival {k} with {d} attempt(s) durable",
                                ob.id()
                            )),
                            _ => {}
                        }
                    }
                }
                Incoming::Disconnected(_) => s.disconnected = true,
                _ => {}
            }
        });
    }
    // The first attempts are lost, then half of what follows.
    w.bob_plug.cut(true);
    let n = 6;
    let mut ids = Vec::new();
    for i in 0..n {
        let ob = w.revoke(&format!("wal-{i}"), &format!("s{i}"), 30, None);
        w.alice.offer(ob.clone()).await.unwrap();
        ids.push(ob.id().clone());
    }
    until("every id lost once", b, || async {
        let s = seen.lock().unwrap();
        ids.iter()
            .all(|id| s.count.get(id).copied().unwrap_or(0) >= 1)
    })
    .await;
    w.bob_plug.set(0.5, 0.0);
    w.bob_plug.cut(false);
    for id in &ids {
        let o = w.outcome(id, WAIT).await;
        assert_eq!(o.state, TerminalState::Applied, "{b:?} {id}: {o:?}");
        assert!(o.attempts.unwrap() >= 2, "{b:?} {id}: retried: {o:?}");
    }
    probe.delay_commits(Duration::ZERO);
    w.bob_plug.set(0.0, 0.0);
    let s = std::mem::take(&mut *seen.lock().unwrap());
    assert!(
        ids.iter()
            .all(|id| s.count.get(id).copied().unwrap_or(0) >= 2),
        "{b:?}: every id reached bob at least twice: {:?}",
        s.count
    );
    assert!(
        s.before_durable.is_empty(),
        "{b:?}: transmits before their commit returned:\n  {}",
        s.before_durable.join("\n  ")
    );
    if s.disconnected {
        eprintln!(
            "{b:?}: bob's edge saw a disconnect; the per-id attempt count is not asserted \
             (a relay re-pushes what it pushed on a connection that ended)"
        );
    } else {
        assert!(
            s.beyond_attempts.is_empty(),
            "{b:?}: retries released before their attempt was durable:\n  {}",
            s.beyond_attempts.join("\n  ")
        );
    }
    w.close().await.unwrap();
}

/// `ack` as a frame from the authenticated peer `peer`.
fn ack_frame(peer: &AgentId, ack: CustodyAck) -> Incoming {
    Incoming::Frame {
        peer: peer.clone(),
        envelope: Envelope::new(peer.clone(), Message::Acks(vec![ack])),
    }
}

/// C-TR-2: forged, misrouted or stale acks never discharge custody. Bob
/// never sees the obligation (his edge is cut); alice's edge is handed
/// (`Plug::inject`, the same on every transport) an `applied` ack with the
/// wrong digest, one with no digest, one from bob naming another receiver
/// (mallory), and one from another authenticated peer (mallory) naming
/// bob. Each is counted and ignored: alice still holds custody. Once bob's
/// edge clears, his real ack applies it, exactly once. A stale ack after
/// that (another digest under the same id) is ignored too: the terminal
/// state stays applied, with nothing to reconcile.
async fn c_tr_2_unbound_acks_never_discharge(b: Backend) {
    let w = World::new(b, Schedule::FAST).await.unwrap();
    w.bob_plug.cut(true);
    let ob = w.revoke("bound", "mail.send", 30, None);
    w.alice.offer(ob.clone()).await.unwrap();
    // The first attempt reached bob's edge and was lost there.
    until("a lost attempt", b, || async {
        w.bob_plug.lost(ob.id()) >= 1
    })
    .await;
    let (bob, mallory) = (agent("bob"), agent("mallory"));
    let good = CustodyAck::new(
        ob.id().clone(),
        bob.clone(),
        AckStatus::Applied,
        w.alice.now(),
        Some(ob.digest()),
    );
    let other_digest = CustodyAck {
        digest: Some(Digest([7; 32])),
        ..good.clone()
    };
    let unbound = [
        ack_frame(&bob, other_digest.clone()),
        ack_frame(
            &bob,
            CustodyAck {
                digest: None,
                ..good.clone()
            },
        ),
        ack_frame(
            &bob,
            CustodyAck {
                target: mallory.clone(),
                ..good.clone()
            },
        ),
        ack_frame(&mallory, good.clone()),
    ];
    let ignored = w.alice.metrics().await.unwrap().acks_ignored;
    for f in unbound {
        w.alice_plug.inject(f);
    }
    // Until each is counted, or one of them (wrongly) discharged custody.
    until("the unbound acks handled", b, || async {
        let m = w.alice.metrics().await.unwrap();
        m.acks_ignored >= ignored + 4 || m.applied > 0
    })
    .await;
    let st = w.alice.status(ob.id()).await.unwrap();
    assert_eq!(
        st.custodian,
        Some(CustodianState::Pending),
        "{b:?}: no unbound ack discharged custody: {st:?}"
    );
    let m = w.alice.metrics().await.unwrap();
    assert_eq!(m.applied, 0, "{b:?}: nothing discharged: {m:?}");
    assert_eq!(
        m.acks_ignored,
        ignored + 4,
        "{b:?}: each counted once: {m:?}"
    );
    assert!(
        w.alice
            .durable_state()
            .await
            .unwrap()
            .custodian
            .pending
            .contains_key(ob.id()),
        "{b:?}: still pending in alice's store"
    );
    assert!(w.bob_ledger().await.is_empty(), "{b:?}: bob never saw it");
    // The real ack, bound to id, digest and receiver, discharges it.
    w.bob_plug.cut(false);
    let o = w.outcome(ob.id(), WAIT).await;
    assert_eq!(o.state, TerminalState::Applied, "{b:?}: {o:?}");
    assert!(o.attempts.unwrap() >= 2, "{b:?}: {o:?}");
    assert_eq!(
        w.bob().metrics().await.unwrap().receiver_applied,
        1,
        "{b:?}"
    );
    // Stale: an ack for the finished id under another digest.
    let ignored = w.alice.metrics().await.unwrap().acks_ignored;
    w.alice_plug.inject(ack_frame(&bob, other_digest));
    until("the stale ack counted", b, || async {
        w.alice.metrics().await.unwrap().acks_ignored > ignored
    })
    .await;
    let m = w.alice.metrics().await.unwrap();
    assert_eq!(m.applied, 1, "{b:?}: applied exactly once: {m:?}");
    assert_eq!(m.late_acks, 0, "{b:?}: {m:?}");
    assert_eq!(
        w.alice.status(ob.id()).await.unwrap().custodian,
        Some(CustodianState::Applied),
        "{b:?}: the terminal state stays applied"
    );
    let st = w.alice.durable_state().await.unwrap();
    assert!(st.custodian.reconciliations.is_empty(), "{b:?}");
    assert!(st.custodian.escalations.is_empty(), "{b:?}");
    w.close().await.unwrap();
}

/// C-AB3-4: same id, different digest. Alice's revocation "reused" of one
/// scope is applied by bob; then alice loses her store (reopened on a
/// fresh one: the honest way for a custodian to reuse an id with other
/// content) and offers "reused" again, revoking another scope. Bob
/// answers `conflict`: no effect (the second scope untouched at bob, his
/// applier asked nothing more, his ledger entry the first one's), custody
/// not discharged: alice escalates at once with cause `conflict`, the
/// fail-safe applied on her side.
async fn c_ab3_4_same_id_other_digest_is_a_conflict(b: Backend) {
    let mut w = World::new(b, Schedule::PATIENT).await.unwrap();
    let first = w.revoke("reused", "conflict-first.read", 30, None);
    w.alice.offer(first.clone()).await.unwrap();
    let o = w.outcome(first.id(), WAIT).await;
    assert_eq!(o.state, TerminalState::Applied, "{b:?}: {o:?}");
    let key = (agent("alice"), first.id().clone());
    let entry = |st: &abhyasa_core::store::DurableState| {
        st.receiver
            .ledger
            .get(&key)
            .map(|l| (l.digest, l.outcome, l.recorded_at))
    };
    let before = entry(&w.bob().durable_state().await.unwrap());
    // Offered without a sequence, it was sent with the first one on its
    // key (C-OR-1): bob's ledger holds the digest of what was sent.
    let sent = first.with_sequence(Some(Sequence(1)));
    assert_eq!(
        before.map(|e| (e.0, e.1)),
        Some((sent.digest(), LedgerOutcome::Applied)),
        "{b:?}"
    );

    w.reopen_alice_on_fresh_store().await.unwrap();
    w.wait_connected().await.unwrap();
    let second = w.revoke("reused", "conflict-second.read", 5, None);
    assert_eq!(second.id(), first.id());
    assert_ne!(second.digest(), first.digest());
    w.alice.offer(second.clone()).await.unwrap();
    let o = w.outcome(second.id(), WAIT).await;
    assert_eq!(
        o.state,
        TerminalState::Escalated,
        "{b:?}: a conflict is not a discharge: {o:?}"
    );
    let esc = o.escalation.as_ref().expect("an escalation record");
    assert_eq!(esc.cause, EscalationCause::Conflict, "{b:?}: {esc:?}");
    assert_eq!(esc.attempts, 1, "{b:?}: escalated at once: {esc:?}");
    let st = w.alice.durable_state().await.unwrap();
    assert_eq!(
        authorization(&st, "conflict-second.read"),
        Some(Authorization::Withheld),
        "{b:?}: the fail-safe withheld the second scope principal-side"
    );
    assert_eq!(st.custodian.escalations.len(), 1, "{b:?}");

    let bob_st = w.bob().durable_state().await.unwrap();
    assert_eq!(
        entry(&bob_st),
        before,
        "{b:?}: bob's ledger entry is the first obligation's, unchanged"
    );
    assert_eq!(
        w.applied_by_bob(first.id()),
        1,
        "{b:?}: bob's applier applied the id once"
    );
    assert_eq!(
        w.bob().metrics().await.unwrap().receiver_applied,
        1,
        "{b:?}: no second apply"
    );
    let effects: Vec<_> = bob_st.receiver.effects.keys().collect();
    assert!(
        effects.iter().any(|k| k.contains("conflict-first.read")),
        "{b:?}: the first revocation's effect stands: {effects:?}"
    );
    assert!(
        !effects.iter().any(|k| k.contains("conflict-second.read")),
        "{b:?}: no effect of the conflicting content: {effects:?}"
    );
    w.close().await.unwrap();
}

/// C-AB2-2: the backoff doubles from base, is capped, and carries bounded
/// jitter; same seed, same schedule. Bob's edge is cut, so alice retries
/// until the deadline (3 s) on [`Schedule::BACKOFF`] (100 ms doubling to
/// 400 ms, jitter 50 %). Alice's store probe records each durable attempt
/// (its `next_at`, the `now` of its commit; the open's `offered_at`).
///
/// Timers never fire early, but may fire late, so the interval the
/// custodian chose after attempt `k` is known only to lie in a window:
/// attempt 1's exactly (`next_at_1 - offered_at`); attempt `k`'s in
/// `[next_at_k - commit_now_k, next_at_k - next_at_{k-1}]` (its commit
/// started after it was decided, which was no earlier than `next_at_{k-1}`).
/// A loaded machine only widens the window. Each window must meet
/// `[nominal_k, nominal_k * 1.5]`, `nominal_k = min(100 ms * 2^(k-1), 400
/// ms)` (computed here, not by the core), and contain the interval a
/// custodian built apart with the same configuration and seed draws for
/// attempt `k` (the node follows the seeded schedule).
async fn c_ab2_2_backoff_doubles_caps_and_jitters(b: Backend) {
    let s = Schedule::BACKOFF;
    let w = World::new(b, s).await.unwrap();
    w.bob_plug.cut(true);
    w.alice_plug.cut(true);
    let ob = w.revoke("backoff", "backoff.read", 3, None);
    w.alice.offer(ob.clone()).await.unwrap();
    let o = w.outcome(ob.id(), WAIT).await;
    assert_eq!(o.state, TerminalState::Escalated, "{b:?}: {o:?}");
    let esc = o.escalation.as_ref().expect("an escalation record");
    let made: Vec<_> = w
        .alice_probe()
        .attempts()
        .into_iter()
        .filter(|a| a.id == *ob.id())
        .collect();
    let n = made.len();
    assert_eq!(
        made.iter().map(|a| a.attempts).collect::<Vec<_>>(),
        (1..=n as u32).collect::<Vec<_>>(),
        "{b:?}: one durable record per attempt, in order"
    );
    assert_eq!(esc.attempts as usize, n, "{b:?}: {esc:?}");
    // 100 + 200 + 400 + 400 ... ms (with up to 50 % more each) over 3 s:
    // attempts 4 on are past the cap, so a missing cap shows.
    assert!(n >= 5, "{b:?}: the schedule reached its cap: {made:?}");
    let reference = w.reference_custodian();
    // The jitter is drawn over the digest of what was sent: the offer
    // carried no sequence, so the node gave it the first on its key.
    let sent = ob.with_sequence(Some(Sequence(1)));
    let eps = Duration::from_micros(2);
    let ms = Duration::from_millis(1);
    let mut jittered = false;
    for (i, a) in made.iter().enumerate() {
        let k = a.attempts;
        let (lo, hi) = match a.offered_at {
            Some(offered_at) => {
                let d = a.next_at.saturating_duration_since(offered_at);
                (d, d)
            }
            None => {
                assert!(i > 0, "{b:?}: attempt {k} without an open");
                (
                    a.next_at.saturating_duration_since(a.commit_now),
                    a.next_at.saturating_duration_since(made[i - 1].next_at),
                )
            }
        };
        let nominal = (s.base * 2u32.pow(k - 1)).min(s.cap);
        let most = nominal.mul_f64(1.0 + s.jitter);
        assert!(
            lo <= most + eps && hi + eps >= nominal,
            "{b:?}: attempt {k}: the interval lies in [{lo:?}, {hi:?}], outside \
             [{nominal:?}, {most:?}] (base doubling to the cap, plus jitter)"
        );
        let r = reference.interval(&sent, k);
        assert!(
            lo <= r + eps && r <= hi + eps,
            "{b:?}: attempt {k}: the interval lies in [{lo:?}, {hi:?}], not the seeded \
             schedule's {r:?} (same seed, same schedule)"
        );
        jittered |= lo > nominal + ms;
    }
    assert!(
        jittered,
        "{b:?}: some interval is stretched by its jitter: {made:?}"
    );
    w.alice_plug.cut(false);
    w.bob_plug.cut(false);
    w.close().await.unwrap();
}
