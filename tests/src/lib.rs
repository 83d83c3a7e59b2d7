//! # abhyasa-conformance
//!
//! One scenario body per conformance id (`shared/CONFORMANCE.md`), run
//! through [`abhyasa::Node`] over every transport × every store
//! ([`Net`] × [`Disk`]): the in-memory network, QUIC (mutual TLS, pinned
//! keys), WebSocket (signed hello), store-and-forward through a relay
//! daemon (sealed frames over QUIC, the relay's spool on redb) and the A2A
//! HTTP binding (plain loopback, per-peer bearer credentials), each over
//! SimStore, redb, sled, the log store, fjall and PostgreSQL (the last only with
//! `ABHYASA_PG_URL`). The scenarios live in `tests/conformance.rs`; this
//! crate is the world they run in.
//!
//! Faults are injected the same way on every transport, at the edge of a
//! node: a [`Plug`] sits between a transport's `incoming` channel and the
//! node's driver and drops, duplicates or cuts the frames the node
//! receives. So "the link dropped the obligation" and "the link dropped
//! the ack" mean the same thing whether the frame crossed a QUIC stream, a
//! WebSocket or the in-memory network, and a scenario body is written once.
//!
//! Two more hooks sit at a node's edge and store, for the ids about
//! what happens inside the node: [`Plug::observe`] sees every item that
//! reaches the edge before the faults and [`Plug::inject`] hands the node
//! an item no transport produced (a forged ack, C-TR-2); alice's store is
//! always wrapped by a [`Probe`] that can slow each commit and records
//! what each commit made durable, after it returned (C-AB1-2: nothing is
//! sent before its commit; C-AB2-2: the durable retry schedule).
//! [`World::reopen_alice_on_fresh_store`] is a custodian that lost its
//! disk (C-AB3-4: an id reused with other content).
//!
//! Ids shown (one body each in `tests/conformance.rs`): C-AB1-1, C-AB1-2,
//! C-AB2-1, C-AB2-2, C-AB2-3, C-AB3-1, C-AB3-2, C-AB3-3, C-AB3-4, C-AB4-1,
//! C-AB4-2, C-AB4-3, C-AB4-4, C-AC-1, C-DC-1, C-DC-2, C-DL-1, C-SS-1,
//! C-SS-2, C-SS-3, C-SS-4, C-TR-2, and C-TR-1 across them all.
//!
//! Every scenario ends ([`World::close`]) with the one invariant checker,
//! `abhyasa_check::check`, over the world's [`World::trace`]: the checker
//! the abstract sweep and the full-stack simulator use.
//!
//! A [`World`] is two nodes: `alice` (custodian) and `bob` (receiver),
//! each with a store that outlives it, so either can be stopped and
//! reopened on the same records (a crash at a commit boundary). A reopened
//! node comes back where its peer looks for it: bob on the same QUIC,
//! WebSocket or HTTP port, alice on the same HTTP port (bob's late acks go
//! there), either with a fresh link to the same relay (which kept what it
//! held). Bob's applier is scripted per obligation ([`SCRIPT`]: decline or
//! defer), and alice holds one kind ([`SURFACE_KIND`]) under the
//! "surface" decline policy.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use abhyasa::{Node, NodeOptions, Outcome};
use abhyasa_a2a::{HttpConfig, HttpPeer};
use abhyasa_check as check;
use abhyasa_core::custody::{
    Applier, ApplyContext, ApplyDecision, CustodyProfile, LedgerOutcome, Record, StandardApplier,
    TerminalState,
};
use abhyasa_core::principal::DecisionItem;
use abhyasa_core::store::SimStore;
use abhyasa_core::store::{
    Committed, Compacted, DurableState, EscalationEntry, EventId, Inbox, ListState, Listed, Page,
    Store, StoreError, StoredEvent,
};
use abhyasa_core::wire::Message;
use abhyasa_core::{
    AgentId, DeclinePolicy, DeclineReason, Kind, Obligation, ObligationId, RetryBackoff, Timestamp,
};
use abhyasa_identity::{generate_identity, Identity};
use abhyasa_quic::QuicConfig;
use abhyasa_spool::{RelayConfig, RelayHandle, RelayedConfig, SpoolLimits};
use abhyasa_store::{StoreKind, StoreOptions};
use abhyasa_transport::mem::MemNetwork;
use abhyasa_transport::{Incoming, LinkConfig, Transport};
// The HTTP cells fix both nodes' ports up front (each node's configuration
// names the other's endpoint, and a restart must come back on the same
// one): ports the kernel never hands to another socket in the meantime.
use abhyasa_testkit::loopback_port;
use abhyasa_ws::WsConfig;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::mpsc;

/// A boxed error for the harness's own failures (setup, not the protocol).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The transports a scenario runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Net {
    /// `abhyasa_transport::mem`.
    Mem,
    /// `abhyasa-quic` on loopback.
    Quic,
    /// `abhyasa-ws` on loopback.
    Ws,
    /// Store-and-forward: each node dials only a relay daemon
    /// (`abhyasa_spool::start`, QUIC on loopback, its spool in the world's
    /// temporary directory) and reaches its peer through it, sealed
    /// (`abhyasa_spool::relayed`). The relay outlives node restarts.
    Relayed,
    /// The A2A HTTP binding (`abhyasa_a2a::transport`), plain HTTP on
    /// loopback with a per-peer bearer credential each way: alice POSTs
    /// obligations to bob's `/abhyasa/obligations` and gets the ack in the
    /// answer (or later at her `/abhyasa/custody_ack`). Both ports are
    /// fixed for the world, so a restarted node is found where it was.
    Http,
}

/// The stores a scenario runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disk {
    /// `SimStore`, shared across restarts of the node using it.
    Sim,
    /// One of `abhyasa-store`'s embedded stores (redb, sled, the log
    /// store, fjall), in a temporary directory.
    Embedded(StoreKind),
    /// `abhyasa-pg` on the database named by `ABHYASA_PG_URL` (CI starts
    /// one), a fresh partition per node per world. Without the variable
    /// the cell is skipped, saying so ([`postgres_url`]).
    Postgres,
}

