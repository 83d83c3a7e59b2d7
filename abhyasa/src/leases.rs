//! Leases as the node reports them (custody plus leases).
//!
//! The receiver stores each leased grant's absolute end with its effect;
//! [`crate::Node::authorized`] and [`crate::Node::leases`] read the
//! authority at the moment of asking, so a partitioned agent that checks
//! before acting stops at lease expiry though no revocation arrives
//! (C-TR-4).
//!
//! As principal, the node renews the leased grants it offered
//! (the `Renewals` scheduler, on the driver's timer loop; shown by
//! [`crate::Node::renewals`]) and warns about leases that outlast the
//! revocation deadline ([`LeaseWarning`], [`crate::Node::lease_warnings`]).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use abhyasa_core::custody::lease::{self, Authority, LEASE_FIELD};
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::principal::{Authorization, PrincipalState};
use abhyasa_core::{AgentId, GovernedKey, Obligation, ObligationId, Sequence, Timestamp};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One governed key that holds (or held) a leased grant.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LeaseView {
    /// The governed key.
    pub key: String,
    /// When the lease ends (the grant's `created_at + lease_seconds`).
    pub lease_until: Timestamp,
    /// True while the grant may be exercised (`now + skew < lease_until`).
    pub authorized: bool,
    /// `granted`, `lapsed` or `withheld`.
    pub state: &'static str,
}

impl LeaseView {
    pub(crate) fn new(key: String, lease_until: Timestamp, authority: Authority) -> Self {
        let state = match authority {
            Authority::Granted { .. } => "granted",
            Authority::Lapsed { .. } => "lapsed",
            Authority::Withheld => "withheld",
            _ => "unknown",
        };
        Self {
            key,
            lease_until,
            authorized: authority.is_authorized(),
            state,
        }
    }
}

/// Why a leased grant drew a warning when it was issued.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "warning")]
#[non_exhaustive]
pub enum LeaseWarningKind {
    /// The lease outlasts the revocation deadline
    /// ([`crate::NodeOptions::revocation_deadline`]): for up to
    /// `term - deadline` after a revocation escalates, a partitioned agent
    /// may still act on the grant (DESIGN §3, custody plus leases).
    TermExceedsRevocationDeadline {
        /// The grant's lease term, in seconds.
        term_seconds: u64,
        /// The revocation deadline, in seconds.
        revocation_deadline_seconds: u64,
    },
    /// The grant carries no sequence, so it is not renewed: a renewal
    /// could not be ordered against a later revocation on the key (the
    /// receiver's supersession guard needs sequences). The lease lapses
    /// at its end unless the principal grants again.
    Unsequenced,
    /// The lease term is not longer than this node's skew margin: a
    /// receiver with the same margin could never exercise it, so it is
    /// not renewed (renewing would be a busy loop of useless grants).
    WithinSkewMargin {
        /// The grant's lease term, in seconds.
        term_seconds: u64,
        /// The skew margin, in milliseconds.
        skew_margin_ms: u64,
    },
}

/// A configuration warning raised when a leased grant was offered: also
/// logged (`tracing` warn) and kept for [`crate::Node::lease_warnings`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LeaseWarning {
    /// The governed key of the grant.
    pub key: GovernedKey,
    /// The grant.
    pub obligation_id: ObligationId,
    /// What is wrong.
    #[serde(flatten)]
    pub kind: LeaseWarningKind,
    /// The message logged.
    pub message: String,
}

/// A lease this node renews as principal, as [`crate::Node::renewals`]
/// shows it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RenewalView {
    /// The governed key.
    pub key: GovernedKey,
    /// The agent holding the lease.
    pub target: AgentId,
    /// The grant the chain started from.
    pub root: ObligationId,
    /// The latest grant or renewal sent on the key.
    pub last: ObligationId,
    /// Its sequence (the next renewal takes the one after).
    pub sequence: Sequence,
    /// The lease term, in seconds.
    pub term_seconds: u64,
    /// Renewals sent so far.
    pub renewals: u64,
    /// When the next renewal is due.
    pub next_at: Timestamp,
}

/// Most warnings kept for [`crate::Node::lease_warnings`] (oldest dropped).
const MAX_WARNINGS: usize = 256;

/// One renewal chain: the principal's standing leased grant on one key.
#[derive(Debug)]
struct Chain {
    /// The latest grant sent (the template of the next renewal).
    last: Obligation,
    root: ObligationId,
    term: Duration,
    renewals: u64,
    next_at: Timestamp,
}

impl Chain {
    fn sequence(&self) -> Sequence {
        // A chain is only started for a sequenced grant, and every
        // renewal is sequenced.
        self.last.sequence().unwrap_or(Sequence(0))
    }
}

