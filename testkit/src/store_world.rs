//! Shared test support: the three backends behind one interface, and a
//! two-node world that drives the real custodian and receiver through
//! their stores the way `abhyasa_check::sim::Pair` drives them through the
//! abstract channel — but committing every batch to a store, with crash
//! points and restarts.
#![allow(dead_code, unreachable_pub, missing_docs, clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use abhyasa_core::custody::{
    Applier, ApplyContext, ApplyDecision, Custodian, CustodianConfig, CustodianEvent,
    CustodyProfile, EffectValue, EffectWrite, ExternalIntent, ExternalOutcome, LedgerOutcome,
    Offered, Receiver, ReceiverConfig, ReceiverEvent, Record, Transmit,
};
use abhyasa_core::polarity::{PolarityRegistry, ANUMATI_KIND, PHALA_KIND};
use abhyasa_core::principal::PrincipalState;
use abhyasa_core::store::{Committed, CrashTiming, DurableState, SimStore, Store, StoreError};
use abhyasa_core::wire::Message;
use abhyasa_core::{
    AgentId, DeclineReason, Escalation, Obligation, ObligationId, RetryBackoff, Timestamp,
};
use abhyasa_store::StoreOptions;
use serde_json::json;

pub const EPOCH: Timestamp = Timestamp::from_unix_seconds(1_780_000_000);
pub const DEADLINE_SECONDS: i64 = 60;
pub const MAX_RETRIES: i64 = 20;
/// How long a crashed node stays down before it restarts.
pub const DOWNTIME: Duration = Duration::from_secs(3);
const LATENCY: Duration = Duration::from_millis(10);

pub fn agent(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

pub fn oid(s: &str) -> ObligationId {
    ObligationId::new(s).unwrap()
}

/// A Phala corrective (admissible; `safe(O)` is an additive down-weight, so
/// a second fail-safe would show in the weight).
pub fn phala(id: &str, delta: f64) -> Obligation {
    Obligation::builder()
        .id(id)
        .kind(PHALA_KIND)
        .target("receiver")
        .payload(json!({"weight_delta": delta, "weight_key": format!("w-{id}")}))
        .deadline_seconds(DEADLINE_SECONDS)
        .max_retries(MAX_RETRIES)
        .created_at(EPOCH)
        .build()
        .unwrap()
}

/// An Anumati revocation of `scope` with `sequence`.
pub fn revoke(id: &str, scope: &str, sequence: u64) -> Obligation {
    Obligation::builder()
        .id(id)
        .kind(ANUMATI_KIND)
        .target("receiver")
        .payload(json!({"decision": "revoke", "scope": scope}))
        .deadline_seconds(DEADLINE_SECONDS)
        .max_retries(MAX_RETRIES)
        .created_at(EPOCH)
        .sequence(sequence)
        .build()
        .unwrap()
}

pub fn backoff() -> RetryBackoff {
    RetryBackoff {
        base: Duration::from_secs(1),
        cap: Duration::from_secs(8),
        jitter: 0.1,
    }
}

pub fn custodian_config() -> CustodianConfig {
    let mut c = CustodianConfig::new(agent("custodian"));
    c.seed = 7;
    c.default_profile = CustodyProfile {
        backoff: backoff(),
        ..CustodyProfile::default()
    };
    c
}

pub fn receiver_config() -> ReceiverConfig {
    let mut r = ReceiverConfig::new(agent("receiver"));
    r.skew_margin = Duration::from_secs(1);
    r
}

// ---------------------------------------------------------------- backends

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Sim,
    Sled,
    Redb,
    Log,
    Fjall,
}

pub const ALL: [Kind; 5] = [Kind::Sim, Kind::Sled, Kind::Redb, Kind::Log, Kind::Fjall];
pub const DISK: [Kind; 4] = [Kind::Sled, Kind::Redb, Kind::Log, Kind::Fjall];
/// The stores that existed before format 2 and event blocks: the log
/// store was born on them, so it has no older database to migrate.
pub const LEGACY: [Kind; 2] = [Kind::Sled, Kind::Redb];

