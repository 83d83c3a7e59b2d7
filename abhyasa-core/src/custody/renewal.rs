//! Lease renewals: the principal's side of custody plus leases
//! (DESIGN §3).
//!
//! A principal that offered a sequenced leased grant renews it before it
//! lapses: [`Renewals`] decides which offers start, end or conflict with a
//! renewal chain (the admission rule), when each renewal is due (the
//! jitter, from the core's seeded SplitMix64 stream) and what it carries.
//! It warns about leases that outlast the revocation that would end them
//! ([`LeaseWarning`]). Sans-IO like the custodian: time comes in as `now`,
//! and the embedding offers each renewal to the custodian itself.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use super::lease::{self, LEASE_FIELD};
use crate::model::{AgentId, GovernedKey, Obligation, ObligationId, Sequence, Timestamp};
use crate::polarity::PolarityRegistry;
use crate::principal::{Authorization, PrincipalState};
use crate::splitmix::SplitMix64;
use crate::FieldError;

/// Why a leased grant drew a warning when it was issued.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "warning")]
#[non_exhaustive]
pub enum LeaseWarningKind {
    /// The lease outlasts the revocation deadline
    /// (the principal's configured revocation deadline): for up to
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

/// A configuration warning raised when a leased grant was offered: kept
/// (the newest [`MAX_WARNINGS`], [`Renewals::warnings`]) and handed once to
/// the embedding to log ([`Renewals::poll_warning`]).
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

/// A lease this node renews as principal, as [`Renewals::views`] shows it.
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

/// Most warnings kept for [`Renewals::warnings`] (oldest dropped).
pub const MAX_WARNINGS: usize = 256;

/// An offer refused because its sequence is not newer than a lease renewal
/// this node already sent on the key: the receiver would decline it
/// `superseded` (and a revocation must never be lost to our own renewals),
/// so nothing is accepted. Offer it with a sequence above `newest` (or
/// none).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "sequence {offered} on {key} is not newer than {newest}, the lease renewal this node \
     already sent on the key; offer it with sequence {next} or higher",
    next = newest.0.saturating_add(1)
)]
pub struct SupersededByRenewal {
    /// The governed key.
    pub key: GovernedKey,
    /// The sequence offered.
    pub offered: Sequence,
    /// The newest renewal's sequence.
    pub newest: Sequence,
}

/// One renewal chain: the principal's standing leased grant on one key.
#[derive(Clone, Debug)]
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

/// The principal-side lease renewal scheduler: time comes in as `now`,
/// the jitter from one SplitMix64 stream seeded once (from the custodian's
/// seed), so a seeded run renews on the same schedule every time.
///
/// A principal that offered a sequenced leased grant keeps a chain on the
/// grant's key. At about half the usable term (35–45 %,
/// [`lease::renewal_delay`]) after the latest grant was issued, the chain
/// yields a renewal: the same grant with a fresh id, `created_at = now`
/// (the lease is measured from it) and the next sequence on the key. The
/// embedding offers it like any grant, so it is best-effort (its loss is
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
#[derive(Clone, Debug)]
pub struct Renewals {
    chains: HashMap<GovernedKey, Chain>,
    /// (`next_at`, key) of every chain.
    timers: BTreeSet<(Timestamp, GovernedKey)>,
    rng: SplitMix64,
    skew_margin: Duration,
    revocation_deadline: Option<Duration>,
    warnings: VecDeque<LeaseWarning>,
    /// Warnings not yet handed out by [`Renewals::poll_warning`].
    fresh: VecDeque<LeaseWarning>,
}

/// What [`Renewals::admit`] found about an obligation about to be offered,
/// handed back to [`Renewals::accepted`] once the custodian accepts it.
#[derive(Clone, Debug)]
#[must_use]
pub struct Admitted {
    /// The key the obligation governs, if a chain could care.
    key: Option<GovernedKey>,
    /// The grant's lease term, when it is a leased grant.
    leased: Option<Duration>,
}

impl Admitted {
    /// Nothing to do with renewals.
    pub fn none() -> Self {
        Self {
            key: None,
            leased: None,
        }
    }

    /// True when [`Renewals::accepted`] must see the obligation.
    pub fn concerns_renewals(&self) -> bool {
        self.key.is_some()
    }
}

