//! [`StatusView`]: where one obligation stands on this node, with typed
//! states. Serialised, it is the JSON `abhyasa status --json` prints
//! (`"custodian": "pending"`, `"receiver": [["alice", "applied"]]`).

use abhyasa_core::custody::{LedgerOutcome, TerminalState};
use abhyasa_core::{AgentId, DeclineReason, ObligationId, Timestamp};

/// The custodian side of an obligation: under custody, or how it ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CustodianState {
    /// Under custody: durable, retried until ack, deadline or retry bound.
    Pending,
    /// Applied by the receiver.
    Applied,
    /// Declined by the receiver.
    Declined,
    /// Escalated with the fail-safe applied.
    Escalated,
    /// Sent best-effort (never under custody).
    BestEffort,
}

impl From<TerminalState> for CustodianState {
    fn from(t: TerminalState) -> Self {
        match t {
            TerminalState::Applied => Self::Applied,
            TerminalState::Declined => Self::Declined,
            TerminalState::Escalated => Self::Escalated,
            TerminalState::BestEffort => Self::BestEffort,
        }
    }
}

impl CustodianState {
    /// The terminal state, or `None` while pending.
    pub fn terminal(self) -> Option<TerminalState> {
        match self {
            Self::Pending => None,
            Self::Applied => Some(TerminalState::Applied),
            Self::Declined => Some(TerminalState::Declined),
            Self::Escalated => Some(TerminalState::Escalated),
            Self::BestEffort => Some(TerminalState::BestEffort),
        }
    }
}

/// Where an obligation stands on this node. Everything it says is durable
/// when it is returned (C-ND-2).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StatusView {
    /// The obligation.
    pub obligation_id: ObligationId,
    /// Custodian side, if this node is its custodian.
    pub custodian: Option<CustodianState>,
    /// Attempts so far, or in all once custody ended (when the terminal
    /// summary knows them).
    pub attempts: Option<u32>,
    /// Custodian side deadline (pending only).
    pub deadline_at: Option<Timestamp>,
    /// Receiver side: the ledger outcome per custodian, if this node
    /// received it.
    pub receiver: Vec<(AgentId, LedgerOutcome)>,
    /// Receiver side: why each custodian's delivery was declined (the
    /// reason and the receiver's text, e.g. `unauthorized` with the policy
    /// that refused it), for the entries of `receiver` that are declines.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub declines: Vec<(AgentId, DeclineReason, Option<String>)>,
}

impl StatusView {
    /// True when this node holds no record of the obligation on either side.
    pub fn is_unknown(&self) -> bool {
        self.custodian.is_none() && self.receiver.is_empty()
    }
}
