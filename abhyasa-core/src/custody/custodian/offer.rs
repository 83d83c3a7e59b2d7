//! Offering an obligation (AC-1, AB-1): validation first, so a refused
//! offer leaves no trace; then an admissible obligation goes under custody
//! (its record emitted, the first attempt queued behind its commit) and an
//! inadmissible one is sent once, best-effort.

use super::super::record::{Record, TerminalState, TerminalSummary};
use super::super::transmit::Transmit;
use super::{pending_record, Custodian, CustodianEvent, Offered, Pending};
use crate::error::{OfferError, ProfileError};
use crate::model::{GovernedKey, Obligation, Timestamp};
use crate::polarity::Admission;
use crate::principal::{Authorization, PrincipalWrite};
use crate::wire::Message;

impl Custodian {
    /// Offers an obligation. Admissible ones go under custody: the record
    /// is emitted and the first attempt queued behind its commit.
    /// Inadmissible ones are sent once. On error nothing was changed.
    pub fn offer(&mut self, now: Timestamp, ob: Obligation) -> Result<Offered, OfferError> {
        let mut class = self.registry.classify(&ob)?;
        let id = ob.id().clone();
        // C-OR-1: an obligation on a set-semantic (sequence-guarded) key
        // without a sequence gets the next one this node issues on that
        // key. Additive keys (Phala deltas) are unordered by design: their
        // effects commute, so no sequence is assigned.
        let assign = class
            .key
            .as_ref()
            .filter(|_| class.guarded && ob.sequence().is_none());
        #[cfg(feature = "mutations")]
        let assign = assign
            .filter(|_| !crate::mutations::active(crate::mutations::Mutation::NoDefaultSequence));
        if let Some(p) = self.pending.get(&id) {
            let same = p.obligation.digest() == ob.digest()
                || (assign.is_some() && p.obligation.with_sequence(None).digest() == ob.digest());
            return if same {
                Ok(Offered::AlreadyPending)
            } else {
                Err(OfferError::IdConflict {
                    id: id.to_string(),
                    existing: p.obligation.digest(),
                    offered: ob.digest(),
                })
            };
        }
        if let Some(t) = self.terminal.get(&id) {
            // An unsequenced re-offer is recognised under the sequence it
            // was given while that is still the newest issued on its key.
            let same = t.digest == ob.digest()
                || assign
                    .and_then(|k| self.principal.issued(k))
                    .filter(|(_, by)| *by == id)
                    .is_some_and(|(s, _)| ob.with_sequence(Some(*s)).digest() == t.digest);
            return if same {
                Ok(Offered::AlreadyTerminal(t.state))
            } else {
                Err(OfferError::IdConflict {
                    id: id.to_string(),
                    existing: t.digest,
                    offered: ob.digest(),
                })
            };
        }
        if ob.target() == &self.config.agent {
            return Err(OfferError::SelfTarget { id: id.to_string() });
        }
        let deadline_at = ob.deadline_at();
        if now >= deadline_at {
            return Err(OfferError::Expired {
                id: id.to_string(),
                deadline_at,
            });
        }
        let ob = match assign {
            Some(key) => {
                let ob = ob.with_sequence(Some(self.principal.next_sequence(key)));
                if let Admission::Custody { safe } = &mut class.admission {
                    safe.sequence = ob.sequence();
                }
                ob
            }
            None => ob,
        };
        let safe = match class.admission {
            Admission::Custody { safe } => Some(safe),
            Admission::BestEffort => None,
        };
        if let Some(safe) = safe {
            let backoff = self.config.profile(ob.kind()).backoff;
            crate::model::check_sizing(
                ob.deadline_seconds(),
                u64::from(ob.max_retries()),
                backoff.base.as_secs_f64(),
                backoff.cap.as_secs_f64(),
            )
            .map_err(|e: ProfileError| OfferError::IncoherentProfile(e))?;
            if self.pending.len() >= self.config.max_pending {
                return Err(OfferError::Backpressure {
                    pending: self.pending.len(),
                    limit: self.config.max_pending,
                });
            }
            // Validation is over: from here on the offer is accepted whole.
            let principal = self.offer_decision(now, &ob, class.key.as_ref(), class.at_offer);
            let next_at = now.saturating_add(self.interval(&ob, 1));
            let due = next_at.min(deadline_at);
            let pending = Pending {
                obligation: ob.clone(),
                safe,
                attempts: 1,
                next_at,
                due,
                deadline_at,
                deferred: false,
                offered_at: now,
                damaged: false,
            };
            self.outbox.record(Record::CustodyOpened {
                pending: pending_record(&pending),
                principal,
            });
            self.timers.insert((due, id.clone()));
            self.pending.insert(id.clone(), Box::new(pending));
            self.stats.opened += 1;
            self.stats.attempts_sent += 1;
            self.outbox.event(CustodianEvent::Opened {
                obligation_id: id,
                deadline_at,
            });
            self.outbox.transmit(Transmit {
                to: ob.target().clone(),
                message: Message::Obligation(ob),
            });
            Ok(Offered::Custody { deadline_at })
        } else {
            let principal = self.offer_decision(now, &ob, class.key.as_ref(), class.at_offer);
            let summary = TerminalSummary {
                obligation_id: id.clone(),
                digest: ob.digest(),
                target: ob.target().clone(),
                state: TerminalState::BestEffort,
                deadline_at,
                closed_at: now,
                late_ack_recorded: false,
                attempts: 1,
            };
            self.terminal.insert(id.clone(), summary.clone());
            self.outbox
                .record(Record::BestEffortSent { summary, principal });
            self.stats.best_effort += 1;
            self.outbox.event(CustodianEvent::BestEffortSent {
                obligation_id: id,
                target: ob.target().clone(),
            });
            self.outbox.transmit(Transmit {
                to: ob.target().clone(),
                message: Message::Obligation(ob),
            });
            Ok(Offered::BestEffort)
        }
    }

    fn offer_decision(
        &mut self,
        now: Timestamp,
        ob: &Obligation,
        key: Option<&GovernedKey>,
        at_offer: Option<Authorization>,
    ) -> Vec<PrincipalWrite> {
        let mut writes = Vec::new();
        if let (Some(key), Some(state)) = (key, at_offer) {
            writes.extend(
                self.principal
                    .decide_at_offer(key, state, ob.sequence(), ob.id(), now)
                    .1,
            );
        }
        // C-OR-1: the key's counter moves in the offer's own commit, so a
        // sequence is never issued twice, across restarts and compaction.
        if let (Some(key), Some(seq)) = (key, ob.sequence()) {
            writes.extend(self.principal.record_issued(key, seq, ob.id()));
        }
        writes
    }
}
