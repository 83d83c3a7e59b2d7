//! JSON v1: strict parsing with the public v1 field names.
//!
//! Strict means: integers must be JSON integers (`"600"`, `true` and `2.0`
//! are errors), timestamps need an explicit offset, statuses and reasons
//! are exact, identifiers are validated. Unknown extra fields from a v1 peer
//! are ignored. Every error names the field.

use serde_json::{Map, Value};

use crate::error::{FieldError, FieldProblem, PeerError};
use crate::model::obligation_json_type as json_type;
use crate::model::{
    AckStatus, AgentId, CustodyAck, DeclineReason, Digest, Kind, KindProfile, Obligation,
    ObligationId, Timestamp,
};

/// Largest JSON document accepted, in bytes.
pub const MAX_JSON_BYTES: usize = 256 * 1024;

/// Parses a JSON document into an object, enforcing the size limit.
pub fn parse_object(text: &[u8]) -> Result<Map<String, Value>, PeerError> {
    if text.len() > MAX_JSON_BYTES {
        return Err(PeerError::FrameTooLarge {
            size: text.len(),
            max: MAX_JSON_BYTES,
        });
    }
    let v: Value = serde_json::from_slice(text).map_err(|e| PeerError::Malformed {
        format: "json",
        detail: e.to_string(),
    })?;
    match v {
        Value::Object(m) => Ok(m),
        other => Err(FieldError::wrong_type("(document)", "object", json_type(&other)).into()),
    }
}

/// Typed, field-naming accessors over a JSON object.
pub(crate) struct Fields<'a> {
    map: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    pub(crate) fn new(map: &'a Map<String, Value>) -> Self {
        Self { map }
    }

    fn present(&self, name: &str) -> Option<&'a Value> {
        match self.map.get(name) {
            None | Some(Value::Null) => None,
            Some(v) => Some(v),
        }
    }

    pub(crate) fn req_str(&self, name: &str) -> Result<&'a str, FieldError> {
        self.opt_str(name)?.ok_or_else(|| FieldError::missing(name))
    }

    pub(crate) fn opt_str(&self, name: &str) -> Result<Option<&'a str>, FieldError> {
        match self.present(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(FieldError::wrong_type(name, "string", json_type(other))),
        }
    }

    pub(crate) fn opt_int(&self, name: &str) -> Result<Option<i128>, FieldError> {
        match self.present(name) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                if let Some(i) = n.as_i64() {
                    Ok(Some(i128::from(i)))
                } else if let Some(u) = n.as_u64() {
                    Ok(Some(i128::from(u)))
                } else {
                    Err(FieldError::wrong_type(name, "integer", "number"))
                }
            }
            Some(other) => Err(FieldError::wrong_type(name, "integer", json_type(other))),
        }
    }

    pub(crate) fn req_int(&self, name: &str) -> Result<i128, FieldError> {
        self.opt_int(name)?.ok_or_else(|| FieldError::missing(name))
    }

    pub(crate) fn opt_f64(&self, name: &str) -> Result<Option<f64>, FieldError> {
        match self.present(name) {
            None => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(other) => Err(FieldError::wrong_type(name, "number", json_type(other))),
        }
    }

    pub(crate) fn req_timestamp(&self, name: &str) -> Result<Timestamp, FieldError> {
        Timestamp::parse_rfc3339(name, self.req_str(name)?)
    }

    pub(crate) fn opt_digest(&self, name: &str) -> Result<Option<Digest>, FieldError> {
        self.opt_str(name)?
            .map(|s| Digest::from_hex(name, s))
            .transpose()
    }
}

fn in_range(name: &str, v: i128, lo: i128, hi: i128) -> Result<i128, FieldError> {
    if v < lo || v > hi {
        return Err(FieldError::new(
            name,
            FieldProblem::OutOfRange {
                allowed: format!("{lo}..={hi}"),
            },
        ));
    }
    Ok(v)
}

impl Obligation {
    /// Parses a v1 JSON obligation. If it carries our optional `digest`,
    /// the digest must match the content.
    pub fn from_json(text: &[u8]) -> Result<Obligation, PeerError> {
        Self::from_json_map(&parse_object(text)?)
    }

    /// Parses a v1 JSON object.
    pub fn from_json_map(m: &Map<String, Value>) -> Result<Obligation, PeerError> {
        let f = Fields::new(m);
        let payload = match f.present("payload") {
            None => Value::Object(Map::new()),
            Some(v @ Value::Object(_)) => v.clone(),
            Some(other) => {
                return Err(FieldError::wrong_type("payload", "object", json_type(other)).into())
            }
        };
        let deadline = f.req_int("deadline_seconds")?;
        let retries = f.req_int("max_retries")?;
        let mut b = Obligation::builder()
            .id(f.req_str("obligation_id")?)
            .kind(f.req_str("kind")?)
            .target(f.req_str("target")?)
            .payload(payload)
            .deadline_seconds(clamp_i64(deadline))
            .max_retries(clamp_i64(retries))
            .created_at(f.req_timestamp("created_at")?);
        if let Some(s) = f.opt_int("sequence")? {
            b = b.sequence(in_range("sequence", s, 0, i128::from(u64::MAX))? as u64);
        }
        let ob = b.build()?;
        if let Some(claimed) = f.opt_digest("digest")? {
            if claimed != ob.digest() {
                return Err(PeerError::DigestMismatch {
                    claimed,
                    computed: ob.digest(),
                });
            }
        }
        Ok(ob)
    }