impl Kind {
    /// The config spelling.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Sim => "sim",
            Kind::Sled => "sled",
            Kind::Redb => "redb",
            Kind::Log => "log",
            Kind::Fjall => "fjall",
        }
    }

    pub fn from_name(s: &str) -> Kind {
        ALL.into_iter().find(|k| k.name() == s).unwrap()
    }

    /// The embedded store kind.
    pub fn store_kind(self) -> abhyasa_store::StoreKind {
        self.name().parse().unwrap()
    }
}

/// Writes `value` (or deletes, `None`) at `key` of `table` in the log
/// store in `dir`, as one commit of the store's own that bypasses the
/// engine's rules (`LogStore::plant_raw`). The tests use it to plant rows
/// the store would never write.
pub fn log_inject(dir: &std::path::Path, table: &str, key: &[u8], value: Option<&[u8]>) {
    abhyasa_store::LogStore::open(dir)
        .unwrap()
        .plant_raw(table, key, value)
        .unwrap();
}

/// Writes `value` (or deletes, `None`) at `key` of `table` in the fjall
/// store in `dir` through fjall itself, durably: the tests use it to plant
/// rows the store would never write.
pub fn fjall_inject(dir: &std::path::Path, table: &str, key: &[u8], value: Option<&[u8]>) {
    let db = fjall::Database::builder(dir).open().unwrap();
    let ks = db
        .keyspace(table, fjall::KeyspaceCreateOptions::default)
        .unwrap();
    match value {
        Some(v) => ks.insert(key, v).unwrap(),
        None => ks.remove(key).unwrap(),
    }
    db.persist(fjall::PersistMode::SyncAll).unwrap();
}

/// A store plus what a test needs around it: a crash hook on commit `k`
/// and a restart (crash of the simulated process, or close and reopen of
/// the database).
pub trait Backend {
    fn kind(&self) -> Kind;
    fn store(&mut self) -> &mut dyn Store;
    fn commit(&mut self, now: Timestamp, batches: &[&[Record]]) -> Result<Committed, StoreError>;
    /// Arms a crash at the `k`-th commit from now (1-based).
    fn arm(&mut self, k: u64, timing: CrashTiming);
    fn restart(&mut self);
    fn commits(&self) -> u64;
    fn load(&mut self) -> DurableState {
        self.store().load().unwrap()
    }
}

pub struct SimBackend(pub SimStore);

impl Backend for SimBackend {
    fn kind(&self) -> Kind {
        Kind::Sim
    }
    fn store(&mut self) -> &mut dyn Store {
        &mut self.0
    }
    fn commit(&mut self, now: Timestamp, batches: &[&[Record]]) -> Result<Committed, StoreError> {
        self.0.commit(now, batches)
    }
    fn arm(&mut self, k: u64, timing: CrashTiming) {
        // The SimStore's own crash hook.
        let at = self.0.commits() + k;
        self.0.crash_at(at, timing);
    }
    fn restart(&mut self) {
        self.0.crash();
    }
    fn commits(&self) -> u64 {
        self.0.commits()
    }
}

/// A disk store that is closed and reopened on restart; the crash hook is
/// emulated around its commit (the batch is not written, or written and
/// then the "process" stops).
pub struct DiskBackend {
    kind: Kind,
    _dir: tempfile::TempDir,
    path: PathBuf,
    store: Option<Box<dyn Store>>,
    commits: u64,
    armed: Option<(u64, CrashTiming)>,
    down: Option<u64>,
}

pub fn open_disk(kind: Kind, path: &std::path::Path) -> Result<Box<dyn Store>, StoreError> {
    let opts = StoreOptions {
        cache_bytes: 8 * 1024 * 1024,
    };
    assert!(kind != Kind::Sim, "not a disk store");
    kind.store_kind().open(path, &opts)
}

