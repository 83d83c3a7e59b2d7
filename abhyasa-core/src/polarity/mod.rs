//! AC-1: polarity rules decide admissibility and `safe(O)`.
//!
//! The core never reads payload semantics except through a registered
//! [`PolarityRule`]. An unknown kind (and every kind under an empty
//! registry) is not admissible: it travels best-effort.

mod anumati;
mod oauth;
mod phala;

use std::sync::Arc;

pub use anumati::{AnumatiRule, ANUMATI_KIND, ANUMATI_RATIONALE};
pub use oauth::{OAuthRule, OAUTH_KIND, OAUTH_RATIONALE};
pub use phala::{PhalaRule, PHALA_KIND, PHALA_RATIONALE};

/// The fail-safe rationales of the standard rules.
pub const STANDARD_RATIONALES: [&str; 3] = [ANUMATI_RATIONALE, OAUTH_RATIONALE, PHALA_RATIONALE];

use crate::error::{FieldError, FieldProblem};
use crate::model::{AgentId, GovernedKey, Kind, Obligation, SafeAction};
use crate::principal::Authorization;

/// Whether an obligation goes under custody.
#[derive(Clone, Debug, PartialEq)]
pub enum Admission {
    /// Admissible (AC-1): custody, retries, fail-safe, escalation.
    Custody {
        /// `safe(O)`.
        safe: SafeAction,
    },
    /// Not admissible: one attempt, no custody, no fail-safe, no escalation.
    BestEffort,
}

/// The verdict of a polarity rule on one obligation.
#[derive(Clone, Debug, PartialEq)]
pub struct Classification {
    /// Custody or best-effort.
    pub admission: Admission,
    /// The governed key, if the obligation governs one.
    pub key: Option<GovernedKey>,
    /// Set-semantic (last-writer-wins by sequence) rather than additive.
    pub guarded: bool,
    /// The principal-side decision the offer itself represents, applied
    /// when the obligation is offered (e.g. an Anumati revocation's
    /// withhold, a grant's grant). Guarded by sequence like any decision.
    pub at_offer: Option<Authorization>,
}

impl Classification {
    /// Best-effort with no key (unknown kinds).
    pub fn best_effort() -> Self {
        Self {
            admission: Admission::BestEffort,
            key: None,
            guarded: false,
            at_offer: None,
        }
    }

    /// True when admissible.
    pub fn is_admissible(&self) -> bool {
        matches!(self.admission, Admission::Custody { .. })
    }

    /// `safe(O)` when admissible.
    pub fn safe(&self) -> Option<&SafeAction> {
        match &self.admission {
            Admission::Custody { safe } => Some(safe),
            Admission::BestEffort => None,
        }
    }
}

/// A kind's polarity rule. Pure: the same obligation always gets the same
/// classification.
pub trait PolarityRule: Send + Sync + 'static {
    /// The kind it governs.
    fn kind(&self) -> &str;

    /// Classifies one obligation of this kind. A payload the rule cannot
    /// read (missing field, wrong type, unknown enum value) is an error,
    /// never a silent best-effort.
    fn classify(&self, obligation: &Obligation) -> Result<Classification, FieldError>;
}

/// The registry of polarity rules, by kind.
#[derive(Clone, Default)]
pub struct PolarityRegistry {
    rules: crate::Map<String, Arc<dyn PolarityRule>>,
}

impl std::fmt::Debug for PolarityRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut kinds: Vec<&String> = self.rules.keys().collect();
        kinds.sort();
        f.debug_struct("PolarityRegistry")
            .field("kinds", &kinds)
            .finish()
    }
}

impl PolarityRegistry {
    /// An empty registry: admits nothing.
    pub fn empty() -> Self {
        Self::default()
    }

    /// The three standard instantiations: Anumati, Phala, OAuth.
    pub fn standard() -> Self {
        let mut r = Self::empty();
        r.register(AnumatiRule);
        r.register(PhalaRule);
        r.register(OAuthRule);
        r
    }

    /// Registers (or replaces) the rule for its kind.
    pub fn register(&mut self, rule: impl PolarityRule) {
        self.rules.insert(rule.kind().to_string(), Arc::new(rule));
    }

    /// True when a rule is registered for `kind`.
    pub fn knows(&self, kind: &Kind) -> bool {
        self.rules.contains_key(kind.as_str())
    }

    /// The kinds with a rule, sorted.
    pub fn kinds(&self) -> Vec<String> {
        let mut k: Vec<String> = self.rules.keys().cloned().collect();
        k.sort();
        k
    }

    /// Classifies an obligation (AC-1). Unknown kind → best-effort.
    pub fn classify(&self, obligation: &Obligation) -> Result<Classification, FieldError> {
        match self.rules.get(obligation.kind().as_str()) {
            Some(rule) => rule.classify(obligation),
            None => Ok(Classification::best_effort()),
        }
    }
}

/// A governed key `kind/target/name`, namespaced so that different kinds,
/// targets and key types never collide; `name` is the concatenation of
/// its parts (`["weight:", key]`). Built in one buffer: this runs for
/// every obligation a rule classifies.
pub(crate) fn key(kind: &str, target: &AgentId, name: &[&str]) -> Result<GovernedKey, FieldError> {
    let target = target.as_str();
    let len = kind.len() + target.len() + 2 + name.iter().map(|p| p.len()).sum::<usize>();
    let mut s = String::with_capacity(len);
    s.push_str(kind);
    s.push('/');
    s.push_str(target);
    s.push('/');
    for p in name {
        s.push_str(p);
    }
    GovernedKey::new(s)
}

/// Reads an optional string field of the payload.
pub(crate) fn payload_str<'a>(
    ob: &'a Obligation,
    name: &str,
) -> Result<Option<&'a str>, FieldError> {
    match ob.payload().get(name) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => {
            if s.is_empty() {
                Err(FieldError::new(
                    format!("payload.{name}"),
                    FieldProblem::Empty,
                ))
            } else {
                Ok(Some(s))
            }
        }
        Some(other) => Err(FieldError::wrong_type(
            format!("payload.{name}"),
            "string",
            crate::model::obligation_json_type(other),
        )),
    }
}
