//! Ground truth: what the simulator saw happen, independent of what the
//! nodes report. The receiver's applier is wrapped ([`RecordingApplier`])
//! so every decision to apply is logged with its simulated time; every
//! store is wrapped ([`RecordingStore`]) so every committed record is
//! logged; the UDP adapter and the transport's incoming queue count
//! datagrams and frames. All of it outlives crashes of the hosts.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use abhyasa_core::custody::{
    Applier, ApplyContext, ApplyDecision, CustodyOutcome, EffectValue, LedgerOutcome, Record,
    StandardApplier,
};
use abhyasa_core::principal::Authorization;
use abhyasa_core::store::{
    Committed, Compacted, DurableState, EventId, SimStore, Store, StoreError, StoredEvent,
};
use abhyasa_core::{
    AgentId, DeclineReason, GovernedKey, GuardOutcome, Obligation, ObligationId, Sequence,
    Timestamp,
};

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One decision of a receiver's applier.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Decision {
    pub(crate) receiver: AgentId,
    pub(crate) custodian: AgentId,
    pub(crate) id: ObligationId,
    pub(crate) at: Timestamp,
    pub(crate) deadline_at: Timestamp,
    pub(crate) verdict: Verdict,
}

/// What the applier said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Apply,
    Decline,
    Defer,
}

/// A committed `applied` ledger record (the effect is in it, AB-3).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Application {
    pub(crate) receiver: AgentId,
    pub(crate) custodian: AgentId,
    pub(crate) id: ObligationId,
    pub(crate) at: Timestamp,
    pub(crate) deadline_at: Timestamp,
    pub(crate) key_sequence: Option<(GovernedKey, Sequence)>,
}

/// A committed custody close.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Close {
    pub(crate) custodian: AgentId,
    pub(crate) id: ObligationId,
    pub(crate) state: CloseState,
    pub(crate) attempts: u32,
    pub(crate) closed_at: Timestamp,
    /// The escalation's guard outcome (escalations only).
    pub(crate) guard: Option<GuardOutcome>,
    /// Whether the close carried an escalation record.
    pub(crate) has_escalation: bool,
    /// Principal-side writes committed with the close.
    pub(crate) principal_writes: usize,
}

/// How custody closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CloseState {
    Applied,
    Declined(Option<DeclineReason>),
    Escalated,
}

/// Counters of delivered frames by message type.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FrameCount {
    pub(crate) frames: u64,
    pub(crate) bytes: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Inner {
    pub(crate) decisions: Vec<Decision>,
    pub(crate) applications: Vec<Application>,
    /// Custody opened (committed), by custodian: the obligation.
    pub(crate) opened: Vec<(AgentId, Obligation)>,
    /// Best-effort sends committed, by custodian.
    pub(crate) best_effort: Vec<(AgentId, ObligationId)>,
    pub(crate) closes: Vec<Close>,
    pub(crate) late_acks: u64,
    /// Principal writes in commit order: (custodian, key, sequence).
    pub(crate) principal: Vec<(AgentId, GovernedKey, Option<Sequence>)>,
    /// Offers refused by the custodian (e.g. re-offered past the deadline after a crash).
    pub(crate) offers_refused: u64,
    pub(crate) datagrams: BTreeMap<String, FrameCount>,
    pub(crate) datagrams_dropped: u64,
    /// Frames delivered to a node, by message type.
    pub(crate) frames: BTreeMap<&'static str, FrameCount>,
    pub(crate) crashes: u64,
    pub(crate) restarts: u64,
    /// Starts of each host's software (1 + restarts).
    pub(crate) incarnations: BTreeMap<String, u64>,
    /// Most frames the relay's spool held at once (sampled).
    pub(crate) relay_spool_peak: u64,
    /// Most frames it held at once for custodians (acks, replies).
    pub(crate) relay_back_peak: u64,
    /// Authorization writes the receivers committed, in commit order
    /// (C-OR-2, C-AZ-2).
    pub(crate) authority_writes: Vec<abhyasa_check::AuthorityWrite>,
    /// Withholds that are their issuer's latest decision on their key in
    /// the workload.
    pub(crate) latest_withholds: Vec<(AgentId, ObligationId)>,
    /// Every issuer's latest decision on each of its keys in the workload.
    pub(crate) latest_decisions: Vec<(AgentId, ObligationId)>,
    /// Committed `superseded` declines: (receiver, (custodian, id)).
    pub(crate) superseded: Vec<(AgentId, (AgentId, ObligationId))>,
    /// What the hostile transport did.
    pub(crate) hostile: HostileCounts,
}

