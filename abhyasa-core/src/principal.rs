//! Principal-side state: where fail-safes take effect.
//!
//! The custodian owns this state, so `safe(O)` completes without any remote
//! cooperation. Set-semantic state (authorizations) is last-writer-wins per
//! governed key by sequence: a fail-safe or decision whose sequence is not
//! newer than the newest applied on its key applies nothing. Additive state
//! (routing weights) is unguarded but clipped to a declared range.

use std::collections::{BTreeMap, HashMap};

use crate::model::{
    AgentId, DeclineReason, GovernedKey, GuardOutcome, Kind, ObligationId, SafeAction, SafeEffect,
    Sequence, Timestamp,
};

/// A governed authority's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Authorization {
    /// Authority granted.
    Granted,
    /// Authority withheld (fail-closed).
    Withheld,
}

/// Who set an authorization, and (for entries written by this version)
/// when and why.
///
/// Variants are only ever appended: stores encode this enum by variant
/// index, so entries written before `When`-carrying variants existed
/// still read back (as the first two).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionSource {
    /// Issuing or failing-safe an obligation (written by older versions:
    /// no time, no cause).
    Obligation(ObligationId),
    /// The principal's explicit decision (written by older versions: no
    /// time).
    Principal,
    /// The principal's explicit decision, taken at `at`.
    PrincipalAt {
        /// When it was taken.
        at: Timestamp,
    },
    /// An obligation's action on the key: its issue or its fail-safe.
    ObligationAt {
        /// The obligation.
        obligation_id: ObligationId,
        /// Why it changed the key.
        cause: ChangeCause,
        /// When.
        at: Timestamp,
    },
}

/// Why an obligation changed an authorization.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeCause {
    /// Issued: the decision the obligation carries, applied at offer
    /// (an Anumati revocation's immediate withhold).
    Issued,
    /// Fail-safe on escalation (AB-4).
    FailSafeEscalation,
    /// Fail-safe on decline (default policy, or the principal's
    /// resolution of a surfaced decline).
    FailSafeDecline,
}

impl DecisionSource {
    /// The obligation behind the change, if any (the principal's own
    /// decisions have none).
    pub fn obligation_id(&self) -> Option<&ObligationId> {
        match self {
            Self::Obligation(id)
            | Self::ObligationAt {
                obligation_id: id, ..
            } => Some(id),
            Self::Principal | Self::PrincipalAt { .. } => None,
        }
    }

    /// When the change was made (unknown for entries of older versions).
    pub fn at(&self) -> Option<Timestamp> {
        match self {
            Self::PrincipalAt { at } | Self::ObligationAt { at, .. } => Some(*at),
            Self::Obligation(_) | Self::Principal => None,
        }
    }

    /// Why, as one word: `decision`, `issued`, `fail_safe_escalation`,
    /// `fail_safe_decline`, or `obligation` (an older entry that did not
    /// record whether it was the issue or a fail-safe).
    pub fn why(&self) -> &'static str {
        match self {
            Self::Principal | Self::PrincipalAt { .. } => "decision",
            Self::Obligation(_) => "obligation",
            Self::ObligationAt { cause, .. } => match cause {
                ChangeCause::Issued => "issued",
                ChangeCause::FailSafeEscalation => "fail_safe_escalation",
                ChangeCause::FailSafeDecline => "fail_safe_decline",
            },
        }
    }

    /// Same origin (the same obligation, or both the principal): the guard
    /// treats a repeat from the same origin as already in effect.
    fn same_origin(&self, other: &Self) -> bool {
        self.obligation_id() == other.obligation_id()
    }
}

/// The state of one governed key.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AuthorizationEntry {
    /// Granted or withheld.
    pub state: Authorization,
    /// The newest sequence applied on the key.
    pub sequence: Option<Sequence>,
    /// Who set it.
    pub source: DecisionSource,
}

/// The declared clip range of routing weights.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WeightRange {
    /// Lowest weight (fail-safes never push below it).
    pub floor: f64,
    /// Highest weight.
    pub ceiling: f64,
    /// Weight of a key never touched.
    pub initial: f64,
}

impl Default for WeightRange {
    fn default() -> Self {
        Self {
            floor: 0.0,
            ceiling: 1.0,
            initial: 1.0,
        }
    }
}

impl WeightRange {
    /// Clips a weight into the range.
    pub fn clip(&self, w: f64) -> f64 {
        w.clamp(self.floor, self.ceiling)
    }
}

/// A durable change to principal state. Values are absolute, so replaying
/// a write twice yields the same state.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "write")]
pub enum PrincipalWrite {
    /// Set an authorization entry.
    Authorization {
        /// The key.
        key: GovernedKey,
        /// The new entry.
        entry: AuthorizationEntry,
    },
    /// Set a routing weight.
    Weight {
        /// The key.
        key: GovernedKey,
        /// The new weight.
        value: f64,
    },
    /// Raise a decision-required item.
    DecisionRaised(DecisionItem),
    /// Close a decision-required item.
    DecisionClosed {
        /// The obligation whose decline it was.
        obligation_id: ObligationId,
    },
    /// The newest sequence this node issued on a governed key (C-OR-1):
    /// committed with the offer that carries it, so the next one is
    /// greater across restarts and compaction.
    Issued {
        /// The key (issuer-less: this node is its issuer).
        key: GovernedKey,
        /// The sequence.
        sequence: Sequence,
        /// The obligation that carries it.
        obligation_id: ObligationId,
    },
}

