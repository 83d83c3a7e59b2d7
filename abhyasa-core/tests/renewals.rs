//! Lease renewals on the principal's side (custody plus leases, DESIGN §3):
//! the admission rule, the jittered schedule (35–45 % of the usable term,
//! one SplitMix64 stream per seed), the renewal built, and the warnings.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use abhyasa_core::custody::renewal::{LeaseWarningKind, Renewals, SupersededByRenewal};
use abhyasa_core::custody::{Custodian, Offered};
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::{GovernedKey, Obligation, Sequence, Timestamp};
use common::*;
use serde_json::json;

const TERM: u64 = 100;
const KEY: &str = "anumati.consent/receiver/scope:email.read";

fn leased(id: &str, seq: Option<u64>, term: u64) -> Obligation {
    let b = builder(
        id,
        "anumati.consent",
        json!({"decision": "grant", "scope": "email.read", "lease_seconds": term}),
    );
    match seq {
        Some(s) => b.sequence(s),
        None => b,
    }
    .build()
    .unwrap()
}

/// A principal that offered `ob` (through admission) with renewals keyed by
/// `seed`, `skew` and the revocation deadline `deadline`.
struct Principal {
    c: Custodian,
    r: Renewals,
}

impl Principal {
    fn new(seed: u64, skew: Duration, deadline: Option<Duration>) -> Self {
        Self {
            c: Custodian::new(custodian_config(), PolarityRegistry::standard()),
            r: Renewals::new(seed, skew, deadline),
        }
    }

    fn offer(&mut self, now: Timestamp, ob: Obligation) -> Result<(), SupersededByRenewal> {
        let admitted = self.r.admit(self.c.registry(), &ob)?;
        let offered = self.c.offer(now, ob.clone()).unwrap();
        assert!(matches!(
            offered,
            Offered::Custody { .. } | Offered::BestEffort
        ));
        self.r.accepted(admitted, &ob, self.c.principal());
        Ok(())
    }
}

fn key() -> GovernedKey {
    GovernedKey::new(KEY).unwrap()
}

/// The first renewal of a leased grant is due 35–45 % of the usable term
/// (term minus skew margin) after the grant was issued, for every seed;
/// the same seed gives the same schedule, and seeds spread it.
#[test]
fn renewal_jitter_is_35_to_45_percent_of_usable_term_and_replays_per_seed() {
    let skew = Duration::from_secs(10);
    let usable = Duration::from_secs(TERM) - skew;
    let first = |seed: u64| {
        let mut p = Principal::new(seed, skew, None);
        p.offer(T0, leased("g", Some(1), TERM)).unwrap();
        p.r.poll_timeout().unwrap()
    };
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..200 {
        let at = first(seed);
        let delay = at.saturating_duration_since(T0);
        assert!(
            delay >= usable.mul_f64(0.35) && delay <= usable.mul_f64(0.45),
            "seed {seed}: {delay:?} of {usable:?}"
        );
        assert_eq!(at, first(seed), "seed {seed} must replay");
        seen.insert(at);
    }
    assert!(
        seen.len() > 150,
        "jitter barely varies: {} values",
        seen.len()
    );
}

/// Successive renewals of one chain draw successive values of the stream:
/// each interval is in bounds, and they are not all the same.
#[test]
fn each_renewal_draws_a_fresh_jitter() {
    let mut p = Principal::new(7, Duration::ZERO, None);
    p.offer(T0, leased("g", Some(1), TERM)).unwrap();
    let mut delays = Vec::new();
    let mut issued = T0;
    for n in 1..=20u64 {
        let at = p.r.poll_timeout().unwrap();
        let delay = at.saturating_duration_since(issued);
        assert!(delay >= Duration::from_secs(35) && delay <= Duration::from_secs(45));
        delays.push(delay);
        let due = p.r.poll_renewals(at, p.c.principal());
        assert_eq!(due.len(), 1, "renewal {n}");
        let (k, ob) = due.into_iter().next().unwrap();
        assert_eq!(ob.sequence(), Some(Sequence(n + 1)));
        let _ = p.c.offer(at, ob.clone()).unwrap();
        p.r.renewed(k, ob);
        issued = at;
    }
    delays.dedup();
    assert!(delays.len() > 10, "{delays:?}");
}

/// The renewal due is the chain's grant again: a fresh id, `created_at =
/// now` (the lease is measured from it), the next sequence; nothing is due
/// before its time.
#[test]
fn due_renewal_is_the_next_grant_of_the_chain() {
    let mut p = Principal::new(1, Duration::ZERO, None);
    p.offer(T0, leased("g", Some(4), TERM)).unwrap();
    let at = p.r.poll_timeout().unwrap();
    let early = Timestamp::from_unix_micros(at.unix_micros() - 1);
    assert!(p.r.poll_renewals(early, p.c.principal()).is_empty());
    let due = p.r.poll_renewals(at, p.c.principal());
    assert_eq!(due.len(), 1);
    let (k, ob) = &due[0];
    assert_eq!(k, &key());
    assert_eq!(ob.id().as_str(), "g~renewal-1");
    assert_eq!(ob.sequence(), Some(Sequence(5)));
    assert_eq!(ob.created_at(), at);
    assert_eq!(ob.payload().get("lease_seconds"), Some(&json!(TERM)));
    // Polled once: the chain waits for `renewed` / `skipped`.
    assert_eq!(p.r.poll_timeout(), None);
    assert_eq!(p.r.views().len(), 1);
}

