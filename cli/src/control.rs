//! The control socket: newline-delimited JSON over a Unix domain socket.
//!
//! Each request is one JSON object on one line, tagged by `op`:
//!
//! | op            | fields                                                        |
//! |---------------|---------------------------------------------------------------|
//! | `offer`       | `obligation` (v1 JSON object), `wait` (bool, default false)   |
//! | `status`      | `id`                                                          |
//! | `list`        | `state` (optional: pending, applied, declined, escalated, best_effort), `limit` (default 1000, at most 10000), `after` (an obligation id: the `next` of the previous page) |
//! | `inbox`       |                                                               |
//! | `escalations` | `limit` (default 1000), `after` (a log position: the `next` of the previous page), `decisions_after` (an obligation id: the `decisions_next` of the previous page) |
//! | `decide`      | `key`, `decision` (`granted` or `withheld`), `sequence` (optional) |
//! | `resolve`     | `obligation_id`, `resolution` (`apply_safe` or `dismiss`)     |
//! | `metrics`     |                                                               |
//! | `authorizations` | (durable principal-side state per governed key)            |
//! | `leases`      | (leased grants this node holds as receiver, the leases it renews as principal, lease warnings) |
//!
//! Reads are paged and answered from the store's indexes:
//! `list` answers `{"items": [...], "next": ID | null}` (obligations in id
//! order after `after`); `escalations` answers `{"escalations": [...],
//! "next": N | null, "decisions": [...], "decisions_next": ID | null}`, each
//! escalation carrying its log `position`. Pass `next` back as `after` for
//! the next page; `null` means this page is the last.
//!
//! Each response is one line: `{"ok": true, "result": …}` or
//! `{"ok": false, "error": {"code": …, "message": …}}` with `code` one of
//! `bad_request`, `invalid_obligation`, `unreachable`, `refused`,
//! `not_sent` (a best-effort obligation's one send was refused locally),
//! `backpressure` (the send queue is near its budget; nothing accepted),
//! `unknown`, `stopped`, `internal`. A malformed request (bad JSON, or a
//! line that is not valid UTF-8: refused, never repaired) gets an error
//! response; the connection stays up.

use std::path::Path;
use std::sync::Arc;

use abhyasa::{Node, NodeError, Outcome};
use abhyasa_core::custody::{Offered, TerminalState};
use abhyasa_core::principal::{Authorization, PrincipalWrite, Resolution};
use abhyasa_core::store::{EventId, ListState, UnknownListState};
use abhyasa_core::{AgentId, GovernedKey, Obligation, ObligationId, Sequence};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

/// A control request.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum Request {
    Offer {
        obligation: Value,
        #[serde(default)]
        wait: bool,
    },
    Status {
        id: String,
    },
    List {
        #[serde(default)]
        state: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<usize>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<String>,
    },
    Inbox,
    Escalations {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<usize>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        decisions_after: Option<String>,
    },
    Decide {
        key: String,
        decision: Authorization,
        #[serde(default)]
        sequence: Option<u64>,
    },
    Resolve {
        obligation_id: String,
        resolution: Resolution,
    },
    Metrics,
    Authorizations,
    Leases,
}

/// The states `list` filters on.
pub(crate) const STATES: [&str; 5] = ["pending", "applied", "declined", "escalated", "best_effort"];

/// Page size of `list` and `escalations` when the request names none.
pub(crate) const DEFAULT_LIMIT: usize = 1000;

fn obligation_id(field: &str, s: &str) -> Result<ObligationId, ControlError> {
    ObligationId::parse_field(field, s).map_err(|e| ControlError::new("bad_request", e.to_string()))
}

/// A typed control error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ControlError {
    pub(crate) code: String,
    pub(crate) message: String,
}

impl ControlError {
    fn new(code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
        }
    }

    /// An `internal` error (a bug of ours, not of the request).
    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new("internal", message)
    }
}

impl From<NodeError> for ControlError {
    fn from(e: NodeError) -> Self {
        let code = match &e {
            NodeError::Offer(_) => "refused",
            NodeError::NotSent { .. } => "not_sent",
            NodeError::Backpressure { .. } => "backpressure",
            NodeError::UnknownObligation(_) | NodeError::UnknownDecisionItem(_) => "unknown",
            NodeError::UnknownPeer(_) => "unreachable",
            NodeError::SupersededByRenewal { .. } => "refused",
            NodeError::Stopped => "stopped",
            _ => "internal",
        };
        Self::new(code, e.to_string())
    }
}

