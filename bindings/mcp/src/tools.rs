//! The tools of the v1 reference server, on the real core.
//!
//! Each tool takes the reference's argument keys and answers the
//! reference's result text: `{"ok": true, ...}` with the same result fields,
//! or `{"ok": false, "error": "..."}`. Bad arguments are a [`ToolError`]
//! (the server turns it into a result with `isError`), never a panic or a
//! protocol error (C-MCP-2).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::Duration;

use abhyasa_core::custody::{
    Applier, ApplyContext, ApplyDecision, Custodian, CustodianConfig, CustodianEvent, Receiver,
    ReceiverConfig, TerminalState, Transmit,
};
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::wire::Message;
use abhyasa_core::{AgentId, CustodyAck, DeclineReason, KindProfile, Obligation, Timestamp};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Map, Value};

use crate::envelope::json_type;

/// A tool refused its arguments (or could not run): the message says what
/// to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ToolError(pub String);

impl ToolError {
    fn new(msg: impl Into<String>) -> Self {
        Self(msg.into())
    }
}

/// A tool's answer: the JSON body (with `ok`) and whether it is an error
/// result.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolReply {
    /// The body, `{"ok": ..., ...}`.
    pub body: Value,
    /// `isError`.
    pub is_error: bool,
}

impl ToolReply {
    /// `{"ok": true, ...fields}`.
    pub fn ok(fields: Value) -> Self {
        let mut m = Map::new();
        m.insert("ok".into(), Value::Bool(true));
        if let Value::Object(f) = fields {
            m.extend(f);
        }
        Self {
            body: Value::Object(m),
            is_error: false,
        }
    }

    /// `{"ok": false, "error": message}` as a tool error.
    pub fn error(message: impl Into<String>) -> Self {
        Self {
            body: json!({"ok": false, "error": message.into()}),
            is_error: true,
        }
    }
}

impl From<Result<ToolReply, ToolError>> for ToolReply {
    fn from(r: Result<ToolReply, ToolError>) -> Self {
        r.unwrap_or_else(|e| ToolReply::error(e.0))
    }
}

/// The object under `key`, or an error naming the key.
pub fn object_arg<'a>(
    args: &'a Map<String, Value>,
    key: &str,
) -> Result<&'a Map<String, Value>, ToolError> {
    match args.get(key) {
        Some(Value::Object(m)) => Ok(m),
        None | Some(Value::Null) => Err(ToolError::new(format!(
            "missing argument {key:?} (expected an object)"
        ))),
        Some(other) => Err(ToolError::new(format!(
            "expected object under key {key:?}, found {}",
            json_type(other)
        ))),
    }
}

fn obligation_arg(args: &Map<String, Value>) -> Result<Obligation, ToolError> {
    let m = object_arg(args, "obligation")?;
    Obligation::from_json_map(m).map_err(|e| ToolError::new(format!("invalid obligation: {e}")))
}

/// `validate_obligation {obligation}`.
pub fn validate_obligation(args: &Map<String, Value>) -> Result<ToolReply, ToolError> {
    let ob = obligation_arg(args)?;
    Ok(ToolReply::ok(json!({
        "obligation": "valid",
        "obligation_id": ob.id().as_str(),
        "digest": ob.digest().to_hex(),
    })))
}

/// `validate_custody_ack {ack}`.
pub fn validate_custody_ack(args: &Map<String, Value>) -> Result<ToolReply, ToolError> {
    let m = object_arg(args, "ack")?;
    let ack =
        CustodyAck::from_json_map(m).map_err(|e| ToolError::new(format!("invalid ack: {e}")))?;
    Ok(ToolReply::ok(json!({
        "ack": "valid",
        "obligation_id": ack.obligation_id.as_str(),
        "status": ack.status.as_str(),
    })))
}

/// `validate_abhyasa_service_ref {ref}`: the AgentCard extension params
/// (`version`, `custody_ack_endpoint`, `supported_kinds[]` of
/// `KindProfile`, each checked with the AB-2 sizing rule).
pub fn validate_abhyasa_service_ref(args: &Map<String, Value>) -> Result<ToolReply, ToolError> {
    let m = object_arg(args, "ref")?;
    let bad = |msg: String| ToolError::new(format!("invalid ref: {msg}"));
    let str_field = |name: &str| -> Result<&str, ToolError> {
        match m.get(name) {
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(s),
            Some(Value::String(_)) => Err(bad(format!("{name}: must not be empty"))),
            None | Some(Value::Null) => Err(bad(format!("{name}: missing"))),
            Some(other) => Err(bad(format!(
                "{name}: expected string, found {}",
                json_type(other)
            ))),
        }
    };
    let version = str_field("version")?;
    let endpoint = str_field("custody_ack_endpoint")?;
    let kinds = match m.get("supported_kinds") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err(bad("supported_kinds: must not be empty".into())),
        None | Some(Value::Null) => return Err(bad("supported_kinds: missing".into())),
        Some(other) => {
            return Err(bad(format!(
                "supported_kinds: expected array, found {}",
                json_type(other)
            )))
        }
    };
    let mut names = Vec::new();
    for (i, k) in kinds.iter().enumerate() {
        let Value::Object(km) = k else {
            return Err(bad(format!(
                "supported_kinds[{i}]: expected object, found {}",
                json_type(k)
            )));
        };
        let p = KindProfile::from_json_map(km)
            .map_err(|e| bad(format!("supported_kinds[{i}]: {e}")))?;
        names.push(p.kind.as_str().to_string());
    }
    Ok(ToolReply::ok(json!({
        "ref": "valid",
        "version": version,
        "custody_ack_endpoint": endpoint,
        "kinds": names,
    })))
}

