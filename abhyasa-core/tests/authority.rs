//! Authority belongs to its issuer (C-AZ-1, C-AZ-2) and order comes from
//! the issuer (C-OR-1, C-OR-3): the receiver's per-peer policy, keys held
//! under their issuer, the rule for unsequenced obligations, and the
//! sequences a custodian assigns.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, HashMap};

use abhyasa_core::custody::lease::Authority;
use abhyasa_core::custody::{
    AckDisposition, CustodianEvent, EffectValue, LedgerOutcome, LedgerRecord, PeerPolicy, Received,
    Receiver, ReceiverSnapshot, StandardApplier, TerminalState,
};
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::principal::Authorization;
use abhyasa_core::wire::Message;
use abhyasa_core::{AckStatus, AgentId, DeclineReason, GovernedKey, Kind, Obligation, Sequence};
use common::*;
use serde_json::json;

const SCOPE_S: &str = "anumati.consent/receiver/scope:s";

fn receiver() -> Receiver {
    Receiver::new(receiver_config(), PolarityRegistry::standard())
}

fn deliver(r: &mut Receiver, from: &str, ob: Obligation) -> Received {
    let mut a = StandardApplier::default();
    let got = r.handle_obligation(at(1.0), &agent(from), ob, &mut a);
    if let Some(b) = r.poll_records() {
        r.handle_committed(b.token());
    }
    got
}

fn held(r: &Receiver, issuer: &str, key: &str) -> Option<EffectValue> {
    let k = GovernedKey::new(key).unwrap().issued_by(&agent(issuer));
    r.effects().get(k.as_str()).cloned()
}

fn acks(r: &mut Receiver) -> Vec<abhyasa_core::CustodyAck> {
    std::iter::from_fn(|| r.poll_transmit())
        .flat_map(|t| match t.message {
            Message::Acks(a) => a,
            _ => Vec::new(),
        })
        .collect()
}

const WITHHELD: Option<EffectValue> = Some(EffectValue::Authorization(Authorization::Withheld));
const GRANTED: Option<EffectValue> = Some(EffectValue::Authorization(Authorization::Granted));

fn policy(kinds: Option<&[&str]>, keys: Option<&[&str]>) -> PeerPolicy {
    PeerPolicy {
        relay: false,
        kinds: kinds.map(|ks| ks.iter().map(|k| Kind::new(k).unwrap()).collect()),
        keys: keys.map(|ks| ks.iter().map(|k| k.to_string()).collect()),
    }
}

// C-AZ-1: a kind the peer's policy does not list is declined
// `unauthorized` with the reason text, recorded, never applied; the
// custodian treats it as a decline and applies safe(O) (declined ≠ applied).
#[test]
fn c_az_1_a_kind_outside_the_policy_is_declined_unauthorized() {
    let mut d = Duo::new();
    let mut cfg = receiver_config();
    cfg.authority
        .set_peer(agent("custodian"), policy(Some(&["oauth.token"]), None));
    d.r = Receiver::new(cfg, PolarityRegistry::standard());
    d.c.offer(T0, revoke("ob-1", "s")).unwrap();
    let out = d.custodian_out();
    assert_eq!(
        d.deliver_to_receiver(at(0.1), &out[0]),
        Received::Declined(DeclineReason::Unauthorized)
    );
    assert_eq!(d.r.applications(), 0);
    assert!(d.r.effects().is_empty(), "nothing applied");
    assert_eq!(
        d.r.ledger_outcome(&agent("custodian"), &"ob-1".parse().unwrap()),
        Some(LedgerOutcome::Declined)
    );
    let (reason, detail) =
        d.r.ledger_decline(&agent("custodian"), &"ob-1".parse().unwrap())
            .unwrap();
    assert_eq!(reason, DeclineReason::Unauthorized);
    assert!(
        detail
            .as_deref()
            .unwrap()
            .contains("may not issue anumati.consent"),
        "{detail:?}"
    );
    let back = d.receiver_out();
    let ack = match &back[0].message {
        Message::Acks(a) => a[0].clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        (ack.status, ack.reason),
        (AckStatus::Declined, Some(DeclineReason::Unauthorized))
    );
    assert_eq!(
        d.deliver_to_custodian(at(0.2), &back[0]),
        vec![AckDisposition::Declined]
    );
    let closed = d.custodian_events().into_iter().any(|e| {
        matches!(
            e,
            CustodianEvent::Declined {
                reason: Some(DeclineReason::Unauthorized),
                ..
            }
        )
    });
    assert!(closed, "the custodian saw the unauthorized decline");
    assert_eq!(
        d.c.terminal(&"ob-1".parse().unwrap()).map(|t| t.state),
        Some(TerminalState::Declined)
    );
    // The principal side holds the scope withheld: safe(O) on decline.
    let k = GovernedKey::new(SCOPE_S).unwrap();
    assert!(!d.c.principal().is_authorized(&k));
}

