//! The embedding agent's side of application.

use std::collections::BTreeMap;

use super::lease;
use super::record::{EffectValue, EffectWrite, ExternalIntent};
use crate::model::{AgentId, DeclineReason, GovernedKey, Obligation, Timestamp};
use crate::polarity::{ANUMATI_KIND, OAUTH_KIND, PHALA_KIND};
use crate::principal::{Authorization, WeightRange};

/// What the receiver knows when it asks the applier.
#[derive(Debug)]
pub struct ApplyContext<'a> {
    /// Now.
    pub now: Timestamp,
    /// The authenticated custodian.
    pub custodian: &'a AgentId,
    /// The governed key, if the kind's rule names one.
    pub key: Option<&'a GovernedKey>,
    /// Receiver-owned effect state, as committed plus this batch.
    pub effects: &'a BTreeMap<String, EffectValue>,
    /// True when the obligation was deferred before and is asked again.
    pub previously_deferred: bool,
}

/// The applier's verdict.
#[derive(Clone, Debug, PartialEq)]
pub enum ApplyDecision {
    /// Apply: these writes to receiver-owned state are committed in the
    /// same record as the ledger entry (AB-3).
    Apply(Vec<EffectWrite>),
    /// Accountably refuse.
    Decline {
        /// Typed reason.
        reason: DeclineReason,
        /// Free text.
        detail: Option<String>,
    },
    /// Not yet: received, will decide later.
    Defer {
        /// Free text.
        detail: Option<String>,
    },
    /// An effect outside receiver-owned state: record this intent durably,
    /// then execute it (dual-write boundary).
    External(ExternalIntent),
}

/// Decides what applying an obligation means for this agent. Must not
/// perform external side effects itself: it returns the effect to commit,
/// or an [`ExternalIntent`] to run after the intent is durable.
pub trait Applier {
    /// Decides one obligation.
    fn decide(&mut self, ctx: &ApplyContext<'_>, obligation: &Obligation) -> ApplyDecision;
}

impl<F> Applier for F
where
    F: FnMut(&ApplyContext<'_>, &Obligation) -> ApplyDecision,
{
    fn decide(&mut self, ctx: &ApplyContext<'_>, obligation: &Obligation) -> ApplyDecision {
        self(ctx, obligation)
    }
}

/// Applies the three standard kinds to receiver-owned state: Anumati and
/// OAuth set the key's authorization; Phala adds the delta to the belief
/// weight, clipped. Other kinds are declined `unsupported_kind`.
#[derive(Debug, Clone, Default)]
pub struct StandardApplier {
    /// Clip range of belief weights.
    pub weights: WeightRange,
}

impl Applier for StandardApplier {
    fn decide(&mut self, ctx: &ApplyContext<'_>, ob: &Obligation) -> ApplyDecision {
        let Some(key) = ctx.key else {
            return ApplyDecision::Decline {
                reason: DeclineReason::UnsupportedKind,
                detail: Some(format!("no applier for kind {}", ob.kind())),
            };
        };
        let restrictive = |field: &str, grant_words: &[&str]| {
            let v = ob.payload().get(field).and_then(|v| v.as_str());
            !v.is_some_and(|s| grant_words.contains(&s))
        };
        match ob.kind().as_str() {
            ANUMATI_KIND | OAUTH_KIND => {
                let withhold = if ob.kind().as_str() == ANUMATI_KIND {
                    restrictive("decision", &["grant"])
                } else {
                    restrictive("action", &["issue", "refresh"])
                };
                // Leases: a grant stores its absolute lease end with the
                // effect; a withhold (or an unleased grant) ends a lease
                // the key held, in the same record (AB-3).
                let until = if withhold {
                    None
                } else {
                    match lease::lease_until(ob) {
                        Ok(u) => u,
                        Err(e) => {
                            return ApplyDecision::Decline {
                                reason: DeclineReason::Policy,
                                detail: Some(e.to_string()),
                            }
                        }
                    }
                };
                let mut writes = vec![EffectWrite {
                    key: key.to_string(),
                    value: EffectValue::Authorization(if withhold {
                        Authorization::Withheld
                    } else {
                        Authorization::Granted
                    }),
                }];
                let lkey = lease::lease_key(key.as_str());
                let leased = ctx
                    .effects
                    .get(&lkey)
                    .is_some_and(|v| lease::decode_lease(v).is_some());
                if until.is_some() || leased {
                    writes.push(EffectWrite {
                        key: lkey,
                        value: lease::encode_lease(until),
                    });
                }
                ApplyDecision::Apply(writes)
            }
            PHALA_KIND => {
                let delta = ob
                    .payload()
                    .get("weight_delta")
                    .and_then(serde_json::Value::as_f64)
                    .unwrap_or(0.0);
                let current = match ctx.effects.get(key.as_str()) {
                    Some(EffectValue::Weight(w)) => *w,
                    _ => self.weights.initial,
                };
                ApplyDecision::Apply(vec![EffectWrite {
                    key: key.to_string(),
                    value: EffectValue::Weight(self.weights.clip(current + delta)),
                }])
            }
            other => ApplyDecision::Decline {
                reason: DeclineReason::UnsupportedKind,
                detail: Some(format!("no applier for kind {other}")),
            },
        }
    }
}

/// Names one outstanding apply request of a [`super::Receiver`]; the
/// decision for it comes back through [`super::Receiver::decide`].
///
/// Tickets are unique within one receiver instance. A ticket that no
/// longer names an outstanding request (decided, expired, cancelled, or
/// from before a restart) is refused with a typed error, never applied to
/// another obligation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ApplyTicket(pub(crate) u64);

impl ApplyTicket {
    /// The ticket's number (for logs and maps).
    pub fn get(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for ApplyTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "apply#{}", self.0)
    }
}

/// The receiver asks the embedding agent to decide one obligation
/// (str0m style: the machine emits the question, the agent's answer comes
/// back as an input). Owned, so the agent may answer from another task.
#[derive(Clone, Debug, PartialEq)]
pub struct ApplyRequest {
    /// Answer with this ticket.
    pub ticket: ApplyTicket,
    /// The authenticated custodian.
    pub custodian: AgentId,
    /// The obligation to decide.
    pub obligation: Obligation,
    /// The governed key, if the kind's rule names one.
    pub key: Option<GovernedKey>,
    /// When the receiver asked.
    pub asked_at: Timestamp,
    /// True when the obligation was deferred before and is asked again.
    pub previously_deferred: bool,
    /// Receiver-owned effect state of the governed key (and of its lease,
    /// [`super::lease::lease_key`]) when asked; absent entries hold nothing
    /// yet. If the key changes
    /// before the decision returns, an `Apply` computed from this value is
    /// stale and the receiver asks again (AB-3: one atomic effect, never a
    /// lost update on an additive key).
    pub effects: BTreeMap<String, EffectValue>,
}

impl ApplyRequest {
    /// The request as the context a synchronous [`Applier`] reads.
    pub fn context(&self) -> ApplyContext<'_> {
        ApplyContext {
            now: self.asked_at,
            custodian: &self.custodian,
            key: self.key.as_ref(),
            effects: &self.effects,
            previously_deferred: self.previously_deferred,
        }
    }

    /// Answers the request at once with a synchronous applier (the
    /// convenience that keeps simulators and model checks synchronous).
    pub fn answer_with(&self, applier: &mut dyn Applier) -> ApplyDecision {
        applier.decide(&self.context(), &self.obligation)
    }
}
