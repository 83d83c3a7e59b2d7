//! The obligation: a message whose receiver must honor the constraint it
//! carries.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::{Map, Number, Value};

use super::{AgentId, Digest, Kind, ObligationId, Sequence, Timestamp};
use crate::canonical::{self, MAX_SAFE_INTEGER};
use crate::error::{FieldError, FieldProblem};

/// Largest accepted payload, in bytes of its canonical JSON.
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024;
/// Largest accepted `max_retries` (anything above is absurd: at a 1 s cap it
/// is more than a day of retries).
pub const MAX_RETRIES_LIMIT: u32 = 100_000;
/// Largest accepted `deadline_seconds` (ten years).
pub const MAX_DEADLINE_SECONDS: u64 = 10 * 366 * 24 * 3600;
/// Deepest accepted payload nesting.
const MAX_PAYLOAD_DEPTH: usize = 32;

/// The invariant-specific body of an obligation: a JSON object, validated
/// for interoperable numbers, depth and size, with its canonical (JCS) form
/// cached.
///
/// Two payloads are equal when their canonical forms are equal (so `-0.0`
/// equals `0` and `2.0` equals `2`, as their digests do).
///
/// The canonical text is the payload; the parsed fields are derived from
/// it. A payload a store restores ([`ObligationBuilder::build_stored`])
/// keeps only the text until a field is first read: a custodian holding a
/// million pending transfers never reads their fields, so it never pays
/// for them.
#[derive(Clone)]
pub struct Payload {
    // Boxed, both: a restored payload holds 32 bytes beside its text, not
    // 56 (the memory per pending obligation).
    map: OnceLock<Box<Map<String, Value>>>,
    canonical: Box<str>,
}

/// Normalizes every field of a payload as [`Payload::new`] accepts it
/// (see [`payload_number`]), naming the first bad one.
fn normalize_fields(map: &mut Map<String, Value>) -> Result<(), FieldError> {
    for (k, v) in map.iter_mut() {
        normalize(v, 1).map_err(|e| e.at_key(k).into_field_error())?;
    }
    Ok(())
}

/// The canonical text buffer a payload built from fields starts with:
/// room for a small payload, so the common case never reallocates.
const PAYLOAD_TEXT_GUESS: usize = 128;

/// The refusal of a payload past [`MAX_PAYLOAD_BYTES`].
fn too_long() -> FieldError {
    FieldError::new(
        "payload",
        FieldProblem::TooLong {
            max: MAX_PAYLOAD_BYTES,
        },
    )
}

impl Payload {
    /// Validates a JSON object as a payload, normalizing every number to
    /// the value its canonical text reads back as (see [`payload_number`]),
    /// so that whatever is accepted here round-trips exactly through JSON,
    /// protobuf and every store.
    pub fn new(map: Map<String, Value>) -> Result<Self, FieldError> {
        Self::with_capacity(map, PAYLOAD_TEXT_GUESS)
    }

    /// [`Payload::new`], writing the canonical text into a buffer of
    /// `capacity` bytes (the received text's length is a good guess):
    /// growing it from empty cost five reallocations per obligation, on
    /// the sender and again on the receiver.
    fn with_capacity(mut map: Map<String, Value>, capacity: usize) -> Result<Self, FieldError> {
        normalize_fields(&mut map)?;
        let mut canonical = String::with_capacity(capacity.min(MAX_PAYLOAD_BYTES));
        canonical::write_object(&map, &mut canonical);
        if canonical.len() > MAX_PAYLOAD_BYTES {
            return Err(too_long());
        }
        Ok(Self {
            map: OnceLock::from(Box::new(map)),
            canonical: canonical.into_boxed_str(),
        })
    }

