//! The stateright model: which actions are enabled in a state and what
//! each does to the real state machines.

use std::time::Duration;

use abhyasa_core::custody::{
    Applier, ApplyContext, ApplyDecision, Custodian, CustodianConfig, CustodyProfile, EffectValue,
    EffectWrite, LedgerOutcome, Received, Receiver, ReceiverConfig, ReceiverSnapshot, Transmit,
};
use abhyasa_core::polarity::{PolarityRegistry, ANUMATI_KIND};
use abhyasa_core::principal::{Resolution, WeightRange};
use abhyasa_core::wire::Message;
use abhyasa_core::{
    AgentId, DeclinePolicy, DeclineReason, GovernedKey, Obligation, ObligationId, RetryBackoff,
    Timestamp,
};
use serde_json::json;

use crate::config::CheckConfig;
use crate::encode::fold_principal_in;
use crate::fingerprint::{fingerprint, Fixed};
use crate::system::{
    at, carries_application, flag, CustodianSide, Frame, Ghost, Network, ReceiverSide, State,
};

/// What the receiver's applier answers when it is consulted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Apply (the effect is committed with the ledger entry).
    Apply,
    /// Accountably refuse (`policy`).
    Decline,
    /// Not yet.
    Defer,
}

/// One step of the composed system.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// The principal hands obligation `i` to the custodian.
    Offer(usize),
    /// The custodian runs its due timers (`handle_timeout(now)`).
    CustodianTimeout,
    /// The custodian's driver commits its write buffer.
    CustodianCommit,
    /// The custodian process crashes and restarts from its durable state.
    CustodianCrash,
    /// The principal resolves a surfaced decline (`true`: apply `safe(O)`).
    Resolve(usize, bool),
    /// The network delivers a frame to the custodian.
    DeliverToCustodian(String),
    /// The network delivers an obligation frame to the receiver, whose
    /// applier answers as given if it is consulted.
    DeliverToReceiver(String, Decision),
    /// The receiver completes a deferred obligation.
    CompleteDeferred(usize, Decision),
    /// The receiver's driver commits its write buffer.
    ReceiverCommit,
    /// The receiver process crashes and restarts from its durable state.
    ReceiverCrash,
    /// The network loses one copy of a frame.
    Drop(String),
    /// The network duplicates a frame.
    Duplicate(String),
    /// One second passes.
    Tick,
    /// The clock jumps to the custodian's next timer.
    AdvanceToTimeout,
}

/// The composed custodian / receiver / network / clock system over the
/// real `abhyasa-core` state machines.
pub struct AbhyasaModel {
    config: CheckConfig,
    obligations: Vec<Obligation>,
    keys: Vec<GovernedKey>,
    admissible: Vec<bool>,
    custodian_id: AgentId,
    receiver_id: AgentId,
    custodian_config: CustodianConfig,
    receiver_config: ReceiverConfig,
    registry: PolarityRegistry,
    t0: Timestamp,
}

/// Time 0 of every run.
pub const T0: Timestamp = Timestamp::from_unix_seconds(1_780_000_000);