/// What the hostile transport did to the frames it carried.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct HostileCounts {
    /// Frames (or copies) held back.
    pub(crate) held: u64,
    /// Frames delivered twice.
    pub(crate) duplicated: u64,
    /// Earlier frames replayed.
    pub(crate) replayed: u64,
}

/// Shared ground truth. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub(crate) struct Truth(pub(crate) Arc<Mutex<Inner>>);

impl Truth {
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        f(&mut lock(&self.0))
    }

    pub(crate) fn count_datagram(&self, host: &str, len: usize) {
        self.with(|t| {
            let c = t.datagrams.entry(host.to_string()).or_default();
            c.frames += 1;
            c.bytes += len as u64;
        });
    }

    pub(crate) fn count_dropped(&self, _host: &str) {
        self.with(|t| t.datagrams_dropped += 1);
    }

    pub(crate) fn count_frame(&self, kind: &'static str, len: usize) {
        self.with(|t| {
            let c = t.frames.entry(kind).or_default();
            c.frames += 1;
            c.bytes += len as u64;
        });
    }

    fn on_commit(&self, agent: &AgentId, batches: &[&[Record]]) {
        let mut t = lock(&self.0);
        for r in batches.iter().flat_map(|b| b.iter()) {
            match r {
                Record::CustodyOpened { pending, principal } => {
                    t.opened.push((agent.clone(), pending.obligation.clone()));
                    note_principal(&mut t, agent, principal);
                }
                Record::BestEffortSent { summary, principal } => {
                    t.best_effort
                        .push((agent.clone(), summary.obligation_id.clone()));
                    note_principal(&mut t, agent, principal);
                }
                Record::CustodyClosed(c) => {
                    let state = match &c.outcome {
                        CustodyOutcome::Applied => CloseState::Applied,
                        CustodyOutcome::Declined { reason, .. } => CloseState::Declined(*reason),
                        CustodyOutcome::Escalated => CloseState::Escalated,
                    };
                    t.closes.push(Close {
                        custodian: agent.clone(),
                        id: c.obligation_id.clone(),
                        state,
                        attempts: c.attempts,
                        closed_at: c.closed_at,
                        guard: c.escalation.as_ref().map(|e| e.guard),
                        has_escalation: c.escalation.is_some(),
                        principal_writes: c.principal.len(),
                    });
                    note_principal(&mut t, agent, &c.principal);
                }
                Record::Principal { writes, .. } => note_principal(&mut t, agent, writes),
                Record::LateAck(_) => t.late_acks += 1,
                Record::Ledger(l)
                    if l.outcome == LedgerOutcome::Declined
                        && l.reason == Some(DeclineReason::Superseded) =>
                {
                    t.superseded.push((
                        agent.clone(),
                        (l.custodian.clone(), l.obligation_id.clone()),
                    ));
                }
                Record::Ledger(l) if l.outcome == LedgerOutcome::Applied => {
                    for w in &l.effect {
                        if let EffectValue::Authorization(a) = &w.value {
                            t.authority_writes.push(abhyasa_check::AuthorityWrite {
                                receiver: agent.clone(),
                                custodian: l.custodian.clone(),
                                id: l.obligation_id.clone(),
                                key: w.key.clone(),
                                granted: *a == Authorization::Granted,
                            });
                        }
                    }
                    t.applications.push(Application {
                        receiver: agent.clone(),
                        custodian: l.custodian.clone(),
                        id: l.obligation_id.clone(),
                        at: l.recorded_at,
                        deadline_at: l.deadline_at,
                        key_sequence: l.key_sequence.clone(),
                    });
                }
                _ => {}
            }
        }
    }
}

fn note_principal(
    t: &mut Inner,
    agent: &AgentId,
    writes: &[abhyasa_core::principal::PrincipalWrite],
) {
    for w in writes {
        if let abhyasa_core::principal::PrincipalWrite::Authorization { key, entry } = w {
            t.principal
                .push((agent.clone(), key.clone(), entry.sequence));
        }
    }
}

