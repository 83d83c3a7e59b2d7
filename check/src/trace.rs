//! The ground-truth record a run hands to [`crate::check()`].
//!
//! A trace is what a driver *saw happen*, not what the nodes report about
//! themselves: the offers it made, every time a receiver's applier applied,
//! the `applied` ledger records the receivers committed, how custody ended
//! at each custodian, and principal-side state. Everything is keyed by
//! (custodian, obligation id), the AB-3 key. Parts a driver cannot observe
//! are `None` (or empty) and the rules that need them are skipped, never
//! guessed.

use std::collections::BTreeMap;

use abhyasa_core::custody::LedgerOutcome;
use abhyasa_core::{AgentId, DeclineReason, GovernedKey, GuardOutcome, ObligationId};
use abhyasa_core::{Sequence, Timestamp};

/// (custodian, obligation id): the key AB-3 deduplicates on.
pub type Key = (AgentId, ObligationId);

/// An obligation handed to a custodian.
#[derive(Clone, Debug, PartialEq)]
pub struct Offer {
    /// The custodian it was offered to.
    pub custodian: AgentId,
    /// Its id.
    pub id: ObligationId,
    /// Whether the kind's polarity rule declares `safe(O)` for it (AC-1):
    /// it must go under custody; otherwise it must travel best-effort.
    pub admissible: bool,
    /// Its absolute deadline (`created_at + deadline`).
    pub deadline_at: Timestamp,
    /// Its `max_retries` (AB-2 allows `1 + max_retries` transmissions).
    pub max_retries: u64,
    /// Its issuance sequence on its governed key, if set-semantic.
    pub sequence: Option<Sequence>,
}

impl Offer {
    /// The AB-3 key.
    pub fn key(&self) -> Key {
        (self.custodian.clone(), self.id.clone())
    }
}

/// One decision of a receiver's applier to apply (the effect ran).
#[derive(Clone, Debug, PartialEq)]
pub struct AppliedByApplier {
    /// The receiver.
    pub receiver: AgentId,
    /// The authenticated custodian it came from.
    pub custodian: AgentId,
    /// The obligation.
    pub id: ObligationId,
    /// When the applier applied it.
    pub at: Timestamp,
    /// The obligation's absolute deadline.
    pub deadline_at: Timestamp,
}

/// A committed `applied` ledger record (the effect is in the same commit,
/// AB-3).
#[derive(Clone, Debug, PartialEq)]
pub struct Application {
    /// The receiver that committed it.
    pub receiver: AgentId,
    /// The custodian (half of the AB-3 key).
    pub custodian: AgentId,
    /// The obligation.
    pub id: ObligationId,
    /// When it was recorded.
    pub at: Timestamp,
    /// The governed key and the sequence applied on it, if set-semantic.
    pub key_sequence: Option<(GovernedKey, Sequence)>,
}

/// How custody (or a best-effort send) ended at the custodian.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Discharged by an `applied` ack.
    Applied,
    /// Discharged by a `declined` ack.
    Declined(Option<DeclineReason>),
    /// Escalated to the principal.
    Escalated,
    /// Sent once, best-effort, without custody (AC-1: not admissible).
    BestEffort,
}

/// A custodian's terminal event for one obligation.
#[derive(Clone, Debug, PartialEq)]
pub struct Terminal {
    /// The custodian.
    pub custodian: AgentId,
    /// The obligation.
    pub id: ObligationId,
    /// How it ended.
    pub outcome: Outcome,
    /// Obligation transmissions (or attempts the custodian recorded).
    pub attempts: u64,
    /// The guard outcome of the escalation record the custodian emitted
    /// (`None`: it emitted none). AB-4: an escalation carries its
    /// fail-safe.
    pub escalation: Option<GuardOutcome>,
    /// Principal-side writes committed with the close, when observed.
    pub principal_writes: Option<usize>,
}

impl Terminal {
    /// The AB-3 key.
    pub fn key(&self) -> Key {
        (self.custodian.clone(), self.id.clone())
    }
}

/// Principal-side state on an additive key (a Phala weight), read around
/// one obligation: what it was, what it became, and what `safe(O)` makes
/// of `before`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PrincipalProbe {
    /// The weight before the offer.
    pub before: f64,
    /// The weight after custody ended.
    pub after: f64,
    /// The weight `safe(O)` yields from `before`.
    pub if_safe: f64,
}

impl PrincipalProbe {
    /// Whether principal state shows `safe(O)` applied. A fail-safe that
    /// would change nothing (`if_safe == before`) cannot be told from none,
    /// so it does not count.
    pub fn safe_applied(&self) -> bool {
        self.after == self.if_safe && self.if_safe != self.before
    }
}

/// A principal-side authorization write, in commit order.
#[derive(Clone, Debug, PartialEq)]
pub struct PrincipalSequence {
    /// The custodian whose principal state it is.
    pub custodian: AgentId,
    /// The governed key.
    pub key: GovernedKey,
    /// The sequence the write leaves on the key.
    pub sequence: Option<Sequence>,
}

/// A committed write to a receiver's authorization on a governed key (the
/// effect of an `applied` ledger record), in commit order.
#[derive(Clone, Debug, PartialEq)]
pub struct AuthorityWrite {
    /// The receiver that committed it.
    pub receiver: AgentId,
    /// The authenticated peer that issued the obligation.
    pub custodian: AgentId,
    /// The obligation.
    pub id: ObligationId,
    /// The effect key the receiver wrote (its governed key as it holds it).
    pub key: String,
    /// Granted (else withheld).
    pub granted: bool,
}

/// Everything a run saw happen.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    /// Offers made (a key offered twice, e.g. re-offered after a crash,
    /// counts once: the first).
    pub offers: Vec<Offer>,
    /// Every application by a receiver's applier.
    pub applier_applies: Vec<AppliedByApplier>,
    /// Committed `applied` ledger records, in commit order (`None`: the
    /// driver does not see commits).
    pub applications: Option<Vec<Application>>,
    /// The receivers' ledger verdicts at the end (`None`: not observed).
    pub ledger: Option<BTreeMap<Key, LedgerOutcome>>,
    /// Terminal events at the custodians.
    pub terminals: Vec<Terminal>,
    /// Principal-side weights around an obligation, by key.
    pub probes: BTreeMap<Key, PrincipalProbe>,
    /// Principal-side authorization writes, in commit order.
    pub principal_writes: Vec<PrincipalSequence>,
    /// Custody still pending once every deadline (and the grace period)
    /// passed.
    pub pending_at_end: Vec<Key>,
    /// Authorization writes at the receivers, in commit order (empty: not
    /// observed; the C-OR-2 and C-AZ-2 rules then see nothing).
    pub authority_writes: Vec<AuthorityWrite>,
    /// Withholds (revoke, restrict) that were their issuer's latest
    /// decision on their governed key (C-OR-2).
    pub latest_withholds: Vec<Key>,
    /// Every issuer's latest decision on each governed key it issued on,
    /// withholding or widening (C-OR-1).
    pub latest_decisions: Vec<Key>,
    /// Obligations a receiver declined `superseded` (committed ledger
    /// records), with the receiver.
    pub superseded: Vec<(AgentId, Key)>,
}