/// Binds the control socket owner-only, replacing a stale socket left by a
/// crashed run; refuses if another node answers on it.
pub(crate) fn bind(path: &Path) -> Result<UnixListener, String> {
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(format!(
                "a node is already running on {} (stop it first)",
                path.display()
            ));
        }
        std::fs::remove_file(path)
            .map_err(|e| format!("cannot remove stale socket {}: {e}", path.display()))?;
    }
    // The node directory is owner-only (0700), so there is no window in
    // which another user can reach the socket before the chmod below.
    let listener = UnixListener::bind(path)
        .map_err(|e| format!("cannot bind control socket {}: {e}", path.display()))?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("cannot restrict {}: {e}", path.display()))?;
    Ok(listener)
}

/// Serves control connections until the listener is dropped.
/// `peers` are the pinned peers: an offer to any other target is refused
/// up front (no transport could ever reach it).
pub(crate) async fn serve(listener: UnixListener, node: Node, peers: Arc<Vec<AgentId>>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(connection(stream, node.clone(), peers.clone()));
            }
            Err(e) => {
                tracing::warn!(error = %e, "control accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

/// Longest request line accepted (an obligation with a large payload fits).
const MAX_LINE: usize = 16 * 1024 * 1024;

async fn connection(stream: UnixStream, node: Node, peers: Arc<Vec<AgentId>>) {
    let (r, mut w) = stream.into_split();
    let mut reader = BufReader::new(r);
    loop {
        let mut buf = Vec::new();
        let limit = u64::try_from(MAX_LINE).unwrap_or(u64::MAX) + 1;
        match (&mut reader).take(limit).read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let too_long = buf.len() > MAX_LINE && buf.last() != Some(&b'\n');
        let response = if too_long {
            let e = ControlError::new(
                "bad_request",
                format!("request longer than {MAX_LINE} bytes"),
            );
            json!({"ok": false, "error": e})
        } else {
            // C-PA-4: a request that is not UTF-8 is refused, never
            // repaired: a replacement character would name a key the
            // caller never sent.
            match std::str::from_utf8(&buf) {
                Err(e) => {
                    let e = ControlError::new(
                        "bad_request",
                        format!(
                            "request is not valid UTF-8 (byte offset {})",
                            e.valid_up_to()
                        ),
                    );
                    json!({"ok": false, "error": e})
                }
                Ok(line) if line.trim().is_empty() => continue,
                Ok(line) => match dispatch(&node, &peers, line).await {
                    Ok(result) => json!({"ok": true, "result": result}),
                    Err(e) => json!({"ok": false, "error": e}),
                },
            }
        };
        let mut out = response.to_string();
        out.push('\n');
        if w.write_all(out.as_bytes()).await.is_err() || too_long {
            // The rest of an oversized line cannot be framed: close.
            return;
        }
    }
}

/// A request read and checked: every field the client wrote is validated
/// here, before the node is touched.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Command {
    Offer {
        obligation: Obligation,
        wait: bool,
    },
    Status {
        id: ObligationId,
    },
    List {
        state: Option<ListState>,
        limit: usize,
        after: Option<ObligationId>,
    },
    Inbox,
    Escalations {
        limit: usize,
        after: Option<EventId>,
        decisions_after: Option<ObligationId>,
    },
    Decide {
        key: GovernedKey,
        decision: Authorization,
        sequence: Option<Sequence>,
    },
    Resolve {
        id: ObligationId,
        resolution: Resolution,
    },
    Metrics,
    Authorizations,
    Leases,
}

/// Reads one request line (C-T-6: any text gets a command or a typed
/// `bad_request` / `invalid_obligation` error, never a panic).
pub(crate) fn parse(line: &str) -> Result<Command, ControlError> {
    let req: Request = serde_json::from_str(line)
        .map_err(|e| ControlError::new("bad_request", format!("malformed request: {e}")))?;
    let bad = |e: &dyn std::fmt::Display| ControlError::new("bad_request", e.to_string());
    Ok(match req {
        Request::Offer { obligation, wait } => Command::Offer {
            obligation: Obligation::from_json(obligation.to_string().as_bytes())
                .map_err(|e| ControlError::new("invalid_obligation", e.to_string()))?,
            wait,
        },
        Request::Status { id } => Command::Status {
            id: ObligationId::new(&id).map_err(|e| bad(&e))?,
        },
        Request::List {
            state,
            limit,
            after,
        } => Command::List {
            state: match &state {
                None => None,
                Some(s) => Some(s.parse().map_err(|e: UnknownListState| bad(&e))?),
            },
            limit: limit.unwrap_or(DEFAULT_LIMIT),
            after: after
                .as_deref()
                .map(|a| obligation_id("after", a))
                .transpose()?,
        },
        Request::Inbox => Command::Inbox,
        Request::Escalations {
            limit,
            after,
            decisions_after,
        } => Command::Escalations {
            limit: limit.unwrap_or(DEFAULT_LIMIT),
            after: after.map(EventId),
            decisions_after: decisions_after
                .as_deref()
                .map(|a| obligation_id("decisions_after", a))
                .transpose()?,
        },
        Request::Decide {
            key,
            decision,
            sequence,
        } => Command::Decide {
            key: GovernedKey::new(&key).map_err(|e| bad(&e))?,
            decision,
            sequence: sequence.map(Sequence),
        },
        Request::Resolve {
            obligation_id,
            resolution,
        } => Command::Resolve {
            id: ObligationId::new(&obligation_id).map_err(|e| bad(&e))?,
            resolution,
        },
        Request::Metrics => Command::Metrics,
        Request::Authorizations => Command::Authorizations,
        Request::Leases => Command::Leases,
    })
}

/// One request to its result.
pub(crate) async fn dispatch(
    node: &Node,
    peers: &[AgentId],
    line: &str,
) -> Result<Value, ControlError> {
    let cmd = parse(line)?;
    tracing::debug!(?cmd, "control request");
    let to_value = |v: &dyn erased::Ser| v.value();
    match cmd {
        Command::Offer {
            obligation: ob,
            wait,
        } => {
            let id = ob.id().clone();
            let target = ob.target().clone();
            if !peers.contains(&target) {
                return Err(ControlError::new(
                    "unreachable",
                    format!("target {target} is not a pinned peer of this node (add it to [[peers]] in config.toml)"),
                ));
            }
            let offered = node.offer(ob).await?;
            let (mode, deadline_at) = match offered {
                Offered::Custody { deadline_at } => ("custody", Some(deadline_at.to_rfc3339())),
                Offered::BestEffort => ("best_effort", None),
                Offered::AlreadyPending => ("already_pending", None),
                Offered::AlreadyTerminal(_) => ("already_terminal", None),
            };
            let mut result = json!({
                "obligation_id": id.as_str(),
                "mode": mode,
                "deadline_at": deadline_at,
                "connected": node.is_connected(&target),
            });
            if wait {
                let o = node.outcome(&id).await?;
                result["outcome"] = outcome_json(&o);
            }
            Ok(result)
        }
        Command::Status { id } => {
            let v = node.status(&id).await?;
            if v.custodian.is_none() && v.receiver.is_empty() {
                return Err(ControlError::new(
                    "unknown",
                    format!("obligation {id} is not known to this node"),
                ));
            }
            Ok(to_value(&v))
        }
        Command::List {
            state,
            limit,
            after,
        } => {
            // An indexed read of one page, never a scan.
            let page = node.list(state, after, limit).await?;
            let items: Vec<Value> = page
                .items
                .iter()
                .map(|r| {
                    json!({
                        "obligation_id": r.obligation_id.as_str(),
                        "state": r.state.as_str(),
                        "kind": r.kind.as_ref().map(|k| k.as_str()),
                        "target": r.target.as_str(),
                        "attempts": r.attempts,
                        "deadline_at": r.deadline_at.to_rfc3339(),
                        "closed_at": r.closed_at.map(|t| t.to_rfc3339()),
                    })
                })
                .collect();
            Ok(json!({
                "items": items,
                "next": page.next.as_ref().map(|n| n.as_str()),
            }))
        }
        Command::Inbox => Ok(to_value(&node.inbox().await?)),
        Command::Escalations {
            limit,
            after,
            decisions_after,
        } => {
            let escalations = node.escalations(after, limit).await?;
            let decisions = node.decisions(decisions_after, limit).await?;
            let items: Vec<Value> = escalations
                .items
                .iter()
                .map(|e| {
                    let mut v = to_value(&e.escalation);
                    if let Value::Object(m) = &mut v {
                        m.insert("position".into(), json!(e.position.0));
                    }
                    v
                })
                .collect();
            Ok(json!({
                "escalations": items,
                "next": escalations.next.map(|n| n.0),
                "decisions": decisions.items,
                "decisions_next": decisions.next.as_ref().map(|n| n.as_str()),
            }))
        }
        Command::Decide {
            key,
            decision,
            sequence,
        } => Ok(to_value(&node.decide(key, decision, sequence).await?)),
        Command::Resolve { id, resolution } => Ok(to_value(&node.resolve(id, resolution).await?)),
        Command::Metrics => Ok(to_value(&node.metrics().await?)),
        Command::Authorizations => {
            // From the store: only what is durable is shown (C-ND-2).
            let ds = node.durable_state().await?;
            let mut rows: Vec<Value> = ds
                .custodian
                .principal
                .iter()
                .filter_map(|w| match w {
                    PrincipalWrite::Authorization { key, entry } => Some(json!({
                        "key": key.as_str(),
                        "state": entry.state,
                        "sequence": entry.sequence.map(|s| s.0),
                        "why": entry.source.why(),
                        "obligation_id": entry.source.obligation_id().map(|i| i.as_str()),
                        "changed_at": entry.source.at().map(|t| t.to_rfc3339()),
                    })),
                    _ => None,
                })
                .collect();
            rows.sort_by(|a, b| a["key"].as_str().cmp(&b["key"].as_str()));
            Ok(Value::Array(rows))
        }
        Command::Leases => leases(node).await,
    }
}

/// The `leases` control request, answered from the node: the leased
/// grants held as receiver (`active`, `lapsed` or `withheld`), the leases
/// renewed as principal, and the lease warnings raised.
async fn leases(node: &Node) -> Result<Value, ControlError> {
    let leases: Vec<Value> = node
        .leases()
        .await?
        .into_iter()
        .map(|l| {
            // Keys are held under their issuer: `@<issuer>/<kind>/<target>/<name>`
            // (C-AZ-2); polarity rules build the `<kind>/<target>/<name>` part.
            let held = GovernedKey::new(&l.key).ok();
            let issuer = held.as_ref().and_then(GovernedKey::issuer);
            let bare = held.as_ref().map_or(l.key.as_str(), |k| k.unqualified());
            let mut parts = bare.splitn(3, '/');
            let (kind, target, scope) = (parts.next(), parts.next(), parts.next());
            let state = match l.state {
                "granted" => "active",
                other => other,
            };
            json!({
                "key": l.key,
                "issuer": issuer.as_ref().map(AgentId::as_str),
                "kind": kind,
                "target": target,
                "scope": scope,
                "lease_until": l.lease_until.to_rfc3339(),
                "state": state,
                "authorized": l.authorized,
            })
        })
        .collect();
    let renewing: Vec<Value> = node
        .renewals()
        .await?
        .into_iter()
        .map(|r| {
            json!({
                "key": r.key.as_str(),
                "target": r.target.as_str(),
                "root": r.root.as_str(),
                "last": r.last.as_str(),
                "sequence": r.sequence.0,
                "term_seconds": r.term_seconds,
                "renewals": r.renewals,
                "next_at": r.next_at.to_rfc3339(),
            })
        })
        .collect();
    let warnings = serde_json::to_value(node.lease_warnings().await?)
        .map_err(|e| ControlError::internal(e.to_string()))?;
    Ok(json!({"leases": leases, "renewing": renewing, "warnings": warnings}))
}

mod erased {
    /// Anything serializable, as a JSON value.
    pub(super) trait Ser {
        fn value(&self) -> serde_json::Value;
    }
    impl<T: serde::Serialize> Ser for T {
        fn value(&self) -> serde_json::Value {
            serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
        }
    }
}

fn state_str(s: TerminalState) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{s:?}"))
}

/// An outcome as JSON.
pub(crate) fn outcome_json(o: &Outcome) -> Value {
    json!({
        "obligation_id": o.obligation_id.as_str(),
        "state": state_str(o.state),
        "attempts": o.attempts,
        "reason": o.reason.map(|r| r.to_string()),
        "escalation": o.escalation,
    })
}
