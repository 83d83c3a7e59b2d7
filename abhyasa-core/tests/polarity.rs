//! AC-1 admissibility and safe(O) for the three instantiations.

#![allow(clippy::unwrap_used)]

mod common;

use abhyasa_core::polarity::{Admission, Classification, PolarityRegistry, PolarityRule};
use abhyasa_core::principal::Authorization;
use abhyasa_core::{FieldError, FieldProblem, GovernedKey, Obligation, SafeEffect};
use common::*;
use serde_json::{json, Value};

fn classify(kind: &str, payload: Value) -> Result<Classification, FieldError> {
    PolarityRegistry::standard().classify(&obligation("ob-1", kind, payload))
}

// C-AC-1: an unknown kind, and every kind under an empty registry, admit
// nothing.
#[test]
fn c_ac_1_unknown_kind_and_empty_registry_admit_nothing() {
    let c = classify("acme.custom", json!({"decision": "revoke"})).unwrap();
    assert_eq!(c.admission, Admission::BestEffort);
    assert_eq!(c.key, None);
    let empty = PolarityRegistry::empty();
    for (kind, payload) in [
        (
            "anumati.consent",
            json!({"decision": "revoke", "scope": "s"}),
        ),
        ("phala.belief_update", json!({"weight_delta": -1.0})),
        ("oauth.token", json!({"action": "revoke", "token_id": "t"})),
    ] {
        assert!(!empty
            .classify(&obligation("x", kind, payload))
            .unwrap()
            .is_admissible());
    }
    // A custom rule plugs in by registration.
    struct Always;
    impl PolarityRule for Always {
        fn kind(&self) -> &str {
            "acme.custom"
        }
        fn classify(&self, ob: &Obligation) -> Result<Classification, FieldError> {
            let key = GovernedKey::new(format!("acme.custom/{}/all", ob.target()))?;
            Ok(Classification {
                admission: Admission::Custody {
                    safe: abhyasa_core::SafeAction {
                        obligation_id: ob.id().clone(),
                        target: ob.target().clone(),
                        effect: SafeEffect::FailClosed,
                        key: key.clone(),
                        sequence: ob.sequence(),
                        rationale: "custom".into(),
                    },
                },
                key: Some(key),
                guarded: true,
                at_offer: None,
            })
        }
    }
    let mut r = PolarityRegistry::standard();
    r.register(Always);
    assert!(r
        .classify(&obligation("x", "acme.custom", json!({})))
        .unwrap()
        .is_admissible());
}

// C-AC-2: Anumati revoke (and no decision) admissible, grant best-effort;
// Phala corrective admissible, reinforcing best-effort, missing delta an
// error; OAuth revoke admissible, issue/refresh best-effort.
#[test]
fn c_ac_2_per_instance_admissibility() {
    let adm = |k: &str, p: Value| classify(k, p).unwrap().is_admissible();
    assert!(adm(
        "anumati.consent",
        json!({"decision": "revoke", "scope": "s"})
    ));
    assert!(adm(
        "anumati.consent",
        json!({"decision": "restrict", "scope": "s"})
    ));
    assert!(adm("anumati.consent", json!({"scope": "s"})));
    assert!(!adm(
        "anumati.consent",
        json!({"decision": "grant", "scope": "s"})
    ));
    assert!(adm("phala.belief_update", json!({"weight_delta": -0.01})));
    assert!(!adm("phala.belief_update", json!({"weight_delta": 0})));
    assert!(!adm("phala.belief_update", json!({"weight_delta": 0.4})));
    assert!(adm(
        "oauth.token",
        json!({"action": "revoke", "token_id": "t"})
    ));
    assert!(adm(
        "oauth.token",
        json!({"action": "revoke", "client_id": "c"})
    ));
    assert!(!adm(
        "oauth.token",
        json!({"action": "issue", "token_id": "t"})
    ));
    assert!(!adm(
        "oauth.token",
        json!({"action": "refresh", "token_id": "t"})
    ));

    let err = |k: &str, p: Value| classify(k, p).unwrap_err();
    assert_eq!(
        err("phala.belief_update", json!({})),
        FieldError::missing("payload.weight_delta")
    );
    assert_eq!(
        err("phala.belief_update", json!({"weight_delta": null})).field,
        "payload.weight_delta"
    );
    assert!(matches!(
        err("phala.belief_update", json!({"weight_delta": "-1"})).problem,
        FieldProblem::WrongType { .. }
    ));
    assert!(matches!(
        err(
            "anumati.consent",
            json!({"decision": "maybe", "scope": "s"})
        )
        .problem,
        FieldProblem::UnknownValue { .. }
    ));
    assert_eq!(
        err("anumati.consent", json!({"decision": "revoke"})),
        FieldError::missing("payload.scope")
    );
    assert!(matches!(
        err("oauth.token", json!({"action": "rotate", "token_id": "t"})).problem,
        FieldProblem::UnknownValue { .. }
    ));
    assert_eq!(
        err("oauth.token", json!({"token_id": "t"})),
        FieldError::missing("payload.action")
    );
    // No silent fallback to the target: a revoke must name its token or client.
    assert_eq!(
        err("oauth.token", json!({"action": "revoke"})).field,
        "payload.token_id"
    );
}