/// `check_admissibility {obligation}` (AC-1, standard registry).
pub fn check_admissibility(args: &Map<String, Value>) -> Result<ToolReply, ToolError> {
    let ob = obligation_arg(args)?;
    let c = PolarityRegistry::standard()
        .classify(&ob)
        .map_err(|e| ToolError::new(format!("invalid obligation: {e}")))?;
    let admissible = c.is_admissible();
    Ok(ToolReply::ok(json!({
        "obligation_id": ob.id().as_str(),
        "kind": ob.kind().as_str(),
        "admissible": admissible,
        "carried": if admissible { "custody" } else { "best_effort" },
        "key": c.key.as_ref().map(|k| k.as_str()),
    })))
}

/// `compute_safe_action {obligation}`: `safe(O)`, or (like the reference)
/// an `ok: false` answer for an inadmissible obligation.
pub fn compute_safe_action(args: &Map<String, Value>) -> Result<ToolReply, ToolError> {
    let ob = obligation_arg(args)?;
    let c = PolarityRegistry::standard()
        .classify(&ob)
        .map_err(|e| ToolError::new(format!("invalid obligation: {e}")))?;
    match c.safe() {
        Some(safe) => Ok(ToolReply::ok(json!({ "safe_action": safe }))),
        None => Ok(ToolReply {
            body: json!({
                "ok": false,
                "error": format!(
                    "obligation {:?} is not admissible (AC-1); safe(O) is undefined for the best-effort side.",
                    ob.id().as_str()
                ),
            }),
            is_error: false,
        }),
    }
}

/// The lossy channel of `run_custody_transfer`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChannelArgs {
    /// Probability an obligation frame is lost.
    pub drop_prob: f64,
    /// Probability a delivered obligation frame arrives twice.
    pub duplicate_prob: f64,
    /// Probability an ack frame is lost.
    pub ack_drop_prob: f64,
    /// Seed of the channel and of the custodian's jitter.
    pub seed: u64,
}

fn channel_arg(args: &Map<String, Value>) -> Result<ChannelArgs, ToolError> {
    let m = match args.get("channel") {
        None | Some(Value::Null) => return Ok(ChannelArgs::default()),
        Some(Value::Object(m)) => m,
        Some(other) => {
            return Err(ToolError::new(format!(
                "'channel' must be an object, found {}",
                json_type(other)
            )))
        }
    };
    let prob = |name: &str| -> Result<f64, ToolError> {
        match m.get(name) {
            None | Some(Value::Null) => Ok(0.0),
            Some(Value::Number(n)) => match n.as_f64() {
                Some(p) if (0.0..=1.0).contains(&p) => Ok(p),
                _ => Err(ToolError::new(format!(
                    "invalid channel config: {name} must be in [0, 1], got {n}"
                ))),
            },
            Some(other) => Err(ToolError::new(format!(
                "invalid channel config: {name} must be a number, found {}",
                json_type(other)
            ))),
        }
    };
    let seed = match m.get("seed") {
        None | Some(Value::Null) => 0,
        Some(Value::Number(n)) => n.as_u64().ok_or_else(|| {
            ToolError::new(format!(
                "invalid channel config: seed must be a non-negative integer, got {n}"
            ))
        })?,
        Some(other) => {
            return Err(ToolError::new(format!(
                "invalid channel config: seed must be an integer, found {}",
                json_type(other)
            )))
        }
    };
    Ok(ChannelArgs {
        drop_prob: prob("drop_prob")?,
        duplicate_prob: prob("duplicate_prob")?,
        ack_drop_prob: prob("ack_drop_prob")?,
        seed,
    })
}

impl Default for ChannelArgs {
    fn default() -> Self {
        Self {
            drop_prob: 0.0,
            duplicate_prob: 0.0,
            ack_drop_prob: 0.0,
            seed: 0,
        }
    }
}

/// What the `simulate` tool's scripted receiver answers
/// (`receiver_decision`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SimDecision {
    Apply,
    Decline,
    Defer,
}