impl AbhyasaModel {
    /// Builds the model; fails if the configuration cannot be offered (an
    /// incoherent profile, an unreadable obligation).
    pub fn new(config: CheckConfig) -> Result<Self, String> {
        let custodian_id = AgentId::new("custodian").map_err(|e| e.to_string())?;
        let receiver_id = AgentId::new("receiver").map_err(|e| e.to_string())?;
        let registry = PolarityRegistry::standard();
        let mut custodian_config = CustodianConfig::new(custodian_id.clone());
        custodian_config.default_profile = CustodyProfile {
            backoff: RetryBackoff {
                base: Duration::from_secs(config.backoff_base_seconds),
                cap: Duration::from_secs(config.backoff_cap_seconds),
                jitter: 0.0,
            },
            decline_policy: config.decline_policy,
        };
        let mut receiver_config = ReceiverConfig::new(receiver_id.clone());
        receiver_config.skew_margin = Duration::from_secs(config.skew_margin_seconds);
        let mut obligations = Vec::new();
        let mut keys = Vec::new();
        let mut admissible = Vec::new();
        for spec in &config.obligations {
            let ob = Obligation::builder()
                .id(spec.id)
                .kind(ANUMATI_KIND)
                .target(receiver_id.as_str())
                .payload(json!({"scope": spec.scope, "decision": spec.decision}))
                .deadline_seconds(i64::try_from(config.deadline_seconds).unwrap_or(i64::MAX))
                .max_retries(i64::from(config.max_retries))
                .created_at(T0)
                .sequence(spec.sequence)
                .build()
                .map_err(|e| format!("{}: {e}", spec.label))?;
            let class = registry
                .classify(&ob)
                .map_err(|e| format!("{}: {e}", spec.label))?;
            let key = class
                .key
                .clone()
                .ok_or_else(|| format!("{}: no governed key", spec.label))?;
            // Every obligation must be offerable under these bounds.
            let mut scratch = Custodian::new(custodian_config.clone(), registry.clone());
            scratch
                .offer(T0, ob.clone())
                .map_err(|e| format!("{}: {e}", spec.label))?;
            admissible.push(class.is_admissible());
            keys.push(key);
            obligations.push(ob);
        }
        Ok(Self {
            config,
            obligations,
            keys,
            admissible,
            custodian_id,
            receiver_id,
            custodian_config,
            receiver_config,
            registry,
            t0: T0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &CheckConfig {
        &self.config
    }

    /// The obligations, in configuration order.
    pub fn obligations(&self) -> &[Obligation] {
        &self.obligations
    }

    /// Trace label of obligation `i`.
    pub fn label(&self, i: usize) -> &'static str {
        self.config.obligations[i].label
    }

    /// Issuance sequence of obligation `i`.
    pub fn sequence(&self, i: usize) -> u64 {
        self.config.obligations[i].sequence
    }

    /// Governed key of obligation `i`.
    pub fn key(&self, i: usize) -> &GovernedKey {
        &self.keys[i]
    }

    /// The distinct governed keys.
    pub fn distinct_keys(&self) -> Vec<&GovernedKey> {
        let mut k: Vec<&GovernedKey> = self.keys.iter().collect();
        k.sort();
        k.dedup();
        k
    }

    /// Whether obligation `i` goes under custody (AC-1).
    pub fn admissible(&self, i: usize) -> bool {
        self.admissible[i]
    }

    /// The custodian's agent id.
    pub fn custodian_id(&self) -> &AgentId {
        &self.custodian_id
    }

    /// Principal-side weight range.
    pub fn weight_range(&self) -> WeightRange {
        self.custodian_config.weight_range
    }

    /// What every fingerprint of this model's states is taken with.
    fn fixed(&self) -> Fixed<'_> {
        Fixed {
            range: self.weight_range(),
            obligations: self.obligations(),
            custodian: self.custodian_id(),
        }
    }

    /// Index of an obligation id.
    pub fn index_of(&self, id: &ObligationId) -> Option<usize> {
        self.obligations.iter().position(|o| o.id() == id)
    }

    /// `now` of a state as a timestamp.
    pub fn now(&self, s: &State) -> Timestamp {
        at(self.t0, s.now)
    }

    /// The absolute deadline of obligation `i`.
    pub fn deadline_at(&self, i: usize) -> Timestamp {
        self.obligations[i].deadline_at()
    }

    /// Seconds since time 0 of a timestamp, rounded up.
    pub fn seconds(&self, t: Timestamp) -> u64 {
        let us = t.unix_micros() - self.t0.unix_micros();
        u64::try_from(us.max(0)).unwrap_or(0).div_ceil(1_000_000)
    }

    /// Whether the custodian knows obligation `i` (pending or terminal).
    pub fn known(&self, s: &State, i: usize) -> bool {
        let id = self.obligations[i].id();
        s.custodian.live.is_pending(id) || s.custodian.live.terminal(id).is_some()
    }

    /// Whether the decline policy surfaces declines.
    pub fn surfaces(&self) -> bool {
        self.config.decline_policy == DeclinePolicy::Surface
    }

    fn initial(&self) -> State {
        let n = self.obligations.len();
        let mut s = State {
            now: 0,
            custodian: CustodianSide {
                live: Custodian::new(self.custodian_config.clone(), self.registry.clone()),
                durable: Default::default(),
                buffer: Vec::new(),
                token: None,
                inputs: Vec::new(),
                crashes_left: self.config.custodian_crashes,
            },
            receiver: ReceiverSide {
                live: Receiver::new(self.receiver_config.clone(), self.registry.clone()),
                durable: ReceiverSnapshot::default(),
                buffer: Vec::new(),
                token: None,
                inputs: Vec::new(),
                crashes_left: self.config.receiver_crashes,
                provisional: Vec::new(),
            },
            network: Network::default(),
            ghost: Ghost {
                applications: vec![0; n],
                late_applications: 0,
                frames_sent: vec![0; n],
                flags: 0,
            },
            duplications_left: self.config.duplications,
            crashes_left: self.config.total_crashes,
            fp: 0,
        };
        s.fp = fingerprint(&self.fixed(), &s);
        s
    }

    fn effect(&self, ob: &Obligation) -> Vec<EffectWrite> {
        let key = self
            .index_of(ob.id())
            .map_or_else(|| ob.id().to_string(), |i| self.keys[i].to_string());
        vec![EffectWrite {
            key,
            value: EffectValue::Json(json!({
                "obligation": ob.id().as_str(),
                "sequence": ob.sequence().map_or(0, |s| s.0),
            })),
        }]
    }

    fn send(&self, s: &mut State, transmits: Vec<Transmit>) {
        for t in transmits {
            if !self.config.benign_acks_in_flight && self.benign_only(&t.message) {
                continue;
            }
            if let Message::Obligation(ob) = &t.message {
                if let Some(i) = self.index_of(ob.id()) {
                    s.ghost.frames_sent[i] = s.ghost.frames_sent[i].saturating_add(1);
                }
            }
            s.network.push(Frame {
                to_receiver: t.to == self.receiver_id,
                message: t.message,
            });
        }
    }

    fn benign_only(&self, msg: &Message) -> bool {
        match msg {
            Message::Acks(acks) => acks.iter().all(|a| {
                self.index_of(&a.obligation_id)
                    .is_some_and(|i| !self.admissible[i])
            }),
            _ => false,
        }
    }

    fn take_effect(s: &mut State, i: usize, late: bool) {
        s.ghost.applications[i] = s.ghost.applications[i].saturating_add(1);
        if late {
            s.ghost.late_applications = s.ghost.late_applications.saturating_add(1);
        }
    }

    /// Records an application the receiver reported for obligation `i`: it
    /// takes effect with its ledger record, or at once if no record of this
    /// input carries it.
    fn applied(&self, s: &mut State, i: usize, emitted: &[abhyasa_core::custody::Record]) {
        let skew = Duration::from_secs(self.config.skew_margin_seconds);
        let late = self.now(s).saturating_add(skew) >= self.deadline_at(i);
        if carries_application(emitted, self.obligations[i].id().as_str()) {
            s.receiver.provisional.push((i, late));
        } else {
            Self::take_effect(s, i, late);
        }
    }

    fn custodian_input(&self, s: &mut State, input: String) {
        let before = s.custodian.buffer.len();
        let tx = s.custodian.after_input(Some(input));
        let now = self.now(s);
        // AB-2/AB-4: no retry is scheduled at or after the absolute deadline.
        for r in &s.custodian.buffer[before..] {
            if let abhyasa_core::custody::Record::AttemptMade { obligation_id, .. } = r {
                if self
                    .index_of(obligation_id)
                    .is_some_and(|i| now >= self.deadline_at(i))
                {
                    s.ghost.flags |= flag::RETRY_AFTER_DEADLINE;
                }
            }
        }
        self.send(s, tx);
    }

    fn receiver_input(&self, s: &mut State, input: String, result: &Received, i: Option<usize>) {
        let (tx, emitted) = s.receiver.after_input(Some(input));
        if let (Received::Applied, Some(i)) = (result, i) {
            self.applied(s, i, &emitted);
        }
        self.send(s, tx);
    }

    fn step(&self, s: &State, a: &Action) -> Option<State> {
        let mut n = s.clone();
        let now = self.now(s);
        let input = format!("{a:?}@{}", s.now);
        match a {
            Action::Offer(i) => {
                n.custodian
                    .live
                    .offer(now, self.obligations[*i].clone())
                    .ok()?;
                self.custodian_input(&mut n, input);
            }
            Action::CustodianTimeout => {
                n.custodian.live.handle_timeout(now);
                self.custodian_input(&mut n, input);
            }
            Action::CustodianCommit => {
                let tx = n.custodian.commit();
                self.send(&mut n, tx);
            }
            Action::CustodianCrash => {
                n.crashes_left = n.crashes_left.checked_sub(1)?;
                let c = &mut n.custodian;
                c.crashes_left = c.crashes_left.checked_sub(1)?;
                c.live = Custodian::restore(
                    self.custodian_config.clone(),
                    self.registry.clone(),
                    &c.durable,
                );
                c.buffer.clear();
                c.token = None;
                c.inputs.clear();
                let tx = c.after_input(None);
                self.send(&mut n, tx);
            }
            Action::Resolve(i, apply) => {
                let how = if *apply {
                    Resolution::ApplySafe
                } else {
                    Resolution::Dismiss
                };
                n.custodian
                    .live
                    .resolve_decision(now, self.obligations[*i].id(), how)?;
                self.custodian_input(&mut n, input);
            }
            Action::DeliverToCustodian(key) => {
                let frame = n.network.take(key)?;
                let c = &mut n.custodian.live;
                match &frame.message {
                    Message::Acks(acks) => {
                        for ack in acks {
                            let _ = c.handle_ack(now, &self.receiver_id, ack);
                        }
                    }
                    Message::Error(e) => c.handle_error(now, &self.receiver_id, e),
                    Message::StatusReply(r) => c.handle_status_reply(now, &self.receiver_id, r),
                    Message::Obligation(_) | Message::StatusQuery(_) | Message::Relay(_) => {}
                }
                self.custodian_input(&mut n, input);
            }
            Action::DeliverToReceiver(key, decision) => {
                let frame = n.network.take(key)?;
                let Message::Obligation(ob) = frame.message else {
                    return Some(self.finish(s, n, a));
                };
                let i = self.index_of(ob.id());
                let mut applier = ModelApplier {
                    model: self,
                    decision: *decision,
                    consulted: false,
                    redecided: false,
                };
                let result =
                    n.receiver
                        .live
                        .handle_obligation(now, &self.custodian_id, ob, &mut applier);
                // The applier's answer only matters when it is asked; the
                // other answers would repeat the `Apply` successor.
                if !applier.consulted && *decision != Decision::Apply {
                    return None;
                }
                if applier.redecided && *decision == Decision::Defer && !self.config.defer_again {
                    return None;
                }
                self.receiver_input(&mut n, input, &result, i);
            }
            Action::CompleteDeferred(i, decision) => {
                let ob = &self.obligations[*i];
                let d = match decision {
                    Decision::Apply => ApplyDecision::Apply(self.effect(ob)),
                    Decision::Decline | Decision::Defer => ApplyDecision::Decline {
                        reason: DeclineReason::Policy,
                        detail: None,
                    },
                };
                let result = n
                    .receiver
                    .live
                    .complete_deferred(now, &self.custodian_id, ob.id(), d)
                    .ok()?;
                self.receiver_input(&mut n, input, &result, Some(*i));
            }
            Action::ReceiverCommit => {
                let (done, tx) = n.receiver.commit();
                for (i, late) in done {
                    Self::take_effect(&mut n, i, late);
                }
                self.send(&mut n, tx);
            }
            Action::ReceiverCrash => {
                n.crashes_left = n.crashes_left.checked_sub(1)?;
                let r = &mut n.receiver;
                r.crashes_left = r.crashes_left.checked_sub(1)?;
                r.live = Receiver::restore(
                    self.receiver_config.clone(),
                    self.registry.clone(),
                    &r.durable,
                    now,
                );
                r.buffer.clear();
                r.token = None;
                r.inputs.clear();
                // Effects riding in the lost buffer never happened.
                r.provisional.clear();
                let (tx, _) = r.after_input(None);
                self.send(&mut n, tx);
            }
            Action::Drop(key) => {
                n.network.take(key)?;
            }
            Action::Duplicate(key) => {
                n.duplications_left = n.duplications_left.checked_sub(1)?;
                if !n.network.duplicate(key) {
                    return None;
                }
            }
            Action::Tick => n.now += 1,
            Action::AdvanceToTimeout => {
                let t = n.custodian.live.poll_timeout()?;
                n.now = self.seconds(t);
            }
        }
        let n = self.finish(s, n, a);
        (n.fp != s.fp).then_some(n)
    }

    /// Checks the transition properties and fingerprints the new state.
    fn finish(&self, old: &State, mut n: State, a: &Action) -> State {
        let crash_c = *a == Action::CustodianCrash;
        let crash_r = *a == Action::ReceiverCrash;
        // Durable state changes only when a side commits.
        let c_commit = *a == Action::CustodianCommit;
        let (p_old, p_new) = if c_commit {
            (
                fold_principal_in(&old.custodian.durable, self.weight_range()),
                fold_principal_in(&n.custodian.durable, self.weight_range()),
            )
        } else {
            Default::default()
        };
        for key in self.distinct_keys() {
            let seq = |p: &abhyasa_core::principal::PrincipalState| {
                p.authorization(key).and_then(|e| e.sequence)
            };
            // Supersession never regresses: durable state across every step
            // (crashes included), live state across every other step.
            if seq(&p_new) < seq(&p_old)
                || (!crash_c
                    && seq(n.custodian.live.principal()) < seq(old.custodian.live.principal()))
            {
                n.ghost.flags |= flag::PRINCIPAL_REGRESSED;
            }
            // The receiver holds the key under its issuer (C-AZ-2).
            let held = key.issued_by(self.custodian_id());
            let rseq = |d: &ReceiverSnapshot| d.key_sequences.get(&held).map(|(s, _)| *s);
            if rseq(&n.receiver.durable) < rseq(&old.receiver.durable)
                || (!crash_r
                    && effect_sequence(&n.receiver.live, &held)
                        < effect_sequence(&old.receiver.live, &held))
                || effect_sequence_durable(&n.receiver.durable, &held)
                    < effect_sequence_durable(&old.receiver.durable, &held)
            {
                n.ghost.flags |= flag::RECEIVER_REGRESSED;
            }
        }
        let (od, nd) = (&old.custodian.durable, &n.custodian.durable);
        let unchanged = std::collections::HashMap::new();
        let terminal = if c_commit { &od.terminal } else { &unchanged };
        for (id, t) in terminal {
            if nd.terminal.get(id).map(|x| x.state) != Some(t.state) {
                n.ghost.flags |= flag::TERMINAL_REOPENED;
            }
        }
        let unchanged = std::collections::HashMap::new();
        let pending = if c_commit { &od.pending } else { &unchanged };
        for (id, p) in pending {
            let ok = match nd.pending.get(id) {
                Some(q) => q.attempts >= p.attempts,
                None => nd.terminal.contains_key(id),
            };
            if !ok {
                n.ghost.flags |= flag::ATTEMPTS_RESET;
            }
        }
        n.fp = fingerprint(&self.fixed(), &n);
        n
    }
}

/// The sequence of the effect in force on `key` in a receiver's live
/// effect state.
pub fn effect_sequence(r: &Receiver, key: &GovernedKey) -> Option<u64> {
    effect_seq(r.effects().get(key.as_str()))
}

/// The sequence of the effect in force on `key` in durable effect state.
pub fn effect_sequence_durable(d: &ReceiverSnapshot, key: &GovernedKey) -> Option<u64> {
    effect_seq(d.effects.get(key.as_str()))
}

fn effect_seq(v: Option<&EffectValue>) -> Option<u64> {
    match v {
        Some(EffectValue::Json(j)) => j.get("sequence").and_then(serde_json::Value::as_u64),
        _ => None,
    }
}

/// The receiver's applier: answers as the action says and notes whether
/// it was consulted at all.
struct ModelApplier<'a> {
    model: &'a AbhyasaModel,
    decision: Decision,
    consulted: bool,
    redecided: bool,
}