/// Opens a store just closed in this process. sled's background flusher
/// can hold the database's file lock for a moment after the handle is
/// dropped (a node restarting in a new process never meets this: the lock
/// dies with the old process), so a refused open is retried for a while
/// before the test fails with the last error.
pub fn reopen(kind: Kind, path: &std::path::Path) -> Box<dyn Store> {
    let mut last = None;
    for _ in 0..100 {
        match open_disk(kind, path) {
            Ok(s) => return s,
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!(
        "{kind:?} store at {} does not reopen: {last:?}",
        path.display()
    );
}

pub fn disk_path(kind: Kind, dir: &std::path::Path) -> PathBuf {
    match kind {
        Kind::Sled => dir.join("sled"),
        Kind::Log => dir.join("log"),
        Kind::Fjall => dir.join("fjall"),
        _ => dir.join("node.redb"),
    }
}

impl DiskBackend {
    pub fn new(kind: Kind) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = disk_path(kind, dir.path());
        let store = Some(open_disk(kind, &path).unwrap());
        Self {
            kind,
            _dir: dir,
            path,
            store,
            commits: 0,
            armed: None,
            down: None,
        }
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl Backend for DiskBackend {
    fn kind(&self) -> Kind {
        self.kind
    }
    fn store(&mut self) -> &mut dyn Store {
        self.store.as_deref_mut().unwrap()
    }
    fn commit(&mut self, now: Timestamp, batches: &[&[Record]]) -> Result<Committed, StoreError> {
        if let Some(commit) = self.down {
            return Err(StoreError::Crashed { commit });
        }
        self.commits += 1;
        let n = self.commits;
        match self.armed {
            Some((k, timing)) if k == n => {
                if timing == CrashTiming::AfterDurable {
                    let _durable = self.store().commit(now, batches)?;
                }
                self.down = Some(n);
                Err(StoreError::Crashed { commit: n })
            }
            _ => self.store().commit(now, batches),
        }
    }
    fn arm(&mut self, k: u64, timing: CrashTiming) {
        self.armed = Some((self.commits + k, timing));
    }
    fn restart(&mut self) {
        // Close the database (drop), then open it again from disk.
        self.store = None;
        self.store = Some(reopen(self.kind, &self.path));
        self.armed = None;
        self.down = None;
    }
    fn commits(&self) -> u64 {
        self.commits
    }
}

pub fn backend(kind: Kind) -> Box<dyn Backend> {
    match kind {
        Kind::Sim => Box::new(SimBackend(SimStore::new())),
        k => Box::new(DiskBackend::new(k)),
    }
}

// ----------------------------------------------------------------- applier

/// What the receiver's application does with an obligation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Apply,
    Decline,
    /// Defer on every delivery; the world completes it (apply) later.
    DeferThenApply,
    /// An external effect behind a durable intent (dual-write boundary).
    External,
}

/// Receiver-owned counter of applications of `id`: a second application
/// would read 1 and write 2.
pub fn counter_key(id: &ObligationId) -> String {
    format!("applied/{id}")
}

pub fn bump(effects: &BTreeMap<String, EffectValue>, id: &ObligationId) -> Vec<EffectWrite> {
    let key = counter_key(id);
    let n = match effects.get(&key) {
        Some(EffectValue::Json(v)) => v.as_u64().unwrap_or(0),
        _ => 0,
    };
    vec![EffectWrite {
        key,
        value: EffectValue::Json(json!(n + 1)),
    }]
}

#[derive(Debug, Default)]
pub struct ScriptApplier {
    pub decisions: HashMap<ObligationId, Decision>,
}

impl Applier for ScriptApplier {
    fn decide(&mut self, ctx: &ApplyContext<'_>, ob: &Obligation) -> ApplyDecision {
        match self
            .decisions
            .get(ob.id())
            .copied()
            .unwrap_or(Decision::Apply)
        {
            Decision::Apply => ApplyDecision::Apply(bump(ctx.effects, ob.id())),
            Decision::Decline => ApplyDecision::Decline {
                reason: DeclineReason::Policy,
                detail: Some("scripted decline".into()),
            },
            Decision::DeferThenApply => ApplyDecision::Defer { detail: None },
            Decision::External => ApplyDecision::External(ExternalIntent {
                idempotency_key: ob.id().clone(),
                action: "notify".into(),
                data: json!({"id": ob.id().as_str()}),
            }),
        }
    }
}

/// An external system that honours idempotency keys and remembers every
/// call, so a blind re-execution is visible.
#[derive(Debug, Default)]
pub struct ExternalSystem {
    pub calls: HashMap<ObligationId, u32>,
}

impl ExternalSystem {
    pub fn execute(&mut self, key: &ObligationId) {
        *self.calls.entry(key.clone()).or_default() += 1;
    }
    pub fn executed(&self, key: &ObligationId) -> bool {
        self.calls.contains_key(key)
    }
}

// ------------------------------------------------------------------- world

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Custodian,
    Receiver,
}

/// A crash to inject: the `commit`-th commit (1-based, from the start of
/// the run) of `side`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrashPlan {
    pub side: Side,
    pub commit: u64,
    pub timing: CrashTiming,
}

