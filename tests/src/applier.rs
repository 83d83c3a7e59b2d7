//! Bob's scripted applier and the ground truth it records.

use std::sync::{Arc, Mutex};

use abhyasa_check as check;
use abhyasa_core::custody::{Applier, ApplyContext, ApplyDecision, StandardApplier};
use abhyasa_core::{DeclineReason, Obligation};

use crate::common::lock;
use crate::peers::{agent, BOB};

/// The payload field a scenario sets to script bob's answer: `"decline"`
/// (declined `policy`, detail [`DECLINE_DETAIL`]) or `"defer"` (deferred
/// on every delivery). Without it bob applies as the standard applier.
pub const SCRIPT: &str = "conformance";

/// The detail of a scripted decline (the custodian must surface it).
pub const DECLINE_DETAIL: &str = "scripted decline";

/// Bob's applier: the standard one, unless the payload's [`SCRIPT`] field
/// says to decline or to defer. The receiver consults it only for an
/// obligation it has not decided yet, inside its deadline and not
/// superseded: what the receiver guards before asking it (AB-3, C-DL-1,
/// C-SS-2) stays the receiver's.
///
/// Every decision to apply is recorded in [`Applies`] (shared by every
/// incarnation of bob in a world): the ground truth [`World::verify`]
/// hands the invariant checker.
#[derive(Debug, Default)]
pub(crate) struct Scripted(pub(crate) StandardApplier, pub(crate) Applies);

/// Bob's applier's decisions to apply, across his restarts: (custodian,
/// obligation, when, its deadline).
pub(crate) type Applies = Arc<Mutex<Vec<check::AppliedByApplier>>>;

impl Applier for Scripted {
    fn decide(&mut self, ctx: &ApplyContext<'_>, ob: &Obligation) -> ApplyDecision {
        let d = match ob.payload().get(SCRIPT).and_then(|v| v.as_str()) {
            Some("decline") => ApplyDecision::Decline {
                reason: DeclineReason::Policy,
                detail: Some(DECLINE_DETAIL.into()),
            },
            Some("defer") => ApplyDecision::Defer {
                detail: Some("scripted deferral".into()),
            },
            _ => self.0.decide(ctx, ob),
        };
        if matches!(d, ApplyDecision::Apply { .. }) {
            lock(&self.1).push(check::AppliedByApplier {
                receiver: agent(BOB),
                custodian: ctx.custodian.clone(),
                id: ob.id().clone(),
                at: ctx.now,
                deadline_at: ob.deadline_at(),
            });
        }
        d
    }
}
