//! The driver loop under load: due timers are served on every turn
//! (C-ND-3), and callers that give up on `outcome()` leave nothing behind
//! (C-ND-5).
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use abhyasa::clock::Clock;
use abhyasa::{Node, NodeOptions};
use abhyasa_core::custody::{CustodyProfile, TerminalState};
use abhyasa_core::store::SimStore;
use abhyasa_core::wire::{Envelope, Message};
use abhyasa_core::{AgentId, Obligation, ObligationId, RetryBackoff, Timestamp};
use abhyasa_transport::mem::MemNetwork;
use abhyasa_transport::LinkConfig;
use serde_json::json;

/// Simulated time the test moves by hand: the node reads it, nothing else
/// does, so a saturated loop cannot slip past a deadline unnoticed.
#[derive(Debug, Default)]
struct ManualClock(AtomicI64);

impl ManualClock {
    fn advance(&self, d: Duration) {
        self.0.fetch_add(d.as_micros() as i64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_unix_micros(self.0.load(Ordering::SeqCst))
    }
}

/// Polls `f` once and drops it; true if it was still waiting.
fn poll_once<F: std::future::Future>(f: F) -> bool {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    f.as_mut().poll(&mut cx).is_pending()
}

fn agent(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

/// A peer that is in the transport's peer table (so `offer` takes it as a
/// target) but never reachable: it joined the network once and left.
async fn gone(net: &MemNetwork, name: &str) {
    let t = net.join(agent(name), LinkConfig::default()).await.unwrap();
    t.handle.shutdown().await;
}

fn revoke_to(now: Timestamp, id: &str, target: &str, deadline: i64) -> Obligation {
    Obligation::builder()
        .id(id)
        .kind("anumati.consent")
        .target(target)
        .payload(json!({"decision": "revoke", "scope": format!("scope.{id}")}))
        .deadline_seconds(deadline)
        .max_retries(abhyasa_core::min_retries_to_span(deadline as u64, 0.05, 0.2) as i64 + 2)
        .created_at(now)
        .build()
        .unwrap()
}

fn options(name: &str, clock: Arc<ManualClock>) -> NodeOptions {
    let mut o = NodeOptions::new(agent(name));
    o.custodian.default_profile = CustodyProfile {
        backoff: RetryBackoff {
            base: Duration::from_millis(50),
            cap: Duration::from_millis(200),
            jitter: 0.0,
        },
        ..CustodyProfile::default()
    };
    o.clock = clock;
    o
}

// C-ND-3: under a flood of commands and inbound frames that keeps every
// other branch of the loop ready, an obligation to an unreachable peer
// still escalates within one timer turn of its deadline.
//
// One thread, and one input folded per turn: the command channel is never
// empty when the loop selects, so a loop that serves timers only when
// nothing else is ready would hold the escalation until the flood ends
// (two simulated seconds past the deadline).
#[tokio::test(flavor = "current_thread")]
async fn c_nd_3_due_timers_are_served_under_a_saturated_loop() {
    let clock = Arc::new(ManualClock::default());
    clock.advance(Duration::from_secs(1_700_000_000));
    let net = MemNetwork::new(11);
    let mut o = options("alice", clock.clone());
    o.max_batch_inputs = 1;
    let t = net
        .join(agent("alice"), LinkConfig::default())
        .await
        .unwrap();
    let alice = Node::open(o, Box::new(SimStore::new()), t).await.unwrap();
    let mallory = net
        .join(agent("mallory"), LinkConfig::default())
        .await
        .unwrap();

    // "carol" is never reachable: every attempt fails, only the deadline
    // ends it.
    gone(&net, "carol").await;
    let ob = revoke_to(clock.now(), "ob-dead", "carol", 1);
    alice.offer(ob.clone()).await.unwrap();
    let deadline_at = ob.deadline_at();
    let flood_until = deadline_at.saturating_add(Duration::from_secs(2));

    let stop = Arc::new(AtomicBool::new(false));
    let mut flood = Vec::new();
    // Commands: each answer moves simulated time on by 20 µs.
    for _ in 0..1000 {
        let (node, clock, stop) = (alice.clone(), clock.clone(), stop.clone());
        flood.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                node.metrics().await.unwrap();
                clock.advance(Duration::from_micros(20));
                if clock.now() >= flood_until {
                    stop.store(true, Ordering::SeqCst);
                }
            }
        }));
    }
    // Inbound frames: status queries from another peer.
    {
        let stop = stop.clone();
        let abhyasa_transport::Transport {
            handle,
            mut incoming,
        } = mallory;
        flood.push(tokio::spawn(async move {
            let q = Message::StatusQuery(vec![ObligationId::new("nothing").unwrap()]);
            while !stop.load(Ordering::SeqCst) {
                for _ in 0..64 {
                    let _ =
                        handle.send(&agent("alice"), &Envelope::new(agent("mallory"), q.clone()));
                }
                while incoming.try_recv().is_ok() {}
                tokio::task::yield_now().await;
            }
        }));
    }
    let out = tokio::time::timeout(Duration::from_secs(60), alice.outcome(ob.id()))
        .await
        .expect("the escalation")
        .unwrap();
    let flooding = !stop.load(Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    for f in flood {
        f.await.unwrap();
    }
    assert_eq!(out.state, TerminalState::Escalated);
    let esc = out.escalation.expect("an escalation record");
    let late = esc.escalated_at.saturating_duration_since(deadline_at);
    // One turn of the loop moves the clock by a few answers (20 µs each);
    // 50 ms is hundreds of turns and still far below the flood's 2 s.
    assert!(
        late <= Duration::from_millis(50),
        "escalated {late:?} after its deadline while the loop was saturated"
    );
    assert!(
        flooding,
        "the flood ended before the escalation: nothing shown"
    );
    let m = alice.metrics().await.unwrap();
    assert!(m.frames_in > 0, "inbound frames were part of the flood");
}

