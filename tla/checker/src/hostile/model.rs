//! The hostile-relay model: two issuers' real custodians and the edge's
//! real receiver, every frame between them through a relay that holds,
//! reorders, loses, duplicates and replays (but cannot forge: a frame is
//! delivered as the peer that sent it).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use abhyasa_core::custody::{
    lease, Custodian, CustodianConfig, CustodianSnapshot, CustodyProfile, LedgerOutcome, Receiver,
    ReceiverConfig, ReceiverSnapshot, Record, StandardApplier, TerminalState, Transmit,
};
use abhyasa_core::polarity::{PolarityRegistry, ANUMATI_KIND};
use abhyasa_core::wire::Message;
use abhyasa_core::{AgentId, Obligation, ObligationId, RetryBackoff, Timestamp};
use serde_json::json;
use sha2::{Digest as _, Sha256};

use super::config::{HostileConfig, SecondIssuer};
use crate::encode::{custodian_snapshot_in, message, receiver_snapshot, Sink};
use crate::system::{at, describe_message};

/// Time 0 of every run.
pub const T0: Timestamp = Timestamp::from_unix_seconds(1_780_000_000);

/// Alice: the principal's custodian.
pub const ALICE: usize = 0;
/// The second issuer (a pinned peer of the edge, e.g. a relay's identity).
pub const SECOND: usize = 1;

/// A frame the relay carries: it knows who sent it and to whom, and
/// delivers it as coming from that peer (sealed frames cannot be forged).
#[derive(Clone, Debug)]
pub struct HFrame {
    /// The authenticated sender.
    pub from: AgentId,
    /// The destination.
    pub to: AgentId,
    /// The message.
    pub message: Message,
}

/// One issuer: its live custodian and the fold of its committed records.
#[derive(Clone, Debug)]
pub struct IssuerSide {
    /// The live state machine.
    pub live: Custodian,
    /// Every committed record, folded.
    pub durable: CustodianSnapshot,
}

/// The edge: its live receiver and the fold of its committed records.
#[derive(Clone, Debug)]
pub struct EdgeSide {
    /// The live state machine.
    pub live: Receiver,
    /// Every committed record, folded.
    pub durable: ReceiverSnapshot,
}

/// Ground truth read from the edge's committed ledger records.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HGhost {
    /// (issuer, effect key) of every write an applied obligation made.
    pub writes: BTreeSet<(String, String)>,
    /// The effect keys alice's latest decision, a withhold, wrote when the
    /// edge applied it.
    pub withdrawn_keys: BTreeSet<String>,
}

/// The composed state.
#[derive(Clone)]
pub struct HState {
    /// Seconds since time 0.
    pub now: u64,
    /// Alice, then the second issuer (present in every configuration; it
    /// offers nothing without one).
    pub issuers: Vec<IssuerSide>,
    /// The edge.
    pub edge: EdgeSide,
    /// Frames in flight, by key, with their copies.
    pub in_flight: BTreeMap<String, (HFrame, u8)>,
    /// Every frame the relay has carried (what it can replay).
    pub seen: BTreeMap<String, HFrame>,
    /// Copies the relay may still put back in flight.
    pub replays_left: u8,
    /// Ground truth.
    pub ghost: HGhost,
    fp: u128,
}

impl std::hash::Hash for HState {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.fp.hash(h);
    }
}

impl PartialEq for HState {
    fn eq(&self, other: &Self) -> bool {
        self.fp == other.fp
    }
}

impl std::fmt::Debug for HState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HState(t={}s, fp={:032x})", self.now, self.fp)
    }
}

/// One step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HAction {
    /// An issuer's caller offers obligation `i` to its node's custodian.
    Offer(usize),
    /// Issuer `j`'s custodian runs its due timers.
    IssuerTimeout(usize),
    /// The edge's receiver runs its due timers (lease lapses).
    EdgeTimeout,
    /// The relay delivers one copy of a frame in flight.
    Deliver(String),
    /// The relay loses one copy of a frame in flight.
    Drop(String),
    /// The relay puts a copy of a frame it carried back in flight.
    Replay(String),
    /// One second passes.
    Tick,
    /// The clock jumps to the next issuer timer.
    AdvanceToTimeout,
}