    /// The v1 JSON object plus our `digest`.
    pub fn to_json_value(&self) -> Value {
        let mut m = self.v1_object();
        m.insert("digest".into(), Value::from(self.digest().to_hex()));
        Value::Object(m)
    }

    /// Compact JSON text.
    pub fn to_json(&self) -> String {
        self.to_json_value().to_string()
    }
}

fn clamp_i64(v: i128) -> i64 {
    v.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

impl CustodyAck {
    /// Parses a v1 JSON ack (plus our optional fields).
    pub fn from_json(text: &[u8]) -> Result<CustodyAck, PeerError> {
        Self::from_json_map(&parse_object(text)?)
    }

    /// Parses a v1 JSON ack object.
    pub fn from_json_map(m: &Map<String, Value>) -> Result<CustodyAck, PeerError> {
        let f = Fields::new(m);
        let ack = CustodyAck {
            obligation_id: ObligationId::parse_field("obligation_id", f.req_str("obligation_id")?)?,
            target: AgentId::parse_field("target", f.req_str("target")?)?,
            status: AckStatus::parse("status", f.req_str("status")?)?,
            acked_at: f.req_timestamp("acked_at")?,
            digest: f.opt_digest("digest")?,
            reason: f
                .opt_str("reason")?
                .map(|s| DeclineReason::parse("reason", s))
                .transpose()?,
            detail: f.opt_str("detail")?.map(str::to_string),
            receiver_instance: f.opt_str("receiver_instance")?.map(str::to_string),
        };
        ack.validate()?;
        Ok(ack)
    }

    /// The v1 JSON object plus our optional fields (omitted when absent).
    pub fn to_json_value(&self) -> Value {
        let mut m = Map::new();
        m.insert(
            "obligation_id".into(),
            Value::from(self.obligation_id.as_str()),
        );
        m.insert("target".into(), Value::from(self.target.as_str()));
        m.insert("status".into(), Value::from(self.status.as_str()));
        m.insert("acked_at".into(), Value::from(self.acked_at.to_rfc3339()));
        if let Some(d) = self.digest {
            m.insert("digest".into(), Value::from(d.to_hex()));
        }
        if let Some(r) = self.reason {
            m.insert("reason".into(), Value::from(r.as_str()));
        }
        if let Some(d) = &self.detail {
            m.insert("detail".into(), Value::from(d.as_str()));
        }
        if let Some(i) = &self.receiver_instance {
            m.insert("receiver_instance".into(), Value::from(i.as_str()));
        }
        Value::Object(m)
    }

    /// Compact JSON text.
    pub fn to_json(&self) -> String {
        self.to_json_value().to_string()
    }
}

impl KindProfile {
    /// Parses a v1 `KindProfile` object and validates it (including the
    /// AB-2 sizing rule).
    pub fn from_json_map(
        m: &Map<String, Value>,
    ) -> Result<KindProfile, crate::error::ProfileError> {
        let f = Fields::new(m);
        let p = KindProfile {
            kind: Kind::parse_field("kind", f.req_str("kind")?)?,
            obligation_endpoint: f.req_str("obligation_endpoint")?.to_string(),
            deadline_seconds: in_range(
                "deadline_seconds",
                f.req_int("deadline_seconds")?,
                1,
                i128::from(u64::MAX),
            )? as u64,
            max_retries: in_range(
                "max_retries",
                f.req_int("max_retries")?,
                0,
                i128::from(u64::MAX),
            )? as u64,
            backoff: f.opt_str("backoff")?.unwrap_or("exponential").to_string(),
            backoff_base_seconds: f.opt_f64("backoff_base_seconds")?.unwrap_or(1.0),
            backoff_cap_seconds: in_range(
                "backoff_cap_seconds",
                f.req_int("backoff_cap_seconds")?,
                1,
                i128::from(u64::MAX),
            )? as u64,
        };
        p.validate()?;
        Ok(p)
    }

    /// The v1 JSON object.
    pub fn to_json_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("kind".into(), Value::from(self.kind.as_str()));
        m.insert(
            "obligation_endpoint".into(),
            Value::from(self.obligation_endpoint.as_str()),
        );
        m.insert(
            "deadline_seconds".into(),
            Value::from(self.deadline_seconds),
        );
        m.insert("max_retries".into(), Value::from(self.max_retries));
        m.insert("backoff".into(), Value::from(self.backoff.as_str()));
        m.insert(
            "backoff_base_seconds".into(),
            Value::from(self.backoff_base_seconds),
        );
        m.insert(
            "backoff_cap_seconds".into(),
            Value::from(self.backoff_cap_seconds),
        );
        Value::Object(m)
    }
}

macro_rules! serde_via_json {
    ($t:ty) => {
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                self.to_json_value().serialize(s)
            }
        }

        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                match Value::deserialize(d)? {
                    Value::Object(m) => <$t>::from_json_map(&m).map_err(serde::de::Error::custom),
                    other => Err(serde::de::Error::custom(format!(
                        "expected a JSON object, found {}",
                        json_type(&other)
                    ))),
                }
            }
        }
    };
}

serde_via_json!(Obligation);
serde_via_json!(CustodyAck);
serde_via_json!(KindProfile);