pub struct World {
    pub now: Timestamp,
    pub cust: Option<Custodian>,
    pub recv: Option<Receiver>,
    pub cstore: Box<dyn Backend>,
    pub rstore: Box<dyn Backend>,
    pub applier: ScriptApplier,
    pub external: ExternalSystem,
    /// Drop every frame (both directions).
    pub partitioned: bool,
    net: BTreeMap<(Timestamp, u64), (Side, Message)>,
    seq: u64,
    restarts: Vec<(Timestamp, Side)>,
    completions: Vec<(Timestamp, ObligationId)>,
    pub sends: HashMap<ObligationId, u32>,
    pub escalation_events: Vec<Escalation>,
    pub outcome_unknown_events: u32,
    pub crashes: u32,
    /// Every record each side committed, in commit order (for fold checks).
    pub committed: HashMap<&'static str, Vec<Record>>,
    pub commits: [u64; 2],
    /// Offers whose custody is not yet known durable: the application
    /// offers them again after a custodian restart (an offer counts once its
    /// `Opened` event is released).
    unconfirmed: Vec<Obligation>,
}

impl World {
    pub fn new(kind: Kind) -> Self {
        Self::with_backends(backend(kind), backend(kind))
    }

    pub fn with_backends(cstore: Box<dyn Backend>, rstore: Box<dyn Backend>) -> Self {
        Self {
            now: EPOCH,
            cust: Some(Custodian::new(
                custodian_config(),
                PolarityRegistry::standard(),
            )),
            recv: Some(Receiver::new(
                receiver_config(),
                PolarityRegistry::standard(),
            )),
            cstore,
            rstore,
            applier: ScriptApplier::default(),
            external: ExternalSystem::default(),
            partitioned: false,
            net: BTreeMap::new(),
            seq: 0,
            restarts: Vec::new(),
            completions: Vec::new(),
            sends: HashMap::new(),
            escalation_events: Vec::new(),
            outcome_unknown_events: 0,
            crashes: 0,
            committed: HashMap::new(),
            commits: [0, 0],
            unconfirmed: Vec::new(),
        }
    }

    /// Arms one crash point.
    pub fn plan(&mut self, p: CrashPlan) {
        match p.side {
            Side::Custodian => self.cstore.arm(p.commit, p.timing),
            Side::Receiver => self.rstore.arm(p.commit, p.timing),
        }
    }

    pub fn offer(&mut self, ob: Obligation) {
        let now = self.now;
        self.cust.as_mut().unwrap().offer(now, ob.clone()).unwrap();
        self.unconfirmed.push(ob);
        self.pump();
    }