    /// A payload from the canonical text a validated payload produced,
    /// without parsing, normalizing or canonicalizing it again: for a
    /// store restoring what it wrote, under its own row checksum. Only
    /// the size bound is checked here. Text that is not such a payload is
    /// a caller's bug: its fields then read as empty (nothing panics).
    pub fn from_canonical_unchecked(canonical: String) -> Result<Self, FieldError> {
        if canonical.len() > MAX_PAYLOAD_BYTES {
            return Err(too_long());
        }
        Ok(Self {
            map: OnceLock::new(),
            canonical: canonical.into_boxed_str(),
        })
    }

    /// Parses a payload from its JSON text (e.g. from a protobuf frame).
    pub fn from_json_bytes(bytes: &[u8]) -> Result<Self, FieldError> {
        if bytes.len() > MAX_PAYLOAD_BYTES * 4 {
            return Err(too_long());
        }
        let v: Value = serde_json::from_slice(bytes)
            .map_err(|e| FieldError::invalid("payload", format!("not JSON: {e}")))?;
        match v {
            Value::Object(m) => Self::with_capacity(m, bytes.len()),
            other => Err(FieldError::wrong_type(
                "payload",
                "object",
                json_type(&other),
            )),
        }
    }

    /// An empty payload.
    pub fn empty() -> Self {
        Self {
            map: OnceLock::from(Box::default()),
            canonical: "{}".into(),
        }
    }

    /// The fields (parsed from the canonical text on first use when the
    /// payload was restored by a store).
    pub fn as_map(&self) -> &Map<String, Value> {
        self.map.get_or_init(|| {
            // The canonical text of a valid payload, parsed and then
            // normalized as `Payload::new` normalizes, is that payload
            // exactly (`normalize(parse(jcs(x))) == x`, C-T-5); anything
            // else is not a payload at all.
            match serde_json::from_str(&self.canonical) {
                Ok(Value::Object(mut m)) => match normalize_fields(&mut m) {
                    Ok(()) => Box::new(m),
                    Err(_) => Box::default(),
                },
                _ => Box::default(),
            }
        })
    }

    /// One field.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.as_map().get(key)
    }

    /// The canonical JSON text (RFC 8785).
    pub fn canonical_json(&self) -> &str {
        &self.canonical
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Self) -> bool {
        self.canonical == other.canonical
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical)
    }
}

/// The JSON type name of a value, for error messages.
pub(crate) fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// What payload numbers may be, in words (used in error messages).
pub const PAYLOAD_NUMBERS: &str = "finite IEEE-754 doubles (RFC 8785); an integer beyond \
     ±(2^53-1) only if it is a double, written exactly or in its shortest form";

/// The one rule for payload numbers (RFC 8785 §3.2.2.3, I-JSON): every
/// number is a finite IEEE-754 double. Returns the number in the form its
/// canonical text parses back to, so `normalize(parse(jcs(x))) == x`:
///
/// - an integer within ±(2^53-1) stays an integer;
/// - an integer literal beyond that is accepted only when it names a
///   double without rounding away information: it is exactly that double
///   (`1152921504606846976` = 2^60) or the double's canonical, shortest
///   spelling (`1152921504606847000`, what JCS writes for 2^60). It is then
///   held as that double. `9007199254740993` is neither and is refused;
/// - a double with an integral value within ±(2^53-1) becomes that integer
///   (`2.0` is `2`, `-0.0` is `0`), as its canonical text says;
/// - any other finite double stays as it is.
///
/// `None` means the number is not admissible.
pub fn payload_number(n: &Number) -> Option<Number> {
    if let Some(i) = n.as_i64() {
        if i.unsigned_abs() <= MAX_SAFE_INTEGER {
            return Some(Number::from(i));
        }
        return big_integer(i128::from(i));
    }
    if let Some(u) = n.as_u64() {
        return big_integer(i128::from(u));
    }
    let f = n.as_f64().filter(|f| f.is_finite())?;
    if f.fract() == 0.0 && f.abs() <= MAX_SAFE_INTEGER as f64 {
        // Exact: |f| <= 2^53-1 is an integer that i64 holds.
        return Some(Number::from(f as i64));
    }
    Number::from_f64(f)
}

