//! The protocol's data model: identities, obligations, acks, safe actions,
//! escalations and kind profiles.

mod ack;
mod ids;
mod obligation;
mod profile;
mod safe;
mod time;

pub use ack::{AckStatus, CustodyAck, DeclineReason};
pub use ids::{
    AgentId, Digest, GovernedKey, Kind, ObligationId, Sequence, MAX_ID_BYTES, MAX_KEY_BYTES,
};
pub(crate) use obligation::json_type as obligation_json_type;
pub use obligation::{
    payload_number, Obligation, ObligationBuilder, Payload, MAX_DEADLINE_SECONDS,
    MAX_PAYLOAD_BYTES, MAX_RETRIES_LIMIT, PAYLOAD_NUMBERS,
};
pub(crate) use profile::check_sizing;
#[allow(deprecated)]
pub use profile::Backoff;
pub use profile::{min_retries_to_span, DeclinePolicy, KindProfile, RetryBackoff};
pub(crate) use safe::ESCALATION_EVENT_TYPE;
pub use safe::{
    Escalation, EscalationCause, EscalationTrigger, GuardOutcome, SafeAction, SafeEffect,
};
pub use time::Timestamp;
