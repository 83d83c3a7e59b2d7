//! The receiver: applies each obligation at most once (AB-3), never past
//! its deadline, never behind a newer sequence on its key.
//!
//! # Polling contract
//!
//! Same as the custodian's: feed [`Receiver::receive`] (and
//! [`Receiver::decide`], [`Receiver::handle_timeout`],
//! [`Receiver::handle_status_query`], [`Receiver::complete_deferred`],
//! [`Receiver::handle_external_outcome`]); drain
//! [`Receiver::poll_apply_request`] and hand each request to the embedding
//! agent, whose answer comes back later through [`Receiver::decide`];
//! drain [`Receiver::poll_records`], commit, [`Receiver::handle_committed`];
//! then drain [`Receiver::poll_transmit`] and [`Receiver::poll_event`], and
//! arm a timer for [`Receiver::poll_timeout`]. An ack is released only
//! after the ledger entry (with its effect) it reports is durable, so an
//! ack can never attest an application a crash could undo. Consecutive
//! acks to one custodian are coalesced into one frame.
//!
//! # Asking the agent (str0m style)
//!
//! The machine never runs user code: an obligation that needs a decision
//! becomes an [`ApplyRequest`], held in memory only (nothing durable is
//! written until the decision comes back, so effect and ledger entry stay
//! one atomic record, AB-3). While it is outstanding a redelivery asks
//! nothing again and is answered by the ack of the decision. A decision is
//! checked against the rules as they stand when it returns (deadline,
//! supersession); its deadline passing with no decision declines it
//! `expired` ([`Receiver::handle_timeout`]). Outstanding requests are
//! bounded ([`ReceiverConfig::max_outstanding_requests`]); beyond the
//! bound an obligation gets an `overloaded` error and the custodian keeps
//! custody and retries. A crash loses only the requests, which the
//! custodian's redelivery asks again. [`Receiver::handle_obligation`] is
//! the synchronous convenience: it asks a synchronous [`Applier`] at once.

mod authority;
mod config;
mod event;
mod intent;
mod leases;
mod ledger;
mod request;

pub use authority::{AuthorityPolicy, PeerPolicy};
pub use config::ReceiverConfig;
pub use event::{CompleteError, Received, ReceiverEvent};
pub use intent::ExternalOutcome;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

#[cfg(doc)]
use super::applier::Applier;
use super::applier::{ApplyRequest, ApplyTicket};
use super::lease::{self, Authority};
use super::outbox::{CommitToken, Outbox, RecordBatch};
use super::record::{EffectValue, ExternalIntent, LedgerOutcome, ReceiverSnapshot};
use super::transmit::Transmit;
use crate::model::{
    AgentId, DeclineReason, Digest, GovernedKey, Obligation, ObligationId, Sequence, Timestamp,
};
use crate::polarity::PolarityRegistry;
use crate::wire::Message;

/// The suffix of [`super::lease::lease_key`].
const LEASE_SUFFIX: &str = "#lease_until";

/// The order a withhold without a sequence records on its key: newer than
/// every widening obligation, sequenced or not, until a sequenced
/// restrictive obligation orders the key again (C-OR-3).
pub(crate) const UNORDERED: Sequence = Sequence(u64::MAX);

/// Most acks coalesced into one frame.
const MAX_ACKS_PER_FRAME: usize = 512;

#[derive(Debug, Clone)]
struct Entry {
    digest: Digest,
    outcome: LedgerOutcome,
    reason: Option<DeclineReason>,
    detail: Option<String>,
    deadline_at: Timestamp,
    /// Kept while undecided.
    obligation: Option<Obligation>,
    /// An external effect is executing or in doubt.
    intent: Option<ExternalIntent>,
}

type LedgerKey = (AgentId, ObligationId);

/// An obligation asked of the agent, held in memory only until decided.
#[derive(Debug, Clone)]
struct Waiting {
    ticket: ApplyTicket,
    obligation: Obligation,
    previously_deferred: bool,
    /// The governed key's value when asked (stale-decision check).
    seen: Option<EffectValue>,
    key: Option<GovernedKey>,
    /// The key if the kind's rule guards it by sequence.
    guarded_key: Option<GovernedKey>,
    /// The obligation widens authority (a grant, an issue).
    widening: bool,
}