    /// Schedules the completion (apply) of a deferred obligation.
    pub fn complete_at(&mut self, at: Timestamp, id: ObligationId) {
        self.completions.push((at, id));
    }

    fn send(&mut self, from: Side, t: Transmit) {
        if let Message::Obligation(o) = &t.message {
            *self.sends.entry(o.id().clone()).or_default() += 1;
        }
        if self.partitioned {
            return;
        }
        let to = if from == Side::Custodian {
            Side::Receiver
        } else {
            Side::Custodian
        };
        self.seq += 1;
        self.net.insert(
            (self.now.saturating_add(LATENCY), self.seq),
            (to, t.message),
        );
    }

    fn crash(&mut self, side: Side) {
        match side {
            Side::Custodian => self.cust = None,
            Side::Receiver => self.recv = None,
        }
        self.crashes += 1;
        self.restarts
            .push((self.now.saturating_add(DOWNTIME), side));
    }

    fn restart(&mut self, side: Side) {
        let now = self.now;
        match side {
            Side::Custodian => {
                self.cstore.restart();
                // C-ND-5 / issue 11 §5: after the crash and reopen the
                // indexes agree with the records.
                assert_indexes_match(self.cstore.store(), now, "custodian after restart");
                let s = self.cstore.load();
                let mut c = Custodian::restore(
                    custodian_config(),
                    PolarityRegistry::standard(),
                    &s.custodian,
                );
                self.unconfirmed
                    .retain(|ob| match c.offer(now, ob.clone()) {
                        Ok(Offered::Custody { .. }) => true,
                        Ok(_) => false,
                        Err(e) => panic!("re-offer of {} failed: {e}", ob.id()),
                    });
                self.cust = Some(c);
            }
            Side::Receiver => {
                self.rstore.restart();
                assert_indexes_match(self.rstore.store(), now, "receiver after restart");
                let s = self.rstore.load();
                self.recv = Some(Receiver::restore(
                    receiver_config(),
                    PolarityRegistry::standard(),
                    &s.receiver,
                    now,
                ));
            }
        }
    }

    /// Commits each live side's records, then releases what waits behind
    /// them, until nothing moves.
    pub fn pump(&mut self) {
        loop {
            let mut moved = false;
            let now = self.now;
            if let Some(c) = self.cust.as_mut() {
                if let Some(b) = c.poll_records() {
                    moved = true;
                    self.commits[0] += 1;
                    match self.cstore.commit(now, &[&b.records]) {
                        Ok(_) => {
                            c.handle_committed(b.token());
                            self.committed
                                .entry("custodian")
                                .or_default()
                                .extend(b.records);
                        }
                        Err(StoreError::Crashed { .. }) => self.crash(Side::Custodian),
                        Err(e) => panic!("custodian commit failed: {e}"),
                    }
                }
            }
            if let Some(r) = self.recv.as_mut() {
                if let Some(b) = r.poll_records() {
                    moved = true;
                    self.commits[1] += 1;
                    match self.rstore.commit(now, &[&b.records]) {
                        Ok(_) => {
                            r.handle_committed(b.token());
                            self.committed
                                .entry("receiver")
                                .or_default()
                                .extend(b.records);
                        }
                        Err(StoreError::Crashed { .. }) => self.crash(Side::Receiver),
                        Err(e) => panic!("receiver commit failed: {e}"),
                    }
                }
            }
            let mut out = Vec::new();
            if let Some(c) = self.cust.as_mut() {
                while let Some(t) = c.poll_transmit() {
                    out.push((Side::Custodian, t));
                }
                while let Some(e) = c.poll_event() {
                    match e {
                        CustodianEvent::Escalated(e) => self.escalation_events.push(*e),
                        CustodianEvent::Opened { obligation_id, .. } => {
                            self.unconfirmed.retain(|o| o.id() != &obligation_id)
                        }
                        _ => {}
                    }
                }
            }
            let mut events = Vec::new();
            if let Some(r) = self.recv.as_mut() {
                while let Some(t) = r.poll_transmit() {
                    out.push((Side::Receiver, t));
                }
                while let Some(e) = r.poll_event() {
                    events.push(e);
                }
            }
            moved |= !out.is_empty() || !events.is_empty();
            for (side, t) in out {
                self.send(side, t);
            }
            for e in events {
                self.receiver_event(e);
            }
            if !moved {
                return;
            }
        }
    }

