//! Authority and order through the node (C-AZ-1, C-AZ-2, C-OR-1, C-OR-2):
//! two issuers, and a link that holds alice's grant back and delivers it
//! after her revoke.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use abhyasa::{Node, NodeOptions};
use abhyasa_core::custody::lease::Authority;
use abhyasa_core::custody::{LedgerOutcome, PeerPolicy, TerminalState};
use abhyasa_core::store::SimStore;
use abhyasa_core::{AgentId, DeclineReason, Obligation, ObligationId, Timestamp};
use abhyasa_transport::mem::{Faults, MemNetwork};
use abhyasa_transport::LinkConfig;
use serde_json::json;

const SCOPE: &str = "anumati.consent/bob/scope:email.read";

fn id(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

async fn node(net: &MemNetwork, name: &str, relay: Option<&str>) -> Node {
    let mut o = NodeOptions::new(id(name));
    o.receiver.skew_margin = Duration::from_millis(100);
    if let Some(r) = relay {
        o.receiver.authority.set_peer(id(r), PeerPolicy::relay());
    }
    let t = net
        .join(o.custodian.agent.clone(), LinkConfig::default())
        .await
        .unwrap();
    Node::open(o, Box::new(SimStore::new()), t).await.unwrap()
}

/// A consent obligation without a sequence: the issuing node assigns one.
fn consent(ob_id: &str, decision: &str, now: Timestamp) -> Obligation {
    Obligation::builder()
        .id(ob_id)
        .kind("anumati.consent")
        .target("bob")
        .payload(json!({"decision": decision, "scope": "email.read"}))
        .deadline_seconds(60)
        .max_retries(20)
        .created_at(now)
        .build()
        .unwrap()
}

async fn wait_for<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !f().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn received(bob: &Node, from: &str, ob: &str) -> Option<LedgerOutcome> {
    let v = bob.status(&ObligationId::new(ob).unwrap()).await.unwrap();
    v.receiver
        .iter()
        .find(|(a, _)| a.as_str() == from)
        .map(|(_, o)| *o)
}

// C-OR-2 (node, in-memory): the link from alice holds her grant and
// delivers it after her revoke. Both carry the sequences alice's node
// assigned (C-OR-1), so bob declines the late grant `superseded` and ends
// withheld, and alice's custody reports `applied` for a revoke that is
// still in force. C-AZ-2: carol's grant on the same scope is held under
// carol and never overrides alice's revoke. C-AZ-1: the relay's grant in
// its own name is declined `unauthorized`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_or_2_late_grant_after_revoke_ends_withheld_with_two_issuers() {
    let net = MemNetwork::new(43);
    let alice = node(&net, "alice", None).await;
    let carol = node(&net, "carol", None).await;
    let relay = node(&net, "relay", None).await;
    let bob = node(&net, "bob", Some("relay")).await;

    // Carol grants in her own name first: applied, under carol.
    carol
        .offer(consent("carol-grant", "grant", carol.now()))
        .await
        .unwrap();
    wait_for("carol's grant applied", || async {
        received(&bob, "carol", "carol-grant").await == Some(LedgerOutcome::Applied)
    })
    .await;
    assert!(bob.authorized(SCOPE).await.unwrap().is_authorized());

    // Alice: grant then revoke; the link holds the grant back behind the
    // revoke.
    net.set_faults(
        &id("alice"),
        &id("bob"),
        Faults {
            reorder: 1.0,
            ..Faults::default()
        },
    );
    alice
        .offer(consent("alice-grant", "grant", alice.now()))
        .await
        .unwrap();
    alice
        .offer(consent("alice-revoke", "revoke", alice.now()))
        .await
        .unwrap();
    wait_for("the held grant delivered after the revoke", || async {
        received(&bob, "alice", "alice-grant").await.is_some()
    })
    .await;
    net.set_faults(&id("alice"), &id("bob"), Faults::default());
    let revoke_outcome = alice
        .outcome(&ObligationId::new("alice-revoke").unwrap())
        .await
        .unwrap();
    assert_eq!(revoke_outcome.state, TerminalState::Applied);
    assert_eq!(net.stats(&id("alice"), &id("bob")).reordered, 1);

    // The late grant was declined: the revoke custody reported applied
    // is what bob holds.
    let v = bob
        .status(&ObligationId::new("alice-grant").unwrap())
        .await
        .unwrap();
    assert_eq!(v.receiver, vec![(id("alice"), LedgerOutcome::Declined)]);
    assert_eq!(v.declines[0].1, DeclineReason::Superseded);
    assert_eq!(
        received(&bob, "alice", "alice-revoke").await,
        Some(LedgerOutcome::Applied)
    );
    // Carol still grants under her own key; alice's withhold wins the
    // scope.
    assert_eq!(bob.authorized(SCOPE).await.unwrap(), Authority::Withheld);
    let carol_key = format!("@carol/{SCOPE}");
    assert!(bob.authorized(&carol_key).await.unwrap().is_authorized());
    assert_eq!(
        bob.authorized(&format!("@alice/{SCOPE}")).await.unwrap(),
        Authority::Withheld
    );

    // The relay, in its own name: declined unauthorized, counted.
    relay
        .offer(consent("relay-grant", "grant", relay.now()))
        .await
        .unwrap();
    wait_for("the relay's grant answered", || async {
        received(&bob, "relay", "relay-grant").await.is_some()
    })
    .await;
    let v = bob
        .status(&ObligationId::new("relay-grant").unwrap())
        .await
        .unwrap();
    assert_eq!(v.declines[0].1, DeclineReason::Unauthorized);
    assert!(v.declines[0].2.as_deref().unwrap().contains("relay"));
    let m = bob.metrics().await.unwrap();
    assert_eq!(m.receiver_unauthorized, 1);
    assert_eq!(m.receiver_declined, 2);
    assert_eq!(bob.authorized(SCOPE).await.unwrap(), Authority::Withheld);

    for n in [alice, carol, relay, bob] {
        n.shutdown().await.unwrap();
    }
}
