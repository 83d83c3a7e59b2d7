//! The axum routes: the card, JSON-RPC `SendMessage`, HTTP+JSON
//! `POST /message:send`, and the v1 extension endpoints.
//!
//! Every route but the card authenticates first (C-A2A-3): no pinned client
//! certificate and no valid per-peer bearer credential, 401 and nothing
//! read or accepted. Bodies are
//! read with a size limit; every error is a JSON body naming the field.

// Early returns here are the HTTP error responses themselves, built at most
// once per request; boxing them would only add an allocation.
#![allow(clippy::result_large_err)]

use std::sync::atomic::Ordering;
use std::sync::Arc;

use abhyasa_core::wire::ErrorCode;
use abhyasa_core::{AckStatus, AgentId, CustodyAck, DeclineReason, Obligation, PeerError};
use axum::body::{Body, Bytes};
use axum::extract::State as AxState;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use serde_json::{json, Value};

use crate::card::EXTENSION_URI;
use crate::message::{
    reply_message, requested_extensions, send_message_result, A2aVersion, RpcError, RpcRequest,
    SendMessage,
};
use crate::state::{Answer, State, SubmitError, TlsPeer};

type St = AxState<Arc<State>>;

pub(crate) fn router(state: Arc<State>) -> Router {
    Router::new()
        .route("/.well-known/agent-card.json", get(card))
        .route("/", post(jsonrpc))
        .route("/message:send", post(rest_send))
        .route("/abhyasa/obligations", post(obligations))
        .route("/abhyasa/custody_ack", post(custody_ack))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(state.clone(), limit))
        .with_state(state)
}

/// Bounds the requests being served at once, before any body is read.
async fn limit(
    AxState(s): St,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match s.inflight.clone().try_acquire_owned() {
        Ok(permit) => {
            let r = next.run(req).await;
            drop(permit);
            r
        }
        Err(_) => {
            s.stats.overloaded.fetch_add(1, Ordering::Relaxed);
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded",
                None,
                "too many requests in flight; retry later",
            )
        }
    }
}

/// A JSON error body `{"error": {"code", "field", "message"}}`.
fn error(
    status: StatusCode,
    code: &str,
    field: Option<&str>,
    message: impl Into<String>,
) -> Response {
    let mut e = json!({"code": code, "message": message.into()});
    if let Some(f) = field {
        e["field"] = Value::from(f);
    }
    (status, json_body(json!({ "error": e }))).into_response()
}

/// A JSON body (axum's `Json` would pull serde_json features the rest of
/// the workspace does not use).
fn json_body(v: Value) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        serde_json::to_vec(&v).unwrap_or_default(),
    )
}

async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "not_found", None, "no such endpoint")
}

async fn card(AxState(s): St) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        s.card.clone(),
    )
        .into_response()
}

/// C-A2A-3: the pinned client certificate (mTLS) or the bearer credential
/// names the agent; AB-3 keys on it. A request carrying both must name the
/// same agent with both.
fn authenticate(
    s: &State,
    tls: Option<&TlsPeer>,
    headers: &HeaderMap,
) -> Result<AgentId, Response> {
    let who = match (tls, s.token_agent(headers)) {
        (Some(TlsPeer(cert)), Some(b)) if cert != b => None,
        (Some(TlsPeer(cert)), _) => Some(cert),
        // Over HTTPS without a certificate, only a bearer-only peer's
        // credential is taken (C-PA-1).
        (None, _) => s.bearer_peer(headers),
    };
    match who {
        Some(agent) => Ok(agent.clone()),
        None => {
            s.stats.unauthenticated.fetch_add(1, Ordering::Relaxed);
            let mut r = error(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                Some("authorization"),
                "a pinned client certificate (mTLS) or a per-peer bearer credential is required (see the card's securitySchemes); both, if given, must name the same agent",
            );
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            Err(r)
        }
    }
}

/// Reads at most `max_body` bytes.
async fn read_body(s: &State, body: Body) -> Result<Bytes, Response> {
    axum::body::to_bytes(body, s.max_body).await.map_err(|_| {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "frame_too_large",
            Some("(body)"),
            format!("request body exceeds {} bytes", s.max_body),
        )
    })
}

/// Requires a JSON content type (`application/json` or any `+json`).
fn json_content(headers: &HeaderMap) -> Result<(), Response> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mime = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if mime == "application/json" || mime.ends_with("+json") {
        Ok(())
    } else {
        Err(error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            Some("content-type"),
            "expected application/json (or application/a2a+json)",
        ))
    }
}

/// Extensions the request activated (`A2A-Extensions`, or 0.3's
/// `X-A2A-Extensions`) that we support: only ours.
fn activated(headers: &HeaderMap) -> bool {
    ["a2a-extensions", "x-a2a-extensions"].iter().any(|h| {
        headers.get_all(*h).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| requested_extensions(v).iter().any(|u| u == EXTENSION_URI))
        })
    })
}

