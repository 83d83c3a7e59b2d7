//! The tools of the v1 reference server, on the real core.
//!
//! Each tool takes the reference's argument keys and answers the
//! reference's result text: `{"ok": true, ...}` with the same result fields,
//! or `{"ok": false, "error": "..."}`. Bad arguments are a [`ToolError`]
//! (the server turns it into a result with `isError`), never a panic or a
//! protocol error (C-MCP-2).

use std::collections::BTreeMap;
use std::time::Duration;

use abhyasa_check::sim::{transfer_rng, LinkProfile, Pair, SimDecision};
use abhyasa_core::custody::{CustodyProfile, TerminalState};
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::{AgentId, CustodyAck, KindProfile, Obligation};
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
/// real custodian and receiver over `abhyasa-check`'s seeded lossy channel
/// ([`Pair`]) in virtual time from the obligation's `created_at`.
pub fn run_custody_transfer(args: &Map<String, Value>) -> Result<ToolReply, ToolError> {
    let ob = obligation_arg(args)?;
    let channel = channel_arg(args)?;
    let (decision, decision_name) = decision_arg(args)?;
    let id = ob.id().clone();
    let target = ob.target().clone();
    let name = if target.as_str() == "custodian" {
        "custodian-1"
    } else {
        "custodian"
    };
    let custodian_id = AgentId::new(name).map_err(|e| ToolError::new(e.to_string()))?;
    let mut pair = Pair::between(
        custodian_id,
        target,
        channel.seed,
        CustodyProfile::default(),
    )
    .with_event_limit(MAX_SIM_EVENTS);
    let link = LinkProfile {
        drop: channel.drop_prob,
        duplicate: channel.duplicate_prob,
        ack_drop: channel.ack_drop_prob,
        latency: LATENCY,
        ..LinkProfile::lossless()
    };
    let mut rng = transfer_rng(channel.seed, 1);
    let r = pair.run_transfer(ob.created_at(), ob, &link, decision, &mut rng);
    if let Some(e) = r.refused {
        return Err(ToolError::new(format!(
            "the custodian refused the obligation: {e}"
        )));
    }
    if r.cut_short {
        return Err(ToolError::new(format!(
            "the simulated transfer took more than {MAX_SIM_EVENTS} events; \
             use a shorter deadline_seconds"
        )));
    }
    let terminal = r.outcome.ok_or_else(|| {
        ToolError::new(format!(
            "internal: obligation {id} did not reach a terminal state (deliver-or-report violated)"
        ))
    })?;
    let mut weights = BTreeMap::new();
    for (k, w) in pair.custodian.principal().weights() {
        weights.insert(k.as_str().to_string(), json!(w));
    }
    let mut auths = BTreeMap::new();
    for (k, e) in pair.custodian.principal().authorizations() {
        auths.insert(k.as_str().to_string(), json!(e.state));
    }
    let escalations: Vec<Value> = r
        .escalations
        .iter()
        .map(|e| serde_json::to_value(e).unwrap_or(Value::Null))
        .collect();
    Ok(ToolReply::ok(json!({
        "terminal": terminal,
        "attempts": r.attempts,
        "discharged": matches!(terminal, TerminalState::Applied | TerminalState::Declined),
        "escalations": escalations,
        "routing_weights": weights,
        "authorizations": auths,
        "applications": r.applications,
        "receiver_decision": decision_name,
        "channel": {
            "drop_prob": channel.drop_prob,
            "duplicate_prob": channel.duplicate_prob,
            "ack_drop_prob": channel.ack_drop_prob,
            "seed": channel.seed,
        },
        "ended_at": r.ended_at.to_rfc3339(),
    })))
}