/// The receiver state machine.
///
/// `Clone` lets a model checker explore alternative futures from one state;
/// a driver must never run two clones against the same store and peers.
#[derive(Debug, Clone)]
pub struct Receiver {
    config: ReceiverConfig,
    registry: PolarityRegistry,
    ledger: crate::ShardedMap<LedgerKey, Entry>,
    /// Ledger entries held per custodian (C-ND-5 quota).
    held: crate::Map<AgentId, usize>,
    key_seq: crate::ShardedMap<GovernedKey, (Sequence, ObligationId)>,
    /// Orders recorded by a build whose keys did not carry their issuer,
    /// by issuer-less key, where the issuer could not be derived: a floor
    /// for every issuer on that key.
    legacy_key_seq: crate::Map<String, (Sequence, ObligationId)>,
    effects: BTreeMap<String, EffectValue>,
    outbox: Outbox<Transmit, ReceiverEvent>,
    applications: u64,
    /// Outstanding apply requests by ledger key.
    waiting: crate::Map<LedgerKey, Waiting>,
    /// Ticket -> ledger key of `waiting`.
    tickets: crate::Map<ApplyTicket, LedgerKey>,
    /// When each waiting obligation can no longer be applied
    /// (`deadline - skew_margin`), for the expiry timer.
    expiries: BTreeSet<(Timestamp, ApplyTicket)>,
    /// Requests not yet polled by the driver.
    requests: VecDeque<ApplyRequest>,
    next_ticket: u64,
    /// Lease end per governed key holding a leased grant.
    leases: crate::Map<String, Timestamp>,
    /// (`lease_until - skew_margin`, governed key): when each lease lapses.
    lease_timers: BTreeSet<(Timestamp, String)>,
    /// [`ReceiverSnapshot::damaged_before`].
    damaged_before: Option<Timestamp>,
}

impl Receiver {
    /// A receiver with an empty ledger.
    pub fn new(config: ReceiverConfig, registry: PolarityRegistry) -> Self {
        Self {
            config,
            registry,
            ledger: crate::ShardedMap::new(),
            held: crate::Map::default(),
            key_seq: crate::ShardedMap::new(),
            legacy_key_seq: crate::Map::default(),
            effects: BTreeMap::new(),
            outbox: Outbox::default(),
            applications: 0,
            waiting: crate::Map::default(),
            tickets: crate::Map::default(),
            expiries: BTreeSet::new(),
            requests: VecDeque::new(),
            next_ticket: 0,
            leases: crate::Map::default(),
            lease_timers: BTreeSet::new(),
            damaged_before: None,
        }
    }

    /// Rebuilds a receiver from its durable state. Intents without a
    /// decided ledger entry are in doubt: they are recorded
    /// `outcome_unknown` and reported as [`ReceiverEvent::OutcomeUnknown`].
    pub fn restore(
        config: ReceiverConfig,
        registry: PolarityRegistry,
        snapshot: &ReceiverSnapshot,
        now: Timestamp,
    ) -> Self {
        let mut r = Self::new(config, registry);
        r.damaged_before = snapshot.damaged_before;
        for (key, l) in &snapshot.ledger {
            r.insert_entry(
                key.clone(),
                Entry {
                    digest: l.digest,
                    outcome: l.outcome,
                    reason: l.reason,
                    detail: l.detail.clone(),
                    deadline_at: l.deadline_at,
                    obligation: l.obligation.clone(),
                    intent: snapshot.intents.get(key).map(|i| i.intent.clone()),
                },
            );
        }
        r.restore_keys(snapshot);
        // Leases survive a restart with the effects they ride in; one that
        // lapsed while down is due at the first timer turn.
        let leased: Vec<(String, EffectValue)> = r
            .effects
            .iter()
            .filter(|(k, _)| k.ends_with(LEASE_SUFFIX))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (k, v) in leased {
            r.track_lease(&k, &v);
        }
        r.recover_in_doubt(snapshot, now);
        r
    }

