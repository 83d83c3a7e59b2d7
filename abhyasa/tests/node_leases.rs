//! Leases through the node (issue 13, C-TR-4): `Node::authorized` reads
//! the authority at the moment of asking, so a partitioned agent stops
//! at lease expiry though no revocation arrives.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use abhyasa::{Node, NodeOptions};
use abhyasa_core::custody::lease::Authority;
use abhyasa_core::store::SimStore;
use abhyasa_core::{AgentId, Obligation};
use abhyasa_transport::mem::MemNetwork;
use abhyasa_transport::LinkConfig;
use serde_json::json;

const KEY: &str = "anumati.consent/bob/scope:email.read";

async fn node(net: &MemNetwork, name: &str) -> Node {
    let mut o = NodeOptions::new(AgentId::new(name).unwrap());
    o.receiver.skew_margin = Duration::from_millis(100);
    let t = net
        .join(o.custodian.agent.clone(), LinkConfig::default())
        .await
        .unwrap();
    Node::open(o, Box::new(SimStore::new()), t).await.unwrap()
}

// C-TR-4 (node): a leased grant, then a partition: authorized until the
// lease ends, lapsed after, with no revocation ever sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_tr_4_node_partitioned_lease_lapses_at_expiry() {
    let net = MemNetwork::new(21);
    let alice = node(&net, "alice").await;
    let bob = node(&net, "bob").await;
    assert_eq!(bob.authorized(KEY).await.unwrap(), Authority::Unknown);
    let grant = Obligation::builder()
        .id("grant-1")
        .kind("anumati.consent")
        .target("bob")
        .payload(json!({"decision": "grant", "scope": "email.read", "lease_seconds": 2}))
        .deadline_seconds(60)
        .max_retries(0)
        .created_at(alice.now())
        .sequence(1)
        .build()
        .unwrap();
    let lease_until = grant.created_at().saturating_add(Duration::from_secs(2));
    alice.offer(grant).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while !bob.authorized(KEY).await.unwrap().is_authorized() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "grant never applied"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    net.partition(
        &AgentId::new("alice").unwrap(),
        &AgentId::new("bob").unwrap(),
    );
    let leases = bob.leases().await.unwrap();
    assert_eq!(leases.len(), 1);
    // Held under its issuer (C-AZ-2).
    assert_eq!(leases[0].key, format!("@alice/{KEY}"));
    assert_eq!(leases[0].lease_until, lease_until);
    assert!(leases[0].authorized);
    // Past the lease end (less the skew margin) with nothing renewed.
    let wait = lease_until.saturating_duration_since(bob.now());
    tokio::time::sleep(wait).await;
    assert_eq!(
        bob.authorized(KEY).await.unwrap(),
        Authority::Lapsed { lease_until }
    );
    let leases = bob.leases().await.unwrap();
    assert_eq!(leases[0].state, "lapsed");
    assert!(!leases[0].authorized);
    alice.shutdown().await.unwrap();
    bob.shutdown().await.unwrap();
}

fn leased_grant(id: &str, seq: Option<u64>, now: abhyasa_core::Timestamp, term: u64) -> Obligation {
    let b = Obligation::builder()
        .id(id)
        .kind("anumati.consent")
        .target("bob")
        .payload(json!({"decision": "grant", "scope": "email.read", "lease_seconds": term}))
        .deadline_seconds(60)
        .max_retries(0)
        .created_at(now);
    match seq {
        Some(s) => b.sequence(s),
        None => b,
    }
    .build()
    .unwrap()
}