/// An integer literal beyond ±(2^53-1): the double it names, if it names
/// one exactly or in that double's canonical spelling.
fn big_integer(v: i128) -> Option<Number> {
    // Integer-to-float `as` rounds to nearest, ties to even: the double a
    // JSON parser reads for these digits. Every i64/u64 is inside f64's
    // range, and `f as i128` is exact for such an integral double.
    let f = v as f64;
    let exact = f as i128 == v;
    (exact || canonical::es_number(f) == v.to_string())
        .then(|| Number::from_f64(f))
        .flatten()
}

/// A payload rule broken at a path, built from the leaf up so the happy
/// path formats nothing.
struct BadValue {
    path: Vec<PathStep>,
    problem: FieldProblem,
}

enum PathStep {
    Key(String),
    Index(usize),
}

impl BadValue {
    fn new(problem: FieldProblem) -> Self {
        Self {
            path: Vec::new(),
            problem,
        }
    }

    fn at_key(mut self, k: &str) -> Self {
        self.path.push(PathStep::Key(k.to_string()));
        self
    }

    fn at_index(mut self, i: usize) -> Self {
        self.path.push(PathStep::Index(i));
        self
    }

    fn into_field_error(self) -> FieldError {
        let mut field = String::from("payload");
        for step in self.path.iter().rev() {
            match step {
                PathStep::Key(k) => {
                    field.push('.');
                    field.push_str(k);
                }
                PathStep::Index(i) => {
                    field.push('[');
                    field.push_str(&i.to_string());
                    field.push(']');
                }
            }
        }
        FieldError::new(field, self.problem)
    }
}

fn normalize(v: &mut Value, depth: usize) -> Result<(), BadValue> {
    if depth > MAX_PAYLOAD_DEPTH {
        return Err(BadValue::new(FieldProblem::Invalid(format!(
            "nested deeper than {MAX_PAYLOAD_DEPTH} levels"
        ))));
    }
    match v {
        Value::Number(n) => match payload_number(n) {
            Some(m) => *n = m,
            None => {
                return Err(BadValue::new(FieldProblem::OutOfRange {
                    allowed: PAYLOAD_NUMBERS.into(),
                }))
            }
        },
        Value::Array(a) => {
            for (i, item) in a.iter_mut().enumerate() {
                normalize(item, depth + 1).map_err(|e| e.at_index(i))?;
            }
        }
        Value::Object(m) => {
            for (k, item) in m.iter_mut() {
                normalize(item, depth + 1).map_err(|e| e.at_key(k))?;
            }
        }
        _ => {}
    }
    Ok(())
}

struct Inner {
    obligation_id: ObligationId,
    kind: Kind,
    target: AgentId,
    payload: Payload,
    deadline_seconds: u64,
    max_retries: u32,
    created_at: Timestamp,
    sequence: Option<Sequence>,
    digest: Digest,
}

/// A governance obligation. Immutable once built; cheap to clone (shared).
///
/// Invariants, checked when it is built or parsed: identifiers valid,
/// `0 < deadline_seconds <= MAX_DEADLINE_SECONDS`,
/// `max_retries <= MAX_RETRIES_LIMIT`, payload a valid [`Payload`]. The
/// content [`Digest`] is computed once, at construction.
#[derive(Clone)]
pub struct Obligation(Arc<Inner>);

impl Obligation {
    /// Starts a builder.
    pub fn builder() -> ObligationBuilder {
        ObligationBuilder::default()
    }