/// The principal-side lease renewal scheduler, sans-IO like the
/// core's machines: time comes in as `now`, the jitter from one RNG seeded
/// once (from the custodian's seed), so a seeded run renews on the same
/// schedule every time.
///
/// A principal that offered a sequenced leased grant keeps a chain on the
/// grant's key. At about half the usable term (35–45 %,
/// [`lease::renewal_delay`]) after the latest grant was issued, the chain
/// yields a renewal: the same grant with a fresh id, `created_at = now`
/// (the lease is measured from it) and the next sequence on the key. The
/// driver offers it like any grant, so it is best-effort (its loss is
/// safe: the lease lapses) and write-ahead: the principal's record of the
/// renewal's sequence is durable before the renewal is released to the
/// transport (the `BestEffortSent` record carries it). A renewal is never
/// repeated: a crash before that commit sends nothing, and after a
/// restart the chains are gone (the leases lapse unless the principal
/// grants again), so no sequence is ever sent twice with two contents.
///
/// Renewals go on only while the principal still grants: a chain ends
/// when any other obligation on its key is accepted (a revocation, a
/// restriction, a new grant, which may start its own chain) and, checked
/// before each renewal, when the principal's entry on the key is no
/// longer the chain's latest grant (withheld by a decision or a
/// fail-safe, or superseded by a newer sequence).
pub(crate) struct Renewals {
    chains: HashMap<GovernedKey, Chain>,
    /// (`next_at`, key) of every chain.
    timers: BTreeSet<(Timestamp, GovernedKey)>,
    rng: ChaCha8Rng,
    skew_margin: Duration,
    revocation_deadline: Option<Duration>,
    warnings: VecDeque<LeaseWarning>,
}

/// What the driver should do with an obligation it is about to offer, as
/// far as renewals go.
pub(crate) struct Admitted {
    /// The key the obligation governs, if a chain could care.
    key: Option<GovernedKey>,
    /// The grant's lease term, when it is a leased grant.
    leased: Option<Duration>,
}

impl Admitted {
    /// Nothing to do with renewals.
    pub(crate) fn none() -> Self {
        Self {
            key: None,
            leased: None,
        }
    }

    /// True when [`Renewals::accepted`] must see the obligation.
    pub(crate) fn concerns_renewals(&self) -> bool {
        self.key.is_some()
    }
}

