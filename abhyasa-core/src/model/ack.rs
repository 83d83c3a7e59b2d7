//! Custody acknowledgments: they attest *application*, not receipt.

use std::fmt;

use super::{AgentId, Digest, ObligationId, Timestamp};
use crate::error::{FieldError, FieldProblem};

/// The receiver's answer about one obligation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AckStatus {
    /// Applied (or recognized as already applied). Discharges custody.
    Applied,
    /// Accountably refused. Discharges delivery, not protection.
    Declined,
    /// Received, not yet applied. Custody continues unchanged.
    Deferred,
}

impl AckStatus {
    /// The v1 JSON spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Declined => "declined",
            Self::Deferred => "deferred",
        }
    }

    /// Parses the v1 JSON spelling (exact, case-sensitive).
    pub fn parse(field: &str, s: &str) -> Result<Self, FieldError> {
        match s {
            "applied" => Ok(Self::Applied),
            "declined" => Ok(Self::Declined),
            "deferred" => Ok(Self::Deferred),
            _ => Err(FieldError::new(
                field,
                FieldProblem::UnknownValue {
                    value: s.to_string(),
                    expected: "applied | declined | deferred",
                },
            )),
        }
    }
}

impl fmt::Display for AckStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a receiver declined.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeclineReason {
    /// The receiver's own policy refused it.
    Policy,
    /// Past its deadline (minus the receiver's skew margin): never applied late.
    Expired,
    /// A newer sequence on the same governed key was already applied.
    Superseded,
    /// The receiver does not handle this kind.
    UnsupportedKind,
    /// The same obligation id arrived with a different content digest. Not a
    /// discharge: the custodian escalates with cause `conflict`.
    Conflict,
    /// The authenticated peer may not issue this kind on this governed key
    /// (the receiver's per-peer authority policy; a relay governs nothing).
    /// Never applied; the custodian treats it as any other decline.
    Unauthorized,
}

impl DeclineReason {
    /// The JSON spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Policy => "policy",
            Self::Expired => "expired",
            Self::Superseded => "superseded",
            Self::UnsupportedKind => "unsupported_kind",
            Self::Conflict => "conflict",
            Self::Unauthorized => "unauthorized",
        }
    }

    /// Parses the JSON spelling.
    pub fn parse(field: &str, s: &str) -> Result<Self, FieldError> {
        match s {
            "policy" => Ok(Self::Policy),
            "expired" => Ok(Self::Expired),
            "superseded" => Ok(Self::Superseded),
            "unsupported_kind" => Ok(Self::UnsupportedKind),
            "conflict" => Ok(Self::Conflict),
            "unauthorized" => Ok(Self::Unauthorized),
            _ => Err(FieldError::new(
                field,
                FieldProblem::UnknownValue {
                    value: s.to_string(),
                    expected:
                        "policy | expired | superseded | unsupported_kind | conflict | unauthorized",
                },
            )),
        }
    }
}

impl fmt::Display for DeclineReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A custody acknowledgment for one obligation.
///
/// v1 fields: `obligation_id, target, status, acked_at`. Our optional
/// additions, which a v1 reader ignores: `digest` (binds the ack to the
/// content it attests), `reason` and `detail` (declines, deferrals) and
/// `receiver_instance`.
#[derive(Clone, Debug, PartialEq)]
pub struct CustodyAck {
    /// The obligation this ack is about.
    pub obligation_id: ObligationId,
    /// The agent that produced the ack (the receiver).
    pub target: AgentId,
    /// Applied, declined or deferred.
    pub status: AckStatus,
    /// When the ack was produced (receiver's clock).
    pub acked_at: Timestamp,
    /// Digest of the obligation the ack attests.
    pub digest: Option<Digest>,
    /// Typed decline reason (only with `declined`).
    pub reason: Option<DeclineReason>,
    /// Free text (decline or deferral detail).
    pub detail: Option<String>,
    /// Receiver process incarnation, for diagnostics.
    pub receiver_instance: Option<String>,
}

impl CustodyAck {
    /// An ack with the given status and no reason.
    pub fn new(
        obligation_id: ObligationId,
        target: AgentId,
        status: AckStatus,
        acked_at: Timestamp,
        digest: Option<Digest>,
    ) -> Self {
        Self {
            obligation_id,
            target,
            status,
            acked_at,
            digest,
            reason: None,
            detail: None,
            receiver_instance: None,
        }
    }

    /// A decline with a reason.
    pub fn declined(
        obligation_id: ObligationId,
        target: AgentId,
        acked_at: Timestamp,
        digest: Option<Digest>,
        reason: DeclineReason,
        detail: Option<String>,
    ) -> Self {
        Self {
            reason: Some(reason),
            detail,
            ..Self::new(obligation_id, target, AckStatus::Declined, acked_at, digest)
        }
    }

    /// Checks cross-field rules: a `reason` only with `declined`; and that
    /// `acked_at` is an instant RFC 3339 can write.
    pub fn validate(&self) -> Result<(), FieldError> {
        // The peer picks `acked_at` (raw microseconds in protobuf, or an
        // offset that moves it out of years 0000..=9999 in JSON). A late
        // ack keeps it in a reconciliation row, written as RFC 3339: an
        // instant outside that range would be accepted here and then make
        // the row, and the store, unreadable (C-T-6).
        if self.acked_at < Timestamp::RFC3339_MIN || self.acked_at > Timestamp::RFC3339_MAX {
            return Err(FieldError::new(
                "acked_at",
                FieldProblem::OutOfRange {
                    allowed: format!("{}..={}", Timestamp::RFC3339_MIN, Timestamp::RFC3339_MAX),
                },
            ));
        }
        if self.reason.is_some() && self.status != AckStatus::Declined {
            return Err(FieldError::invalid(
                "reason",
                format!(
                    "a decline reason is only valid with status declined, not {}",
                    self.status
                ),
            ));
        }
        if let Some(d) = &self.detail {
            if d.len() > 4096 {
                return Err(FieldError::new(
                    "detail",
                    FieldProblem::TooLong { max: 4096 },
                ));
            }
        }
        Ok(())
    }
}