    fn receiver_event(&mut self, e: ReceiverEvent) {
        let now = self.now;
        let (custodian, id, in_doubt) = match e {
            ReceiverEvent::Execute {
                custodian,
                obligation,
                ..
            } => (custodian, obligation.id().clone(), false),
            ReceiverEvent::OutcomeUnknown {
                custodian,
                obligation,
                ..
            } => (custodian, obligation.id().clone(), true),
            _ => return,
        };
        if in_doubt {
            // C-AB3-5: settle by querying, never re-execute blindly.
            self.outcome_unknown_events += 1;
            if !self.external.executed(&id) {
                self.external.execute(&id);
            }
        } else {
            self.external.execute(&id);
        }
        let Some(r) = self.recv.as_mut() else { return };
        let effect = bump(r.effects(), &id);
        r.handle_external_outcome(now, &custodian, &id, ExternalOutcome::Applied(effect))
            .unwrap();
    }

    fn deliver(&mut self, to: Side, msg: Message) {
        let now = self.now;
        match (to, msg) {
            (Side::Receiver, Message::Obligation(o)) => {
                if let Some(r) = self.recv.as_mut() {
                    let _ = r.handle_obligation(now, &agent("custodian"), o, &mut self.applier);
                }
            }
            (Side::Custodian, Message::Acks(acks)) => {
                if let Some(c) = self.cust.as_mut() {
                    for a in &acks {
                        let _ = c.handle_ack(now, &agent("receiver"), a);
                    }
                }
            }
            (Side::Custodian, Message::Error(e)) => {
                if let Some(c) = self.cust.as_mut() {
                    c.handle_error(now, &agent("receiver"), &e);
                }
            }
            _ => {}
        }
    }

    /// Completes a deferred obligation; true once its final outcome is
    /// durable (the application re-checks after a crash, as a work queue
    /// would) or its deadline has passed.
    fn complete(&mut self, id: ObligationId) -> bool {
        let now = self.now;
        if now > EPOCH.saturating_add(Duration::from_secs(DEADLINE_SECONDS as u64)) {
            return true;
        }
        let Some(r) = self.recv.as_mut() else {
            return false;
        };
        let c = agent("custodian");
        match r.ledger_outcome(&c, &id) {
            Some(LedgerOutcome::Deferred) => {
                let effect = bump(r.effects(), &id);
                r.complete_deferred(now, &c, &id, ApplyDecision::Apply(effect))
                    .unwrap();
                false
            }
            Some(LedgerOutcome::Applied | LedgerOutcome::Declined) => {
                // Decided in memory; durable once the store holds it.
                let s = self.rstore.load();
                s.receiver.ledger.get(&(c, id)).is_some_and(|l| {
                    matches!(l.outcome, LedgerOutcome::Applied | LedgerOutcome::Declined)
                })
            }
            // Not (durably) received yet: wait for a redelivery.
            _ => false,
        }
    }

