//! Shared helpers for the core conformance tests: builders and a manual
//! two-party driver (no channel model: the test moves every frame).
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use abhyasa_core::custody::{
    AckDisposition, Applier, Custodian, CustodianConfig, CustodianEvent, CustodyProfile, Receiver,
    ReceiverConfig, ReceiverEvent, StandardApplier, Transmit,
};
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::wire::Message;
use abhyasa_core::{AgentId, Obligation, RetryBackoff, Timestamp};
use serde_json::{json, Value};

pub const T0: Timestamp = Timestamp::from_unix_seconds(1_780_000_000);

pub fn at(secs: f64) -> Timestamp {
    T0.saturating_add(Duration::from_secs_f64(secs))
}

pub fn agent(s: &str) -> AgentId {
    AgentId::new(s).expect("valid agent id")
}

pub fn obligation(id: &str, kind: &str, payload: Value) -> Obligation {
    builder(id, kind, payload)
        .build()
        .expect("valid obligation")
}

pub fn builder(id: &str, kind: &str, payload: Value) -> abhyasa_core::ObligationBuilder {
    Obligation::builder()
        .id(id)
        .kind(kind)
        .target("receiver")
        .payload(payload)
        .deadline_seconds(600)
        .max_retries(64)
        .created_at(T0)
}

pub fn revoke(id: &str, scope: &str) -> Obligation {
    obligation(
        id,
        "anumati.consent",
        json!({"decision": "revoke", "scope": scope}),
    )
}

pub fn revoke_seq(id: &str, scope: &str, seq: u64) -> Obligation {
    builder(
        id,
        "anumati.consent",
        json!({"decision": "revoke", "scope": scope}),
    )
    .sequence(seq)
    .build()
    .expect("valid")
}

pub fn grant_seq(id: &str, scope: &str, seq: u64) -> Obligation {
    builder(
        id,
        "anumati.consent",
        json!({"decision": "grant", "scope": scope}),
    )
    .sequence(seq)
    .build()
    .expect("valid")
}

pub fn corrective(id: &str, delta: f64) -> Obligation {
    obligation(
        id,
        "phala.belief_update",
        json!({"weight_delta": delta, "weight_key": "routing.receiver.preference"}),
    )
}

/// Backoff without jitter: 1, 2, 4, ... capped at 64 s.
pub fn plain_backoff() -> RetryBackoff {
    RetryBackoff {
        base: Duration::from_secs(1),
        cap: Duration::from_secs(64),
        jitter: 0.0,
    }
}

pub fn custodian_config() -> CustodianConfig {
    let mut c = CustodianConfig::new(agent("custodian"));
    c.default_profile = CustodyProfile {
        backoff: plain_backoff(),
        ..CustodyProfile::default()
    };
    c
}

pub fn receiver_config() -> ReceiverConfig {
    let mut r = ReceiverConfig::new(agent("receiver"));
    r.skew_margin = Duration::from_secs(2);
    r
}

/// A custodian and a receiver, driven by hand.
pub struct Duo {
    pub c: Custodian,
    pub r: Receiver,
    pub applier: Box<dyn Applier>,
    pub cid: AgentId,
    pub rid: AgentId,
}

impl Duo {
    pub fn new() -> Self {
        Self::with(custodian_config(), Box::new(StandardApplier::default()))
    }

    pub fn with(cc: CustodianConfig, applier: Box<dyn Applier>) -> Self {
        Self {
            c: Custodian::new(cc, PolarityRegistry::standard()),
            r: Receiver::new(receiver_config(), PolarityRegistry::standard()),
            applier,
            cid: agent("custodian"),
            rid: agent("receiver"),
        }
    }

    /// Commits the custodian's records and returns its released transmits.
    pub fn custodian_out(&mut self) -> Vec<Transmit> {
        if let Some(b) = self.c.poll_records() {
            self.c.handle_committed(b.token());
        }
        std::iter::from_fn(|| self.c.poll_transmit()).collect()
    }

    /// Commits the receiver's records and returns its released transmits.
    pub fn receiver_out(&mut self) -> Vec<Transmit> {
        if let Some(b) = self.r.poll_records() {
            self.r.handle_committed(b.token());
        }
        std::iter::from_fn(|| self.r.poll_transmit()).collect()
    }

    pub fn deliver_to_receiver(
        &mut self,
        now: Timestamp,
        t: &Transmit,
    ) -> abhyasa_core::custody::Received {
        match &t.message {
            Message::Obligation(o) => {
                let cid = self.cid.clone();
                self.r
                    .handle_obligation(now, &cid, o.clone(), self.applier.as_mut())
            }
            other => panic!("expected an obligation, got {other:?}"),
        }
    }

    pub fn deliver_to_custodian(&mut self, now: Timestamp, t: &Transmit) -> Vec<AckDisposition> {
        let rid = self.rid.clone();
        match &t.message {
            Message::Acks(acks) => acks
                .iter()
                .map(|a| self.c.handle_ack(now, &rid, a))
                .collect(),
            Message::Error(e) => {
                self.c.handle_error(now, &rid, e);
                Vec::new()
            }
            other => panic!("expected acks, got {other:?}"),
        }
    }

    /// Delivers every released custodian transmit, then every receiver ack.
    pub fn exchange(&mut self, now: Timestamp) -> Vec<AckDisposition> {
        let out = self.custodian_out();
        for t in &out {
            self.deliver_to_receiver(now, t);
        }
        let back = self.receiver_out();
        back.iter()
            .flat_map(|t| self.deliver_to_custodian(now, t))
            .collect()
    }

    /// Fires timers up to `until`, dropping every transmit (a dead link).
    /// Returns the obligation transmits dropped.
    pub fn run_dead_until(&mut self, until: Timestamp) -> usize {
        let mut sent = self.custodian_out().len();
        while let Some(t) = self.c.poll_timeout() {
            if t > until {
                break;
            }
            self.c.handle_timeout(t);
            sent += self.custodian_out().len();
        }
        sent
    }

    pub fn custodian_events(&mut self) -> Vec<CustodianEvent> {
        let _ = self.custodian_out();
        std::iter::from_fn(|| self.c.poll_event()).collect()
    }

    pub fn receiver_events(&mut self) -> Vec<ReceiverEvent> {
        let _ = self.receiver_out();
        std::iter::from_fn(|| self.r.poll_event()).collect()
    }
}