/// Admission: an offer on the key whose sequence is not newer than the
/// chain's latest grant is refused (the receiver would decline it
/// superseded); a newer one, an unsequenced one and the chain's own grant
/// pass.
#[test]
fn admission_refuses_an_offer_behind_the_renewal_already_sent() {
    let mut p = Principal::new(1, Duration::ZERO, None);
    p.offer(T0, leased("g", Some(3), TERM)).unwrap();
    let behind = revoke_seq("r-old", "email.read", 3);
    let err = p.r.admit(p.c.registry(), &behind).unwrap_err();
    assert_eq!(
        err,
        SupersededByRenewal {
            key: key(),
            offered: Sequence(3),
            newest: Sequence(3)
        }
    );
    assert!(err.to_string().contains("sequence 4 or higher"), "{err}");
    assert!(p
        .r
        .admit(p.c.registry(), &revoke_seq("r", "email.read", 4))
        .is_ok());
    assert!(p
        .r
        .admit(p.c.registry(), &revoke("r-any", "email.read"))
        .is_ok());
    assert!(p
        .r
        .admit(p.c.registry(), &leased("g", Some(3), TERM))
        .is_ok());
    // Another key is not concerned.
    assert!(p
        .r
        .admit(p.c.registry(), &revoke_seq("o", "email.send", 1))
        .is_ok());
}

/// Any other obligation accepted on the key ends the chain: a revocation
/// stops renewals at once.
#[test]
fn an_accepted_revocation_ends_the_chain() {
    let mut p = Principal::new(1, Duration::ZERO, None);
    p.offer(T0, leased("g", Some(1), TERM)).unwrap();
    assert!(p.r.poll_timeout().is_some());
    p.offer(at(1.0), revoke_seq("r", "email.read", 2)).unwrap();
    assert_eq!(p.r.poll_timeout(), None);
    assert!(p.r.views().is_empty());
}

/// Back-pressure retries a renewal an interval later; any other refusal
/// ends the chain.
#[test]
fn skipped_renewal_retries_later_or_ends_the_chain() {
    let mut p = Principal::new(1, Duration::ZERO, None);
    p.offer(T0, leased("g", Some(1), TERM)).unwrap();
    let at1 = p.r.poll_timeout().unwrap();
    let (k, _) = p.r.poll_renewals(at1, p.c.principal()).remove(0);
    p.r.skipped(at1, k.clone(), true);
    let at2 = p.r.poll_timeout().unwrap();
    let d = at2.saturating_duration_since(at1);
    assert!(
        d >= Duration::from_secs(35) && d <= Duration::from_secs(45),
        "{d:?}"
    );
    let (k, _) = p.r.poll_renewals(at2, p.c.principal()).remove(0);
    p.r.skipped(at2, k, false);
    assert_eq!(p.r.poll_timeout(), None);
    assert!(p.r.views().is_empty());
}

/// Leases that cannot or should not be renewed warn once each: a term
/// longer than the revocation deadline, an unsequenced grant (no chain),
/// a term within the skew margin (no chain).
#[test]
fn unrenewable_and_long_leases_warn_once() {
    let mut p = Principal::new(1, Duration::from_secs(5), Some(Duration::from_secs(60)));
    p.offer(T0, leased("long", Some(1), TERM)).unwrap();
    let w = p.r.poll_warning().unwrap();
    assert!(matches!(
        w.kind,
        LeaseWarningKind::TermExceedsRevocationDeadline {
            term_seconds: 100,
            revocation_deadline_seconds: 60
        }
    ));
    assert!(p.r.poll_warning().is_none(), "handed out once");
    assert!(p.r.poll_timeout().is_some(), "still renewed");

    let mut p = Principal::new(1, Duration::from_secs(5), None);
    p.offer(T0, leased("u", None, 30)).unwrap();
    // The custodian gave it the next sequence on the key: a chain starts.
    assert!(p.r.poll_warning().is_none());
    assert!(p.r.poll_timeout().is_some());

    let mut p = Principal::new(1, Duration::from_secs(50), None);
    p.offer(T0, leased("short", Some(1), 30)).unwrap();
    let w = p.r.poll_warning().unwrap();
    assert!(matches!(w.kind, LeaseWarningKind::WithinSkewMargin { .. }));
    assert_eq!(p.r.poll_timeout(), None);
    assert_eq!(p.r.warnings().len(), 1);
}
