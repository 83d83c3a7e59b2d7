//! The A2A message subset: JSON-RPC 2.0 envelopes, `SendMessage` (1.0)
//! and `message/send` (0.3) requests carrying an obligation in
//! `message.metadata[<URI>]`, and the reply message carrying the ack.
//!
//! Every parser here takes untrusted bytes or values and answers with a
//! typed [`RpcError`]; none panics (C-T-6).

use abhyasa_core::{FieldError, Obligation, PeerError};
use serde_json::{json, Map, Value};

use crate::card::EXTENSION_URI;

/// A2A protocol versions this binding answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum A2aVersion {
    /// 0.3 (also: no `A2A-Version` header at all).
    V0_3,
    /// 1.0.
    V1_0,
}

impl A2aVersion {
    /// Reads the `A2A-Version` header value: missing means 0.3; `1.0` and
    /// `0.3` (with or without a patch part) are spoken; anything else is
    /// [`RpcError::VersionNotSupported`].
    pub fn from_header(v: Option<&str>) -> Result<Self, RpcError> {
        let Some(v) = v.map(str::trim) else {
            return Ok(Self::V0_3);
        };
        let mut it = v.split('.');
        let (major, minor) = (it.next(), it.next());
        let patch_ok = it.all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        match (major, minor, patch_ok) {
            (Some("1"), Some("0"), true) => Ok(Self::V1_0),
            (Some("0"), Some("3"), true) => Ok(Self::V0_3),
            _ => Err(RpcError::VersionNotSupported(v.chars().take(64).collect())),
        }
    }

    /// The header value of this version.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V0_3 => "0.3",
            Self::V1_0 => "1.0",
        }
    }
}

/// Parses an `A2A-Extensions` header value: comma-separated URIs,
/// whitespace around each ignored, empties dropped.
pub fn requested_extensions(header: &str) -> Vec<String> {
    header
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// An error answered to an A2A request, with its JSON-RPC code.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RpcError {
    /// The body is not JSON (-32700).
    #[error("parse error: {0}")]
    Parse(String),
    /// Not a JSON-RPC 2.0 request object (-32600).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// Unknown method (-32601).
    #[error("method not found: {0}")]
    MethodNotFound(String),
    /// Bad params, naming the field (-32602).
    #[error("invalid params: field `{field}`: {message}")]
    InvalidParams {
        /// Dotted path of the field.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// `A2A-Version` names a version we do not speak (-32009).
    #[error("A2A version {0} is not supported (supported: 1.0, 0.3)")]
    VersionNotSupported(String),
    /// Internal failure (-32603), e.g. the node is gone.
    #[error("internal error: {0}")]
    Internal(String),
}

impl RpcError {
    /// The JSON-RPC error code.
    pub fn code(&self) -> i64 {
        match self {
            Self::Parse(_) => -32700,
            Self::InvalidRequest(_) => -32600,
            Self::MethodNotFound(_) => -32601,
            Self::InvalidParams { .. } => -32602,
            Self::VersionNotSupported(_) => -32009,
            Self::Internal(_) => -32603,
        }
    }

    /// The field at fault, if one is.
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::InvalidParams { field, .. } => Some(field),
            _ => None,
        }
    }

    /// The JSON-RPC `error` object.
    pub fn to_json(&self) -> Value {
        let mut e = json!({"code": self.code(), "message": self.to_string()});
        if let Some(f) = self.field() {
            e["data"] = json!({"field": f});
        }
        e
    }

    /// The HTTP status for the HTTP+JSON binding.
    pub fn http_status(&self) -> u16 {
        match self {
            Self::MethodNotFound(_) => 404,
            Self::Internal(_) => 500,
            _ => 400,
        }
    }

    /// The HTTP+JSON error body (`google.rpc.Status`-like, as the A2A
    /// REST binding answers), with the field at fault.
    pub fn to_rest_json(&self) -> Value {
        let (status, reason) = match self {
            Self::VersionNotSupported(_) => ("FAILED_PRECONDITION", "VERSION_NOT_SUPPORTED"),
            Self::MethodNotFound(_) => ("NOT_FOUND", "METHOD_NOT_FOUND"),
            Self::Internal(_) => ("INTERNAL", "INTERNAL"),
            Self::Parse(_) | Self::InvalidRequest(_) => ("INVALID_ARGUMENT", "INVALID_REQUEST"),
            Self::InvalidParams { .. } => ("INVALID_ARGUMENT", "INVALID_PARAMS"),
        };
        let mut e = json!({
            "code": self.http_status(),
            "status": status,
            "message": self.to_string(),
            "details": [{"reason": reason, "domain": "a2a-protocol.org"}],
        });
        if let Some(f) = self.field() {
            e["details"][0]["metadata"] = json!({"field": f});
        }
        json!({ "error": e })
    }

    fn params(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::InvalidParams {
            field: field.into(),
            message: message.into(),
        }
    }

    /// A bad obligation inside the message, its field path prefixed.
    fn from_obligation(prefix: &str, e: PeerError) -> Self {
        match e {
            PeerError::Field(FieldError { field, problem }) => {
                Self::params(format!("{prefix}.{field}"), problem.to_string())
            }
            other => Self::params(prefix.to_string(), other.to_string()),
        }
    }
}

