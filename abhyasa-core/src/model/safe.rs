//! `safe(O)` and escalations.

use std::borrow::Cow;
use std::fmt;

use super::{AgentId, Digest, GovernedKey, Kind, ObligationId, Sequence, Timestamp};

/// The principal-side effect a fail-safe applies.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "effect")]
pub enum SafeEffect {
    /// Withhold the governed authority (fail-closed): consent scope, token.
    FailClosed,
    /// Lower the principal's routing weight on the key by `magnitude`,
    /// clipped to the declared floor (Phala corrective).
    DownWeight {
        /// `abs(weight_delta)`.
        magnitude: f64,
    },
}

/// The action AB-4 applies to principal-side state when application of an
/// obligation is not confirmed. A pure function of the obligation.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SafeAction {
    /// The obligation it protects against losing.
    pub obligation_id: ObligationId,
    /// The obligation's target.
    pub target: AgentId,
    /// The effect.
    #[serde(flatten)]
    pub effect: SafeEffect,
    /// The governed key it acts on.
    pub key: GovernedKey,
    /// The obligation's sequence, for the supersession guard.
    pub sequence: Option<Sequence>,
    /// Why, in words (recorded with the escalation). The standard rules
    /// use one static text each (no allocation per transfer);
    /// [`SafeAction::rationale_text`] shares them again when a stored
    /// action is read back.
    pub rationale: Cow<'static, str>,
}

impl SafeAction {
    /// A rationale read back from a store or the wire: one of the
    /// standard rules' texts is shared (a pending transfer then holds no
    /// copy of it), any other text is kept as given.
    pub fn rationale_text(text: String) -> Cow<'static, str> {
        match Self::standard_rationale(&text) {
            Some(r) => Cow::Borrowed(r),
            None => Cow::Owned(text),
        }
    }

    /// [`SafeAction::rationale_text`] of borrowed text: copied only when
    /// it is not one of the standard texts.
    pub fn rationale_of(text: &str) -> Cow<'static, str> {
        match Self::standard_rationale(text) {
            Some(r) => Cow::Borrowed(r),
            None => Cow::Owned(text.to_owned()),
        }
    }

    fn standard_rationale(text: &str) -> Option<&'static str> {
        crate::polarity::STANDARD_RATIONALES
            .iter()
            .find(|r| **r == text)
            .copied()
    }
}

/// What the principal-side supersession guard did with an action.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum GuardOutcome {
    /// The action changed principal state.
    Applied,
    /// The same obligation's effect was already in force (e.g. an Anumati
    /// withhold applied at offer); nothing to change.
    AlreadyInEffect,
    /// A newer decision stands on the key; the action applied nothing.
    Superseded {
        /// The newest sequence on the key.
        newest: Sequence,
    },
}

/// Why custody ended without application.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EscalationCause {
    /// No ack at all: the receiver was unreachable (or every ack was lost).
    Unreachable,
    /// The receiver answered `deferred` but never applied in time.
    ResponsiveButDeferring,
    /// The receiver holds a different obligation under the same id.
    Conflict,
    /// The receiver rejected the obligation as invalid.
    Rejected,
    /// The node's store was damaged and a repair could not prove this
    /// custody (the records after its offer were lost): the fail-safe is
    /// applied rather than custody resumed on what is left.
    StoreDamaged,
}

impl EscalationCause {
    /// Human-readable cause.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Unreachable => "receiver unreachable: no ack within the custody window",
            Self::ResponsiveButDeferring => {
                "receiver responsive but deferring; never applied in time"
            }
            Self::Conflict => {
                "receiver holds a different obligation under this id (digest conflict)"
            }
            Self::Rejected => "receiver rejected the obligation as invalid",
            Self::StoreDamaged => "the store was damaged: a repair could not prove this custody",
        }
    }
}

impl fmt::Display for EscalationCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Unreachable => "unreachable",
            Self::ResponsiveButDeferring => "responsive_but_deferring",
            Self::Conflict => "conflict",
            Self::Rejected => "rejected",
            Self::StoreDamaged => "store_damaged",
        })
    }
}

/// What ended custody.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EscalationTrigger {
    /// The absolute deadline passed.
    Deadline,
    /// `1 + max_retries` attempts were made and the last interval ran out.
    RetriesExhausted,
    /// A protocol error from the receiver made further attempts pointless.
    ProtocolError,
    /// A repair of the node's damaged store handed it over as custody it
    /// could not prove (escalated at the first start after the repair).
    StoreRepair,
}

/// The principal-visible record that custody ended without application;
/// `safe(O)` has been applied (or dropped by the supersession guard, which
/// is recorded in `guard`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Escalation {
    /// Event type, for v1 compatibility.
    #[serde(rename = "type")]
    pub event_type: String,
    /// The obligation.
    pub obligation_id: ObligationId,
    /// Its kind.
    pub kind: Kind,
    /// Its target.
    pub target: AgentId,
    /// Its digest.
    pub digest: Digest,
    /// Attempts made.
    pub attempts: u32,
    /// Why.
    pub cause: EscalationCause,
    /// What ended custody.
    pub trigger: EscalationTrigger,
    /// Human-readable last error (v1 `last_error`).
    pub last_error: String,
    /// The fail-safe.
    pub safe_action: SafeAction,
    /// What the principal-side guard did with it.
    pub guard: GuardOutcome,
    /// When.
    pub escalated_at: Timestamp,
    /// The absolute deadline.
    pub deadline_at: Timestamp,
}

/// v1 escalation event type.
pub(crate) const ESCALATION_EVENT_TYPE: &str = "abhyasa.delivery_failed";