// C-ND-5: `outcome()` waiters are pruned when their callers give up, so
// abandoned waits cannot pile up for the life of a pending obligation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_nd_5_abandoned_outcome_waiters_are_pruned() {
    let clock = Arc::new(ManualClock::default());
    clock.advance(Duration::from_secs(1_700_000_000));
    let net = MemNetwork::new(12);
    let t = net
        .join(agent("alice"), LinkConfig::default())
        .await
        .unwrap();
    let alice = Node::open(
        options("alice", clock.clone()),
        Box::new(SimStore::new()),
        t,
    )
    .await
    .unwrap();
    // Stays pending: the clock does not move and carol never answers.
    gone(&net, "carol").await;
    let ob = revoke_to(clock.now(), "ob-long", "carol", 3600);
    alice.offer(ob.clone()).await.unwrap();
    // One caller that keeps waiting.
    let (n, id) = (alice.clone(), ob.id().clone());
    let live = tokio::spawn(async move { n.outcome(&id).await });
    let mut abandoned = 0;
    for _ in 0..10 {
        for _ in 0..1000 {
            // Polled once (the request reaches the node), then dropped.
            // Unconstrained: tokio's co-operative budget would otherwise
            // refuse most sends of this tight loop.
            if poll_once(tokio::task::unconstrained(alice.outcome(ob.id()))) {
                abandoned += 1;
            }
        }
        // In order behind the waits: they have all reached the driver.
        alice.metrics().await.unwrap();
    }
    assert!(abandoned > 5000, "only {abandoned} waits were abandoned");
    let m = alice.metrics().await.unwrap();
    assert!(
        (1..=2048).contains(&m.outcome_waiters),
        "{} outcome waiters held after {abandoned} callers gave up",
        m.outcome_waiters
    );
    assert!(!live.is_finished());
    // The caller that stayed still gets its answer.
    clock.advance(Duration::from_secs(3601));
    let out = tokio::time::timeout(Duration::from_secs(10), live)
        .await
        .expect("the live waiter is answered")
        .unwrap()
        .unwrap();
    assert_eq!(out.state, TerminalState::Escalated);
}