    /// Loads the supersession state and the effects, holding each key
    /// under its issuer. A key written by a build whose keys did not carry
    /// their issuer (`kind/target/name`) is moved under the issuer the
    /// ledger names for it: the custodian of the entry whose obligation
    /// set its order, or whose effect wrote it, when exactly one custodian
    /// did. A key held under its issuer wins over a moved one. An order
    /// whose issuer cannot be derived stays a floor for every issuer on
    /// that key ([`Receiver::superseded`]); an effect whose issuer cannot
    /// be derived stays where it is, under its old key, which no issuer's
    /// authority reads (fail-closed: such a grant no longer authorizes).
    fn restore_keys(&mut self, snapshot: &ReceiverSnapshot) {
        // The one custodian behind each obligation id and each written
        // key, or None where several are.
        let mut by_id: crate::Map<&ObligationId, Option<&AgentId>> = crate::Map::default();
        let mut by_key: crate::Map<&str, Option<&AgentId>> = crate::Map::default();
        for ((custodian, id), l) in &snapshot.ledger {
            let e = by_id.entry(id).or_insert(Some(custodian));
            if *e != Some(custodian) {
                *e = None;
            }
            for w in &l.effect {
                let base = w.key.strip_suffix(LEASE_SUFFIX).unwrap_or(&w.key);
                if GovernedKey::new(base).is_ok_and(|k| k.issuer().is_none()) {
                    let e = by_key.entry(base).or_insert(Some(custodian));
                    if *e != Some(custodian) {
                        *e = None;
                    }
                }
            }
        }
        let mut moved: crate::Map<String, GovernedKey> = crate::Map::default();
        for (k, v) in &snapshot.key_sequences {
            if k.issuer().is_some() {
                self.key_seq.insert(k.clone(), v.clone());
            }
        }
        for (k, v) in &snapshot.key_sequences {
            if k.issuer().is_some() {
                continue;
            }
            let issuer = by_id.get(&v.1).copied().flatten();
            match issuer {
                Some(issuer) => {
                    let q = k.issued_by(issuer);
                    if self.key_seq.get(&q).is_none() {
                        self.key_seq.insert(q.clone(), v.clone());
                    }
                    moved.insert(k.to_string(), q);
                }
                None => {
                    self.legacy_key_seq.insert(k.to_string(), v.clone());
                }
            }
        }
        for (base, issuer) in by_key {
            if let (Some(issuer), false) = (issuer, moved.contains_key(base)) {
                if let Ok(k) = GovernedKey::new(base) {
                    moved.insert(base.to_string(), k.issued_by(issuer));
                }
            }
        }
        for (k, v) in &snapshot.effects {
            let (base, lease) = match k.strip_suffix(LEASE_SUFFIX) {
                Some(b) => (b, true),
                None => (k.as_str(), false),
            };
            let target = match moved.get(base) {
                Some(q) if lease => lease::lease_key(q.as_str()),
                Some(q) => q.to_string(),
                None => k.clone(),
            };
            if target != *k && snapshot.effects.contains_key(&target) {
                continue;
            }
            self.effects.insert(target, v.clone());
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ReceiverConfig {
        &self.config
    }

    /// Replaces the authority policy (C-AZ-1); it rules every obligation
    /// evaluated from now on. What was applied stays applied.
    pub fn set_authority(&mut self, policy: AuthorityPolicy) {
        self.config.authority = policy;
    }

    /// Receiver-owned effect state (including uncommitted writes).
    pub fn effects(&self) -> &BTreeMap<String, EffectValue> {
        &self.effects
    }

    /// Applications performed by this instance (since start or restore).
    pub fn applications(&self) -> u64 {
        self.applications
    }

    /// When [`Receiver::handle_timeout`] must next run: the earliest
    /// moment an outstanding request can no longer be applied, or a lease
    /// lapses.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        let request = self.expiries.first().map(|(at, _)| *at);
        let lease = self.lease_timers.first().map(|(at, _)| *at);
        match (request, lease) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Declines `expired` every outstanding request whose deadline (less
    /// the skew margin) has come: the decision did not come in time, and a
    /// receiver never applies late (C-DL-1). Reports every lease that
    /// lapsed ([`ReceiverEvent::LeaseLapsed`]); the authority itself ends
    /// at read time ([`Receiver::authority`]), timer or not.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        while let Some(&(at, ticket)) = self.expiries.first() {
            if at > now {
                break;
            }
            self.expire(now, ticket);
        }
        while let Some((at, key)) = self.lease_timers.first().cloned() {
            if at > now {
                break;
            }
            self.lease_timers.remove(&(at, key.clone()));
            if let Some(lease_until) = self.leases.remove(&key) {
                if self.authority(&key, now) == (Authority::Lapsed { lease_until }) {
                    self.outbox
                        .event(ReceiverEvent::LeaseLapsed { key, lease_until });
                }
            }
        }
    }

    /// The records to commit before the acks that report them.
    #[must_use]
    pub fn poll_records(&mut self) -> Option<RecordBatch> {
        self.outbox.poll_records()
    }

    /// Marks a polled batch durable.
    pub fn handle_committed(&mut self, token: CommitToken) {
        self.outbox.committed(token);
    }

    /// The next frame to send. Consecutive releasable acks to the same
    /// custodian are coalesced into one frame.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        let mut t = self.outbox.poll_transmit()?;
        if let Message::Acks(acks) = &mut t.message {
            while acks.len() < MAX_ACKS_PER_FRAME {
                let same = matches!(
                    self.outbox.peek_transmit(),
                    Some(Transmit { to, message: Message::Acks(_) }) if *to == t.to
                );
                if !same {
                    break;
                }
                if let Some(Transmit {
                    message: Message::Acks(more),
                    ..
                }) = self.outbox.poll_transmit()
                {
                    acks.extend(more);
                }
            }
        }
        Some(t)
    }

    /// The next event, once its records are committed.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<ReceiverEvent> {
        self.outbox.poll_event()
    }

    /// Records emitted but not yet committed.
    pub fn uncommitted_records(&self) -> u64 {
        self.outbox.uncommitted()
    }
}