impl Renewals {
    pub(crate) fn new(
        seed: u64,
        skew_margin: Duration,
        revocation_deadline: Option<Duration>,
    ) -> Self {
        Self {
            chains: HashMap::new(),
            timers: BTreeSet::new(),
            // Seeded once: the whole schedule is one reproducible stream.
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x6c65_6173_655f_726e),
            skew_margin,
            revocation_deadline,
            warnings: VecDeque::new(),
        }
    }

    /// Whether [`Renewals::admit`] could find `ob` concerns a renewal
    /// chain: not while no chain is open and `ob` carries no lease. (The
    /// common case, answered without classifying `ob`.)
    pub(crate) fn may_concern(&self, ob: &Obligation) -> bool {
        !self.chains.is_empty() || ob.payload().get(LEASE_FIELD).is_some()
    }

    /// Looks at an obligation before it is offered. Refuses one that
    /// would arrive behind a renewal this node already sent: a sequenced
    /// obligation on a key with a live chain whose sequence is not newer
    /// than the chain's (the receiver would decline it `superseded`, and a
    /// revocation must never be lost to our own renewals). An unsequenced
    /// obligation, or one with a newer sequence, passes.
    pub(crate) fn admit(
        &self,
        registry: &PolarityRegistry,
        ob: &Obligation,
    ) -> Result<Admitted, crate::NodeError> {
        if !self.may_concern(ob) {
            // The common path: no classification beyond the custodian's.
            return Ok(Admitted::none());
        }
        let Ok(class) = registry.classify(ob) else {
            // The custodian refuses it with the typed error.
            return Ok(Admitted::none());
        };
        let key = class.key.filter(|_| class.guarded);
        if let (Some(k), Some(s)) = (&key, ob.sequence()) {
            if let Some(c) = self.chains.get(k) {
                if s <= c.sequence() && !self.is_chain_member(c, ob) {
                    return Err(crate::NodeError::SupersededByRenewal {
                        key: k.clone(),
                        offered: s,
                        newest: c.sequence(),
                    });
                }
            }
        }
        let leased = if class.at_offer == Some(Authorization::Granted) {
            lease::lease_term(ob).ok().flatten()
        } else {
            None
        };
        Ok(Admitted { key, leased })
    }

    /// The chain's own grant, offered again by the caller (idempotent).
    fn is_chain_member(&self, c: &Chain, ob: &Obligation) -> bool {
        ob.id() == &c.root || ob.id() == c.last.id()
    }

    /// An obligation was accepted (newly, custody or best-effort): the
    /// chain on its key ends, and a sequenced leased grant the principal
    /// now holds starts one.
    pub(crate) fn accepted(
        &mut self,
        admitted: Admitted,
        ob: &Obligation,
        principal: &PrincipalState,
    ) {
        let Some(key) = admitted.key else {
            return;
        };
        // The custodian gave an unsequenced offer the next sequence on its
        // key (C-OR-1): the chain follows the obligation as issued.
        let issued;
        let ob = match (ob.sequence(), principal.issued(&key)) {
            (None, Some((s, by))) if by == ob.id() => {
                issued = ob.with_sequence(Some(*s));
                &issued
            }
            _ => ob,
        };
        if admitted.leased.is_none() {
            self.warn_revocation(&key, ob);
        }
        self.stop(&key);
        let Some(term) = admitted.leased else {
            return;
        };
        if let Some(deadline) = self.revocation_deadline {
            self.warn_term_exceeds(&key, ob, term, deadline);
        }
        if ob.sequence().is_none() {
            self.warn(LeaseWarning {
                key: key.clone(),
                obligation_id: ob.id().clone(),
                kind: LeaseWarningKind::Unsequenced,
                message: format!(
                    "leased grant {} on {key} has no sequence: it is not renewed (a renewal \
                     could not be ordered against a later revocation); give it a sequence",
                    ob.id()
                ),
            });
            return;
        }
        if term <= self.skew_margin {
            self.warn(LeaseWarning {
                key: key.clone(),
                obligation_id: ob.id().clone(),
                kind: LeaseWarningKind::WithinSkewMargin {
                    term_seconds: term.as_secs(),
                    skew_margin_ms: u64::try_from(self.skew_margin.as_millis()).unwrap_or(u64::MAX),
                },
                message: format!(
                    "leased grant {} on {key}: a lease of {} s is not longer than the skew \
                     margin of {} ms, so it is never exercisable and is not renewed",
                    ob.id(),
                    term.as_secs(),
                    self.skew_margin.as_millis()
                ),
            });
            return;
        }
        if !still_grants(principal, &key, ob) {
            // Superseded at offer: the principal does not hold this grant.
            return;
        }
        let next_at = self.next_at(ob.created_at(), term);
        self.timers.insert((next_at, key.clone()));
        self.chains.insert(
            key,
            Chain {
                last: ob.clone(),
                root: ob.id().clone(),
                term,
                renewals: 0,
                next_at,
            },
        );
    }

    /// A revocation (any non-grant) on a key this node leased: its own
    /// deadline is the revocation deadline that matters, and a lease that
    /// outlasts it leaves the partitioned agent acting after the
    /// revocation escalates.
    fn warn_revocation(&mut self, key: &GovernedKey, ob: &Obligation) {
        let Some(term) = self.chains.get(key).map(|c| c.term) else {
            return;
        };
        let deadline = Duration::from_secs(ob.deadline_seconds());
        self.warn_term_exceeds(key, ob, term, deadline);
    }

    /// Warns when a lease of `term` outlasts the revocation `deadline`
    /// (`lease::lease_warning`): the window where a partitioned agent acts.
    fn warn_term_exceeds(
        &mut self,
        key: &GovernedKey,
        ob: &Obligation,
        term: Duration,
        deadline: Duration,
    ) {
        if let Some(message) = lease::lease_warning(term, deadline) {
            self.warn(LeaseWarning {
                key: key.clone(),
                obligation_id: ob.id().clone(),
                kind: LeaseWarningKind::TermExceedsRevocationDeadline {
                    term_seconds: term.as_secs(),
                    revocation_deadline_seconds: deadline.as_secs(),
                },
                message,
            });
        }
    }

    fn warn(&mut self, w: LeaseWarning) {
        tracing::warn!(key = %w.key, id = %w.obligation_id, "{}", w.message);
        if self.warnings.len() >= MAX_WARNINGS {
            self.warnings.pop_front();
        }
        self.warnings.push_back(w);
    }

    fn next_at(&mut self, issued: Timestamp, term: Duration) -> Timestamp {
        let u: f64 = self.rng.random();
        // A floor of a twentieth of the term: a usable term barely above
        // the skew margin must not turn into a busy loop of renewals.
        let delay = lease::renewal_delay(term, self.skew_margin, u).max(term / 20);
        issued.saturating_add(delay)
    }

    /// Ends the chain on `key`, if any.
    fn stop(&mut self, key: &GovernedKey) {
        if let Some(c) = self.chains.remove(key) {
            self.timers.remove(&(c.next_at, key.clone()));
            tracing::debug!(%key, renewals = c.renewals, "lease renewals stopped");
        }
    }

    /// When [`Renewals::poll_renewals`] has work.
    #[must_use]
    pub(crate) fn poll_timeout(&self) -> Option<Timestamp> {
        self.timers.first().map(|(at, _)| *at)
    }

    /// The renewals due at `now`, each built as the next grant of its
    /// chain. A chain whose grant the principal no longer holds ends
    /// here instead. The driver offers each one and reports it with
    /// [`Renewals::renewed`] (or [`Renewals::skipped`]).
    #[must_use]
    pub(crate) fn poll_renewals(
        &mut self,
        now: Timestamp,
        principal: &PrincipalState,
    ) -> Vec<(GovernedKey, Obligation)> {
        let mut due = Vec::new();
        while let Some((at, key)) = self.timers.first().cloned() {
            if at > now {
                break;
            }
            self.timers.remove(&(at, key.clone()));
            let Some(c) = self.chains.get(&key) else {
                continue;
            };
            if !still_grants(principal, &key, &c.last) {
                self.chains.remove(&key);
                tracing::debug!(%key, "principal no longer grants: lease renewals stopped");
                continue;
            }
            match renewal_of(c, now, principal.next_sequence(&key)) {
                Ok(ob) => due.push((key, ob)),
                Err(e) => {
                    tracing::warn!(%key, error = %e, "lease renewal could not be built; renewals stopped");
                    self.chains.remove(&key);
                }
            }
        }
        due
    }

    /// A renewal was accepted and will be sent (after its record
    /// commits): it is the chain's latest grant from now on.
    pub(crate) fn renewed(&mut self, key: GovernedKey, renewal: Obligation) {
        let Some(term) = self.chains.get(&key).map(|c| c.term) else {
            return;
        };
        let next_at = self.next_at(renewal.created_at(), term);
        if let Some(c) = self.chains.get_mut(&key) {
            c.last = renewal;
            c.renewals += 1;
            c.next_at = next_at;
            self.timers.insert((next_at, key));
        }
    }

    /// A renewal could not be offered now (back-pressure): try again a
    /// renewal interval later; the lease may lapse meanwhile, which is
    /// safe. Any other refusal ends the chain.
    pub(crate) fn skipped(&mut self, now: Timestamp, key: GovernedKey, retry: bool) {
        if !retry {
            self.stop(&key);
            return;
        }
        let Some(term) = self.chains.get(&key).map(|c| c.term) else {
            return;
        };
        let next_at = self.next_at(now, term);
        if let Some(c) = self.chains.get_mut(&key) {
            c.next_at = next_at;
            self.timers.insert((next_at, key));
        }
    }

    /// The live chains, in key order.
    pub(crate) fn views(&self) -> Vec<RenewalView> {
        let mut v: Vec<RenewalView> = self
            .chains
            .iter()
            .map(|(k, c)| RenewalView {
                key: k.clone(),
                target: c.last.target().clone(),
                root: c.root.clone(),
                last: c.last.id().clone(),
                sequence: c.sequence(),
                term_seconds: c.term.as_secs(),
                renewals: c.renewals,
                next_at: c.next_at,
            })
            .collect();
        v.sort_by(|a, b| a.key.as_str().cmp(b.key.as_str()));
        v
    }

    /// The warnings raised so far (the newest [`MAX_WARNINGS`]).
    pub(crate) fn warnings(&self) -> Vec<LeaseWarning> {
        self.warnings.iter().cloned().collect()
    }
}

