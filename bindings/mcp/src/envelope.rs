//! The custody envelope in MCP `_meta`.
//!
//! A request carries an obligation under the key [`ENVELOPE_KEY`] of its
//! `_meta`:
//!
//! ```json
//! {"_meta": {"io.github.ravikiran438/abhyasa": {"obligation": { /* v1 JSON */ }}}}
//! ```
//!
//! and the result answers under the same key of its own `_meta`, with the
//! receiver's [`CustodyAck`] in v1 JSON (or, when the obligation could not
//! be taken at all, an `error` naming the field):
//!
//! ```json
//! {"_meta": {"io.github.ravikiran438/abhyasa": {"ack": { /* CustodyAck */ }}}}
//! ```
//!
//! The key is valid under every MCP revision's `_meta` key rules: a
//! reverse-DNS prefix (`io.github.ravikiran438/`) whose second label is
//! neither `modelcontextprotocol` nor `mcp`.

use abhyasa_core::json::MAX_JSON_BYTES;
use abhyasa_core::{CustodyAck, Obligation, PeerError};
use serde_json::{Map, Value};

/// The `_meta` key of the custody envelope, in requests and results.
pub const ENVELOPE_KEY: &str = "io.github.ravikiran438/abhyasa";

/// Why an envelope could not be read. Every variant names what is wrong,
/// so the client can fix its envelope.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvelopeError {
    /// The value under [`ENVELOPE_KEY`] is not a JSON object.
    #[error("_meta.\"{ENVELOPE_KEY}\" must be an object, found {found}")]
    NotAnObject {
        /// The JSON type found.
        found: &'static str,
    },
    /// The envelope is larger than the core's JSON limit.
    #[error("_meta.\"{ENVELOPE_KEY}\" is {size} bytes, more than the limit of {max}")]
    TooLarge {
        /// Its size as compact JSON.
        size: usize,
        /// The limit ([`MAX_JSON_BYTES`]).
        max: usize,
    },
    /// The envelope has no `obligation`.
    #[error("_meta.\"{ENVELOPE_KEY}\".obligation is missing")]
    MissingObligation,
    /// `obligation` is not a JSON object.
    #[error("_meta.\"{ENVELOPE_KEY}\".obligation must be an object, found {found}")]
    ObligationNotAnObject {
        /// The JSON type found.
        found: &'static str,
    },
    /// The obligation is not valid v1 JSON.
    #[error("_meta.\"{ENVELOPE_KEY}\".obligation: {0}")]
    Obligation(PeerError),
}

impl EnvelopeError {
    /// A short machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::TooLarge { .. } => "too_large",
            Self::Obligation(_) => "invalid_obligation",
            _ => "invalid_envelope",
        }
    }
}

/// The JSON type name of a value, for error messages.
pub(crate) fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// An envelope read from a request's `_meta`.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    /// The obligation it carries.
    pub obligation: Obligation,
}

impl Envelope {
    /// Reads the envelope from a `_meta` map: `Ok(None)` when the map has no
    /// [`ENVELOPE_KEY`] (a request without Abhyasa), an error when the
    /// envelope is present but unreadable. Never panics on any input
    /// (C-T-6).
    pub fn from_meta(meta: &Map<String, Value>) -> Result<Option<Envelope>, EnvelopeError> {
        match meta.get(ENVELOPE_KEY) {
            None => Ok(None),
            Some(v) => Self::from_value(v).map(Some),
        }
    }

    /// Reads the value found under [`ENVELOPE_KEY`].
    pub fn from_value(v: &Value) -> Result<Envelope, EnvelopeError> {
        let Value::Object(m) = v else {
            return Err(EnvelopeError::NotAnObject {
                found: json_type(v),
            });
        };
        // Bound what a peer can make us parse: the same limit as any v1
        // JSON document.
        let size = v.to_string().len();
        if size > MAX_JSON_BYTES {
            return Err(EnvelopeError::TooLarge {
                size,
                max: MAX_JSON_BYTES,
            });
        }
        let ob = match m.get("obligation") {
            None | Some(Value::Null) => return Err(EnvelopeError::MissingObligation),
            Some(Value::Object(o)) => o,
            Some(other) => {
                return Err(EnvelopeError::ObligationNotAnObject {
                    found: json_type(other),
                })
            }
        };
        let obligation = Obligation::from_json_map(ob).map_err(EnvelopeError::Obligation)?;
        Ok(Envelope { obligation })
    }

    /// The envelope as the value to put under [`ENVELOPE_KEY`] of a
    /// request's `_meta` (what a custodian sends).
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("obligation".into(), self.obligation.to_json_value());
        Value::Object(m)
    }

    /// Inserts the envelope into a `_meta` map.
    pub fn insert_into(&self, meta: &mut Map<String, Value>) {
        meta.insert(ENVELOPE_KEY.into(), self.to_value());
    }
}

/// What a result's `_meta` carries back under [`ENVELOPE_KEY`].
#[derive(Debug, Clone, PartialEq)]
pub enum EnvelopeReply {
    /// The receiver's ack, released only after the ledger entry it reports
    /// is durable.
    Ack(CustodyAck),
    /// The envelope or its obligation was refused before any ledger entry:
    /// nothing was applied, and the custodian's schedule goes on.
    Error {
        /// A short code (`invalid_envelope`, `invalid_obligation`, ...).
        code: String,
        /// What is wrong, naming the field.
        message: String,
    },
}

impl EnvelopeReply {
    /// The value to put under [`ENVELOPE_KEY`] of a result's `_meta`.
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        match self {
            Self::Ack(a) => {
                m.insert("ack".into(), a.to_json_value());
            }
            Self::Error { code, message } => {
                let mut e = Map::new();
                e.insert("code".into(), Value::from(code.as_str()));
                e.insert("message".into(), Value::from(message.as_str()));
                m.insert("error".into(), Value::Object(e));
            }
        }
        Value::Object(m)
    }

    /// Reads the reply from a result's `_meta` (what a custodian does with
    /// the answer): `Ok(None)` when the server did not answer the envelope
    /// (a server without Abhyasa: the custodian's schedule retries).
    pub fn from_meta(meta: &Map<String, Value>) -> Result<Option<EnvelopeReply>, String> {
        let Some(v) = meta.get(ENVELOPE_KEY) else {
            return Ok(None);
        };
        let Value::Object(m) = v else {
            return Err(format!(
                "result _meta.\"{ENVELOPE_KEY}\" must be an object, found {}",
                json_type(v)
            ));
        };
        if let Some(a) = m.get("ack") {
            let Value::Object(a) = a else {
                return Err(format!(
                    "result _meta.\"{ENVELOPE_KEY}\".ack must be an object, found {}",
                    json_type(a)
                ));
            };
            return CustodyAck::from_json_map(a)
                .map(|a| Some(EnvelopeReply::Ack(a)))
                .map_err(|e| format!("result _meta.\"{ENVELOPE_KEY}\".ack: {e}"));
        }
        if let Some(Value::Object(e)) = m.get("error") {
            let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            return Ok(Some(EnvelopeReply::Error {
                code: s("code"),
                message: s("message"),
            }));
        }
        Err(format!(
            "result _meta.\"{ENVELOPE_KEY}\" has neither ack nor error"
        ))
    }
}