/// A host's simulated disk: one [`SimStore`] for the whole run (a crash
/// of the host keeps what was committed), whose commits are logged.
#[derive(Debug, Clone)]
pub(crate) struct RecordingStore {
    pub(crate) disk: Arc<Mutex<SimStore>>,
    pub(crate) agent: AgentId,
    pub(crate) truth: Truth,
}

impl Store for RecordingStore {
    fn backend(&self) -> &'static str {
        "sim"
    }
    fn format_version(&self) -> u32 {
        lock(&self.disk).format_version()
    }
    fn commit(&mut self, now: Timestamp, batches: &[&[Record]]) -> Result<Committed, StoreError> {
        let r = lock(&self.disk).commit(now, batches)?;
        self.truth.on_commit(&self.agent, batches);
        Ok(r)
    }
    fn load(&self) -> Result<DurableState, StoreError> {
        lock(&self.disk).load()
    }
    fn events(&self, from: EventId, limit: usize) -> Result<Vec<StoredEvent>, StoreError> {
        lock(&self.disk).events(from, limit)
    }
    fn compact(&mut self, now: Timestamp, retention: Duration) -> Result<Compacted, StoreError> {
        lock(&self.disk).compact(now, retention)
    }
}

/// A receiver's applier: draws apply / decline / defer per obligation
/// from the run seed (so a redelivery gets the same verdict), completes a
/// deferral on the first redelivery after `defer_for`, applies through the
/// standard applier, and logs every verdict.
pub(crate) struct RecordingApplier {
    pub(crate) agent: AgentId,
    pub(crate) seed: u64,
    pub(crate) apply: f64,
    pub(crate) decline: f64,
    pub(crate) defer_for: Duration,
    pub(crate) first_deferred: BTreeMap<(AgentId, ObligationId), Timestamp>,
    pub(crate) inner: StandardApplier,
    pub(crate) truth: Truth,
}

/// A uniform draw in [0, 1) keyed on the seed and a label (splitmix64).
pub(crate) fn draw(seed: u64, label: &str) -> f64 {
    let mut h = seed ^ 0x9E37_79B9_7F4A_7C15;
    for b in label.bytes() {
        h = splitmix(h ^ u64::from(b));
    }
    (splitmix(h) >> 11) as f64 / (1u64 << 53) as f64
}

pub(crate) fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Applier for RecordingApplier {
    fn decide(&mut self, ctx: &ApplyContext<'_>, ob: &Obligation) -> ApplyDecision {
        let label = format!("{}/{}/{}", self.agent, ctx.custodian, ob.id());
        let u = draw(self.seed, &label);
        let final_verdict = if draw(self.seed, &format!("{label}/final"))
            * (self.apply + self.decline)
            < self.apply
        {
            Verdict::Apply
        } else {
            Verdict::Decline
        };
        let k = (ctx.custodian.clone(), ob.id().clone());
        let verdict = if u < self.apply {
            Verdict::Apply
        } else if u < self.apply + self.decline {
            Verdict::Decline
        } else {
            // Defer, then decide once `defer_for` has passed.
            let since = *self.first_deferred.entry(k).or_insert(ctx.now);
            if ctx.now.saturating_duration_since(since) >= self.defer_for
                && self.apply + self.decline > 0.0
            {
                final_verdict
            } else {
                Verdict::Defer
            }
        };
        let decision = match verdict {
            Verdict::Apply => self.inner.decide(ctx, ob),
            Verdict::Decline => ApplyDecision::Decline {
                reason: DeclineReason::Policy,
                detail: Some("scenario receiver policy".into()),
            },
            Verdict::Defer => ApplyDecision::Defer {
                detail: Some("scenario receiver deferring".into()),
            },
        };
        let logged = match &decision {
            ApplyDecision::Apply(_) => Verdict::Apply,
            ApplyDecision::Defer { .. } => Verdict::Defer,
            _ => Verdict::Decline,
        };
        self.truth.with(|t| {
            t.decisions.push(Decision {
                receiver: self.agent.clone(),
                custodian: ctx.custodian.clone(),
                id: ob.id().clone(),
                at: ctx.now,
                deadline_at: ob.deadline_at(),
                verdict: logged,
            })
        });
        decision
    }
}
