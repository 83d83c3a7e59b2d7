//! Custody plus leases (DESIGN §3, issue 13): a leased grant holds only
//! while `now + skew_margin < lease_until`; renewals are new grants with a
//! higher sequence; a revocation ends the lease on application.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use abhyasa_core::custody::lease::{self, Authority};
use abhyasa_core::custody::{Received, Receiver, ReceiverEvent, ReceiverSnapshot, StandardApplier};
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::{DeclineReason, Obligation, Timestamp};
use common::*;
use rand::{Rng, SeedableRng};
use serde_json::json;

const SCOPE_KEY: &str = "anumati.consent/receiver/scope:email.read";
/// The key as the receiver holds it: under its issuer (C-AZ-2).
const HELD_KEY: &str = "@custodian/anumati.consent/receiver/scope:email.read";
const TERM: u64 = 30;

/// A leased grant issued at `issued` (the principal's clock).
fn leased_grant(id: &str, seq: u64, issued: Timestamp) -> Obligation {
    Obligation::builder()
        .id(id)
        .kind("anumati.consent")
        .target("receiver")
        .payload(json!({"decision": "grant", "scope": "email.read", "lease_seconds": TERM}))
        .deadline_seconds(600)
        .max_retries(64)
        .created_at(issued)
        .sequence(seq)
        .build()
        .unwrap()
}

struct Edge {
    r: Receiver,
    snap: ReceiverSnapshot,
    events: Vec<ReceiverEvent>,
}

impl Edge {
    fn new() -> Self {
        Self {
            r: Receiver::new(receiver_config(), PolarityRegistry::standard()),
            snap: ReceiverSnapshot::default(),
            events: Vec::new(),
        }
    }

    fn deliver(&mut self, now: Timestamp, ob: Obligation) -> Received {
        let got = self.r.handle_obligation(
            now,
            &agent("custodian"),
            ob,
            &mut StandardApplier::default(),
        );
        self.flush();
        got
    }

    fn flush(&mut self) {
        if let Some(b) = self.r.poll_records() {
            b.records.iter().for_each(|rec| self.snap.apply(rec));
            self.r.handle_committed(b.token());
        }
        while self.r.poll_transmit().is_some() {}
        self.events
            .extend(std::iter::from_fn(|| self.r.poll_event()));
    }

    /// Serves timers up to `until`, as a driver would.
    fn run_until(&mut self, until: Timestamp) {
        while let Some(t) = self.r.poll_timeout() {
            if t > until {
                break;
            }
            self.r.handle_timeout(t);
            self.flush();
        }
    }

    fn authority(&self, now: Timestamp) -> Authority {
        self.r.authority(SCOPE_KEY, now)
    }

    fn lapses(&self) -> usize {
        self.events
            .iter()
            .filter(|e| matches!(e, ReceiverEvent::LeaseLapsed { key, .. } if key == HELD_KEY))
            .count()
    }
}

// C-TR-4: a partitioned receiver stops exercising a leased scope at lease
// expiry though no revocation ever arrives.
#[test]
fn c_tr_4_partitioned_receiver_stops_at_lease_expiry() {
    let mut e = Edge::new();
    assert_eq!(
        e.deliver(at(0.5), leased_grant("g-1", 1, T0)),
        Received::Applied
    );
    let until = at(TERM as f64);
    assert_eq!(
        e.authority(at(1.0)),
        Authority::Granted {
            lease_until: Some(until)
        }
    );
    // Skew margin 2 s on the safe side: exercisable before 28 s only.
    assert!(e.authority(at(27.9)).is_authorized());
    assert_eq!(
        e.authority(at(28.0)),
        Authority::Lapsed { lease_until: until }
    );
    // The partition holds: nothing arrives; the lease timer reports it.
    assert_eq!(e.r.poll_timeout(), Some(at(28.0)));
    e.run_until(at(27.0));
    assert_eq!(e.lapses(), 0);
    e.run_until(at(60.0));
    assert_eq!(e.lapses(), 1);
    assert_eq!(e.r.poll_timeout(), None);
    assert!(!e.authority(at(3600.0)).is_authorized());
}

// C-TR-4: renewals sent about every half term (seeded jitter) keep the
// lease; one lost renewal is tolerated, the second in a row lapses it.
#[test]
fn c_tr_4_tolerates_one_lost_renewal_and_lapses_after_two() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
    let skew = receiver_config().skew_margin;
    for round in 0..20 {
        let mut e = Edge::new();
        let mut issued = T0;
        let mut seq = 1;
        e.deliver(
            issued.saturating_add(Duration::from_millis(100)),
            leased_grant("g-0", seq, issued),
        );
        // Renewals 1 and 3 are lost; renewal 2 gets through; then two are
        // lost in a row.
        let mut lost_in_a_row = 0;
        let mut last_delivered = issued;
        for k in 1..=5 {
            let delay = lease::renewal_delay(Duration::from_secs(TERM), skew, rng.random::<f64>());
            issued = issued.saturating_add(delay);
            seq += 1;
            let renewal = leased_grant(&format!("g-{k}"), seq, issued);
            let arrives = issued.saturating_add(Duration::from_millis(100));
            // Exercisable right up to the renewal's arrival unless two in
            // a row were lost before it.
            let held = e.authority(arrives.saturating_sub(Duration::from_millis(1)));
            if lost_in_a_row < 2 {
                assert!(held.is_authorized(), "round {round} renewal {k}: {held:?}");
            }
            if k == 1 || k >= 3 {
                lost_in_a_row += 1;
                continue;
            }
            lost_in_a_row = 0;
            assert_eq!(e.deliver(arrives, renewal), Received::Applied);
            last_delivered = issued;
        }
        // Two lost in a row: lapsed at the last delivered grant's end.
        let until = last_delivered.saturating_add(Duration::from_secs(TERM));
        e.run_until(until);
        assert_eq!(
            e.authority(until.saturating_sub(skew)),
            Authority::Lapsed { lease_until: until },
            "round {round}"
        );
        assert_eq!(
            e.lapses(),
            1,
            "round {round}: one lapse, not one per lost renewal"
        );
    }
}

