//! The wire's error codes.

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
