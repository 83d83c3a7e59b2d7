//! The wire's error codes, and the one mapping from errors to them.
//!
//! `wire` owns its codes. The decoders in `wire` produce [`PeerError`]s,
//! so `wire` depends on `error` and the mapping from a peer error to the
//! code its error frame carries must live here, beside the codes (as
//! rustls keeps its alert mapping in one place): `error` never imports
//! `wire`, so the two modules form no cycle.

use crate::error::PeerError;

/// Typed protocol error codes (the wire's `ErrorCode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorCode {
    /// Not decodable.
    Malformed,
    /// Version not spoken.
    UnsupportedVersion,
    /// Message type not known.
    UnknownMessageType,
    /// Frame larger than the limit.
    FrameTooLarge,
    /// Digest does not match the content.
    DigestMismatch,
    /// The obligation breaks a rule (field error, polarity rule, target).
    InvalidObligation,
    /// The sender is not who it claims, or not allowed.
    Unauthorized,
    /// The receiver is overloaded; retry later.
    Overloaded,
}

impl From<&PeerError> for ErrorCode {
    /// The one mapping from peer errors to wire codes.
    fn from(e: &PeerError) -> Self {
        match e {
            PeerError::Malformed { .. } => Self::Malformed,
            PeerError::FrameTooLarge { .. } => Self::FrameTooLarge,
            PeerError::UnsupportedVersion { .. } => Self::UnsupportedVersion,
            PeerError::UnknownMessageType => Self::UnknownMessageType,
            PeerError::Field(_) => Self::InvalidObligation,
            PeerError::DigestMismatch { .. } => Self::DigestMismatch,
        }
    }
}

impl PeerError {
    /// The wire error code for this error (the one mapping from errors to
    /// wire reasons).
    pub fn code(&self) -> ErrorCode {
        ErrorCode::from(self)
    }
}