/// The hostile-relay model over the real `abhyasa-core` state machines.
pub struct HostileModel {
    config: HostileConfig,
    registry: PolarityRegistry,
    ids: [AgentId; 2],
    edge_id: AgentId,
    issuer_configs: [CustodianConfig; 2],
    edge_config: ReceiverConfig,
    /// (label, issuer, obligation as its caller hands it over).
    obligations: Vec<(&'static str, usize, Obligation)>,
}

impl HostileModel {
    /// Builds the model.
    pub fn new(config: HostileConfig) -> Result<Self, String> {
        let id = |s: &str| AgentId::new(s).map_err(|e| e.to_string());
        let ids = [id("alice")?, id("relay")?];
        let edge_id = id("edge")?;
        let profile = CustodyProfile {
            backoff: RetryBackoff {
                base: Duration::from_secs(config.backoff_base_seconds),
                cap: Duration::from_secs(config.backoff_cap_seconds),
                jitter: 0.0,
            },
            ..CustodyProfile::default()
        };
        let issuer_configs = ids.clone().map(|a| {
            let mut c = CustodianConfig::new(a);
            c.default_profile = profile;
            c
        });
        let mut edge_config = ReceiverConfig::new(edge_id.clone());
        edge_config.skew_margin = Duration::from_secs(config.skew_margin_seconds);
        let build = |oid: &str, decision: &str, seq: Option<u64>| {
            let mut b = Obligation::builder()
                .id(oid)
                .kind(ANUMATI_KIND)
                .target(edge_id.as_str())
                .payload(json!({"scope": "s", "decision": decision}))
                .deadline_seconds(i64::try_from(config.deadline_seconds).unwrap_or(i64::MAX))
                .max_retries(i64::from(config.max_retries))
                .created_at(T0);
            if let Some(s) = seq {
                b = b.sequence(s);
            }
            b.build().map_err(|e| format!("{oid}: {e}"))
        };
        let mut obligations = Vec::new();
        for (n, d) in config.alice.iter().enumerate() {
            let label: &'static str = ["A1", "A2", "A3", "A4"]
                .get(n)
                .ok_or("at most 4 decisions of alice")?;
            let decision = if d.grant { "grant" } else { "revoke" };
            let ob = build(&format!("a{}", n + 1), decision, d.caller_sequence)?;
            obligations.push((label, ALICE, ob));
        }
        if config.second_issuer == SecondIssuer::Peer {
            obligations.push((
                "XG",
                SECOND,
                build("xg", "grant", config.second_grant_sequence)?,
            ));
        }
        Ok(Self {
            config,
            registry: PolarityRegistry::standard(),
            ids,
            edge_id,
            issuer_configs,
            edge_config,
            obligations,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &HostileConfig {
        &self.config
    }

    /// Trace label of obligation `i`.
    pub fn label(&self, i: usize) -> &'static str {
        self.obligations[i].0
    }

    /// Obligation `i` as its caller hands it to the custodian.
    pub fn obligation(&self, i: usize) -> &Obligation {
        &self.obligations[i].2
    }

    /// How many obligations the configuration has.
    pub fn obligation_count(&self) -> usize {
        self.obligations.len()
    }

    /// The issuer of obligation `i`.
    pub fn issuer_of(&self, i: usize) -> usize {
        self.obligations[i].1
    }

    /// Agent id of issuer `j`.
    pub fn issuer_id(&self, j: usize) -> &AgentId {
        &self.ids[j]
    }

    /// The edge's agent id.
    pub fn edge_id(&self) -> &AgentId {
        &self.edge_id
    }

    /// `now` of a state as a timestamp.
    pub fn now(&self, s: &HState) -> Timestamp {
        at(T0, s.now)
    }

    /// The label of an obligation id.
    pub fn label_of(&self, id: &ObligationId) -> String {
        self.obligations
            .iter()
            .find(|(_, _, o)| o.id() == id)
            .map_or_else(|| id.to_string(), |(l, _, _)| (*l).to_string())
    }

    /// Index of alice's latest decision.
    pub fn alice_latest(&self) -> usize {
        self.config.alice.len() - 1
    }

    /// Whether alice's latest decision withholds the scope.
    pub fn latest_withholds(&self) -> bool {
        !self.config.alice[self.alice_latest()].grant
    }

    /// Index of the second issuer's grant, if there is one.
    pub fn second_grant(&self) -> Option<usize> {
        (self.obligations.len() > self.config.alice.len()).then_some(self.config.alice.len())
    }

    /// Whether issuer `j`'s custodian knows obligation `i` (offered).
    pub fn offered(&self, s: &HState, i: usize) -> bool {
        let id = self.obligations[i].2.id();
        let c = &s.issuers[self.obligations[i].1].live;
        c.is_pending(id) || c.terminal(id).is_some()
    }

    /// The durable custody state of obligation `i` at its issuer.
    pub fn terminal(&self, s: &HState, i: usize) -> Option<TerminalState> {
        let (_, j, ob) = &self.obligations[i];
        s.issuers[*j].durable.terminal.get(ob.id()).map(|t| t.state)
    }

    /// The edge's durable ledger outcome for obligation `i`, with reason.
    pub fn ledger(
        &self,
        s: &HState,
        i: usize,
    ) -> Option<(LedgerOutcome, Option<abhyasa_core::DeclineReason>)> {
        let (_, j, ob) = &self.obligations[i];
        let key = (self.ids[*j].clone(), ob.id().clone());
        s.edge
            .durable
            .ledger
            .get(&key)
            .map(|l| (l.outcome, l.reason))
    }

    /// The canonical key of a frame: a readable summary, then a hash of
    /// sender, destination and the message's canonical form.
    pub fn frame_key(f: &HFrame) -> String {
        let mut h = Sink(Sha256::new());
        // Writing into a hasher cannot fail.
        let _ = write!(h, "{}>{}|", f.from, f.to);
        let _ = message(&mut h, &f.message);
        let d = h.0.finalize();
        format!(
            "{}->{} {} #{:02x}{:02x}{:02x}",
            f.from,
            f.to,
            describe_message(&f.message),
            d[0],
            d[1],
            d[2]
        )
    }

    fn initial(&self) -> HState {
        let mut s = HState {
            now: 0,
            issuers: self
                .issuer_configs
                .iter()
                .map(|c| IssuerSide {
                    live: Custodian::new(c.clone(), self.registry.clone()),
                    durable: CustodianSnapshot::default(),
                })
                .collect(),
            edge: EdgeSide {
                live: Receiver::new(self.edge_config.clone(), self.registry.clone()),
                durable: ReceiverSnapshot::default(),
            },
            in_flight: BTreeMap::new(),
            seen: BTreeMap::new(),
            replays_left: self.config.replays,
            ghost: HGhost::default(),
            fp: 0,
        };
        s.fp = self.fingerprint(&s);
        s
    }

    /// True for acks that only concern best-effort obligations: their
    /// custodian ignores them (no custody meaning), so carrying them only
    /// adds no-op deliveries.
    fn best_effort_only(&self, m: &Message) -> bool {
        match m {
            Message::Acks(acks) => acks.iter().all(|a| {
                self.obligations
                    .iter()
                    .find(|(_, _, o)| *o.id() == a.obligation_id)
                    .is_some_and(|(_, _, o)| {
                        self.registry.classify(o).is_ok_and(|c| !c.is_admissible())
                    })
            }),
            _ => false,
        }
    }

    fn send(&self, s: &mut HState, from: &AgentId, transmits: Vec<Transmit>) {
        for t in transmits {
            if self.best_effort_only(&t.message) {
                continue;
            }
            let f = HFrame {
                from: from.clone(),
                to: t.to,
                message: t.message,
            };
            let key = Self::frame_key(&f);
            s.seen.entry(key.clone()).or_insert_with(|| f.clone());
            s.in_flight
                .entry(key)
                .and_modify(|(_, n)| *n = n.saturating_add(1))
                .or_insert((f, 1));
        }
    }

    /// Drives issuer `j` after an input: its records commit at once
    /// (write-ahead: nothing it sends is released before), then what waited
    /// is sent.
    fn drive_issuer(&self, s: &mut HState, j: usize) {
        let side = &mut s.issuers[j];
        if let Some(batch) = side.live.poll_records() {
            let token = batch.token();
            for r in &batch.records {
                side.durable.apply(r);
            }
            side.live.handle_committed(token);
        }
        let out: Vec<Transmit> = std::iter::from_fn(|| side.live.poll_transmit()).collect();
        while side.live.poll_event().is_some() {}
        self.send(s, &self.ids[j].clone(), out);
    }

    /// Drives the edge after an input, as `drive_issuer`, and reads ground
    /// truth from the ledger records it commits.
    fn drive_edge(&self, s: &mut HState) {
        let e = &mut s.edge;
        if let Some(batch) = e.live.poll_records() {
            let token = batch.token();
            for r in &batch.records {
                e.durable.apply(r);
                if let Record::Ledger(l) = r {
                    if l.outcome != LedgerOutcome::Applied {
                        continue;
                    }
                    let latest = &self.obligations[self.alice_latest()].2;
                    let withdrawn = self.latest_withholds()
                        && l.custodian == self.ids[ALICE]
                        && l.obligation_id == *latest.id();
                    let lease_suffix = lease::lease_key("");
                    for w in &l.effect {
                        if w.key.ends_with(&lease_suffix) {
                            continue;
                        }
                        s.ghost
                            .writes
                            .insert((l.custodian.to_string(), w.key.clone()));
                        if withdrawn {
                            s.ghost.withdrawn_keys.insert(w.key.clone());
                        }
                    }
                }
            }
            e.live.handle_committed(token);
        }
        let out: Vec<Transmit> = std::iter::from_fn(|| e.live.poll_transmit()).collect();
        while e.live.poll_event().is_some() {}
        self.send(s, &self.edge_id.clone(), out);
    }

    fn step(&self, s: &HState, a: &HAction) -> Option<HState> {
        let mut n = s.clone();
        let now = self.now(s);
        match a {
            HAction::Offer(i) => {
                let (_, j, ob) = &self.obligations[*i];
                n.issuers[*j].live.offer(now, ob.clone()).ok()?;
                self.drive_issuer(&mut n, *j);
            }
            HAction::IssuerTimeout(j) => {
                n.issuers[*j].live.handle_timeout(now);
                self.drive_issuer(&mut n, *j);
            }
            HAction::EdgeTimeout => {
                n.edge.live.handle_timeout(now);
                self.drive_edge(&mut n);
            }
            HAction::Deliver(key) => {
                let f = take(&mut n.in_flight, key)?;
                if f.to == self.edge_id {
                    match f.message {
                        Message::Obligation(ob) => {
                            let mut applier = StandardApplier::default();
                            let _ = n
                                .edge
                                .live
                                .handle_obligation(now, &f.from, ob, &mut applier);
                        }
                        Message::StatusQuery(ids) => {
                            n.edge.live.handle_status_query(now, &f.from, &ids);
                        }
                        Message::Acks(_)
                        | Message::Error(_)
                        | Message::StatusReply(_)
                        | Message::Relay(_) => {}
                    }
                    self.drive_edge(&mut n);
                } else {
                    let j = self.ids.iter().position(|x| *x == f.to)?;
                    let c = &mut n.issuers[j].live;
                    match &f.message {
                        Message::Acks(acks) => {
                            for ack in acks {
                                let _ = c.handle_ack(now, &f.from, ack);
                            }
                        }
                        Message::Error(e) => c.handle_error(now, &f.from, e),
                        Message::StatusReply(r) => c.handle_status_reply(now, &f.from, r),
                        Message::Obligation(_) | Message::StatusQuery(_) | Message::Relay(_) => {}
                    }
                    self.drive_issuer(&mut n, j);
                }
            }
            HAction::Drop(key) => {
                take(&mut n.in_flight, key)?;
            }
            HAction::Replay(key) => {
                n.replays_left = n.replays_left.checked_sub(1)?;
                let f = n.seen.get(key)?.clone();
                n.in_flight
                    .entry(key.clone())
                    .and_modify(|(_, c)| *c = c.saturating_add(1))
                    .or_insert((f, 1));
            }
            HAction::Tick => n.now += 1,
            HAction::AdvanceToTimeout => {
                let t = self.next_issuer_timer(s)?;
                n.now = self.seconds(t);
            }
        }
        n.fp = self.fingerprint(&n);
        (n.fp != s.fp).then_some(n)
    }

    fn next_issuer_timer(&self, s: &HState) -> Option<Timestamp> {
        s.issuers.iter().filter_map(|c| c.live.poll_timeout()).min()
    }

    /// Seconds since time 0 of a timestamp, rounded up.
    fn seconds(&self, t: Timestamp) -> u64 {
        let us = t.unix_micros() - T0.unix_micros();
        u64::try_from(us.max(0)).unwrap_or(0).div_ceil(1_000_000)
    }

    /// Nothing in flight, no custody pending at either issuer, no timer
    /// due at the edge, nothing left to offer. (A custodian's timer may
    /// outlive the custody it was armed for; it then does nothing.)
    pub fn quiescent(&self, s: &HState) -> bool {
        s.in_flight.is_empty()
            && s.issuers.iter().all(|c| c.live.pending_len() == 0)
            && s.edge.live.poll_timeout().is_none_or(|t| t > self.now(s))
            && (s.now >= self.config.offer_window_seconds
                || (0..self.obligations.len()).all(|i| self.offered(s, i)))
    }

    fn fingerprint(&self, s: &HState) -> u128 {
        let mut w = Sink(Sha256::new());
        // Writing into a hasher cannot fail.
        let _ = self.encode(&mut w, s);
        let d = w.0.finalize();
        let mut b = [0u8; 16];
        b.copy_from_slice(&d[..16]);
        u128::from_le_bytes(b)
    }

    /// The canonical encoding. Every side commits after each input and
    /// nothing crashes, so the durable folds, the live timers and the
    /// frames determine everything a later step or property reads.
    fn encode(&self, w: &mut Sink, s: &HState) -> std::fmt::Result {
        write!(w, "t{} r{} g{:?}|", s.now, s.replays_left, s.ghost)?;
        for (j, c) in s.issuers.iter().enumerate() {
            write!(w, "I{j}")?;
            custodian_snapshot_in(w, &c.durable, self.issuer_configs[j].weight_range)?;
            write!(
                w,
                "timer{:?} q{}|",
                c.live.poll_timeout().map(Timestamp::unix_micros),
                c.live.queued_transmits()
            )?;
        }
        write!(w, "E")?;
        receiver_snapshot(w, &s.edge.durable)?;
        write!(
            w,
            "timer{:?}|",
            s.edge.live.poll_timeout().map(Timestamp::unix_micros)
        )?;
        write!(w, "N")?;
        for (k, (_, c)) in &s.in_flight {
            write!(w, "{k}*{c};")?;
        }
        write!(w, "S")?;
        for k in s.seen.keys() {
            write!(w, "{k};")?;
        }
        Ok(())
    }
}

fn take(frames: &mut BTreeMap<String, (HFrame, u8)>, key: &str) -> Option<HFrame> {
    let (f, c) = frames.get_mut(key)?;
    let f = f.clone();
    *c -= 1;
    if *c == 0 {
        frames.remove(key);
    }
    Some(f)
}

/// The transitions stateright explores (the [`Model`] impl delegates here).
impl HostileModel {
    /// The initial state, inside the configured scope.
    pub(crate) fn initial_states(&self) -> Vec<HState> {
        let mut s = None;
        (self.config.scope)(&mut || s = Some(self.initial()));
        s.into_iter().collect()
    }

    /// The actions enabled in `s`.
    pub(crate) fn enabled(&self, s: &HState, out: &mut Vec<HAction>) {
        let now = self.now(s);
        if s.now < self.config.offer_window_seconds {
            for i in 0..self.obligations.len() {
                // Alice decides in order.
                let in_order = self.issuer_of(i) != ALICE || i == 0 || self.offered(s, i - 1);
                if in_order && !self.offered(s, i) {
                    out.push(HAction::Offer(i));
                }
            }
        }
        for (j, c) in s.issuers.iter().enumerate() {
            if c.live.poll_timeout().is_some_and(|t| t <= now) {
                out.push(HAction::IssuerTimeout(j));
            }
        }
        if s.edge.live.poll_timeout().is_some_and(|t| t <= now) {
            out.push(HAction::EdgeTimeout);
        }
        for key in s.in_flight.keys() {
            out.push(HAction::Deliver(key.clone()));
            if self.config.drops {
                out.push(HAction::Drop(key.clone()));
            }
        }
        if s.replays_left > 0 {
            for key in s.seen.keys() {
                out.push(HAction::Replay(key.clone()));
            }
        }
        if s.now < self.config.horizon_seconds {
            out.push(HAction::Tick);
            if let Some(t) = self.next_issuer_timer(s) {
                let t = self.seconds(t);
                if t > s.now + 1 && t <= self.config.horizon_seconds {
                    out.push(HAction::AdvanceToTimeout);
                }
            }
        }
    }

    /// The state `a` leads to from `s`, inside the configured scope.
    pub(crate) fn next(&self, s: &HState, a: HAction) -> Option<HState> {
        let mut out = None;
        (self.config.scope)(&mut || out = self.step(s, &a));
        out
    }
}
