//! [`NodeError`]: every way a node API call can fail, typed.
//!
//! Variants are split by who is at fault (STYLE.md §4): the caller
//! (`UnknownObligation`, `UnknownDecisionItem`, `UnknownPeer`,
//! `InvalidOptions`, `Offer`, `Complete`), the environment (`Store`, `Io`,
//! `Stopped`) and the link (`NotSent`, `Backpressure`). Whatever the
//! variant, an error means the call changed nothing it claims to have
//! changed: write-ahead (AB-1, C-ND-2) holds on every error path.

use abhyasa_core::store::StoreError;
use abhyasa_core::{AgentId, ObligationId, OfferError};

/// Errors of the node API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The custodian refused the offer; nothing was accepted.
    #[error(transparent)]
    Offer(#[from] OfferError),
    /// The store failed; the node stops rather than send what is not durable.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The node has stopped.
    #[error("the node has stopped")]
    Stopped,
    /// A deferred obligation or external effect could not be completed.
    #[error(transparent)]
    Complete(#[from] abhyasa_core::custody::CompleteError),
    /// A best-effort obligation's one send was refused by the transport
    /// (peer down, queue full, frame too large): nothing left this node.
    /// It is recorded as best-effort with 0 attempts; offering it again
    /// answers `AlreadyTerminal`.
    #[error("best-effort obligation {obligation_id} was not sent: {reason}")]
    NotSent {
        /// The obligation.
        obligation_id: ObligationId,
        /// Why the transport refused it.
        reason: abhyasa_transport::SendError,
    },
    /// The send queue towards the target is near its byte budget; nothing
    /// was accepted. Offer again once it drains.
    #[error(
        "backpressure: {queued_bytes} bytes queued towards {peer} (limit {limit}); nothing was accepted"
    )]
    Backpressure {
        /// The target.
        peer: AgentId,
        /// Bytes queued or about to be.
        queued_bytes: usize,
        /// The limit the offer would pass.
        limit: usize,
    },
    /// This node has no custody record of the obligation: it never offered
    /// it, or its terminal record was compacted past retention.
    #[error("obligation {0} is not known to this node")]
    UnknownObligation(ObligationId),
    /// No surfaced decline awaits a principal decision under this id
    /// (never surfaced, or already resolved).
    #[error("no decision item awaits a resolution for obligation {0}")]
    UnknownDecisionItem(ObligationId),
    /// The offer's target is not a peer of this node's transport (not
    /// pinned, so no connection to it could ever be authenticated);
    /// nothing was accepted.
    #[error("target {0} is not a known peer of this node (pin it in the transport's peer set)")]
    UnknownPeer(AgentId),
    /// The node was built with options that cannot work; nothing was
    /// opened.
    #[error("invalid option {field}: {reason}")]
    InvalidOptions {
        /// The option, as a path (`receiver.agent`,
        /// `custodian.default_profile.backoff.base`, `store`, ...).
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// I/O.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The offer's sequence is not newer than a lease renewal this node
    /// already sent on the key: the receiver would decline it
    /// `superseded`, so it is refused here instead; nothing was accepted.
    /// Offer it with a sequence above `newest` (or none).
    #[error(
        "sequence {offered} on {key} is not newer than {newest}, the lease renewal this node \
         already sent on the key; offer it with sequence {next} or higher",
        next = newest.0.saturating_add(1)
    )]
    SupersededByRenewal {
        /// The governed key.
        key: abhyasa_core::GovernedKey,
        /// The sequence offered.
        offered: abhyasa_core::Sequence,
        /// The newest renewal's sequence.
        newest: abhyasa_core::Sequence,
    },
}

impl From<abhyasa_core::custody::renewal::SupersededByRenewal> for NodeError {
    fn from(e: abhyasa_core::custody::renewal::SupersededByRenewal) -> Self {
        Self::SupersededByRenewal {
            key: e.key,
            offered: e.offered,
            newest: e.newest,
        }
    }
}

impl From<abhyasa_core::agent::Refused> for NodeError {
    fn from(e: abhyasa_core::agent::Refused) -> Self {
        match e {
            abhyasa_core::agent::Refused::SupersededByRenewal(s) => s.into(),
            abhyasa_core::agent::Refused::Offer(e) => Self::Offer(e),
            // `Refused` may grow; what it carries is shown as is.
            other => Self::invalid("obligation", other.to_string()),
        }
    }
}

impl NodeError {
    /// An [`InvalidOptions`](Self::InvalidOptions) error.
    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidOptions {
            field: field.into(),
            reason: reason.into(),
        }
    }
}