/// A surfaced decline awaiting the principal's decision.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DecisionItem {
    /// The declined obligation.
    pub obligation_id: ObligationId,
    /// Its kind.
    pub kind: Kind,
    /// Its target.
    pub target: AgentId,
    /// The receiver's reason.
    pub reason: DeclineReason,
    /// The receiver's free text.
    pub detail: Option<String>,
    /// The fail-safe the principal may choose to apply.
    pub safe_action: SafeAction,
    /// When the decline arrived.
    pub raised_at: Timestamp,
}

/// How the principal resolves a decision-required item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resolution {
    /// Apply `safe(O)` (guarded).
    ApplySafe,
    /// Accept the decline without a fail-safe.
    Dismiss,
}

/// Principal-side state.
#[derive(Clone, Debug, Default)]
pub struct PrincipalState {
    range: WeightRange,
    authorizations: HashMap<GovernedKey, AuthorizationEntry>,
    weights: HashMap<GovernedKey, f64>,
    decisions: BTreeMap<ObligationId, DecisionItem>,
    /// The newest sequence issued per key, with its obligation (C-OR-1).
    issued: HashMap<GovernedKey, (Sequence, ObligationId)>,
}

impl PrincipalState {
    /// Empty state with a weight range.
    pub fn new(range: WeightRange) -> Self {
        Self {
            range,
            ..Self::default()
        }
    }

    /// The weight range.
    pub fn weight_range(&self) -> WeightRange {
        self.range
    }

    /// Applies `safe(O)` through the guard. Returns what the guard did and
    /// the write to make durable, if any.
    pub fn apply_safe(&mut self, action: &SafeAction) -> (GuardOutcome, Option<PrincipalWrite>) {
        self.apply_safe_from(
            action,
            DecisionSource::Obligation(action.obligation_id.clone()),
        )
    }

    /// [`apply_safe`](Self::apply_safe), recording why and when on the
    /// key's entry (shown by `abhyasa authorizations`).
    pub fn apply_safe_at(
        &mut self,
        action: &SafeAction,
        cause: ChangeCause,
        at: Timestamp,
    ) -> (GuardOutcome, Option<PrincipalWrite>) {
        let source = DecisionSource::ObligationAt {
            obligation_id: action.obligation_id.clone(),
            cause,
            at,
        };
        self.apply_safe_from(action, source)
    }

    fn apply_safe_from(
        &mut self,
        action: &SafeAction,
        source: DecisionSource,
    ) -> (GuardOutcome, Option<PrincipalWrite>) {
        match action.effect {
            SafeEffect::FailClosed => self.set_authorization(
                &action.key,
                Authorization::Withheld,
                action.sequence,
                source,
            ),
            SafeEffect::DownWeight { magnitude } => {
                // Additive: unguarded, clipped to the declared floor.
                let current = self.weight(&action.key);
                let value = self.range.clip(current - magnitude.abs());
                let w = PrincipalWrite::Weight {
                    key: action.key.clone(),
                    value,
                };
                self.apply_write(&w);
                (GuardOutcome::Applied, Some(w))
            }
        }
    }

    /// The principal's own decision on a key. Without a sequence, it is
    /// newest by definition: it takes the next sequence on the key.
    pub fn decide(
        &mut self,
        key: &GovernedKey,
        state: Authorization,
        sequence: Option<Sequence>,
    ) -> (GuardOutcome, Option<PrincipalWrite>) {
        self.decide_from(key, state, sequence, DecisionSource::Principal)
    }

    /// [`decide`](Self::decide), recording when on the key's entry.
    pub fn decide_at(
        &mut self,
        key: &GovernedKey,
        state: Authorization,
        sequence: Option<Sequence>,
        at: Timestamp,
    ) -> (GuardOutcome, Option<PrincipalWrite>) {
        self.decide_from(key, state, sequence, DecisionSource::PrincipalAt { at })
    }

    fn decide_from(
        &mut self,
        key: &GovernedKey,
        state: Authorization,
        sequence: Option<Sequence>,
        source: DecisionSource,
    ) -> (GuardOutcome, Option<PrincipalWrite>) {
        let seq = sequence.or_else(|| {
            Some(Sequence(
                self.authorizations
                    .get(key)
                    .and_then(|e| e.sequence)
                    .map_or(0, |s| s.0.saturating_add(1)),
            ))
        });
        self.set_authorization(key, state, seq, source)
    }

    /// Records the decision an offered obligation represents (e.g. an
    /// Anumati revocation's immediate withhold).
    pub(crate) fn decide_at_offer(
        &mut self,
        key: &GovernedKey,
        state: Authorization,
        sequence: Option<Sequence>,
        id: &ObligationId,
        at: Timestamp,
    ) -> (GuardOutcome, Option<PrincipalWrite>) {
        let source = DecisionSource::ObligationAt {
            obligation_id: id.clone(),
            cause: ChangeCause::Issued,
            at,
        };
        self.set_authorization(key, state, sequence, source)
    }