/// The database of the [`Disk::Postgres`] cells, if any.
pub fn postgres_url() -> Option<String> {
    std::env::var(abhyasa_pg::URL_ENV)
        .ok()
        .filter(|u| !u.is_empty())
}

/// One cell of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backend {
    /// Transport.
    pub net: Net,
    /// Store.
    pub disk: Disk,
}

impl Backend {
    /// A cell.
    pub fn new(net: Net, disk: Disk) -> Self {
        Self { net, disk }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct PlugState {
    drop: f64,
    duplicate: f64,
    cut: bool,
    hold: bool,
    held: Vec<Incoming>,
    injected: Vec<Incoming>,
    rng: ChaCha8Rng,
    passed: u64,
    dropped: u64,
    duplicated: u64,
    /// Obligation frames dropped, by id: what [`Plug::lost`] reports.
    lost: HashMap<ObligationId, u64>,
    observer: Option<Observer>,
}

/// A hook that sees every item a [`Plug`] receives, before its faults.
pub type Observer = Arc<dyn Fn(&Incoming) + Send + Sync>;

/// Inbound faults at a node's edge: each received frame is dropped with
/// probability `drop`, else delivered twice with probability `duplicate`;
/// `cut` drops every frame. Connection events always pass (the transport
/// is up; only frames are lost), so custody sees loss, not a dead peer.
/// Seeded: the same seed makes the same choices for the same frames.
///
/// `hold` delays instead of dropping: frames are kept, in order, until the
/// hold is released, then delivered once each (a late ack, a redelivery
/// that arrives past its deadline).
///
/// An observer ([`Plug::observe`]) sees every item the transport hands
/// the plug, before any fault: what crossed the wire to this node's edge,
/// whatever the plug then does with it (C-AB1-2 checks each obligation
/// frame against what the custodian had made durable).
///
/// [`Plug::inject`] hands the node an item no transport produced, at the
/// same edge: a frame "from" any peer, as if that peer's authenticated
/// link had carried it. So a forged or misrouted ack (C-TR-2) reaches the
/// node the same way on every transport, past the transport's own checks,
/// and exercises the node's binding of acks rather than the transport's
/// authentication. Injected items bypass the plug's faults.
#[derive(Clone)]
pub struct Plug(Arc<Mutex<PlugState>>, Arc<tokio::sync::Notify>);

impl Plug {
    /// A plug that passes everything, with a seed for later faults.
    pub fn new(seed: u64) -> Self {
        Self(
            Arc::new(Mutex::new(PlugState {
                drop: 0.0,
                duplicate: 0.0,
                cut: false,
                hold: false,
                held: Vec::new(),
                injected: Vec::new(),
                rng: ChaCha8Rng::seed_from_u64(seed),
                passed: 0,
                dropped: 0,
                duplicated: 0,
                lost: HashMap::new(),
                observer: None,
            })),
            Arc::new(tokio::sync::Notify::new()),
        )
    }

    /// Calls `f` on every item the transport delivers to this plug from
    /// now on (frames and connection events), before drops, duplicates,
    /// cuts or holds. `f` runs on the plug's task: keep it short.
    pub fn observe(&self, f: impl Fn(&Incoming) + Send + Sync + 'static) {
        lock(&self.0).observer = Some(Arc::new(f));
    }

    /// Delivers `item` to the node behind this plug, after the faults
    /// (see the type's docs), in order with the frames the plug passes.
    pub fn inject(&self, item: Incoming) {
        lock(&self.0).injected.push(item);
        self.1.notify_one();
    }

    /// Holds every frame from now on (`true`), or delivers what was held
    /// and stops holding (`false`).
    pub fn hold(&self, on: bool) {
        lock(&self.0).hold = on;
        if !on {
            self.1.notify_one();
        }
    }

    /// Frames held so far and not yet released.
    pub fn held(&self) -> usize {
        lock(&self.0).held.len()
    }

    /// Sets the drop and duplicate probabilities.
    pub fn set(&self, drop: f64, duplicate: f64) {
        let mut s = lock(&self.0);
        s.drop = drop;
        s.duplicate = duplicate;
    }

    /// Drops every frame (`true`) or none beyond the probabilities (`false`).
    pub fn cut(&self, on: bool) {
        lock(&self.0).cut = on;
    }

    /// Frames delivered, dropped and duplicated so far.
    pub fn counts(&self) -> (u64, u64, u64) {
        let s = lock(&self.0);
        (s.passed, s.dropped, s.duplicated)
    }

    /// Copies of obligation `id` this plug dropped so far. Unlike
    /// [`Plug::counts`], which counts every frame (a status query sent on
    /// connect is one too), this says that attempt was lost: a scenario
    /// that waits on it knows the first copy can no longer arrive late.
    pub fn lost(&self, id: &ObligationId) -> u64 {
        lock(&self.0).lost.get(id).copied().unwrap_or(0)
    }

    /// How many copies of the next frame to deliver; `ob` is the id when
    /// the frame is an obligation.
    fn copies(&self, ob: Option<&ObligationId>) -> usize {
        let mut s = lock(&self.0);
        let (drop, dup) = (s.drop, s.duplicate);
        if s.cut || (drop > 0.0 && s.rng.random_bool(drop.min(1.0))) {
            s.dropped += 1;
            if let Some(id) = ob {
                *s.lost.entry(id.clone()).or_insert(0) += 1;
            }
            return 0;
        }
        s.passed += 1;
        if dup > 0.0 && s.rng.random_bool(dup.min(1.0)) {
            s.duplicated += 1;
            return 2;
        }
        1
    }

    /// Puts the plug between `t`'s incoming channel and whoever reads it.
    pub fn wrap(&self, t: Transport) -> Transport {
        let Transport {
            handle,
            mut incoming,
        } = t;
        let (tx, rx) = mpsc::channel(1024);
        let plug = self.clone();
        tokio::spawn(async move {
            loop {
                let item = tokio::select! {
                    item = incoming.recv() => match item {
                        Some(item) => item,
                        None => return,
                    },
                    () = plug.1.notified() => {
                        // Injections always; what was held only once the
                        // hold is off (both wake this task).
                        let released = {
                            let mut s = lock(&plug.0);
                            let mut v = std::mem::take(&mut s.injected);
                            if !s.hold {
                                v.extend(std::mem::take(&mut s.held));
                            }
                            v
                        };
                        for item in released {
                            if tx.send(item).await.is_err() {
                                return;
                            }
                        }
                        continue;
                    }
                };
                let observer = lock(&plug.0).observer.clone();
                if let Some(f) = observer {
                    f(&item);
                }
                let n = match &item {
                    Incoming::Frame { envelope, .. } => {
                        let mut s = lock(&plug.0);
                        if s.hold {
                            s.held.push(item);
                            continue;
                        }
                        drop(s);
                        let ob = match &envelope.message {
                            Message::Obligation(o) => Some(o.id()),
                            _ => None,
                        };
                        plug.copies(ob)
                    }
                    _ => 1,
                };
                for _ in 0..n {
                    if tx.send(item.clone()).await.is_err() {
                        return;
                    }
                }
            }
        });
        Transport {
            handle,
            incoming: rx,
        }
    }
}

/// One custody attempt as alice's store made it durable: the record that
/// counted it (`CustodyOpened` for attempt 1, `AttemptMade` after), the
/// `now` its commit was stamped with, and the next attempt's due time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurableAttempt {
    /// The obligation.
    pub id: ObligationId,
    /// Attempts made, this one included.
    pub attempts: u32,
    /// When the custodian scheduled the next attempt.
    pub next_at: Timestamp,
    /// The `now` passed to the commit that made it durable (taken by the
    /// driver when it started the commit, so never before the attempt was
    /// decided).
    pub commit_now: Timestamp,
    /// When custody was opened (attempt 1 only).
    pub offered_at: Option<Timestamp>,
}

#[derive(Debug, Default)]
struct ProbeState {
    delay: Duration,
    durable: HashMap<ObligationId, u32>,
    attempts: Vec<DurableAttempt>,
}

/// What alice's store has made durable, seen from a wrapper around it
/// ([`Probed`]; every [`Disk`] of a world's custodian is wrapped).
///
/// The wrapper records a commit's custody attempts only after the inner
/// store's `commit` returned `Ok`: whatever the probe holds was durable
/// (AB-1). It can also slow each commit down ([`Probe::delay_commits`]),
/// so a driver that released a transmit before its commit returned would
/// show that transmit arriving before the probe holds its attempt
/// (C-AB1-2).
#[derive(Debug, Clone, Default)]
pub struct Probe(Arc<Mutex<ProbeState>>);

impl Probe {
    /// Sleeps `d` at the start of every commit, before the inner store
    /// commits (`Duration::ZERO`: no delay).
    pub fn delay_commits(&self, d: Duration) {
        lock(&self.0).delay = d;
    }