/// A parsed JSON-RPC request: its id (echoed), method and params.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcRequest {
    /// The request id (string, number or null), echoed in the answer.
    pub id: Value,
    /// The method name.
    pub method: String,
    /// The params object.
    pub params: Map<String, Value>,
}

impl RpcRequest {
    /// Parses a JSON-RPC 2.0 request body. On error the id, if it could be
    /// read, comes back with the error so the answer can echo it.
    pub fn parse(body: &[u8]) -> Result<Self, (Value, RpcError)> {
        let v: Value = serde_json::from_slice(body)
            .map_err(|e| (Value::Null, RpcError::Parse(e.to_string())))?;
        let Value::Object(mut m) = v else {
            return Err((
                Value::Null,
                RpcError::InvalidRequest("not an object".into()),
            ));
        };
        let id = match m.remove("id") {
            None => Value::Null,
            Some(v @ (Value::String(_) | Value::Number(_) | Value::Null)) => v,
            Some(_) => {
                return Err((
                    Value::Null,
                    RpcError::InvalidRequest("`id` must be a string, number or null".into()),
                ))
            }
        };
        if m.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return Err((
                id,
                RpcError::InvalidRequest("`jsonrpc` must be \"2.0\"".into()),
            ));
        }
        let method = match m.remove("method") {
            Some(Value::String(s)) => s,
            _ => {
                return Err((
                    id,
                    RpcError::InvalidRequest("`method` must be a string".into()),
                ))
            }
        };
        let params = match m.remove("params") {
            Some(Value::Object(p)) => p,
            None => Map::new(),
            Some(_) => return Err((id, RpcError::params("params", "must be an object"))),
        };
        Ok(Self { id, method, params })
    }
}

/// What a `SendMessage` request carries for us.
#[derive(Debug, Clone, PartialEq)]
pub struct SendMessage {
    /// The obligation in `message.metadata[<URI>]`.
    pub obligation: Obligation,
    /// The request message's `contextId`, echoed.
    pub context_id: Option<String>,
    /// The request message's `messageId`.
    pub message_id: String,
}