// C-AZ-1: a relay governs nothing in its own name: its grant on a scope
// alice revoked is declined `unauthorized` and alice's withhold stands.
#[test]
fn c_az_1_a_relay_governs_nothing() {
    let mut cfg = receiver_config();
    cfg.authority.set_peer(agent("relay"), PeerPolicy::relay());
    let mut r = Receiver::new(cfg, PolarityRegistry::standard());
    assert_eq!(
        deliver(&mut r, "alice", revoke_seq("a-1", "s", 1)),
        Received::Applied
    );
    assert_eq!(
        deliver(&mut r, "relay", grant_seq("r-1", "s", 100)),
        Received::Declined(DeclineReason::Unauthorized)
    );
    // Even a revoke: a relay issues nothing.
    assert_eq!(
        deliver(&mut r, "relay", revoke_seq("r-2", "s", 101)),
        Received::Declined(DeclineReason::Unauthorized)
    );
    assert_eq!(held(&r, "alice", SCOPE_S), WITHHELD);
    assert_eq!(held(&r, "relay", SCOPE_S), None);
    assert_eq!(r.authority(SCOPE_S, at(1.0)), Authority::Withheld);
    let detail = acks(&mut r)
        .into_iter()
        .find(|a| a.obligation_id.as_str() == "r-1")
        .and_then(|a| a.detail)
        .unwrap();
    assert!(detail.contains("relay"), "{detail}");
}

// C-AZ-1: key prefixes: a peer may govern only the issuer-less keys its
// policy lists; an obligation naming no key is refused under prefixes.
#[test]
fn c_az_1_policy_key_prefixes() {
    let mut cfg = receiver_config();
    cfg.authority.set_peer(
        agent("ops"),
        policy(None, Some(&["anumati.consent/receiver/scope:mail."])),
    );
    let mut r = Receiver::new(cfg, PolarityRegistry::standard());
    assert_eq!(
        deliver(&mut r, "ops", revoke_seq("o-1", "mail.read", 1)),
        Received::Applied
    );
    assert_eq!(
        deliver(&mut r, "ops", revoke_seq("o-2", "calendar", 1)),
        Received::Declined(DeclineReason::Unauthorized)
    );
    let keyless = obligation("o-3", "acme.unknown", json!({"x": 1}));
    assert_eq!(
        deliver(&mut r, "ops", keyless),
        Received::Declined(DeclineReason::Unauthorized)
    );
    assert_eq!(
        held(&r, "ops", "anumati.consent/receiver/scope:mail.read"),
        WITHHELD
    );
    assert_eq!(
        held(&r, "ops", "anumati.consent/receiver/scope:calendar"),
        None
    );
    // A peer without a policy of its own keeps the default: any kind,
    // any key, under its own identity.
    assert_eq!(
        deliver(&mut r, "bob", revoke_seq("b-1", "calendar", 1)),
        Received::Applied
    );
    assert_eq!(
        held(&r, "bob", "anumati.consent/receiver/scope:calendar"),
        WITHHELD
    );
}

// C-AZ-2: the governed key, the effects, the lease table and the
// supersession state carry the issuer: bob's newer grant never overrides
// alice's revoke, and sequences on one issuer's key never order another's.
#[test]
fn c_az_2_one_issuers_grant_never_overrides_anothers_revoke() {
    let mut r = receiver();
    assert_eq!(
        deliver(&mut r, "alice", revoke_seq("a-1", "s", 5)),
        Received::Applied
    );
    let leased = builder(
        "b-1",
        "anumati.consent",
        json!({"decision": "grant", "scope": "s", "lease_seconds": 300}),
    )
    .sequence(9)
    .build()
    .unwrap();
    assert_eq!(deliver(&mut r, "bob", leased), Received::Applied);
    assert_eq!(held(&r, "alice", SCOPE_S), WITHHELD);
    assert_eq!(held(&r, "bob", SCOPE_S), GRANTED);
    // Read at the moment of use, the scope holds only if no issuer
    // withholds it.
    assert_eq!(r.authority(SCOPE_S, at(1.0)), Authority::Withheld);
    let bob_key = GovernedKey::new(SCOPE_S).unwrap().issued_by(&agent("bob"));
    assert!(matches!(
        r.authority(bob_key.as_str(), at(1.0)),
        Authority::Granted {
            lease_until: Some(_)
        }
    ));
    // The lease table holds bob's lease under bob's key only.
    let leases: Vec<String> = r.leases(at(1.0)).into_iter().map(|l| l.0).collect();
    assert_eq!(leases, vec![bob_key.to_string()]);
    // Alice's own older grant is superseded by her revoke (her order),
    // not by bob's sequence 9.
    assert_eq!(
        deliver(&mut r, "alice", grant_seq("a-0", "s", 4)),
        Received::Declined(DeclineReason::Superseded)
    );
    assert_eq!(
        deliver(&mut r, "alice", grant_seq("a-2", "s", 6)),
        Received::Applied
    );
    assert_eq!(held(&r, "alice", SCOPE_S), GRANTED);
    let by_issuer: Vec<(AgentId, Authority)> = r.authority_by_issuer(SCOPE_S, at(1.0));
    assert_eq!(by_issuer.len(), 2);
    assert_eq!(by_issuer[0].0, agent("alice"));
}