/// Echoes the extensions actually activated, under both header names.
fn echo(mut r: Response, active: bool) -> Response {
    if active {
        let v = HeaderValue::from_static(EXTENSION_URI);
        r.headers_mut().insert("a2a-extensions", v.clone());
        r.headers_mut().insert("x-a2a-extensions", v);
    }
    r
}

fn version(headers: &HeaderMap) -> Result<A2aVersion, RpcError> {
    match headers.get("a2a-version") {
        None => A2aVersion::from_header(None),
        Some(v) => A2aVersion::from_header(Some(v.to_str().unwrap_or("(not text)"))),
    }
}

fn peer_error(e: &PeerError) -> Response {
    match e {
        PeerError::FrameTooLarge { .. } => error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "frame_too_large",
            Some("(body)"),
            e.to_string(),
        ),
        PeerError::Field(f) => error(
            StatusCode::BAD_REQUEST,
            "invalid_obligation",
            Some(&f.field),
            e.to_string(),
        ),
        PeerError::DigestMismatch { .. } => error(
            StatusCode::BAD_REQUEST,
            "digest_mismatch",
            Some("digest"),
            e.to_string(),
        ),
        _ => error(
            StatusCode::BAD_REQUEST,
            "malformed",
            Some("(body)"),
            e.to_string(),
        ),
    }
}

fn code_str(c: ErrorCode) -> String {
    serde_json::to_value(c)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "error".into())
}

/// What the node said, for the HTTP endpoints.
enum Outcome {
    Final(CustodyAck),
    Deferred(CustodyAck),
    Pending,
    Refused(abhyasa_core::wire::ProtocolError),
}

async fn settle(s: &State, peer: &AgentId, ob: Obligation) -> Result<Outcome, Response> {
    match s.submit(peer, ob).await {
        Ok(Some(Answer::Ack(a))) if a.status == AckStatus::Deferred => Ok(Outcome::Deferred(a)),
        Ok(Some(Answer::Ack(a))) => Ok(Outcome::Final(a)),
        Ok(Some(Answer::Error(e))) => Ok(Outcome::Refused(e)),
        Ok(None) => Ok(Outcome::Pending),
        Err(SubmitError::Busy) => Err(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            None,
            "too many requests waiting for acks; retry later",
        )),
        Err(SubmitError::Gone) => Err(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            None,
            "the node is not accepting frames",
        )),
    }
}

fn pending_json(ob_id: &str) -> Value {
    json!({"obligation_id": ob_id, "pending": true})
}

fn refused(e: &abhyasa_core::wire::ProtocolError) -> Response {
    let status = match e.code {
        ErrorCode::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::Unauthorized => StatusCode::FORBIDDEN,
        _ => StatusCode::UNPROCESSABLE_ENTITY,
    };
    error(status, &code_str(e.code), None, e.message.clone())
}

/// `POST /abhyasa/obligations` (v1 SPEC): 200 + final ack, 202 + deferred
/// ack (the final one is POSTed to the custodian later), or 202 pending.
async fn obligations(
    AxState(s): St,
    tls: Option<Extension<TlsPeer>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let active = activated(&headers);
    let r = async {
        let peer = authenticate(&s, tls.as_ref().map(|e| &e.0), &headers)?;
        json_content(&headers)?;
        let bytes = read_body(&s, body).await?;
        let ob = Obligation::from_json(&bytes).map_err(|e| peer_error(&e))?;
        let id = ob.id().to_string();
        Ok::<_, Response>(match settle(&s, &peer, ob).await? {
            // AB-3: the same id with another digest is a protocol error,
            // not a decline a v1 peer could take as discharge: 409, with
            // the receiver's ack for the custodian's escalation record.
            Outcome::Final(a) if a.reason == Some(DeclineReason::Conflict) => {
                let body = json!({
                    "error": {
                        "code": "conflict",
                        "field": "obligation_id",
                        "message": a.detail.clone().unwrap_or_else(|| "obligation id already used with another digest".into()),
                    },
                    "ack": a.to_json_value(),
                });
                (StatusCode::CONFLICT, json_body(body)).into_response()
            }
            Outcome::Final(a) => (StatusCode::OK, json_body(a.to_json_value())).into_response(),
            Outcome::Deferred(a) => {
                (StatusCode::ACCEPTED, json_body(a.to_json_value())).into_response()
            }
            Outcome::Pending => {
                (StatusCode::ACCEPTED, json_body(pending_json(&id))).into_response()
            }
            Outcome::Refused(e) => refused(&e),
        })
    }
    .await;
    echo(r.unwrap_or_else(|e| e), active)
}

/// `POST /abhyasa/custody_ack`: a receiver's asynchronous final ack, fed
/// to the node as an ack frame from the authenticated peer (which binds
/// it: an ack naming another receiver or digest never discharges custody,
/// C-TR-2). 204 means received, not that it discharged anything.
async fn custody_ack(
    AxState(s): St,
    tls: Option<Extension<TlsPeer>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let active = activated(&headers);
    let r = async {
        let peer = authenticate(&s, tls.as_ref().map(|e| &e.0), &headers)?;
        json_content(&headers)?;
        let bytes = read_body(&s, body).await?;
        let ack = CustodyAck::from_json(&bytes).map_err(|e| match &e {
            PeerError::Field(f) => error(
                StatusCode::BAD_REQUEST,
                "invalid_ack",
                Some(&f.field),
                e.to_string(),
            ),
            _ => peer_error(&e),
        })?;
        if s.deliver_acks(&peer, vec![ack]).await {
            Ok(StatusCode::NO_CONTENT.into_response())
        } else {
            Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                None,
                "the node is not accepting frames",
            ))
        }
    }
    .await;
    echo(r.unwrap_or_else(|e| e), active)
}