/// True while the principal's entry on `key` is `ob`'s grant: granted, at
/// `ob`'s sequence, set by `ob` (not withheld since, not superseded).
fn still_grants(principal: &PrincipalState, key: &GovernedKey, ob: &Obligation) -> bool {
    principal.authorization(key).is_some_and(|e| {
        e.state == Authorization::Granted
            && e.sequence == ob.sequence()
            && e.source.obligation_id() == Some(ob.id())
    })
}

/// The next grant of chain `c`, issued at `now`: same kind, target,
/// payload (lease term included), deadline and retries; a fresh id; `next`,
/// the next sequence this node issues on the key (its durable counter,
/// C-OR-1), never below the chain's own next.
fn renewal_of(
    c: &Chain,
    now: Timestamp,
    next: Sequence,
) -> Result<Obligation, abhyasa_core::FieldError> {
    let last = &c.last;
    let seq = c.sequence().0.checked_add(1).ok_or_else(|| {
        abhyasa_core::FieldError::invalid("sequence", "the key's sequences are exhausted")
    })?;
    let seq = seq.max(next.0);
    Obligation::builder()
        .id(format!("{}~renewal-{}", c.root, c.renewals + 1))
        .kind(last.kind().as_str())
        .target(last.target().as_str())
        .payload(serde_json::Value::Object(last.payload().as_map().clone()))
        .deadline_seconds(i64::try_from(last.deadline_seconds()).unwrap_or(i64::MAX))
        .max_retries(i64::from(last.max_retries()))
        .created_at(now)
        .sequence(seq)
        .build()
}