    /// The idempotency key.
    pub fn id(&self) -> &ObligationId {
        &self.0.obligation_id
    }
    /// The kind (selects the polarity rule).
    pub fn kind(&self) -> &Kind {
        &self.0.kind
    }
    /// The receiver that must honor it.
    pub fn target(&self) -> &AgentId {
        &self.0.target
    }
    /// The body.
    pub fn payload(&self) -> &Payload {
        &self.0.payload
    }
    /// Custody deadline relative to `created_at`, in seconds.
    pub fn deadline_seconds(&self) -> u64 {
        self.0.deadline_seconds
    }
    /// Retries after the first attempt: at most `1 + max_retries` attempts.
    pub fn max_retries(&self) -> u32 {
        self.0.max_retries
    }
    /// Issue time.
    pub fn created_at(&self) -> Timestamp {
        self.0.created_at
    }
    /// Issuance order on its governed key, if set-semantic.
    pub fn sequence(&self) -> Option<Sequence> {
        self.0.sequence
    }
    /// This obligation with `sequence` instead of its own, and the digest
    /// that content has (the issuer assigning the order on a key, C-OR-1).
    pub fn with_sequence(&self, sequence: Option<Sequence>) -> Obligation {
        let o = &self.0;
        let mut inner = Inner {
            obligation_id: o.obligation_id.clone(),
            kind: o.kind.clone(),
            target: o.target.clone(),
            payload: o.payload.clone(),
            deadline_seconds: o.deadline_seconds,
            max_retries: o.max_retries,
            created_at: o.created_at,
            sequence,
            digest: Digest([0; 32]),
        };
        inner.digest = compute_digest(&inner);
        Obligation(Arc::new(inner))
    }

    /// Content digest of the immutable fields.
    pub fn digest(&self) -> Digest {
        self.0.digest
    }
    /// The absolute deadline: `created_at + deadline_seconds`. Never
    /// restarted (AB-2).
    pub fn deadline_at(&self) -> Timestamp {
        self.0
            .created_at
            .saturating_add(Duration::from_secs(self.0.deadline_seconds))
    }

    /// The JSON object of the eight v1 fields, in canonical value form.
    pub fn v1_object(&self) -> Map<String, Value> {
        v1_object(&self.0)
    }
}

fn v1_object(o: &Inner) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert(
        "obligation_id".into(),
        Value::from(o.obligation_id.as_str()),
    );
    m.insert("kind".into(), Value::from(o.kind.as_str()));
    m.insert("target".into(), Value::from(o.target.as_str()));
    m.insert("payload".into(), Value::Object(o.payload.as_map().clone()));
    m.insert("deadline_seconds".into(), Value::from(o.deadline_seconds));
    m.insert("max_retries".into(), Value::from(o.max_retries));
    m.insert("created_at".into(), Value::from(o.created_at.to_rfc3339()));
    if let Some(s) = o.sequence {
        m.insert("sequence".into(), Value::from(s.0));
    }
    m
}

fn compute_digest(o: &Inner) -> Digest {
    // JCS of the v1 object, written directly to avoid cloning the payload.
    // Room for all of it at once: the member names and punctuation (~110
    // bytes), the timestamp and two integers (< 60), the strings (escaping
    // may still grow it).
    let mut s = String::with_capacity(
        192 + o.payload.canonical.len()
            + o.kind.as_str().len()
            + o.obligation_id.as_str().len()
            + o.target.as_str().len(),
    );
    s.push('{');
    let field = |name: &str, first: bool, s: &mut String| {
        if !first {
            s.push(',');
        }
        s.push('"');
        s.push_str(name);
        s.push_str("\":");
    };
    // Member names are ASCII, so UTF-16 order equals byte order:
    // created_at, deadline_seconds, kind, max_retries, obligation_id,
    // payload, sequence, target.
    // Strings and integers are written straight into `s` (no JSON value,
    // no temporary string per field).
    field("created_at", true, &mut s);
    // RFC 3339 text needs no escaping: quoted as it is.
    s.push('"');
    o.created_at.write_rfc3339(&mut s);
    s.push('"');
    field("deadline_seconds", false, &mut s);
    s.push_str(itoa::Buffer::new().format(o.deadline_seconds));
    field("kind", false, &mut s);
    canonical::write_string(o.kind.as_str(), &mut s);
    field("max_retries", false, &mut s);
    s.push_str(itoa::Buffer::new().format(o.max_retries));
    field("obligation_id", false, &mut s);
    canonical::write_string(o.obligation_id.as_str(), &mut s);
    field("payload", false, &mut s);
    s.push_str(&o.payload.canonical);
    if let Some(seq) = o.sequence {
        field("sequence", false, &mut s);
        s.push_str(itoa::Buffer::new().format(seq.0));
    }
    field("target", false, &mut s);
    canonical::write_string(o.target.as_str(), &mut s);
    s.push('}');
    Digest(canonical::sha256(s.as_bytes()))
}