// C-TR-4: the lease end is durable with the effect; after a restart the
// lapsed authority is still lapsed (and a live lease is still live).
#[test]
fn c_tr_4_still_lapsed_after_restart() {
    let mut e = Edge::new();
    e.deliver(at(0.5), leased_grant("g-1", 1, T0));
    let restored = |snap: &ReceiverSnapshot, now| {
        Receiver::restore(receiver_config(), PolarityRegistry::standard(), snap, now)
    };
    // Restart while the lease holds.
    let r = restored(&e.snap, at(10.0));
    assert!(r.authority(SCOPE_KEY, at(10.0)).is_authorized());
    assert_eq!(
        r.poll_timeout(),
        Some(at(28.0)),
        "the lapse timer is rebuilt"
    );
    // Restart after it lapsed while the process was down.
    let mut r = restored(&e.snap, at(100.0));
    assert_eq!(
        r.authority(SCOPE_KEY, at(100.0)),
        Authority::Lapsed {
            lease_until: at(TERM as f64)
        }
    );
    r.handle_timeout(at(100.0));
    let events: Vec<_> = std::iter::from_fn(|| r.poll_event()).collect();
    assert!(events
        .iter()
        .any(|ev| matches!(ev, ReceiverEvent::LeaseLapsed { key, .. } if key == HELD_KEY)));
    assert_eq!(r.leases(at(100.0)).len(), 1);
}

// A revocation under custody ends the lease on application: the withhold
// and the lease's end are one record, and no lapse is reported later.
#[test]
fn revocation_ends_the_lease_on_application() {
    let mut e = Edge::new();
    e.deliver(at(0.5), leased_grant("g-1", 1, T0));
    let revoke = revoke_seq("r-2", "email.read", 2);
    assert_eq!(e.deliver(at(5.0), revoke), Received::Applied);
    assert_eq!(e.authority(at(5.0)), Authority::Withheld);
    assert!(e.r.leases(at(5.0)).is_empty());
    assert_eq!(e.r.poll_timeout(), None, "the lapse timer is gone");
    // A stale renewal (older sequence) cannot bring it back.
    assert_eq!(
        e.deliver(at(6.0), leased_grant("g-0", 1, at(1.0))),
        Received::Declined(DeclineReason::Superseded)
    );
    e.run_until(at(100.0));
    assert_eq!(e.lapses(), 0);
    assert_eq!(e.authority(at(6.0)), Authority::Withheld);
}

// C-T-2: a lease term that is not a positive integer is refused naming
// the field; an unleased grant holds without a lease.
#[test]
fn bad_lease_terms_are_declined_naming_the_field() {
    for bad in [json!(0), json!(-5), json!(1.5), json!("30")] {
        let mut e = Edge::new();
        let ob = Obligation::builder()
            .id("g-bad")
            .kind("anumati.consent")
            .target("receiver")
            .payload(json!({"decision": "grant", "scope": "email.read", "lease_seconds": bad}))
            .deadline_seconds(600)
            .max_retries(64)
            .created_at(T0)
            .build()
            .unwrap();
        let err = lease::lease_term(&ob).unwrap_err();
        assert_eq!(err.field, "payload.lease_seconds");
        assert_eq!(
            e.deliver(at(1.0), ob),
            Received::Declined(DeclineReason::Policy)
        );
        assert_eq!(e.authority(at(1.0)), Authority::Unknown);
    }
    let mut e = Edge::new();
    e.deliver(at(1.0), grant_seq("g-1", "email.read", 1));
    assert_eq!(
        e.authority(at(1e6)),
        Authority::Granted { lease_until: None }
    );
}

#[test]
fn renewal_delay_fits_two_intervals_in_a_term_and_warns_on_long_leases() {
    let term = Duration::from_secs(30);
    let skew = Duration::from_secs(2);
    for u in [0.0, 0.25, 0.5, 0.999_999, 1.0, f64::NAN] {
        let d = lease::renewal_delay(term, skew, u);
        assert!(d >= Duration::from_secs_f64(28.0 * 0.35), "{u}: {d:?}");
        assert!(d <= Duration::from_secs_f64(28.0 * 0.45), "{u}: {d:?}");
        assert!(d * 2 < term - skew);
    }
    assert!(lease::lease_warning(Duration::from_secs(30), Duration::from_secs(600)).is_none());
    let w = lease::lease_warning(Duration::from_secs(900), Duration::from_secs(600)).unwrap();
    assert!(w.contains("300 s"), "{w}");
}
