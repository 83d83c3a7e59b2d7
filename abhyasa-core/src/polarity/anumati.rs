//! Anumati consent: binary polarity, fail-closed.
//!
//! A revocation (or restriction, or a decision left unstated) is
//! admissible: losing it leaves an agent acting on withdrawn authority. A
//! grant is best-effort: losing it is benign. `safe(O)` withholds the scope;
//! the withhold is also applied at offer (custody carries the propagation).

use super::{key, payload_str, Admission, Classification, PolarityRule};
use crate::error::{FieldError, FieldProblem};
use crate::model::{Obligation, SafeAction, SafeEffect};
use crate::principal::Authorization;

/// The rationale of this rule's fail-safe (recorded with an escalation).
pub const ANUMATI_RATIONALE: &str = "Anumati: an unconfirmed consent restriction defaults \
                                    fail-closed: withhold the scope";

/// `anumati.consent`.
pub const ANUMATI_KIND: &str = "anumati.consent";

/// The Anumati rule. Payload: `scope` (required string), `decision`
/// (`revoke` | `restrict` | `grant`; absent means restrictive).
#[derive(Debug, Clone, Copy, Default)]
pub struct AnumatiRule;

impl PolarityRule for AnumatiRule {
    fn kind(&self) -> &str {
        ANUMATI_KIND
    }

    fn classify(&self, ob: &Obligation) -> Result<Classification, FieldError> {
        let restrictive = match payload_str(ob, "decision")? {
            None | Some("revoke") | Some("restrict") => true,
            Some("grant") => false,
            Some(other) => {
                return Err(FieldError::new(
                    "payload.decision",
                    FieldProblem::UnknownValue {
                        value: other.to_string(),
                        expected: "revoke | restrict | grant",
                    },
                ))
            }
        };
        let scope =
            payload_str(ob, "scope")?.ok_or_else(|| FieldError::missing("payload.scope"))?;
        let key = key(ANUMATI_KIND, ob.target(), &["scope:", scope])?;
        Ok(if restrictive {
            Classification {
                admission: Admission::Custody {
                    safe: SafeAction {
                        obligation_id: ob.id().clone(),
                        target: ob.target().clone(),
                        effect: SafeEffect::FailClosed,
                        key: key.clone(),
                        sequence: ob.sequence(),
                        rationale: std::borrow::Cow::Borrowed(ANUMATI_RATIONALE),
                    },
                },
                key: Some(key),
                guarded: true,
                at_offer: Some(Authorization::Withheld),
            }
        } else {
            Classification {
                admission: Admission::BestEffort,
                key: Some(key),
                guarded: true,
                at_offer: Some(Authorization::Granted),
            }
        })
    }
}