// C-OR-3: an unsequenced widening obligation (a v1 peer's grant) never
// widens authority past a withhold on its key; a withhold without a
// sequence counts as newer than every widening obligation until a
// sequenced withhold orders the key again.
#[test]
fn c_or_3_unsequenced_grant_never_widens_past_a_withhold() {
    let unsequenced_grant = |id: &str| {
        obligation(
            id,
            "anumati.consent",
            json!({"decision": "grant", "scope": "s"}),
        )
    };
    let mut r = receiver();
    // Nothing withheld yet: an unsequenced grant applies.
    assert_eq!(
        deliver(&mut r, "alice", unsequenced_grant("g-0")),
        Received::Applied
    );
    assert_eq!(
        deliver(&mut r, "alice", revoke_seq("v-1", "s", 2)),
        Received::Applied
    );
    assert_eq!(
        deliver(&mut r, "alice", unsequenced_grant("g-1")),
        Received::Declined(DeclineReason::Superseded)
    );
    assert_eq!(held(&r, "alice", SCOPE_S), WITHHELD);
    // A sequenced grant newer than the withhold applies.
    assert_eq!(
        deliver(&mut r, "alice", grant_seq("g-2", "s", 3)),
        Received::Applied
    );
    // The v1 mix: an unsequenced revoke, then a sequenced grant the relay
    // held (its sequence is higher than anything seen): declined.
    assert_eq!(
        deliver(&mut r, "alice", revoke("v-2", "s")),
        Received::Applied
    );
    assert_eq!(
        deliver(&mut r, "alice", grant_seq("g-held", "s", 50)),
        Received::Declined(DeclineReason::Superseded)
    );
    assert_eq!(
        deliver(&mut r, "alice", unsequenced_grant("g-3")),
        Received::Declined(DeclineReason::Superseded)
    );
    assert_eq!(held(&r, "alice", SCOPE_S), WITHHELD);
    // A sequenced withhold orders the key again; a newer grant applies.
    assert_eq!(
        deliver(&mut r, "alice", revoke_seq("v-3", "s", 60)),
        Received::Applied
    );
    assert_eq!(
        deliver(&mut r, "alice", grant_seq("g-4", "s", 59)),
        Received::Declined(DeclineReason::Superseded)
    );
    assert_eq!(
        deliver(&mut r, "alice", grant_seq("g-5", "s", 61)),
        Received::Applied
    );
    assert_eq!(held(&r, "alice", SCOPE_S), GRANTED);
}

fn ledger_row(
    custodian: &str,
    id: &str,
    ob: &Obligation,
) -> ((AgentId, abhyasa_core::ObligationId), LedgerRecord) {
    (
        (agent(custodian), id.parse().unwrap()),
        LedgerRecord {
            custodian: agent(custodian),
            obligation_id: id.parse().unwrap(),
            digest: ob.digest(),
            kind: ob.kind().clone(),
            outcome: LedgerOutcome::Applied,
            reason: None,
            detail: None,
            effect: Vec::new(),
            key_sequence: None,
            recorded_at: T0,
            deadline_at: ob.deadline_at(),
            obligation: None,
        },
    )
}