impl Renewals {
    /// A scheduler with no chains. `seed` keys the jitter stream;
    /// `skew_margin` is subtracted from each term before the renewal
    /// interval is taken; `revocation_deadline`, when set, is the deadline
    /// a lease term is warned against at offer.
    pub fn new(seed: u64, skew_margin: Duration, revocation_deadline: Option<Duration>) -> Self {
        Self {
            chains: HashMap::new(),
            timers: BTreeSet::new(),
            // Seeded once: the whole schedule is one reproducible stream.
            rng: SplitMix64::new(seed ^ 0x6c65_6173_655f_726e),
            skew_margin,
            revocation_deadline,
            warnings: VecDeque::new(),
            fresh: VecDeque::new(),
        }
    }

    /// Whether [`Renewals::admit`] could find `ob` concerns a renewal
    /// chain: not while no chain is open and `ob` carries no lease. (The
    /// common case, answered without classifying `ob`.)
    pub fn may_concern(&self, ob: &Obligation) -> bool {
        !self.chains.is_empty() || ob.payload().get(LEASE_FIELD).is_some()
    }

    /// Looks at an obligation before it is offered. Refuses one that
    /// would arrive behind a renewal this node already sent: a sequenced
    /// obligation on a key with a live chain whose sequence is not newer
    /// than the chain's (the receiver would decline it `superseded`, and a
    /// revocation must never be lost to our own renewals). An unsequenced
    /// obligation, or one with a newer sequence, passes.
    pub fn admit(
        &self,
        registry: &PolarityRegistry,
        ob: &Obligation,
    ) -> Result<Admitted, SupersededByRenewal> {
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
                    return Err(SupersededByRenewal {
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
    pub fn accepted(&mut self, admitted: Admitted, ob: &Obligation, principal: &PrincipalState) {
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
        for q in [&mut self.warnings, &mut self.fresh] {
            if q.len() >= MAX_WARNINGS {
                q.pop_front();
            }
        }
        self.fresh.push_back(w.clone());
        self.warnings.push_back(w);
    }

    /// The next warning not yet handed out, for the embedding to log
    /// (each warning once; the newest [`MAX_WARNINGS`] wait).
    #[must_use]
    pub fn poll_warning(&mut self) -> Option<LeaseWarning> {
        self.fresh.pop_front()
    }

    fn next_at(&mut self, issued: Timestamp, term: Duration) -> Timestamp {
        let u = self.rng.next_f64();
        // A floor of a twentieth of the term: a usable term barely above
        // the skew margin must not turn into a busy loop of renewals.
        let delay = lease::renewal_delay(term, self.skew_margin, u).max(term / 20);
        issued.saturating_add(delay)
    }

    /// Ends the chain on `key`, if any.
    fn stop(&mut self, key: &GovernedKey) {
        if let Some(c) = self.chains.remove(key) {
            self.timers.remove(&(c.next_at, key.clone()));
        }
    }

    /// When [`Renewals::poll_renewals`] has work.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        self.timers.first().map(|(at, _)| *at)
    }

    /// The renewals due at `now`, each built as the next grant of its
    /// chain. A chain whose grant the principal no longer holds, or whose
    /// next renewal cannot be built (its key's sequences are exhausted),
    /// ends here instead. The embedding offers each one and reports it with
    /// [`Renewals::renewed`] (or [`Renewals::skipped`]).
    #[must_use]
    pub fn poll_renewals(
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
                continue;
            }
            match renewal_of(c, now, principal.next_sequence(&key)) {
                Ok(ob) => due.push((key, ob)),
                Err(_) => {
                    self.chains.remove(&key);
                }
            }
        }
        due
    }

    /// A renewal was accepted and will be sent (after its record
    /// commits): it is the chain's latest grant from now on.
    pub fn renewed(&mut self, key: GovernedKey, renewal: Obligation) {
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
    pub fn skipped(&mut self, now: Timestamp, key: GovernedKey, retry: bool) {
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
    pub fn views(&self) -> Vec<RenewalView> {
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
    pub fn warnings(&self) -> Vec<LeaseWarning> {
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
fn renewal_of(c: &Chain, now: Timestamp, next: Sequence) -> Result<Obligation, FieldError> {
    let last = &c.last;
    let seq = c
        .sequence()
        .0
        .checked_add(1)
        .ok_or_else(|| FieldError::invalid("sequence", "the key's sequences are exhausted"))?;
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
