//! The node asks an asynchronous applier (issue 11 §6): a slow decision
//! runs on its own task and stalls neither other obligations nor timers;
//! declines and deferrals travel back through the same path; a redelivery
//! while a decision is outstanding is applied once.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use abhyasa::{AsyncApplier, AsyncApplierHandle, CustodianState, Node, NodeOptions};
use abhyasa_core::custody::{
    ApplyDecision, ApplyRequest, EffectValue, EffectWrite, LedgerOutcome, StandardApplier,
    TerminalState,
};
use abhyasa_core::principal::Authorization;
use abhyasa_core::store::{EventId, LogEvent, SimStore};
use abhyasa_core::{AgentId, DeclineReason, Obligation, RetryBackoff};
use abhyasa_transport::mem::MemNetwork;
use abhyasa_transport::LinkConfig;
use serde_json::json;

/// Decides by the scope's name: `slow*` after a sleep, `decline*` and
/// `defer*` as they say, anything else at once; counts calls per id.
#[derive(Clone, Default)]
struct Scripted {
    calls: Arc<Mutex<HashMap<String, u32>>>,
    slow: Duration,
}

impl AsyncApplier for Scripted {
    async fn decide(&self, req: ApplyRequest) -> ApplyDecision {
        *self
            .calls
            .lock()
            .unwrap()
            .entry(req.obligation.id().to_string())
            .or_insert(0) += 1;
        let scope = req
            .obligation
            .payload()
            .get("scope")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string();
        if scope.starts_with("slow") {
            tokio::time::sleep(self.slow).await;
        }
        if scope.starts_with("decline") {
            return ApplyDecision::Decline {
                reason: DeclineReason::Policy,
                detail: Some("the agent says no".into()),
            };
        }
        if scope.starts_with("defer") {
            return ApplyDecision::Defer {
                detail: Some("asking a human".into()),
            };
        }
        req.answer_with(&mut StandardApplier::default())
    }
}

impl Scripted {
    fn calls(&self, id: &str) -> u32 {
        self.calls.lock().unwrap().get(id).copied().unwrap_or(0)
    }
}