async fn wait_for<F, Fut>(what: &str, within: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    while !f().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn renewals_sent(alice: &Node) -> u64 {
    alice
        .renewals()
        .await
        .unwrap()
        .first()
        .map_or(0, |r| r.renewals)
}

async fn bob_lease_until(bob: &Node) -> abhyasa_core::Timestamp {
    bob.leases().await.unwrap()[0].lease_until
}

// C-TR-4 (principal side): the principal renews a sequenced leased grant
// about every half term, so the receiver keeps authority across several
// terms; cut off, it tolerates one lost renewal and lapses after two;
// healed, the next renewal restores it; after a revocation no renewal
// goes out. Without the renewal scheduler the first term already lapses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_tr_4_renewals_keep_the_lease_until_the_link_is_cut_or_the_principal_revokes() {
    let net = MemNetwork::new(22);
    let alice = node(&net, "alice").await;
    let bob = node(&net, "bob").await;
    let (a, b) = (AgentId::new("alice").unwrap(), AgentId::new("bob").unwrap());
    // Term 1 s, skew margin 100 ms: a renewal every 315–405 ms.
    alice
        .offer(leased_grant("grant-1", Some(1), alice.now(), 1))
        .await
        .unwrap();
    wait_for("grant applied", Duration::from_secs(2), || async {
        bob.authorized(KEY).await.unwrap().is_authorized()
    })
    .await;
    let first_until = bob_lease_until(&bob).await;
    // Three terms of renewals: authorized at every look.
    let until = tokio::time::Instant::now() + Duration::from_millis(3000);
    while tokio::time::Instant::now() < until {
        let a = bob.authorized(KEY).await.unwrap();
        assert!(a.is_authorized(), "lapsed while renewals flow: {a:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let renewed = renewals_sent(&alice).await;
    assert!(renewed >= 6, "{renewed} renewals in three terms");
    assert!(bob_lease_until(&bob).await > first_until.saturating_add(Duration::from_secs(2)));
    let view = alice.renewals().await.unwrap();
    assert_eq!(view.len(), 1);
    assert_eq!(view[0].key.as_str(), KEY);
    assert_eq!(
        view[0].sequence.0,
        1 + view[0].renewals,
        "one sequence per renewal"
    );

    // Cut the link right after a renewal landed: nothing is in flight.
    let landed = bob_lease_until(&bob).await;
    wait_for("a renewal lands", Duration::from_secs(2), || async {
        bob_lease_until(&bob).await > landed
    })
    .await;
    net.partition(&a, &b);
    let cut_until = bob_lease_until(&bob).await;
    let c0 = renewals_sent(&alice).await;
    // One renewal lost: still authorized (tolerated).
    wait_for(
        "first renewal after the cut",
        Duration::from_secs(2),
        || async { renewals_sent(&alice).await > c0 },
    )
    .await;
    assert!(
        bob.authorized(KEY).await.unwrap().is_authorized(),
        "one lost renewal tolerated"
    );
    // The second lost renewal: the lease lapses at the end of the last one
    // that landed.
    wait_for(
        "second renewal after the cut",
        Duration::from_secs(2),
        || async { renewals_sent(&alice).await > c0 + 1 },
    )
    .await;
    tokio::time::sleep(cut_until.saturating_duration_since(bob.now())).await;
    assert_eq!(
        bob.authorized(KEY).await.unwrap(),
        Authority::Lapsed {
            lease_until: cut_until
        }
    );
    // Healed: the next renewal grants again.
    net.heal(&a, &b);
    wait_for("renewed after the heal", Duration::from_secs(3), || async {
        bob.authorized(KEY).await.unwrap().is_authorized()
    })
    .await;

    // A revocation our renewals would supersede is refused, typed...
    let newest = alice.renewals().await.unwrap()[0].sequence;
    let revoke = |seq: u64| {
        Obligation::builder()
            .id(format!("revoke-{seq}"))
            .kind("anumati.consent")
            .target("bob")
            .payload(json!({"decision": "revoke", "scope": "email.read"}))
            .deadline_seconds(60)
            .max_retries(6)
            .created_at(alice.now())
            .sequence(seq)
            .build()
            .unwrap()
    };
    match alice.offer(revoke(newest.0)).await {
        Err(abhyasa::NodeError::SupersededByRenewal {
            offered, newest: n, ..
        }) => {
            assert_eq!((offered, n), (newest, newest));
        }
        other => panic!("stale revocation accepted: {other:?}"),
    }
    // ... and one above the newest renewal ends the renewals.
    alice.offer(revoke(newest.0 + 1)).await.unwrap();
    assert!(alice.renewals().await.unwrap().is_empty());
    wait_for("revocation applied", Duration::from_secs(2), || async {
        bob.authorized(KEY).await.unwrap() == Authority::Withheld
    })
    .await;
    let sent = alice.metrics().await.unwrap().best_effort;
    // Three renewal intervals: no grant goes out, the key stays withheld.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert_eq!(
        alice.metrics().await.unwrap().best_effort,
        sent,
        "renewal after revoke"
    );
    assert_eq!(bob.authorized(KEY).await.unwrap(), Authority::Withheld);
    alice.shutdown().await.unwrap();
    bob.shutdown().await.unwrap();
}

// Issue 13: a lease longer than the revocation deadline is a warning
// (typed, and logged) when the grant is offered; an unsequenced leased
// grant is not renewed and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_longer_than_the_revocation_deadline_warns_when_granted() {
    let net = MemNetwork::new(23);
    let mut o = NodeOptions::new(AgentId::new("alice").unwrap());
    o.revocation_deadline = Some(Duration::from_secs(600));
    let t = net
        .join(o.custodian.agent.clone(), LinkConfig::default())
        .await
        .unwrap();
    let alice = Node::open(o, Box::new(SimStore::new()), t).await.unwrap();
    let bob = node(&net, "bob").await;
    alice
        .offer(leased_grant("short", Some(1), alice.now(), 300))
        .await
        .unwrap();
    assert!(
        alice.lease_warnings().await.unwrap().is_empty(),
        "300 s < 600 s"
    );
    alice
        .offer(leased_grant("long", Some(2), alice.now(), 900))
        .await
        .unwrap();
    let w = alice.lease_warnings().await.unwrap();
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].obligation_id.as_str(), "long");
    assert_eq!(w[0].key.as_str(), KEY);
    assert_eq!(
        w[0].kind,
        abhyasa::leases::LeaseWarningKind::TermExceedsRevocationDeadline {
            term_seconds: 900,
            revocation_deadline_seconds: 600
        }
    );
    assert!(
        w[0].message.contains("300 s after a revocation"),
        "{}",
        w[0].message
    );
    // The long grant is still renewed (a warning, not a refusal).
    assert_eq!(alice.renewals().await.unwrap()[0].root.as_str(), "long");
    // A grant offered without a sequence is given the next one on its key
    // (C-OR-1), so it is ordered and renewed like any other.
    alice
        .offer(leased_grant("unsequenced", None, alice.now(), 60))
        .await
        .unwrap();
    let w = alice.lease_warnings().await.unwrap();
    assert_eq!(w.len(), 1, "{w:?}");
    let chains = alice.renewals().await.unwrap();
    assert_eq!(chains[0].root.as_str(), "unsequenced");
    assert_eq!(chains[0].sequence, abhyasa_core::Sequence(3));
    // A lease no longer than the skew margin (2 s by default) could never
    // be exercised: warned, not renewed.
    alice
        .offer(leased_grant("too-short", Some(10), alice.now(), 2))
        .await
        .unwrap();
    let w = alice.lease_warnings().await.unwrap();
    assert_eq!(
        w[1].kind,
        abhyasa::leases::LeaseWarningKind::WithinSkewMargin {
            term_seconds: 2,
            skew_margin_ms: 2000
        }
    );
    assert!(
        alice.renewals().await.unwrap().is_empty(),
        "within skew: no chain"
    );
    // A revocation on a renewed key whose own deadline is shorter than
    // the lease warns too (here 60 s against 900 s), and ends the renewals.
    alice
        .offer(leased_grant("long-2", Some(11), alice.now(), 900))
        .await
        .unwrap();
    let revoke = Obligation::builder()
        .id("revoke-12")
        .kind("anumati.consent")
        .target("bob")
        .payload(json!({"decision": "revoke", "scope": "email.read"}))
        .deadline_seconds(60)
        .max_retries(6)
        .created_at(alice.now())
        .sequence(12)
        .build()
        .unwrap();
    alice.offer(revoke).await.unwrap();
    let w = alice.lease_warnings().await.unwrap();
    assert_eq!(w.len(), 4, "{w:?}");
    assert_eq!(w[3].obligation_id.as_str(), "revoke-12");
    assert_eq!(
        w[3].kind,
        abhyasa::leases::LeaseWarningKind::TermExceedsRevocationDeadline {
            term_seconds: 900,
            revocation_deadline_seconds: 60
        }
    );
    assert!(alice.renewals().await.unwrap().is_empty());
    alice.shutdown().await.unwrap();
    bob.shutdown().await.unwrap();
}