impl PartialEq for Obligation {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
            || (self.0.digest == other.0.digest
                && self.0.obligation_id == other.0.obligation_id
                && self.0.payload == other.0.payload
                && self.0.created_at == other.0.created_at
                && self.0.sequence == other.0.sequence
                && self.0.deadline_seconds == other.0.deadline_seconds
                && self.0.max_retries == other.0.max_retries
                && self.0.kind == other.0.kind
                && self.0.target == other.0.target)
    }
}

impl fmt::Debug for Obligation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Obligation")
            .field("obligation_id", &self.0.obligation_id.as_str())
            .field("kind", &self.0.kind.as_str())
            .field("target", &self.0.target.as_str())
            .field("payload", &self.0.payload)
            .field("deadline_seconds", &self.0.deadline_seconds)
            .field("max_retries", &self.0.max_retries)
            .field("created_at", &self.0.created_at)
            .field("sequence", &self.0.sequence)
            .field("digest", &self.0.digest)
            .finish()
    }
}

/// Builds an [`Obligation`], validating every field and naming the first
/// bad one in the error.
#[derive(Debug, Default, Clone)]
pub struct ObligationBuilder {
    obligation_id: Option<Part<ObligationId>>,
    kind: Option<Part<Kind>>,
    target: Option<Part<AgentId>>,
    payload: Option<Value>,
    deadline_seconds: Option<i128>,
    max_retries: Option<i128>,
    created_at: Option<Timestamp>,
    sequence: Option<i128>,
}

/// An identifier set on a builder: text still to be validated, or one
/// already valid (shared, not copied, into the obligation).
#[derive(Debug, Clone)]
enum Part<T> {
    Text(String),
    Valid(T),
}

/// The identifier `part` sets, validated under `field` if it is text.
fn part<T>(
    field: &'static str,
    part: Option<Part<T>>,
    parse: fn(&str, &str) -> Result<T, FieldError>,
) -> Result<T, FieldError> {
    match part.ok_or_else(|| FieldError::missing(field))? {
        Part::Text(s) => parse(field, &s),
        Part::Valid(v) => Ok(v),
    }
}

