//! Phala belief updates: signed polarity. Corrective (`weight_delta < 0`)
//! is admissible; reinforcing (`>= 0`) is best-effort. `safe(O)` lowers the
//! principal's routing weight toward the target by `abs(delta)`, clipped.

use super::{key, payload_str, Admission, Classification, PolarityRule};
use crate::error::{FieldError, FieldProblem};
use crate::model::{Obligation, SafeAction, SafeEffect};

/// The rationale of this rule's fail-safe (recorded with an escalation).
pub const PHALA_RATIONALE: &str = "Phala: principal-side routing down-weight toward the target \
                                    whose corrective update was not confirmed";

/// `phala.belief_update`.
pub const PHALA_KIND: &str = "phala.belief_update";

/// The Phala rule. Payload: `weight_delta` (required finite number),
/// `weight_key` (optional; default `routing.<target>.preference`, as in v1).
/// Deltas are additive: not sequence-guarded.
#[derive(Debug, Clone, Copy, Default)]
pub struct PhalaRule;

/// Reads and checks `weight_delta`.
pub(crate) fn weight_delta(ob: &Obligation) -> Result<f64, FieldError> {
    match ob.payload().get("weight_delta") {
        None | Some(serde_json::Value::Null) => Err(FieldError::missing("payload.weight_delta")),
        Some(serde_json::Value::Number(n)) => match n.as_f64() {
            Some(d) if d.is_finite() => Ok(d),
            _ => Err(FieldError::new(
                "payload.weight_delta",
                FieldProblem::OutOfRange {
                    allowed: "a finite number".into(),
                },
            )),
        },
        Some(other) => Err(FieldError::wrong_type(
            "payload.weight_delta",
            "number",
            crate::model::obligation_json_type(other),
        )),
    }
}

impl PolarityRule for PhalaRule {
    fn kind(&self) -> &str {
        PHALA_KIND
    }

    fn classify(&self, ob: &Obligation) -> Result<Classification, FieldError> {
        let delta = weight_delta(ob)?;
        // The routing key is `weight_key`, or `routing.<target>.preference`
        // without one.
        let key = match payload_str(ob, "weight_key")? {
            Some(k) => key(PHALA_KIND, ob.target(), &["weight:", k])?,
            None => key(
                PHALA_KIND,
                ob.target(),
                &["weight:", "routing.", ob.target().as_str(), ".preference"],
            )?,
        };
        Ok(if delta < 0.0 {
            Classification {
                admission: Admission::Custody {
                    safe: SafeAction {
                        obligation_id: ob.id().clone(),
                        target: ob.target().clone(),
                        effect: SafeEffect::DownWeight {
                            magnitude: delta.abs(),
                        },
                        key: key.clone(),
                        sequence: ob.sequence(),
                        rationale: std::borrow::Cow::Borrowed(PHALA_RATIONALE),
                    },
                },
                key: Some(key),
                guarded: false,
                at_offer: None,
            }
        } else {
            Classification {
                admission: Admission::BestEffort,
                key: Some(key),
                guarded: false,
                at_offer: None,
            }
        })
    }
}