    /// The attempts of `id` that are durable (0: custody not yet durable).
    pub fn durable_attempts(&self, id: &ObligationId) -> u32 {
        lock(&self.0).durable.get(id).copied().unwrap_or(0)
    }

    /// Every custody attempt made durable so far, in commit order.
    pub fn attempts(&self) -> Vec<DurableAttempt> {
        lock(&self.0).attempts.clone()
    }

    /// Forgets everything (the store it watched was lost).
    fn clear(&self) {
        let mut s = lock(&self.0);
        s.durable.clear();
        s.attempts.clear();
    }

    /// Notes what a successful commit of `batches` at `now` made durable,
    /// folding as the stores do: a replayed open changes nothing, attempt
    /// counts only grow.
    fn committed(&self, now: Timestamp, batches: &[&[Record]]) {
        let mut s = lock(&self.0);
        for r in batches.iter().flat_map(|b| b.iter()) {
            let a = match r {
                Record::CustodyOpened { pending, .. } => {
                    let id = pending.obligation.id();
                    if s.durable.contains_key(id) {
                        continue;
                    }
                    DurableAttempt {
                        id: id.clone(),
                        attempts: pending.attempts,
                        next_at: pending.next_at,
                        commit_now: now,
                        offered_at: Some(pending.offered_at),
                    }
                }
                Record::AttemptMade {
                    obligation_id,
                    attempts,
                    next_at,
                } => DurableAttempt {
                    id: obligation_id.clone(),
                    attempts: *attempts,
                    next_at: *next_at,
                    commit_now: now,
                    offered_at: None,
                },
                _ => continue,
            };
            let n = s.durable.entry(a.id.clone()).or_insert(0);
            *n = (*n).max(a.attempts);
            s.attempts.push(a);
        }
    }
}

/// A store wrapped by a [`Probe`]: forwards every method of the trait
/// (the defaulted ones too, so an indexed backend keeps answering from
/// its indexes), delaying and observing commits.
pub struct Probed {
    inner: Box<dyn Store>,
    probe: Probe,
}

impl Store for Probed {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn format_version(&self) -> u32 {
        self.inner.format_version()
    }
    fn commit(&mut self, now: Timestamp, batches: &[&[Record]]) -> Result<Committed, StoreError> {
        let delay = lock(&self.probe.0).delay;
        if !delay.is_zero() {
            // The store thread is blocking by design; so is this sleep.
            std::thread::sleep(delay);
        }
        let c = self.inner.commit(now, batches)?;
        self.probe.committed(now, batches);
        Ok(c)
    }
    fn load(&self) -> Result<DurableState, StoreError> {
        self.inner.load()
    }
    fn inbox(&self, now: Timestamp) -> Result<Inbox, StoreError> {
        self.inner.inbox(now)
    }
    fn list(
        &self,
        state: Option<ListState>,
        after: Option<&ObligationId>,
        limit: usize,
    ) -> Result<Page<Listed, ObligationId>, StoreError> {
        self.inner.list(state, after, limit)
    }
    fn escalations(
        &self,
        after: Option<EventId>,
        limit: usize,
    ) -> Result<Page<EscalationEntry, EventId>, StoreError> {
        self.inner.escalations(after, limit)
    }
    fn decisions(
        &self,
        after: Option<&ObligationId>,
        limit: usize,
    ) -> Result<Page<DecisionItem, ObligationId>, StoreError> {
        self.inner.decisions(after, limit)
    }
    fn events(&self, from: EventId, limit: usize) -> Result<Vec<StoredEvent>, StoreError> {
        self.inner.events(from, limit)
    }
    fn compact(&mut self, now: Timestamp, retention: Duration) -> Result<Compacted, StoreError> {
        self.inner.compact(now, retention)
    }
    fn health(&self) -> Result<(), StoreError> {
        self.inner.health()
    }
    fn idle(&mut self) -> Result<(), StoreError> {
        self.inner.idle()
    }
}

/// A SimStore that outlives the node using it (restarts reopen it).
#[derive(Clone, Default)]
pub struct SharedSim(Arc<Mutex<SimStore>>);

impl Store for SharedSim {
    fn backend(&self) -> &'static str {
        "sim"
    }
    fn format_version(&self) -> u32 {
        lock(&self.0).format_version()
    }
    fn commit(&mut self, now: Timestamp, batches: &[&[Record]]) -> Result<Committed, StoreError> {
        lock(&self.0).commit(now, batches)
    }
    fn load(&self) -> Result<DurableState, StoreError> {
        lock(&self.0).load()
    }
    fn events(&self, from: EventId, limit: usize) -> Result<Vec<StoredEvent>, StoreError> {
        lock(&self.0).events(from, limit)
    }
    fn compact(&mut self, now: Timestamp, retention: Duration) -> Result<Compacted, StoreError> {
        lock(&self.0).compact(now, retention)
    }
}