impl ObligationBuilder {
    /// Sets `obligation_id`.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.obligation_id = Some(Part::Text(id.into()));
        self
    }
    /// Sets `kind`.
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(Part::Text(kind.into()));
        self
    }
    /// Sets `target`.
    pub fn target(mut self, target: impl Into<String>) -> Self {
        self.target = Some(Part::Text(target.into()));
        self
    }
    /// Sets `obligation_id` to an identifier already valid: shared, not
    /// copied (a store restoring a million obligations, say).
    pub fn with_id(mut self, id: ObligationId) -> Self {
        self.obligation_id = Some(Part::Valid(id));
        self
    }
    /// Sets `kind` to one already valid (shared, not copied): a store
    /// restoring many obligations of one kind holds the text once.
    pub fn with_kind(mut self, kind: Kind) -> Self {
        self.kind = Some(Part::Valid(kind));
        self
    }
    /// Sets `target` to one already valid (shared, not copied).
    pub fn with_target(mut self, target: AgentId) -> Self {
        self.target = Some(Part::Valid(target));
        self
    }
    /// Sets the payload from a JSON value (must be an object).
    pub fn payload(mut self, payload: Value) -> Self {
        self.payload = Some(payload);
        self
    }
    /// Sets `deadline_seconds`.
    pub fn deadline_seconds(mut self, s: i64) -> Self {
        self.deadline_seconds = Some(i128::from(s));
        self
    }
    /// Sets `max_retries`.
    pub fn max_retries(mut self, r: i64) -> Self {
        self.max_retries = Some(i128::from(r));
        self
    }
    /// Sets `created_at`.
    pub fn created_at(mut self, t: Timestamp) -> Self {
        self.created_at = Some(t);
        self
    }
    /// Sets `sequence`.
    pub fn sequence(mut self, s: u64) -> Self {
        self.sequence = Some(i128::from(s));
        self
    }

    /// Validates and builds.
    pub fn build(mut self) -> Result<Obligation, FieldError> {
        let payload = match self.payload.take() {
            None => Payload::empty(),
            Some(Value::Object(m)) => Payload::new(m)?,
            Some(other) => {
                return Err(FieldError::wrong_type(
                    "payload",
                    "object",
                    json_type(&other),
                ))
            }
        };
        self.finish(payload, None)
    }

    /// Validates and builds with `payload`, already validated and
    /// canonical (a [`Payload`] is only made by its checking
    /// constructors): the payload set on the builder, if any, is ignored
    /// and the payload is not normalized or canonicalized again; the
    /// digest is computed. For a decoder that parsed the payload itself
    /// (a protobuf frame's payload used to be parsed, copied
    /// and canonicalized twice).
    pub fn build_with_payload(self, payload: Payload) -> Result<Obligation, FieldError> {
        self.finish(payload, None)
    }

    /// Builds an obligation a store restores: every field but the payload
    /// is validated as [`build`](Self::build) does; the payload is the
    /// canonical text and the digest the one the store wrote when the
    /// obligation was first built, and neither is parsed, canonicalized
    /// or hashed again (see [`Payload::from_canonical_unchecked`]). The
    /// caller vouches for both with its own checksum over the row they
    /// came from; a payload set on the builder is ignored.
    pub fn build_stored(
        self,
        canonical_payload: String,
        digest: Digest,
    ) -> Result<Obligation, FieldError> {
        let payload = Payload::from_canonical_unchecked(canonical_payload)?;
        self.finish(payload, Some(digest))
    }

    fn finish(self, payload: Payload, digest: Option<Digest>) -> Result<Obligation, FieldError> {
        let obligation_id = part(
            "obligation_id",
            self.obligation_id,
            ObligationId::parse_field,
        )?;
        let kind = part("kind", self.kind, Kind::parse_field)?;
        let target = part("target", self.target, AgentId::parse_field)?;
        let deadline_seconds = check_range(
            "deadline_seconds",
            self.deadline_seconds
                .ok_or_else(|| FieldError::missing("deadline_seconds"))?,
            1,
            i128::from(MAX_DEADLINE_SECONDS),
        )? as u64;
        let max_retries = check_range(
            "max_retries",
            self.max_retries
                .ok_or_else(|| FieldError::missing("max_retries"))?,
            0,
            i128::from(MAX_RETRIES_LIMIT),
        )? as u32;
        let created_at = self
            .created_at
            .ok_or_else(|| FieldError::missing("created_at"))?;
        // Every timestamp derived from it (the absolute deadline included)
        // must print as RFC 3339 and parse back: a later one would be
        // accepted here and fail to decode from JSON or a store's JSON row.
        let latest =
            Timestamp::RFC3339_MAX.saturating_sub(Duration::from_secs(MAX_DEADLINE_SECONDS));
        if created_at < Timestamp::RFC3339_MIN || created_at > latest {
            return Err(FieldError::new(
                "created_at",
                FieldProblem::OutOfRange {
                    allowed: format!("{}..={latest}", Timestamp::RFC3339_MIN),
                },
            ));
        }
        let sequence = match self.sequence {
            None => None,
            Some(s) => Some(Sequence(
                check_range("sequence", s, 0, i128::from(u64::MAX))? as u64,
            )),
        };
        let mut inner = Inner {
            obligation_id,
            kind,
            target,
            payload,
            deadline_seconds,
            max_retries,
            created_at,
            sequence,
            digest: Digest([0; 32]),
        };
        inner.digest = match digest {
            Some(d) => d,
            None => compute_digest(&inner),
        };
        Ok(Obligation(Arc::new(inner)))
    }
}