// C-AC-3: safe(O): Anumati and OAuth fail-closed on the scope/token; Phala
// down-weights by abs(delta) on the routing key.
#[test]
fn c_ac_3_safe_actions() {
    let c = classify(
        "anumati.consent",
        json!({"decision": "revoke", "scope": "email.read"}),
    )
    .unwrap();
    let s = c.safe().unwrap();
    assert_eq!(s.effect, SafeEffect::FailClosed);
    assert_eq!(s.key.as_str(), "anumati.consent/receiver/scope:email.read");
    assert_eq!(
        c.at_offer,
        Some(Authorization::Withheld),
        "withheld at offer"
    );
    assert!(c.guarded);

    let c = classify(
        "oauth.token",
        json!({"action": "revoke", "token_id": "t-1", "client_id": "c-1"}),
    )
    .unwrap();
    assert_eq!(c.safe().unwrap().effect, SafeEffect::FailClosed);
    assert_eq!(
        c.safe().unwrap().key.as_str(),
        "oauth.token/receiver/token:t-1"
    );
    let c2 = classify(
        "oauth.token",
        json!({"action": "revoke", "client_id": "t-1"}),
    )
    .unwrap();
    assert_ne!(c.key, c2.key, "a token and a client never share a key");

    let c = classify(
        "phala.belief_update",
        json!({"weight_delta": -0.35, "weight_key": "routing.x"}),
    )
    .unwrap();
    assert_eq!(
        c.safe().unwrap().effect,
        SafeEffect::DownWeight { magnitude: 0.35 }
    );
    assert_eq!(
        c.safe().unwrap().key.as_str(),
        "phala.belief_update/receiver/weight:routing.x"
    );
    assert!(
        !c.guarded,
        "Phala deltas are additive, not sequence-guarded"
    );
    let c = classify("phala.belief_update", json!({"weight_delta": -0.35})).unwrap();
    assert_eq!(
        c.safe().unwrap().key.as_str(),
        "phala.belief_update/receiver/weight:routing.receiver.preference"
    );

    // Through the principal: clipped at the declared floor.
    let mut p =
        abhyasa_core::principal::PrincipalState::new(abhyasa_core::principal::WeightRange {
            floor: 0.2,
            ceiling: 1.0,
            initial: 1.0,
        });
    let safe = c.safe().unwrap().clone();
    for _ in 0..10 {
        p.apply_safe(&safe);
    }
    assert_eq!(p.weight(&safe.key), 0.2);
}

#[test]
fn classification_is_pure_and_keys_distinguish_targets() {
    let a = obligation("ob-1", "anumati.consent", json!({"scope": "s"}));
    let b = builder("ob-1", "anumati.consent", json!({"scope": "s"}))
        .target("other")
        .build()
        .unwrap();
    let r = PolarityRegistry::standard();
    assert_eq!(r.classify(&a).unwrap(), r.classify(&a).unwrap());
    assert_ne!(r.classify(&a).unwrap().key, r.classify(&b).unwrap().key);
    assert_eq!(
        r.kinds(),
        vec!["anumati.consent", "oauth.token", "phala.belief_update"]
    );
}