/// The payload field a scenario sets to script bob's answer: `"decline"`
/// (declined `policy`, detail [`DECLINE_DETAIL`]) or `"defer"` (deferred
/// on every delivery). Without it bob applies as the standard applier.
pub const SCRIPT: &str = "conformance";

/// The detail of a scripted decline (the custodian must surface it).
pub const DECLINE_DETAIL: &str = "scripted decline";

/// Bob's applier: the standard one, unless the payload's [`SCRIPT`] field
/// says to decline or to defer. The receiver consults it only for an
/// obligation it has not decided yet, inside its deadline and not
/// superseded: what the receiver guards before asking it (AB-3, C-DL-1,
/// C-SS-2) stays the receiver's.
///
/// Every decision to apply is recorded in [`Applies`] (shared by every
/// incarnation of bob in a world): the ground truth [`World::verify`]
/// hands the invariant checker.
#[derive(Debug, Default)]
struct Scripted(StandardApplier, Applies);

/// Bob's applier's decisions to apply, across his restarts: (custodian,
/// obligation, when, its deadline).
type Applies = Arc<Mutex<Vec<check::AppliedByApplier>>>;

impl Applier for Scripted {
    fn decide(&mut self, ctx: &ApplyContext<'_>, ob: &Obligation) -> ApplyDecision {
        let d = match ob.payload().get(SCRIPT).and_then(|v| v.as_str()) {
            Some("decline") => ApplyDecision::Decline {
                reason: DeclineReason::Policy,
                detail: Some(DECLINE_DETAIL.into()),
            },
            Some("defer") => ApplyDecision::Defer {
                detail: Some("scripted deferral".into()),
            },
            _ => self.0.decide(ctx, ob),
        };
        if matches!(d, ApplyDecision::Apply { .. }) {
            lock(&self.1).push(check::AppliedByApplier {
                receiver: agent(BOB),
                custodian: ctx.custodian.clone(),
                id: ob.id().clone(),
                at: ctx.now,
                deadline_at: ob.deadline_at(),
            });
        }
        d
    }
}

/// The kind alice holds under the "surface" decline policy (C-DC-2): a
/// decline of it raises a decision item instead of applying `safe(O)`.
/// Every other kind has the default policy (apply `safe(O)`).
pub const SURFACE_KIND: &str = "oauth.token";

/// The custody schedule of a world's custodian.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    /// First retry after this long.
    pub base: Duration,
    /// Retries at most this far apart (before jitter).
    pub cap: Duration,
    /// Each interval is stretched by up to this fraction (seeded).
    pub jitter: f64,
}

impl Schedule {
    /// Fast retries, for scenarios about loss (50 ms, capped at 200 ms).
    pub const FAST: Schedule = Schedule {
        base: Duration::from_millis(50),
        cap: Duration::from_millis(200),
        jitter: 0.1,
    };
    /// Slow retries, for scenarios that count attempts on a clean link (a
    /// loaded machine must not retry before the ack is back).
    pub const PATIENT: Schedule = Schedule {
        base: Duration::from_secs(3),
        cap: Duration::from_secs(5),
        jitter: 0.1,
    };
    /// The schedule C-AB2-2 measures: 100 ms doubling to a 400 ms cap
    /// (so a lost doubling or cap is off by at least 100 ms), jitter up to
    /// 50 % (so another seed's draws are far apart).
    pub const BACKOFF: Schedule = Schedule {
        base: Duration::from_millis(100),
        cap: Duration::from_millis(400),
        jitter: 0.5,
    };
}

/// The seed of every world's custodian's jitter stream (C-AB2-2: same
/// seed, same schedule).
pub const CUSTODIAN_SEED: u64 = 0x00AB_2202;

const ALICE: &str = "alice";
const BOB: &str = "bob";
const RELAY: &str = "relay-1";

