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

/// Who set an authorization.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionSource {
    /// Issuing or failing-safe an obligation.
    Obligation(ObligationId),
    /// The principal's explicit decision.
    Principal,
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
        match action.effect {
            SafeEffect::FailClosed => self.set_authorization(
                &action.key,
                Authorization::Withheld,
                action.sequence,
                DecisionSource::Obligation(action.obligation_id.clone()),
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
        let seq = sequence.or_else(|| {
            Some(Sequence(
                self.authorizations
                    .get(key)
                    .and_then(|e| e.sequence)
                    .map_or(0, |s| s.0.saturating_add(1)),
            ))
        });
        self.set_authorization(key, state, seq, DecisionSource::Principal)
    }

    /// Records the decision an offered obligation represents (e.g. an
    /// Anumati revocation's immediate withhold).
    pub(crate) fn decide_at_offer(
        &mut self,
        key: &GovernedKey,
        state: Authorization,
        sequence: Option<Sequence>,
        id: &ObligationId,
    ) -> (GuardOutcome, Option<PrincipalWrite>) {
        self.set_authorization(key, state, sequence, DecisionSource::Obligation(id.clone()))
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
                    if cur.source == source && cur.state == state {
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
        }
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