    /// Runs virtual time until nothing is left to do (or `limit`).
    pub fn run(&mut self, limit: Duration) {
        let until = self.now.saturating_add(limit);
        self.pump();
        loop {
            let mut next: Option<Timestamp> = None;
            let mut consider = |t: Option<Timestamp>| {
                if let Some(t) = t {
                    next = Some(next.map_or(t, |n: Timestamp| n.min(t)));
                }
            };
            consider(self.net.keys().next().map(|k| k.0));
            consider(self.cust.as_ref().and_then(|c| c.poll_timeout()));
            consider(self.restarts.iter().map(|r| r.0).min());
            consider(self.completions.iter().map(|r| r.0).min());
            let Some(next) = next else { break };
            if next > until {
                break;
            }
            self.now = self.now.max(next);
            let now = self.now;
            if let Some(i) = self.restarts.iter().position(|r| r.0 <= now) {
                let (_, side) = self.restarts.remove(i);
                self.restart(side);
            } else if let Some((&k, _)) = self.net.iter().next().filter(|(k, _)| k.0 <= now) {
                if let Some((to, msg)) = self.net.remove(&k) {
                    let alive = match to {
                        Side::Custodian => self.cust.is_some(),
                        Side::Receiver => self.recv.is_some(),
                    };
                    if alive {
                        self.deliver(to, msg);
                    }
                }
            } else if let Some(i) = self.completions.iter().position(|r| r.0 <= now) {
                let (_, id) = self.completions.remove(i);
                if !self.complete(id.clone()) {
                    self.completions
                        .push((now.saturating_add(Duration::from_secs(1)), id));
                }
            } else if let Some(c) = self.cust.as_mut() {
                c.handle_timeout(now);
            }
            self.pump();
        }
    }

    /// The principal state the custodian's store would restore.
    pub fn principal(&mut self) -> PrincipalState {
        let s = self.cstore.load();
        let mut p = PrincipalState::new(custodian_config().weight_range);
        for w in &s.custodian.principal {
            p.apply_write(w);
        }
        p
    }
}

// ------------------------------------------------------------ index check

/// Every page of `read`, from the start, `limit` items at a time.
pub fn all_pages<T, C: Clone>(
    limit: usize,
    mut read: impl FnMut(Option<C>, usize) -> abhyasa_core::store::Page<T, C>,
) -> Vec<T> {
    let mut out = Vec::new();
    let mut after = None;
    for _ in 0..100_000 {
        let page = read(after.clone(), limit);
        assert!(page.items.len() <= limit, "a page longer than its limit");
        out.extend(page.items);
        match page.next {
            Some(c) => after = Some(c),
            None => return out,
        }
    }
    panic!("paging did not end");
}

/// C-ND-5 / issue 11 §5: the indexed answers of `list`, `escalations`,
/// `decisions` and `inbox` equal what the records (a full `load`) say, and
/// paging (two items a page) neither skips nor repeats an item.
pub fn assert_indexes_match(store: &dyn Store, now: Timestamp, label: &str) {
    use abhyasa_core::store::{ListState, MAX_PAGE};
    let ds = store.load().unwrap();
    assert_eq!(
        store.inbox(now).unwrap(),
        ds.inbox(now),
        "{label}: inbox counters disagree with the records"
    );
    let mut states: Vec<Option<ListState>> = vec![None];
    states.extend(ListState::ALL.map(Some));
    for st in states {
        let expected = ds.list(st, None, MAX_PAGE).items;
        let paged = all_pages(2, |after: Option<ObligationId>, n| {
            store.list(st, after.as_ref(), n).unwrap()
        });
        assert_eq!(
            paged, expected,
            "{label}: list {st:?} disagrees with the records"
        );
    }
    let escalations: Vec<Escalation> =
        all_pages(1, |after, n| store.escalations(after, n).unwrap())
            .into_iter()
            .map(|e| e.escalation)
            .collect();
    assert_eq!(
        escalations, ds.custodian.escalations,
        "{label}: escalations disagree with the records"
    );
    let mut decisions = ds.decisions();
    decisions.sort_by(|a, b| a.obligation_id.cmp(&b.obligation_id));
    let paged = all_pages(1, |after: Option<ObligationId>, n| {
        store.decisions(after.as_ref(), n).unwrap()
    });
    assert_eq!(
        paged, decisions,
        "{label}: decisions disagree with the records"
    );
}