/// The bearer credential `who` presents on its POSTs (HTTP cells).
fn token(who: &str) -> String {
    format!("{who}-conformance-secret")
}

/// The agent id `s` (a valid literal).
pub fn agent(s: &str) -> AgentId {
    AgentId::new(s).unwrap_or_else(|e| panic!("agent id {s}: {e}"))
}

/// What a world's nodes are opened from: identities, stores that outlive
/// the nodes, the in-memory network and bob's address.
struct Env {
    backend: Backend,
    schedule: Schedule,
    dir: tempfile::TempDir,
    mem: MemNetwork,
    alice_id: Identity,
    bob_id: Identity,
    bob_addr: Option<SocketAddr>,
    sims: [SharedSim; 2],
    alice_plug: Plug,
    bob_plug: Plug,
    /// The relay daemon of the [`Net::Relayed`] cells (it outlives both
    /// nodes' restarts) and its identity.
    relay: Option<RelayHandle>,
    relay_id: Identity,
    /// Alice's and bob's HTTP ports ([`Net::Http`]), fixed for the world.
    http_ports: [u16; 2],
    /// This world's partitions' prefix on PostgreSQL: unique per world, so
    /// cells sharing the database never see each other's rows.
    pg_prefix: String,
    /// Bob's applier's decisions to apply, across restarts.
    applies: Applies,
    /// What alice's store made durable (every store of hers is wrapped).
    probe: Probe,
    /// How many times alice's store was lost ([`World::reopen_alice_on_fresh_store`]):
    /// her current store's generation, part of its file or partition name.
    alice_generation: u32,
    /// Every obligation a scenario built (the candidates for the trace's
    /// offers: those alice holds or closed were offered).
    made: Arc<Mutex<Vec<Obligation>>>,
}

impl Env {
    fn options(&self, name: &str) -> NodeOptions {
        let mut o = NodeOptions::new(agent(name));
        let backoff = RetryBackoff {
            base: self.schedule.base,
            cap: self.schedule.cap,
            jitter: self.schedule.jitter,
        };
        o.custodian.seed = CUSTODIAN_SEED;
        o.custodian.default_profile = CustodyProfile {
            backoff,
            ..CustodyProfile::default()
        };
        o.custodian.profiles.insert(
            Kind::new(SURFACE_KIND).unwrap_or_else(|e| panic!("kind {SURFACE_KIND}: {e}")),
            CustodyProfile {
                backoff,
                decline_policy: DeclinePolicy::Surface,
            },
        );
        o.receiver.skew_margin = Duration::from_millis(100);
        o.applier = Box::new(Scripted(StandardApplier::default(), self.applies.clone()));
        o
    }

    /// The name of `name`'s current store (file or partition): alice's
    /// carries her store's generation once it was lost.
    fn store_name(&self, name: &str) -> String {
        match self.alice_generation {
            g if g > 0 && name == ALICE => format!("{name}-{g}"),
            _ => name.to_string(),
        }
    }

    fn store_path(&self, name: &str) -> PathBuf {
        self.dir
            .path()
            .join(format!("{}.db", self.store_name(name)))
    }

    async fn store(&self, name: &str) -> Result<Box<dyn Store>, BoxError> {
        let i = usize::from(name == BOB);
        Ok(match self.backend.disk {
            Disk::Sim => Box::new(self.sims[i].clone()),
            Disk::Embedded(kind) => kind.open(self.store_path(name), &StoreOptions::default())?,
            Disk::Postgres => {
                let url = postgres_url().ok_or("ABHYASA_PG_URL is not set")?;
                let mut o = abhyasa_pg::PgOptions::default();
                let partition = format!("{}-{}", self.pg_prefix, self.store_name(name));
                // One holder name per node: a restart takes its partition
                // back at once (the previous store ended its lease anyway).
                o.holder = partition.clone();
                o.partition = Some(partition);
                let agent = agent(name);
                // The synchronous client runs its own runtime: off this one.
                Box::new(
                    tokio::task::spawn_blocking(move || {
                        abhyasa_pg::PgStore::open(&url, &agent, &o)
                    })
                    .await??,
                )
            }
        })
    }