/// `message.metadata` travels as a `google.protobuf.Struct` in A2A 1.0
/// clients, which has only doubles: an integer the custodian wrote comes
/// back as `30.0`. Integral doubles within ±2^53 are read back as integers
/// so the strict v1 obligation parser accepts them; the content digest is
/// unchanged (RFC 8785 prints both alike).
fn integral_floats_to_ints(v: &mut Value) {
    match v {
        Value::Number(n) if n.is_f64() => {
            if let Some(f) = n.as_f64() {
                if f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 {
                    *v = Value::from(f as i64);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(integral_floats_to_ints),
        Value::Object(m) => m.values_mut().for_each(integral_floats_to_ints),
        _ => {}
    }
}

impl SendMessage {
    /// Reads `params.message` of a `SendMessage` / `message/send` request
    /// (the same shape in the HTTP+JSON `SendMessageRequest` body). The
    /// extension must be active: listed in `message.extensions` or
    /// activated by the `A2A-Extensions` header (`header_active`).
    pub fn from_params(params: &Map<String, Value>, header_active: bool) -> Result<Self, RpcError> {
        let message = match params.get("message") {
            Some(Value::Object(m)) => m,
            None | Some(Value::Null) => return Err(RpcError::params("message", "missing")),
            Some(_) => return Err(RpcError::params("message", "must be an object")),
        };
        let message_id = match message.get("messageId") {
            Some(Value::String(s)) if !s.is_empty() => s.chars().take(256).collect(),
            None | Some(Value::Null) => String::new(),
            Some(_) => return Err(RpcError::params("message.messageId", "must be a string")),
        };
        let context_id = match message.get("contextId") {
            Some(Value::String(s)) => Some(s.chars().take(256).collect()),
            None | Some(Value::Null) => None,
            Some(_) => return Err(RpcError::params("message.contextId", "must be a string")),
        };
        let listed = match message.get("extensions") {
            None | Some(Value::Null) => false,
            Some(Value::Array(a)) => {
                if a.iter().any(|v| !v.is_string()) {
                    return Err(RpcError::params(
                        "message.extensions",
                        "must be an array of strings",
                    ));
                }
                a.iter().any(|v| v.as_str() == Some(EXTENSION_URI))
            }
            Some(_) => {
                return Err(RpcError::params(
                    "message.extensions",
                    "must be an array of strings",
                ))
            }
        };
        if !(listed || header_active) {
            return Err(RpcError::params(
                "message.extensions",
                format!("the Abhyasa extension {EXTENSION_URI} is not activated (list it in message.extensions or the A2A-Extensions header)"),
            ));
        }
        let field = format!("message.metadata[\"{EXTENSION_URI}\"]");
        let metadata = match message.get("metadata") {
            Some(Value::Object(m)) => m,
            None | Some(Value::Null) => {
                return Err(RpcError::params(
                    field,
                    "missing: no obligation in the message",
                ))
            }
            Some(_) => return Err(RpcError::params("message.metadata", "must be an object")),
        };
        let mut ob = match metadata.get(EXTENSION_URI) {
            Some(Value::Object(o)) => Value::Object(o.clone()),
            None | Some(Value::Null) => {
                return Err(RpcError::params(
                    field,
                    "missing: no obligation in the message",
                ))
            }
            Some(_) => return Err(RpcError::params(field, "must be an obligation object")),
        };
        integral_floats_to_ints(&mut ob);
        let Value::Object(ob) = ob else {
            return Err(RpcError::params(field, "must be an obligation object"));
        };
        let obligation =
            Obligation::from_json_map(&ob).map_err(|e| RpcError::from_obligation(&field, e))?;
        Ok(Self {
            obligation,
            context_id,
            message_id,
        })
    }
}

/// The agent's answer message carrying `ack` (a CustodyAck JSON, or a
/// pending marker) in `metadata[<URI>]`, in the version's spelling.
pub fn reply_message(
    version: A2aVersion,
    message_id: &str,
    context_id: Option<&str>,
    ack: Value,
    text: &str,
) -> Value {
    let mut metadata = Map::new();
    metadata.insert(EXTENSION_URI.into(), ack);
    let mut m = match version {
        A2aVersion::V1_0 => json!({
            "messageId": message_id,
            "role": "ROLE_AGENT",
            "parts": [{"text": text}],
            "metadata": metadata,
            "extensions": [EXTENSION_URI],
        }),
        A2aVersion::V0_3 => json!({
            "kind": "message",
            "messageId": message_id,
            "role": "agent",
            "parts": [{"kind": "text", "text": text}],
            "metadata": metadata,
            "extensions": [EXTENSION_URI],
        }),
    };
    if let Some(c) = context_id {
        m["contextId"] = Value::from(c);
    }
    m
}

/// The `SendMessage` result: 1.0 wraps the message as
/// `{"message": {...}}` (`SendMessageResponse`); 0.3's `message/send`
/// answers the message itself.
pub fn send_message_result(version: A2aVersion, message: Value) -> Value {
    match version {
        A2aVersion::V1_0 => json!({ "message": message }),
        A2aVersion::V0_3 => message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(A2aVersion::from_header(None), Ok(A2aVersion::V0_3));
        assert_eq!(A2aVersion::from_header(Some("1.0")), Ok(A2aVersion::V1_0));
        assert_eq!(A2aVersion::from_header(Some("1.0.1")), Ok(A2aVersion::V1_0));
        assert_eq!(A2aVersion::from_header(Some("0.3")), Ok(A2aVersion::V0_3));
        let e = A2aVersion::from_header(Some("2.0")).unwrap_err();
        assert_eq!(e.code(), -32009);
        assert!(A2aVersion::from_header(Some("1.")).is_err());
    }

    #[test]
    fn extension_header_splits() {
        assert_eq!(
            requested_extensions(" a , b,,c "),
            vec!["a".to_string(), "b".into(), "c".into()]
        );
    }

    #[test]
    fn struct_doubles_become_integers() {
        let mut v = json!({"a": 30.0, "b": -0.5, "c": [2.0, 1e300]});
        integral_floats_to_ints(&mut v);
        assert_eq!(v["a"], json!(30));
        assert_eq!(v["b"], json!(-0.5));
        assert_eq!(v["c"][0], json!(2));
        assert!(v["c"][1].is_f64());
    }

    // The normalization never changes what the digest covers (RFC 8785
    // prints 3.0 and 3 alike), so an ack still binds to the custodian's
    // digest.
    #[test]
    fn struct_doubles_keep_the_digest() {
        let ob = |n: Value| {
            let mut o = json!({
                "obligation_id": "d", "kind": "anumati.consent", "target": "bob",
                "payload": {"decision": "revoke", "scope": "s", "n": n, "z": -0.0},
                "deadline_seconds": 60, "max_retries": 20,
                "created_at": "2026-01-01T00:00:00Z",
            });
            integral_floats_to_ints(&mut o);
            Obligation::from_json_map(o.as_object().unwrap())
                .unwrap()
                .digest()
        };
        assert_eq!(ob(json!(3.0)), ob(json!(3)));
    }
}