/// The `simulate` tool's receiver: answers as scripted every time it is
/// asked, and counts real applications (the tool reports them).
#[derive(Debug)]
struct SimApplier {
    decision: SimDecision,
    applications: u32,
}

impl Applier for SimApplier {
    fn decide(&mut self, _ctx: &ApplyContext<'_>, _ob: &Obligation) -> ApplyDecision {
        match self.decision {
            SimDecision::Apply => {
                self.applications += 1;
                ApplyDecision::Apply(Vec::new())
            }
            SimDecision::Decline => ApplyDecision::Decline {
                reason: DeclineReason::Policy,
                detail: None,
            },
            SimDecision::Defer => ApplyDecision::Defer { detail: None },
        }
    }
}

fn decision_arg(args: &Map<String, Value>) -> Result<(SimDecision, &'static str), ToolError> {
    match args.get("receiver_decision") {
        None | Some(Value::Null) => Ok((SimDecision::Apply, "applied")),
        Some(Value::String(s)) => match s.as_str() {
            "applied" => Ok((SimDecision::Apply, "applied")),
            "declined" => Ok((SimDecision::Decline, "declined")),
            "deferred" => Ok((SimDecision::Defer, "deferred")),
            other => Err(ToolError::new(format!(
                "receiver_decision must be applied|declined|deferred, got {other:?}"
            ))),
        },
        Some(other) => Err(ToolError::new(format!(
            "receiver_decision must be applied|declined|deferred, found {}",
            json_type(other)
        ))),
    }
}

/// Most channel and timer events one simulated transfer may take (a
/// deadline of years with total loss would otherwise run for minutes).
pub const MAX_SIM_EVENTS: u64 = 200_000;

/// One-way latency of the simulated link.
const LATENCY: Duration = Duration::from_millis(20);

/// `run_custody_transfer {obligation, channel?, receiver_decision?}`: the
/// real custodian and receiver over a seeded lossy channel in virtual time
/// from the obligation's `created_at`.
pub fn run_custody_transfer(args: &Map<String, Value>) -> Result<ToolReply, ToolError> {
    let ob = obligation_arg(args)?;
    let channel = channel_arg(args)?;
    let (decision, decision_name) = decision_arg(args)?;
    let sim = simulate(ob, channel, decision)?;
    let mut weights = BTreeMap::new();
    for (k, w) in sim.custodian.principal().weights() {
        weights.insert(k.as_str().to_string(), json!(w));
    }
    let mut auths = BTreeMap::new();
    for (k, e) in sim.custodian.principal().authorizations() {
        auths.insert(k.as_str().to_string(), json!(e.state));
    }
    let terminal = sim.terminal;
    Ok(ToolReply::ok(json!({
        "terminal": terminal,
        "attempts": sim.attempts,
        "discharged": matches!(terminal, TerminalState::Applied | TerminalState::Declined),
        "escalations": sim.escalations,
        "routing_weights": weights,
        "authorizations": auths,
        "applications": sim.applications,
        "receiver_decision": decision_name,
        "channel": {
            "drop_prob": channel.drop_prob,
            "duplicate_prob": channel.duplicate_prob,
            "ack_drop_prob": channel.ack_drop_prob,
            "seed": channel.seed,
        },
        "ended_at": sim.ended_at.to_rfc3339(),
    })))
}

struct SimOutcome {
    custodian: Custodian,
    terminal: TerminalState,
    attempts: u64,
    applications: u32,
    escalations: Vec<Value>,
    ended_at: Timestamp,
}

/// A frame in flight: due time, tie-break, towards the receiver?, body.
type Frame = Reverse<(Timestamp, u64, bool, FrameBody)>;

#[derive(Debug)]
struct FrameBody(Message);
impl PartialEq for FrameBody {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for FrameBody {}
impl PartialOrd for FrameBody {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for FrameBody {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

struct Sim {
    custodian: Custodian,
    receiver: Receiver,
    applier: SimApplier,
    custodian_id: AgentId,
    target: AgentId,
    queue: BinaryHeap<Frame>,
    seq: u64,
    rng: ChaCha8Rng,
    channel: ChannelArgs,
    attempts: u64,
    escalations: Vec<Value>,
}

impl Sim {
    fn send(&mut self, now: Timestamp, t: Transmit) {
        let to_receiver = t.to == self.target;
        if to_receiver && matches!(t.message, Message::Obligation(_)) {
            self.attempts += 1;
        }
        let loss = if to_receiver {
            self.channel.drop_prob
        } else {
            self.channel.ack_drop_prob
        };
        if self.rng.random::<f64>() < loss {
            return;
        }
        let copies = if to_receiver && self.rng.random::<f64>() < self.channel.duplicate_prob {
            2
        } else {
            1
        };
        for _ in 0..copies {
            self.seq += 1;
            self.queue.push(Reverse((
                now.saturating_add(LATENCY),
                self.seq,
                to_receiver,
                FrameBody(t.message.clone()),
            )));
        }
    }