// C-AZ-2: state written by a build whose keys carried no issuer loads: a
// key whose issuer the ledger names moves under it; an order whose
// issuer cannot be derived stays a floor for every issuer on that key.
#[test]
fn c_az_2_issuer_less_keys_from_an_older_build_load() {
    let old_s = GovernedKey::new(SCOPE_S).unwrap();
    let old_t = GovernedKey::new("anumati.consent/receiver/scope:t").unwrap();
    let rev = revoke_seq("a-7", "s", 7);
    let mut ledger = HashMap::new();
    let (k, v) = ledger_row("alice", "a-7", &rev);
    ledger.insert(k, v);
    let mut key_sequences = HashMap::new();
    key_sequences.insert(old_s.clone(), (Sequence(7), "a-7".parse().unwrap()));
    // Its ledger entry was compacted: no issuer can be derived.
    key_sequences.insert(old_t.clone(), (Sequence(20), "gone".parse().unwrap()));
    let mut effects = BTreeMap::new();
    effects.insert(
        SCOPE_S.to_string(),
        EffectValue::Authorization(Authorization::Withheld),
    );
    let snap = ReceiverSnapshot {
        ledger,
        key_sequences,
        effects,
        intents: HashMap::new(),
        damaged_before: None,
    };
    let mut r = Receiver::restore(
        receiver_config(),
        PolarityRegistry::standard(),
        &snap,
        at(1.0),
    );
    assert_eq!(held(&r, "alice", SCOPE_S), WITHHELD, "moved under alice");
    assert_eq!(r.authority(SCOPE_S, at(1.0)), Authority::Withheld);
    assert_eq!(
        deliver(&mut r, "alice", grant_seq("a-6", "s", 6)),
        Received::Declined(DeclineReason::Superseded),
        "alice's order moved with her key"
    );
    assert_eq!(
        deliver(&mut r, "alice", grant_seq("a-8", "s", 8)),
        Received::Applied
    );
    // The underivable order on t is a floor for every issuer.
    for who in ["alice", "bob"] {
        assert_eq!(
            deliver(&mut r, who, grant_seq(&format!("{who}-t"), "t", 20)),
            Received::Declined(DeclineReason::Superseded),
            "{who}"
        );
    }
    assert_eq!(
        deliver(&mut r, "bob", grant_seq("bob-t2", "t", 21)),
        Received::Applied
    );
}

// C-OR-1: an offer on a governed key without a sequence gets the next one
// this node issues on that key (per key, from 1, above any the caller gave);
// an unsequenced re-offer of the same obligation is recognised, not a
// conflict.
#[test]
fn c_or_1_custodian_assigns_per_key_monotonic_sequences() {
    let mut d = Duo::new();
    let sent = |d: &mut Duo| -> Vec<Option<u64>> {
        d.custodian_out()
            .into_iter()
            .filter_map(|t| match t.message {
                Message::Obligation(o) => Some(o.sequence().map(|s| s.0)),
                _ => None,
            })
            .collect()
    };
    d.c.offer(T0, revoke("r-1", "s")).unwrap();
    d.c.offer(T0, revoke("r-2", "t")).unwrap();
    d.c.offer(T0, grant_seq("g-1", "s", 10)).unwrap();
    d.c.offer(T0, revoke("r-3", "s")).unwrap();
    assert_eq!(sent(&mut d), vec![Some(1), Some(1), Some(10), Some(11)]);
    // Idempotent re-offer of the unsequenced obligation while pending.
    assert_eq!(
        d.c.offer(T0, revoke("r-3", "s")),
        Ok(abhyasa_core::custody::Offered::AlreadyPending)
    );
    // Unknown kinds govern no key: nothing is assigned.
    d.c.offer(T0, obligation("u-1", "acme.unknown", json!({})))
        .unwrap();
    assert_eq!(sent(&mut d), vec![None]);
    // The principal's counter holds the newest issued per key.
    let k = GovernedKey::new(SCOPE_S).unwrap();
    assert_eq!(d.c.principal().issued(&k).map(|e| e.0), Some(Sequence(11)));
    assert_eq!(d.c.principal().next_sequence(&k), Sequence(12));
}

// C-AZ-2: the key format: `@<issuer>/<key>` with the issuer's `%` and `/`
// escaped, so the issuer reads back exactly and two (issuer, key) pairs
// never share a string; a key already held under an issuer is unchanged.
#[test]
fn c_az_2_keys_held_under_their_issuer_are_unambiguous() {
    let k = GovernedKey::new("anumati.consent/r/scope:x").unwrap();
    let plain = k.issued_by(&agent("alice"));
    assert_eq!(plain.as_str(), "@alice/anumati.consent/r/scope:x");
    assert_eq!(plain.issued_by(&agent("bob")), plain);
    for who in ["spiffe://org/a", "50%/x", "%2F", "a%2Fb"] {
        let q = k.issued_by(&agent(who));
        assert_eq!(q.issuer(), Some(agent(who)), "{q}");
        assert_eq!(q.unqualified(), k.as_str(), "{q}");
    }
    // "a/b" + "c/d" versus "a" + "b/c/d": different strings.
    let one = GovernedKey::new("c/d").unwrap().issued_by(&agent("a/b"));
    let two = GovernedKey::new("b/c/d").unwrap().issued_by(&agent("a"));
    assert_ne!(one, two);
    assert_eq!(k.issuer(), None);
    assert_eq!(k.unqualified(), k.as_str());
}