impl Applier for ModelApplier<'_> {
    fn decide(&mut self, ctx: &ApplyContext<'_>, ob: &Obligation) -> ApplyDecision {
        self.consulted = true;
        self.redecided = ctx.previously_deferred;
        match self.decision {
            Decision::Apply => ApplyDecision::Apply(self.model.effect(ob)),
            Decision::Decline => ApplyDecision::Decline {
                reason: DeclineReason::Policy,
                detail: None,
            },
            Decision::Defer => ApplyDecision::Defer { detail: None },
        }
    }
}

/// The transitions stateright explores (the [`Model`] impl delegates here).
impl AbhyasaModel {
    /// The initial state, inside the configured scope.
    pub(crate) fn initial_states(&self) -> Vec<State> {
        let mut s = None;
        (self.config.scope)(&mut || s = Some(self.initial()));
        s.into_iter().collect()
    }

    /// The actions enabled in `s`.
    pub(crate) fn enabled(&self, s: &State, out: &mut Vec<Action>) {
        // A side with uncommitted records commits or crashes next. This is
        // a partial-order reduction, not a restriction: nothing in the
        // buffer is visible to anyone before the commit (write-ahead), so
        // any other step taken in between commutes with the commit, and a
        // crash before the commit is still explored.
        if !s.custodian.buffer.is_empty() || !s.receiver.buffer.is_empty() {
            if !s.custodian.buffer.is_empty() {
                out.push(Action::CustodianCommit);
                if s.custodian.crashes_left > 0 && s.crashes_left > 0 {
                    out.push(Action::CustodianCrash);
                }
            }
            if !s.receiver.buffer.is_empty() {
                out.push(Action::ReceiverCommit);
                if s.receiver.crashes_left > 0 && s.crashes_left > 0 {
                    out.push(Action::ReceiverCrash);
                }
            }
            return;
        }
        let now = self.now(s);
        let timer = s.custodian.live.poll_timeout();
        if s.now < self.config.offer_window_seconds {
            for i in 0..self.obligations.len() {
                // Issuance order: a sequence is offered after the older
                // ones on its key.
                let in_order = (0..self.obligations.len()).all(|j| {
                    self.keys[j] != self.keys[i]
                        || self.sequence(j) >= self.sequence(i)
                        || self.known(s, j)
                });
                if !self.known(s, i) && in_order {
                    out.push(Action::Offer(i));
                }
            }
        }
        if timer.is_some_and(|t| t <= now) {
            out.push(Action::CustodianTimeout);
        }
        if s.custodian.crashes_left > 0 && s.crashes_left > 0 {
            out.push(Action::CustodianCrash);
        }
        if self.surfaces() {
            for (i, ob) in self.obligations.iter().enumerate() {
                if s.custodian.live.principal().decision(ob.id()).is_some() {
                    out.push(Action::Resolve(i, true));
                    out.push(Action::Resolve(i, false));
                }
            }
        }
        for (key, (frame, _)) in &s.network.frames {
            if frame.to_receiver {
                out.push(Action::DeliverToReceiver(key.clone(), Decision::Apply));
                out.push(Action::DeliverToReceiver(key.clone(), Decision::Decline));
                if self.config.allow_defer {
                    out.push(Action::DeliverToReceiver(key.clone(), Decision::Defer));
                }
            } else {
                out.push(Action::DeliverToCustodian(key.clone()));
            }
            out.push(Action::Drop(key.clone()));
            if s.duplications_left > 0 {
                out.push(Action::Duplicate(key.clone()));
            }
        }
        for (i, ob) in self.obligations.iter().enumerate() {
            if s.receiver.live.ledger_outcome(&self.custodian_id, ob.id())
                == Some(LedgerOutcome::Deferred)
            {
                out.push(Action::CompleteDeferred(i, Decision::Apply));
                out.push(Action::CompleteDeferred(i, Decision::Decline));
            }
        }
        if s.receiver.crashes_left > 0 && s.crashes_left > 0 {
            out.push(Action::ReceiverCrash);
        }
        if s.now < self.config.horizon_seconds {
            out.push(Action::Tick);
            if let Some(t) = timer {
                let t = self.seconds(t);
                if t > s.now + 1 && t <= self.config.horizon_seconds {
                    out.push(Action::AdvanceToTimeout);
                }
            }
        }
    }

    /// The state `a` leads to from `s`, inside the configured scope.
    pub(crate) fn next(&self, s: &State, a: Action) -> Option<State> {
        let mut out = None;
        (self.config.scope)(&mut || out = self.step(s, &a));
        out
    }
}