    async fn transport(&mut self, name: &str) -> Result<Transport, BoxError> {
        let is_bob = name == BOB;
        let (me, peer) = if is_bob { (BOB, ALICE) } else { (ALICE, BOB) };
        let (my_id, peer_id) = if is_bob {
            (self.bob_id.clone(), self.alice_id.clone())
        } else {
            (self.alice_id.clone(), self.bob_id.clone())
        };
        // Over QUIC and WebSocket bob listens (on the same port across
        // restarts, one the kernel hands no other socket while he is down);
        // alice dials him.
        let listen = || -> SocketAddr {
            match (is_bob, self.bob_addr) {
                (true, Some(a)) => a,
                (true, None) => SocketAddr::from(([127, 0, 0, 1], loopback_port())),
                (false, _) => SocketAddr::from(([127, 0, 0, 1], 0)),
            }
        };
        let dial = if is_bob { None } else { self.bob_addr };
        let t = match self.backend.net {
            Net::Mem => self.mem.join(agent(me), LinkConfig::default()).await?,
            Net::Quic => {
                abhyasa_quic::start(
                    QuicConfig::new(agent(me), my_id, listen())
                        .with_peer(peer_id.pin(agent(peer)), dial),
                )
                .await?
            }
            Net::Ws => {
                abhyasa_ws::start(
                    WsConfig::new(agent(me), my_id, Some(listen()))
                        .with_peer(peer_id.pin(agent(peer)), dial.map(|a| format!("ws://{a}"))),
                )
                .await?
            }
            Net::Relayed => {
                // Both nodes dial out to the relay; neither needs an address
                // the other knows. A reopened node gets a fresh link to the
                // same relay, which kept what it held for it.
                let relay_addr = self
                    .relay
                    .as_ref()
                    .and_then(RelayHandle::local_addr)
                    .ok_or("the relay is not running")?;
                let quic = abhyasa_quic::start(
                    QuicConfig::new(agent(me), my_id.clone(), "127.0.0.1:0".parse()?)
                        .with_peer(self.relay_id.pin(agent(RELAY)), Some(relay_addr)),
                )
                .await?;
                let (t, _stats) = abhyasa_spool::relayed(
                    quic,
                    RelayedConfig::new(agent(RELAY), vec![peer_id.pin(agent(peer))], my_id),
                );
                t
            }
            Net::Http => {
                let (mine, theirs) = if is_bob {
                    (self.http_ports[1], self.http_ports[0])
                } else {
                    (self.http_ports[0], self.http_ports[1])
                };
                let base = format!("http://127.0.0.1:{theirs}");
                let peer_cfg = HttpPeer {
                    agent: agent(peer),
                    token: Some(token(peer)),
                    fingerprint: None,
                    // Bob pushes late final acks to alice; alice POSTs
                    // obligations to bob.
                    custody_ack_endpoint: (is_bob).then(|| format!("{base}/abhyasa/custody_ack")),
                    obligation_endpoint: (!is_bob).then(|| format!("{base}/abhyasa/obligations")),
                    outbound_token: Some(token(me)),
                };
                // The card must advertise at least one kind; it restricts
                // nothing the binding accepts.
                let mut profiles = Vec::new();
                for k in ["anumati.consent", SURFACE_KIND] {
                    profiles.push(abhyasa_a2a::card::kind_profile(
                        Kind::new(k)?,
                        "",
                        600,
                        &RetryBackoff::DEFAULT,
                    )?);
                }
                let mut cfg = HttpConfig::loopback(me, vec![peer_cfg], profiles);
                cfg.listen = SocketAddr::from(([127, 0, 0, 1], mine));
                // A request whose frame the plug dropped is answered 202
                // after this; the custodian's retry is the redelivery.
                cfg.sync_wait = Duration::from_millis(500);
                cfg.client_timeout = Duration::from_secs(2);
                // Alice's client opens a connection per concurrent request,
                // all from 127.0.0.1: a burst of offers would meet the
                // per-source cap on handshakes, which bounds anonymous
                // floods (C-PA-1, shown in cli/tests/preauth.rs) and is not
                // what this suite measures.
                cfg.max_handshakes_per_source = cfg.max_handshakes;
                let (t, _server) = abhyasa_a2a::start(agent(me), cfg).await?;
                t
            }
        };
        if is_bob && matches!(self.backend.net, Net::Quic | Net::Ws) {
            self.bob_addr = t.handle.local_addr();
        }
        let plug = if is_bob {
            &self.bob_plug
        } else {
            &self.alice_plug
        };
        Ok(plug.wrap(t))
    }

    async fn open_node(&mut self, name: &str) -> Result<Node, BoxError> {
        // A restarted bob rebinds his port: the previous endpoint's socket
        // is closed by `shutdown`, but the kernel may take a moment to let
        // the address go (UDP for QUIC). Retry the bind briefly.
        let mut tries = 0;
        let t = loop {
            match self.transport(name).await {
                Ok(t) => break t,
                Err(e) if tries < 40 && e.to_string().contains("in use") => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(e),
            }
        };
        let mut store = self.store(name).await?;
        if name == ALICE {
            store = Box::new(Probed {
                inner: store,
                probe: self.probe.clone(),
            });
        }
        Ok(Node::open(self.options(name), store, t).await?)
    }
}

/// A name no other world (in this or another test process) uses.
fn unique_prefix() -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("conformance-{}-{nanos}-{n}", std::process::id())
}

/// Two nodes, alice (custodian) and bob (receiver), on one backend.
pub struct World {
    /// The cell this world runs on.
    pub backend: Backend,
    env: Env,
    /// The custodian.
    pub alice: Node,
    bob: Option<Node>,
    /// Faults on what alice receives (acks).
    pub alice_plug: Plug,
    /// Faults on what bob receives (obligations).
    pub bob_plug: Plug,
}

impl World {
    /// Starts both nodes on `backend` and waits until alice is connected
    /// to bob.
    pub async fn new(backend: Backend, schedule: Schedule) -> Result<World, BoxError> {
        let (alice_plug, bob_plug) = (Plug::new(11), Plug::new(13));
        let dir = tempfile::tempdir()?;
        let alice_id = generate_identity(&agent(ALICE))?;
        let bob_id = generate_identity(&agent(BOB))?;
        let relay_id = generate_identity(&agent(RELAY))?;
        let relay = match backend.net {
            Net::Relayed => {
                let quic = QuicConfig::new(agent(RELAY), relay_id.clone(), "127.0.0.1:0".parse()?)
                    .with_peer(alice_id.pin(agent(ALICE)), None)
                    .with_peer(bob_id.pin(agent(BOB)), None);
                Some(
                    abhyasa_spool::start(RelayConfig {
                        quic: Some(quic),
                        ws: None,
                        spool_path: dir.path().join("spool.redb"),
                        limits: SpoolLimits::default(),
                        status_path: None,
                    })
                    .await?,
                )
            }
            _ => None,
        };
        let http_ports = match backend.net {
            Net::Http => [loopback_port(), loopback_port()],
            _ => [0, 0],
        };
        let mut env = Env {
            backend,
            schedule,
            dir,
            mem: MemNetwork::new(7),
            alice_id,
            bob_id,
            bob_addr: None,
            sims: [SharedSim::default(), SharedSim::default()],
            alice_plug: alice_plug.clone(),
            bob_plug: bob_plug.clone(),
            relay,
            relay_id,
            http_ports,
            pg_prefix: unique_prefix(),
            applies: Applies::default(),
            probe: Probe::default(),
            alice_generation: 0,
            made: Arc::default(),
        };
        let bob = env.open_node(BOB).await?;
        let alice = env.open_node(ALICE).await?;
        let w = World {
            backend,
            env,
            alice,
            bob: Some(bob),
            alice_plug,
            bob_plug,
        };
        w.wait_connected().await?;
        Ok(w)
    }