fn check_range(field: &str, v: i128, lo: i128, hi: i128) -> Result<i128, FieldError> {
    if v < lo || v > hi {
        return Err(FieldError::new(
            field,
            FieldProblem::OutOfRange {
                allowed: format!("{lo}..={hi}"),
            },
        ));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> ObligationBuilder {
        Obligation::builder()
            .id("ob-1")
            .kind("anumati.consent")
            .target("agent-b")
            .payload(json!({"decision": "revoke", "scope": "email.read"}))
            .deadline_seconds(600)
            .max_retries(64)
            .created_at(Timestamp::from_unix_seconds(1_780_000_000))
    }

    // C-T-2: non-positive deadline, negative/absurd retries, oversize payload.
    #[test]
    fn builder_rejects_bad_fields_naming_them() {
        assert_eq!(
            base().deadline_seconds(0).build().unwrap_err().field,
            "deadline_seconds"
        );
        assert_eq!(
            base().deadline_seconds(-5).build().unwrap_err().field,
            "deadline_seconds"
        );
        assert_eq!(
            base().max_retries(-1).build().unwrap_err().field,
            "max_retries"
        );
        assert_eq!(
            base().max_retries(1 << 40).build().unwrap_err().field,
            "max_retries"
        );
        let big = "x".repeat(MAX_PAYLOAD_BYTES);
        let e = base().payload(json!({ "blob": big })).build().unwrap_err();
        assert_eq!(e.field, "payload");
        assert!(matches!(e.problem, FieldProblem::TooLong { .. }));
        // 2^60 + 1 is not a double: no peer could hold it exactly.
        let e = base()
            .payload(json!({ "n": (1u64 << 60) + 1 }))
            .build()
            .unwrap_err();
        assert_eq!(e.field, "payload.n");
        let e = base()
            .payload(json!({ "a": [1, {"b": -9_007_199_254_740_993i64}] }))
            .build()
            .unwrap_err();
        assert_eq!(e.field, "payload.a[1].b");
        assert_eq!(
            base()
                .created_at(Timestamp::from_unix_micros(i64::MAX))
                .build()
                .unwrap_err()
                .field,
            "created_at"
        );
        assert_eq!(base().id("").build().unwrap_err().field, "obligation_id");
        assert_eq!(
            base().payload(json!([1])).build().unwrap_err().field,
            "payload"
        );
    }

    #[test]
    fn digest_depends_on_every_field_and_is_stable() {
        let a = base().build().unwrap();
        let b = base().build().unwrap();
        assert_eq!(a.digest(), b.digest());
        for other in [
            base().id("ob-2"),
            base().kind("oauth.token"),
            base().target("agent-c"),
            base().payload(json!({"decision": "grant", "scope": "email.read"})),
            base().deadline_seconds(601),
            base().max_retries(65),
            base().created_at(Timestamp::from_unix_seconds(1_780_000_001)),
            base().sequence(0),
        ] {
            assert_ne!(other.build().unwrap().digest(), a.digest());
        }
        // The fast digest path equals SHA-256 over JCS of the v1 object.
        let mut s = String::new();
        crate::canonical::write_object(&a.v1_object(), &mut s);
        assert_eq!(a.digest().0, crate::canonical::sha256(s.as_bytes()));
        let c = base().sequence(7).build().unwrap();
        let mut s = String::new();
        crate::canonical::write_object(&c.v1_object(), &mut s);
        assert_eq!(c.digest().0, crate::canonical::sha256(s.as_bytes()));
    }
}