    /// Commits both sides (no crashes in this channel) and moves what the
    /// commits released onto the channel.
    fn pump(&mut self, now: Timestamp) {
        loop {
            if let Some(b) = self.custodian.poll_records() {
                self.custodian.handle_committed(b.token());
            }
            if let Some(b) = self.receiver.poll_records() {
                self.receiver.handle_committed(b.token());
            }
            let mut moved = false;
            while let Some(t) = self.custodian.poll_transmit() {
                self.send(now, t);
                moved = true;
            }
            while let Some(t) = self.receiver.poll_transmit() {
                self.send(now, t);
                moved = true;
            }
            while let Some(e) = self.custodian.poll_event() {
                if let CustodianEvent::Escalated(esc) = e {
                    self.escalations
                        .push(serde_json::to_value(&*esc).unwrap_or(Value::Null));
                }
            }
            while self.receiver.poll_event().is_some() {}
            if !moved {
                return;
            }
        }
    }

    fn deliver(&mut self, now: Timestamp, to_receiver: bool, msg: Message) {
        if to_receiver {
            let from = self.custodian_id.clone();
            match msg {
                Message::Obligation(o) => {
                    let _ = self
                        .receiver
                        .handle_obligation(now, &from, o, &mut self.applier);
                }
                Message::StatusQuery(ids) => self.receiver.handle_status_query(now, &from, &ids),
                _ => {}
            }
        } else {
            let from = self.target.clone();
            match msg {
                Message::Acks(acks) => {
                    for a in &acks {
                        let _ = self.custodian.handle_ack(now, &from, a);
                    }
                }
                Message::Error(e) => self.custodian.handle_error(now, &from, &e),
                Message::StatusReply(r) => self.custodian.handle_status_reply(now, &from, &r),
                _ => {}
            }
        }
    }
}

fn simulate(
    ob: Obligation,
    channel: ChannelArgs,
    decision: SimDecision,
) -> Result<SimOutcome, ToolError> {
    let target = ob.target().clone();
    let name = if target.as_str() == "custodian" {
        "custodian-1"
    } else {
        "custodian"
    };
    let custodian_id = AgentId::new(name).map_err(|e| ToolError::new(e.to_string()))?;
    let mut cc = CustodianConfig::new(custodian_id.clone());
    cc.seed = channel.seed;
    let mut rc = ReceiverConfig::new(target.clone());
    rc.skew_margin = Duration::from_secs(1);
    let mut rng = ChaCha8Rng::seed_from_u64(channel.seed);
    rng.set_stream(1);
    let mut sim = Sim {
        custodian: Custodian::new(cc, PolarityRegistry::standard()),
        receiver: Receiver::new(rc, PolarityRegistry::standard()),
        applier: SimApplier {
            decision,
            applications: 0,
        },
        custodian_id,
        target,
        queue: BinaryHeap::new(),
        seq: 0,
        rng,
        channel,
        attempts: 0,
        escalations: Vec::new(),
    };
    let id = ob.id().clone();
    let mut now = ob.created_at();
    sim.custodian
        .offer(now, ob)
        .map_err(|e| ToolError::new(format!("the custodian refused the obligation: {e}")))?;
    sim.pump(now);
    let mut events = 0u64;
    loop {
        let next_frame = sim.queue.peek().map(|Reverse((t, ..))| *t);
        let next_timer = sim.custodian.poll_timeout();
        let next = match (next_frame, next_timer) {
            (None, None) => break,
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) => a,
            (None, Some(b)) => b,
        };
        events += 1;
        if events > MAX_SIM_EVENTS {
            return Err(ToolError::new(format!(
                "the simulated transfer took more than {MAX_SIM_EVENTS} events; \
                 use a shorter deadline_seconds"
            )));
        }
        now = now.max(next);
        if next_frame.is_some_and(|t| t <= now) {
            if let Some(Reverse((_, _, to_receiver, FrameBody(msg)))) = sim.queue.pop() {
                sim.deliver(now, to_receiver, msg);
            }
        } else {
            sim.custodian.handle_timeout(now);
        }
        sim.pump(now);
    }
    let terminal = sim
        .custodian
        .terminal(&id)
        .map(|t| t.state)
        .ok_or_else(|| {
            ToolError::new(format!(
                "internal: obligation {id} did not reach a terminal state (deliver-or-report violated)"
            ))
        })?;
    // One obligation per simulation: every application is of `id`.
    let applications = sim.applier.applications;
    Ok(SimOutcome {
        custodian: sim.custodian,
        terminal,
        attempts: sim.attempts,
        applications,
        escalations: sim.escalations,
        ended_at: now,
    })
}
