//! Custody: the custodian and receiver state machines, their durable
//! records and the write-ahead gate between records and transmits.

mod applier;
mod custodian;
pub mod lease;
mod outbox;
mod receiver;
mod record;
pub mod renewal;
mod transmit;

pub use applier::{
    Applier, ApplyContext, ApplyDecision, ApplyRequest, ApplyTicket, StandardApplier,
};
pub use custodian::{
    AckBinding, AckDisposition, Custodian, CustodianConfig, CustodianEvent, CustodianStats,
    CustodyProfile, IgnoredAck, Offered, STATUS_QUERY_MAX_IDS,
};
pub use outbox::{CommitToken, RecordBatch};
pub use receiver::{
    AuthorityPolicy, CompleteError, ExternalOutcome, PeerPolicy, Received, Receiver,
    ReceiverConfig, ReceiverEvent,
};
pub use record::{
    ClosedRecord, CustodianSnapshot, CustodyOutcome, DeclineDisposition, EffectValue, EffectWrite,
    ExternalIntent, IntentRecord, LedgerOutcome, LedgerRecord, PendingRecord, ReceiverSnapshot,
    Reconciliation, Record, TerminalState, TerminalSummary,
};
pub use transmit::Transmit;