    /// What alice's store has made durable (C-AB1-2, C-AB2-2).
    pub fn alice_probe(&self) -> &Probe {
        &self.env.probe
    }

    /// The receiver (panics when it is stopped: a scenario bug).
    pub fn bob(&self) -> &Node {
        self.bob
            .as_ref()
            .unwrap_or_else(|| panic!("bob is stopped"))
    }

    /// Waits until alice has an authenticated connection to bob.
    pub async fn wait_connected(&self) -> Result<(), BoxError> {
        tokio::time::timeout(Duration::from_secs(15), async {
            while !self.alice.is_connected(&agent(BOB)) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .map_err(|_| format!("{:?}: alice never connected to bob", self.backend))?;
        Ok(())
    }

    /// Stops bob (his store keeps everything he committed).
    pub async fn stop_bob(&mut self) -> Result<(), BoxError> {
        if let Some(b) = self.bob.take() {
            b.shutdown().await?;
        }
        Ok(())
    }

    /// Reopens bob on his store (and, for QUIC and WebSocket, his port).
    pub async fn start_bob(&mut self) -> Result<(), BoxError> {
        self.stop_bob().await?;
        let b = self.env.open_node(BOB).await?;
        self.bob = Some(b);
        Ok(())
    }

    /// Stops alice and reopens her on her store: every pending transfer
    /// must resume from its durable record.
    pub async fn restart_alice(&mut self) -> Result<(), BoxError> {
        self.restart_alice_after(Duration::ZERO).await
    }

    /// Stops alice, leaves her down for `down`, and reopens her on her
    /// store (a custodian that was away across deadlines).
    pub async fn restart_alice_after(&mut self, down: Duration) -> Result<(), BoxError> {
        self.alice.shutdown().await?;
        tokio::time::sleep(down).await;
        let a = self.env.open_node(ALICE).await?;
        let old = std::mem::replace(&mut self.alice, a);
        drop(old);
        Ok(())
    }

    /// Stops alice and reopens her on a FRESH, empty store (a new
    /// SimStore, a new file, a new PostgreSQL partition): a custodian that
    /// lost its disk and kept its identity and address. Everything her old
    /// store held is gone, from her and from [`World::trace`] (which reads
    /// her store): an obligation whose custody lived only there is no
    /// longer an offer of hers, while bob's ledger and applier still show
    /// what he did with it. The honest way, through the node, to reuse an
    /// obligation id with other content (C-AB3-4).
    pub async fn reopen_alice_on_fresh_store(&mut self) -> Result<(), BoxError> {
        self.alice.shutdown().await?;
        self.env.alice_generation += 1;
        self.env.sims[0] = SharedSim::default();
        self.env.probe.clear();
        let a = self.env.open_node(ALICE).await?;
        let old = std::mem::replace(&mut self.alice, a);
        drop(old);
        Ok(())
    }

    /// A custodian with alice's configuration (schedule, profiles, seed)
    /// and no history: what the node must follow, computed apart from it
    /// (C-AB2-2 compares its [`Custodian::interval`](abhyasa_core::custody::Custodian::interval)
    /// with the node's durable schedule).
    pub fn reference_custodian(&self) -> abhyasa_core::custody::Custodian {
        abhyasa_core::custody::Custodian::new(
            self.env.options(ALICE).custodian,
            abhyasa_core::polarity::PolarityRegistry::standard(),
        )
    }

    /// How many times bob's applier decided to apply `id` from alice,
    /// across his restarts.
    pub fn applied_by_bob(&self, id: &ObligationId) -> usize {
        lock(&self.env.applies)
            .iter()
            .filter(|a| a.id == *id && a.custodian == agent(ALICE))
            .count()
    }

    /// An Anumati revocation of `scope` from alice to bob: admissible,
    /// custody mode, deadline `deadline_s` seconds, retries enough to span it.
    pub fn revoke(
        &self,
        id: &str,
        scope: &str,
        deadline_s: i64,
        sequence: Option<u64>,
    ) -> Obligation {
        let mut b = Obligation::builder()
            .id(id)
            .kind("anumati.consent")
            .target(BOB)
            .payload(serde_json::json!({"decision": "revoke", "scope": scope}))
            .deadline_seconds(deadline_s)
            .max_retries(abhyasa_core::min_retries_to_span(deadline_s as u64, 0.05, 0.2) as i64 + 2)
            .created_at(self.alice.now());
        if let Some(s) = sequence {
            b = b.sequence(s);
        }
        let ob = b.build().unwrap_or_else(|e| panic!("obligation {id}: {e}"));
        lock(&self.env.made).push(ob.clone());
        ob
    }

    /// An obligation of `kind` with `payload` from alice to bob, custody
    /// sized like [`World::revoke`] (admissible or not: the registry
    /// decides).
    pub fn obligation(
        &self,
        id: &str,
        kind: &str,
        payload: serde_json::Value,
        deadline_s: i64,
    ) -> Obligation {
        let ob = Obligation::builder()
            .id(id)
            .kind(kind)
            .target(BOB)
            .payload(payload)
            .deadline_seconds(deadline_s)
            .max_retries(abhyasa_core::min_retries_to_span(deadline_s as u64, 0.05, 0.2) as i64 + 2)
            .created_at(self.alice.now())
            .build()
            .unwrap_or_else(|e| panic!("obligation {id}: {e}"));
        lock(&self.env.made).push(ob.clone());
        ob
    }

    /// Alice's terminal outcome for `id`, waiting at most `within`.
    pub async fn outcome(&self, id: &ObligationId, within: Duration) -> Outcome {
        match tokio::time::timeout(within, self.alice.outcome(id)).await {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => panic!("{:?}: outcome of {id}: {e}", self.backend),
            Err(_) => panic!("{:?}: {id} not terminal within {within:?}", self.backend),
        }
    }

    /// Bob's durable ledger: obligation id → outcome, read from his store
    /// (not from events), so "applied once" is what survives.
    pub async fn bob_ledger(&self) -> Vec<(ObligationId, LedgerOutcome)> {
        let st = self
            .bob()
            .durable_state()
            .await
            .unwrap_or_else(|e| panic!("bob's durable state: {e}"));
        let mut v: Vec<_> = st
            .receiver
            .ledger
            .values()
            .map(|r| (r.obligation_id.clone(), r.outcome))
            .collect();
        v.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
        v
    }

    /// Bob's durable ledger entry for `id`: outcome and decline reason.
    pub async fn bob_entry(
        &self,
        id: &ObligationId,
    ) -> Option<(LedgerOutcome, Option<DeclineReason>)> {
        let st = self
            .bob()
            .durable_state()
            .await
            .unwrap_or_else(|e| panic!("bob's durable state: {e}"));
        st.receiver
            .ledger
            .values()
            .find(|r| r.obligation_id == *id)
            .map(|r| (r.outcome, r.reason))
    }

    /// What the world saw happen, as the one invariant checker's trace
    /// (`abhyasa_check`, the same checker the abstract sweep and the
    /// full-stack simulator use): the obligations alice was offered (held
    /// or closed in her store), every decision of bob's applier to apply,
    /// bob's durable ledger, and how custody ended at alice (her stored
    /// terminal summaries with the attempts and escalation of each
    /// outcome). Only alice's current store is read: after
    /// [`World::reopen_alice_on_fresh_store`] the custody her lost store
    /// held is not in the trace (its obligation is no offer of hers any
    /// more), while bob's ledger and applier still show his side of it;
    /// an id she reused is checked as the custody she holds now, against
    /// everything bob did under that id. Custody still pending when the
    /// trace is taken goes into `pending_at_end`, which the checker
    /// reports as AB-1: every scenario waits for the outcome of everything
    /// it offered before it closes.
    pub async fn trace(&self) -> check::Trace {
        let a = self
            .alice
            .durable_state()
            .await
            .unwrap_or_else(|e| panic!("{:?}: alice's durable state: {e}", self.backend));
        let registry = abhyasa_core::polarity::PolarityRegistry::standard();
        let alice = agent(ALICE);
        let made = lock(&self.env.made).clone();
        let made_count = made.len();
        let mut trace = check::Trace::default();
        for ob in made {
            let id = ob.id();
            // Alice holds this very obligation (same digest): an id reused
            // after a store loss names another one, whose records went
            // with the lost store.
            // An obligation offered without a sequence was sent with the
            // next one on its key (C-OR-1): same content but for that.
            let as_sent = |d: abhyasa_core::Digest, seq: Option<abhyasa_core::Sequence>| {
                d == ob.digest() || (ob.sequence().is_none() && d == ob.with_sequence(seq).digest())
            };
            let pending = a
                .custodian
                .pending
                .get(id)
                .is_some_and(|p| as_sent(p.obligation.digest(), p.obligation.sequence()));
            let closed = a.custodian.terminal.get(id).is_some_and(|t| {
                (1..=made_count as u64 + 1)
                    .any(|s| as_sent(t.digest, Some(abhyasa_core::Sequence(s))))
            });
            if !pending && !closed {
                continue;
            }
            let admissible = registry.classify(&ob).is_ok_and(|c| c.is_admissible());
            trace.offers.push(check::Offer {
                custodian: alice.clone(),
                id: id.clone(),
                admissible,
                deadline_at: ob.deadline_at(),
                max_retries: u64::from(ob.max_retries()),
                sequence: ob.sequence(),
            });
            if pending {
                trace.pending_at_end.push((alice.clone(), id.clone()));
            }
        }
        for (id, t) in &a.custodian.terminal {
            let o = self.outcome(id, Duration::from_secs(1)).await;
            let outcome = match t.state {
                TerminalState::Applied => check::Outcome::Applied,
                TerminalState::Declined => check::Outcome::Declined(o.reason),
                TerminalState::Escalated => check::Outcome::Escalated,
                TerminalState::BestEffort => check::Outcome::BestEffort,
            };
            trace.terminals.push(check::Terminal {
                custodian: alice.clone(),
                id: id.clone(),
                outcome,
                attempts: u64::from(o.attempts.unwrap_or(1)),
                escalation: o.escalation.as_ref().map(|e| e.guard),
                principal_writes: None,
            });
        }
        let b = self
            .bob()
            .durable_state()
            .await
            .unwrap_or_else(|e| panic!("{:?}: bob's durable state: {e}", self.backend));
        trace.ledger = Some(
            b.receiver
                .ledger
                .iter()
                .map(|((c, id), l)| ((c.clone(), id.clone()), l.outcome))
                .collect(),
        );
        trace.applier_applies = lock(&self.env.applies).clone();
        trace
    }

    /// Runs the invariant checker over [`World::trace`] and fails the
    /// scenario, naming its cell, on any violation. Every scenario ends
    /// with it (through [`World::close`]).
    pub async fn verify(&self) {
        let trace = self.trace().await;
        let violations = check::check(&trace);
        assert!(
            violations.is_empty(),
            "{:?}: the invariant checker found {} violation(s):\n{}",
            self.backend,
            violations.len(),
            violations
                .iter()
                .map(|v| format!("  {v}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    /// Checks the invariants ([`World::verify`]), then shuts both nodes
    /// down (and the relay, if any).
    pub async fn close(mut self) -> Result<(), BoxError> {
        if self.bob.is_some() {
            self.verify().await;
        }
        self.stop_bob().await?;
        self.alice.shutdown().await?;
        if let Some(r) = self.env.relay.take() {
            r.shutdown().await;
        }
        Ok(())
    }
}
