//! Errors, split by who is at fault.
//!
//! * [`FieldError`] — one field of an obligation, ack or profile is wrong;
//!   shared by the caller-facing builders and the peer-facing decoders, and
//!   always names the field.
//! * [`PeerError`] — bytes from the network are bad (malformed frame,
//!   oversize, unknown version or message type, wrong digest). Every variant
//!   maps to one wire code in [`PeerError::code`], which the wire defines
//!   beside its codes (`wire/code.rs`), so this module imports nothing
//!   from the wire.
//! * [`OfferError`] — the embedding application asked the custodian for
//!   something it cannot do (caller misuse or backpressure).
//!
//! Storage and I/O errors live with the stores and transports.

use std::fmt;

use crate::model::Digest;

/// What is wrong with a field.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum FieldProblem {
    /// A required field is absent (or `null`).
    Missing,
    /// The JSON type is not the one the schema requires.
    WrongType {
        /// The type the schema requires.
        expected: &'static str,
        /// The type that was found.
        found: &'static str,
    },
    /// An identifier or string is empty.
    Empty,
    /// An identifier has leading or trailing white space.
    Padded,
    /// A string is longer than the limit (bytes).
    TooLong {
        /// The limit in bytes.
        max: usize,
    },
    /// A string contains a control character.
    ControlCharacter,
    /// A number is outside the allowed range.
    OutOfRange {
        /// The allowed range, in words.
        allowed: String,
    },
    /// A string is not one of the allowed values.
    UnknownValue {
        /// The value that was found.
        value: String,
        /// The allowed values, in words.
        expected: &'static str,
    },
    /// Any other rule of the field is broken.
    Invalid(String),
}

/// One field is wrong; names the field and the problem.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("field `{field}`: {problem}")]
pub struct FieldError {
    /// Dotted path of the field, e.g. `payload.weight_delta`.
    pub field: String,
    /// What is wrong with it.
    pub problem: FieldProblem,
}

impl FieldError {
    /// Builds a field error.
    pub fn new(field: impl Into<String>, problem: FieldProblem) -> Self {
        Self {
            field: field.into(),
            problem,
        }
    }

    /// Shorthand for a missing required field.
    pub fn missing(field: impl Into<String>) -> Self {
        Self::new(field, FieldProblem::Missing)
    }

    /// Shorthand for a wrong JSON type.
    pub fn wrong_type(
        field: impl Into<String>,
        expected: &'static str,
        found: &'static str,
    ) -> Self {
        Self::new(field, FieldProblem::WrongType { expected, found })
    }

    /// Shorthand for an invalid value.
    pub fn invalid(field: impl Into<String>, why: impl Into<String>) -> Self {
        Self::new(field, FieldProblem::Invalid(why.into()))
    }

    /// Prefixes the field path (`payload` + `scope` → `payload.scope`).
    pub fn within(mut self, parent: &str) -> Self {
        self.field = format!("{parent}.{}", self.field);
        self
    }
}

impl fmt::Display for FieldProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing => write!(f, "required field is missing"),
            Self::WrongType { expected, found } => write!(f, "expected {expected}, found {found}"),
            Self::Empty => write!(f, "must not be empty"),
            Self::Padded => write!(f, "must not have leading or trailing white space"),
            Self::TooLong { max } => write!(f, "longer than {max} bytes"),
            Self::ControlCharacter => write!(f, "contains a control character"),
            Self::OutOfRange { allowed } => write!(f, "out of range (allowed: {allowed})"),
            Self::UnknownValue { value, expected } => {
                write!(f, "unknown value {value:?} (expected {expected})")
            }
            Self::Invalid(why) => write!(f, "{why}"),
        }
    }
}

/// Bad input from a peer. Nothing that was already accepted is affected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PeerError {
    /// The bytes are not valid JSON or protobuf.
    #[error("malformed {format}: {detail}")]
    Malformed {
        /// `json` or `protobuf`.
        format: &'static str,
        /// Decoder message.
        detail: String,
    },
    /// A frame or document is larger than the limit.
    #[error("frame of {size} bytes exceeds the limit of {max} bytes")]
    FrameTooLarge {
        /// Declared or actual size.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// The protocol version is not one this implementation speaks.
    #[error("unsupported protocol version {found} (this node speaks version {supported})")]
    UnsupportedVersion {
        /// Version found in the message.
        found: u32,
        /// The version we speak.
        supported: u32,
    },
    /// The message type is unknown (e.g. from a newer peer).
    #[error("unknown message type")]
    UnknownMessageType,
    /// A field is invalid.
    #[error("invalid message: {0}")]
    Field(#[from] FieldError),
    /// The digest the peer sent does not match the content.
    #[error("digest mismatch: message claims {claimed}, content hashes to {computed}")]
    DigestMismatch {
        /// Digest carried in the message.
        claimed: Digest,
        /// Digest computed over the content.
        computed: Digest,
    },
}

/// The custodian refused an offer. Nothing was half-accepted: no record,
/// no transmit, no principal-side change.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum OfferError {
    /// The obligation's payload breaks its kind's rule (AC-1 cannot be
    /// decided).
    #[error("obligation rejected by its polarity rule: {0}")]
    Invalid(#[from] FieldError),
    /// `max_retries` is too small for the capped backoff to span the
    /// deadline (AB-2 sizing rule).
    #[error(transparent)]
    IncoherentProfile(#[from] ProfileError),
    /// The id is already under custody or terminal with a different
    /// content digest; the existing record is never overwritten.
    #[error("obligation id {id} already used with digest {existing}; refusing content with digest {offered}")]
    IdConflict {
        /// The id.
        id: String,
        /// Digest of the existing record.
        existing: Digest,
        /// Digest of the refused offer.
        offered: Digest,
    },
    /// The obligation's absolute deadline has already passed.
    #[error("obligation {id} expired at {deadline_at} before it was offered")]
    Expired {
        /// The id.
        id: String,
        /// `created_at + deadline_seconds`.
        deadline_at: crate::model::Timestamp,
    },
    /// The configured bound on pending obligations is reached.
    #[error("backpressure: {pending} obligations pending, limit is {limit}; retry later")]
    Backpressure {
        /// Pending now.
        pending: usize,
        /// The configured bound.
        limit: usize,
    },
    /// The obligation targets this custodian itself.
    #[error("obligation {id} targets this agent itself")]
    SelfTarget {
        /// The id.
        id: String,
    },
}

/// A custody profile is incoherent.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ProfileError {
    /// The retry bound cannot span the deadline (AB-2 sizing rule).
    #[error(
        "max_retries={max_retries} too small for deadline_seconds={deadline_seconds} with \
         backoff base {base_seconds}s and cap {cap_seconds}s: the capped schedule needs \
         {minimum} retries to span the deadline (AB-2); set max_retries >= {minimum}"
    )]
    RetriesTooFew {
        /// Configured retries.
        max_retries: u64,
        /// The minimum that spans the deadline.
        minimum: u64,
        /// Deadline.
        deadline_seconds: u64,
        /// Backoff base.
        base_seconds: f64,
        /// Backoff cap.
        cap_seconds: f64,
    },
    /// A field of the profile is invalid.
    #[error("invalid kind profile: {0}")]
    Field(#[from] FieldError),
}