fn agent(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

fn options(name: &str) -> NodeOptions {
    let mut o = NodeOptions::new(agent(name));
    o.custodian.default_profile.backoff = RetryBackoff {
        base: Duration::from_millis(50),
        cap: Duration::from_millis(200),
        jitter: 0.1,
    };
    o.receiver.skew_margin = Duration::from_millis(100);
    o
}

async fn node(net: &MemNetwork, o: NodeOptions) -> Node {
    let t = net
        .join(o.custodian.agent.clone(), LinkConfig::default())
        .await
        .unwrap();
    Node::open(o, Box::new(SimStore::new()), t).await.unwrap()
}

fn revoke(from: &Node, id: &str, target: &str, scope: &str, deadline: i64) -> Obligation {
    Obligation::builder()
        .id(id)
        .kind("anumati.consent")
        .target(target)
        .payload(json!({"decision": "revoke", "scope": scope}))
        .deadline_seconds(deadline)
        .max_retries(abhyasa_core::min_retries_to_span(deadline as u64, 0.05, 0.2) as i64 + 2)
        .created_at(from.now())
        .build()
        .unwrap()
}

/// `Applied` ledger records for `id` in the receiver's durable log.
async fn durable_applications(bob: &Node, id: &str) -> usize {
    let log = bob.events(EventId(0), 100_000).await.unwrap();
    log.iter()
        .filter(|e| {
            matches!(&e.event, LogEvent::Ledger { obligation_id, outcome: LedgerOutcome::Applied, .. }
                if obligation_id.as_str() == id)
        })
        .count()
}

async fn bob_with(net: &MemNetwork, applier: &Scripted) -> Node {
    let mut o = options("bob");
    o.async_applier = Some(AsyncApplierHandle::new(applier.clone()).with_concurrency(4));
    node(net, o).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_async_applier_stalls_neither_other_obligations_nor_timers() {
    let net = MemNetwork::new(11);
    let applier = Scripted {
        slow: Duration::from_secs(3),
        ..Scripted::default()
    };
    let alice = node(&net, options("alice")).await;
    let bob = bob_with(&net, &applier).await;
    let carol = node(&net, options("carol")).await;
    net.partition(&agent("alice"), &agent("carol"));

    let slow = revoke(&alice, "slow-1", "bob", "slow", 30);
    alice.offer(slow.clone()).await.unwrap();
    let fast: Vec<_> = (0..12)
        .map(|i| revoke(&alice, &format!("fast-{i}"), "bob", &format!("s{i}"), 30))
        .collect();
    for ob in &fast {
        alice.offer(ob.clone()).await.unwrap();
    }
    // A timer on the custodian: an obligation to a partitioned peer
    // escalates at its 1 s deadline while the slow decision runs.
    let lost = revoke(&alice, "lost-1", "carol", "x", 1);
    alice.offer(lost.clone()).await.unwrap();

    for ob in &fast {
        let out = tokio::time::timeout(Duration::from_secs(2), alice.outcome(ob.id()))
            .await
            .expect("a fast obligation waited behind the slow decision")
            .unwrap();
        assert_eq!(out.state, TerminalState::Applied);
    }
    let out = tokio::time::timeout(Duration::from_millis(2500), alice.outcome(lost.id()))
        .await
        .expect("the deadline timer waited behind the slow decision")
        .unwrap();
    assert_eq!(out.state, TerminalState::Escalated);
    // The slow decision is still out: nothing recorded for it yet.
    assert_eq!(applier.calls("slow-1"), 1);
    assert!(
        bob.status(slow.id()).await.unwrap().receiver.is_empty(),
        "nothing is in the ledger while the agent decides"
    );
    let out = tokio::time::timeout(Duration::from_secs(10), alice.outcome(slow.id()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.state, TerminalState::Applied);
    assert_eq!(durable_applications(&bob, "slow-1").await, 1);
    for ob in &fast {
        assert_eq!(applier.calls(ob.id().as_str()), 1);
    }
    for n in [alice, bob, carol] {
        n.shutdown().await.unwrap();
    }
}

// C-AB3-1 (node, async path): the custodian redelivers many times while
// the decision is outstanding; the agent is asked once, the effect is
// applied once, and the decision's ack discharges custody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_ab3_1_redelivery_while_deciding_is_applied_once() {
    let net = MemNetwork::new(12);
    let applier = Scripted {
        slow: Duration::from_millis(1500),
        ..Scripted::default()
    };
    let alice = node(&net, options("alice")).await;
    let bob = bob_with(&net, &applier).await;
    let ob = revoke(&alice, "slow-1", "bob", "slow", 30);
    alice.offer(ob.clone()).await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), alice.outcome(ob.id()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.state, TerminalState::Applied);
    assert!(
        out.attempts.unwrap() >= 3,
        "redelivered while deciding: {:?} attempts",
        out.attempts
    );
    assert_eq!(applier.calls("slow-1"), 1, "asked once");
    assert_eq!(durable_applications(&bob, "slow-1").await, 1);
    assert_eq!(bob.metrics().await.unwrap().receiver_applied, 1);
    alice.shutdown().await.unwrap();
    bob.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_decline_and_defer_travel_back_to_the_custodian() {
    let net = MemNetwork::new(13);
    let applier = Scripted::default();
    let alice = node(&net, options("alice")).await;
    let bob = bob_with(&net, &applier).await;
    let declined = revoke(&alice, "no-1", "bob", "decline", 30);
    let deferred = revoke(&alice, "later-1", "bob", "defer", 30);
    alice.offer(declined.clone()).await.unwrap();
    alice.offer(deferred.clone()).await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(5), alice.outcome(declined.id()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.state, TerminalState::Declined);
    assert_eq!(out.reason, Some(DeclineReason::Policy));
    // The deferral is recorded at the receiver and keeps custody open.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let s = bob.status(deferred.id()).await.unwrap();
        if s.receiver
            .iter()
            .any(|(_, o)| *o == LedgerOutcome::Deferred)
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never deferred");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        alice.status(deferred.id()).await.unwrap().custodian,
        Some(CustodianState::Pending)
    );
    // Later the agent applies it: the final ack discharges custody.
    let effect = vec![EffectWrite {
        key: "anumati.consent/bob/scope:defer".into(),
        value: EffectValue::Authorization(Authorization::Withheld),
    }];
    bob.complete_deferred(
        agent("alice"),
        deferred.id().clone(),
        ApplyDecision::Apply(effect),
    )
    .await
    .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(5), alice.outcome(deferred.id()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.state, TerminalState::Applied);
    assert_eq!(durable_applications(&bob, "later-1").await, 1);
    assert_eq!(applier.calls("no-1"), 1, "a decline is remembered");
    alice.shutdown().await.unwrap();
    bob.shutdown().await.unwrap();
}