    fn set_authorization(
        &mut self,
        key: &GovernedKey,
        state: Authorization,
        sequence: Option<Sequence>,
        source: DecisionSource,
    ) -> (GuardOutcome, Option<PrincipalWrite>) {
        let current = self.authorizations.get(key);
        if let (Some(s), Some(cur)) = (sequence, current) {
            if let Some(newest) = cur.sequence {
                if s <= newest {
                    // Supersession guard: not newer than the newest applied.
                    if cur.source.same_origin(&source) && cur.state == state {
                        return (GuardOutcome::AlreadyInEffect, None);
                    }
                    return (GuardOutcome::Superseded { newest }, None);
                }
            }
        }
        if sequence.is_none() {
            if let Some(cur) = current {
                if cur.state == state {
                    return (GuardOutcome::AlreadyInEffect, None);
                }
            }
        }
        let entry = AuthorizationEntry {
            state,
            // An unsequenced action keeps the key's newest sequence.
            sequence: sequence.or_else(|| current.and_then(|c| c.sequence)),
            source,
        };
        let w = PrincipalWrite::Authorization {
            key: key.clone(),
            entry,
        };
        self.apply_write(&w);
        (GuardOutcome::Applied, Some(w))
    }

    /// Applies a durable write (also used when recovering from a store).
    pub fn apply_write(&mut self, w: &PrincipalWrite) {
        match w {
            PrincipalWrite::Authorization { key, entry } => {
                self.authorizations.insert(key.clone(), entry.clone());
            }
            PrincipalWrite::Weight { key, value } => {
                self.weights.insert(key.clone(), *value);
            }
            PrincipalWrite::DecisionRaised(item) => {
                self.decisions
                    .insert(item.obligation_id.clone(), item.clone());
            }
            PrincipalWrite::DecisionClosed { obligation_id } => {
                self.decisions.remove(obligation_id);
            }
            PrincipalWrite::Issued {
                key,
                sequence,
                obligation_id,
            } => {
                self.issued
                    .insert(key.clone(), (*sequence, obligation_id.clone()));
            }
        }
    }

    /// The sequence the next obligation this node issues on `key` gets:
    /// one above the newest issued or decided on it (1 on a fresh key).
    pub fn next_sequence(&self, key: &GovernedKey) -> Sequence {
        let issued = self.issued.get(key).map(|e| e.0);
        let decided = self.authorizations.get(key).and_then(|e| e.sequence);
        Sequence(issued.max(decided).map_or(1, |s| s.0.saturating_add(1)))
    }

    /// The newest sequence issued on `key`, with the obligation carrying it.
    pub fn issued(&self, key: &GovernedKey) -> Option<&(Sequence, ObligationId)> {
        self.issued.get(key)
    }

    /// Every key's newest issued sequence.
    pub fn issued_sequences(
        &self,
    ) -> impl Iterator<Item = (&GovernedKey, &(Sequence, ObligationId))> {
        self.issued.iter()
    }

    /// Records that `id` carries `sequence` on `key`; the write to commit
    /// with the offer, unless a sequence as new was already issued there.
    pub(crate) fn record_issued(
        &mut self,
        key: &GovernedKey,
        sequence: Sequence,
        id: &ObligationId,
    ) -> Option<PrincipalWrite> {
        if self.issued.get(key).is_some_and(|(s, _)| *s >= sequence) {
            return None;
        }
        let w = PrincipalWrite::Issued {
            key: key.clone(),
            sequence,
            obligation_id: id.clone(),
        };
        self.apply_write(&w);
        Some(w)
    }

    /// The entry of a key, if any decision was ever applied on it.
    pub fn authorization(&self, key: &GovernedKey) -> Option<&AuthorizationEntry> {
        self.authorizations.get(key)
    }

    /// True unless the key is withheld.
    pub fn is_authorized(&self, key: &GovernedKey) -> bool {
        self.authorizations
            .get(key)
            .is_none_or(|e| e.state == Authorization::Granted)
    }

    /// The routing weight of a key.
    pub fn weight(&self, key: &GovernedKey) -> f64 {
        self.weights.get(key).copied().unwrap_or(self.range.initial)
    }

    /// Open decision-required items.
    pub fn decisions(&self) -> impl Iterator<Item = &DecisionItem> {
        self.decisions.values()
    }

    /// One decision-required item.
    pub fn decision(&self, id: &ObligationId) -> Option<&DecisionItem> {
        self.decisions.get(id)
    }

    /// All authorization entries.
    pub fn authorizations(&self) -> impl Iterator<Item = (&GovernedKey, &AuthorizationEntry)> {
        self.authorizations.iter()
    }

    /// All weights that differ from the initial weight.
    pub fn weights(&self) -> impl Iterator<Item = (&GovernedKey, f64)> {
        self.weights.iter().map(|(k, v)| (k, *v))
    }
}