/// The ack (or pending marker) as A2A reply text and metadata.
fn a2a_reply(
    s: &State,
    outcome: Outcome,
    sm: &SendMessage,
    v: A2aVersion,
) -> Result<Value, RpcError> {
    let (ack, text) = match outcome {
        Outcome::Final(a) | Outcome::Deferred(a) => {
            let t = a.status.as_str().to_string();
            (a.to_json_value(), t)
        }
        Outcome::Pending => (
            pending_json(sm.obligation.id().as_str()),
            "pending".to_string(),
        ),
        Outcome::Refused(e) => {
            return Err(RpcError::InvalidParams {
                field: format!("message.metadata[\"{EXTENSION_URI}\"]"),
                message: format!("{}: {}", code_str(e.code), e.message),
            })
        }
    };
    let id = format!("{}-ack-{}", s.local, sm.obligation.id());
    let m = reply_message(v, &id, sm.context_id.as_deref(), ack, &text);
    Ok(send_message_result(v, m))
}

async fn send_over_a2a(
    s: &State,
    peer: &AgentId,
    params: &serde_json::Map<String, Value>,
    active: bool,
    v: A2aVersion,
) -> Result<Result<Value, RpcError>, Response> {
    let sm = match SendMessage::from_params(params, active) {
        Ok(sm) => sm,
        Err(e) => return Ok(Err(e)),
    };
    let outcome = settle(s, peer, sm.obligation.clone()).await?;
    Ok(a2a_reply(s, outcome, &sm, v))
}

fn rpc_answer(id: Value, r: Result<Value, RpcError>) -> Response {
    let body = match r {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err(e) => json!({"jsonrpc": "2.0", "id": id, "error": e.to_json()}),
    };
    json_body(body).into_response()
}

/// JSON-RPC 2.0 at the interface URL: `SendMessage` (1.0) and
/// `message/send` (0.3).
async fn jsonrpc(
    AxState(s): St,
    tls: Option<Extension<TlsPeer>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let active = activated(&headers);
    let r = async {
        let peer = authenticate(&s, tls.as_ref().map(|e| &e.0), &headers)?;
        let bytes = read_body(&s, body).await?;
        let req = match RpcRequest::parse(&bytes) {
            Ok(r) => r,
            Err((id, e)) => return Ok(rpc_answer(id, Err(e))),
        };
        let v = match version(&headers) {
            Ok(v) => v,
            Err(e) => return Ok(rpc_answer(req.id, Err(e))),
        };
        let known = match v {
            A2aVersion::V1_0 => req.method == "SendMessage",
            A2aVersion::V0_3 => req.method == "message/send" || req.method == "SendMessage",
        };
        if !known {
            return Ok(rpc_answer(
                req.id,
                Err(RpcError::MethodNotFound(req.method)),
            ));
        }
        let result = send_over_a2a(&s, &peer, &req.params, active, v).await?;
        Ok::<_, Response>(rpc_answer(req.id, result))
    }
    .await;
    echo(r.unwrap_or_else(|e| e), active)
}

/// HTTP+JSON binding: `POST /message:send` with a `SendMessageRequest`
/// body, answered `application/a2a+json`.
async fn rest_send(
    AxState(s): St,
    tls: Option<Extension<TlsPeer>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let active = activated(&headers);
    let rest_err = |e: RpcError| {
        let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
        (status, a2a_json(e.to_rest_json())).into_response()
    };
    let r = async {
        let peer = authenticate(&s, tls.as_ref().map(|e| &e.0), &headers)?;
        json_content(&headers)?;
        // The REST binding answers the 1.0 shape; the header is still checked.
        version(&headers).map_err(rest_err)?;
        let bytes = read_body(&s, body).await?;
        let params = match serde_json::from_slice::<Value>(&bytes) {
            Ok(Value::Object(m)) => m,
            Ok(_) => {
                return Err(rest_err(RpcError::InvalidRequest(
                    "body must be an object".into(),
                )))
            }
            Err(e) => return Err(rest_err(RpcError::Parse(e.to_string()))),
        };
        match send_over_a2a(&s, &peer, &params, active, A2aVersion::V1_0).await? {
            Ok(result) => Ok((StatusCode::OK, a2a_json(result)).into_response()),
            Err(e) => Err(rest_err(e)),
        }
    }
    .await;
    echo(r.unwrap_or_else(|e| e), active)
}

fn a2a_json(v: Value) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/a2a+json"),
        )],
        serde_json::to_vec(&v).unwrap_or_default(),
    )
}
