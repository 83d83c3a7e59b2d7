//! One party of the protocol: its custodian, its receiver and the lease
//! renewals it sends as principal, behind one set of inputs.
//!
//! # Polling contract
//!
//! The agent never reads a clock and never does I/O. A driver:
//!
//! 1. feeds inputs: [`Agent::handle_message`] for each decoded frame,
//!    [`Agent::handle_link_up`] when a link to a peer comes up (and sends
//!    what it returns at once), [`Agent::offer`] for the embedding's
//!    obligations, and [`Agent::handle_timeout`] whenever
//!    `now >= poll_timeout()`, then offers the lease renewals due
//!    ([`Agent::poll_renewals`], [`Agent::offer_renewal`] or
//!    [`Agent::defer_renewal`]);
//! 2. commits the custodian's and the receiver's record batches and hands
//!    back their tokens (write-ahead, exactly as each machine's own
//!    contract says: [`Custodian`] and [`Receiver`]);
//! 3. drains [`Agent::poll_transmit`] and each machine's events.
//!
//! Nothing the agent adds is sent before its records are durable: a
//! renewal is an offer like any other, and the status queries on link-up
//! depend on no record.

use crate::custody::renewal::{Admitted, LeaseWarning, Renewals, SupersededByRenewal};
use crate::custody::{Applier, Custodian, IgnoredAck, Offered, Received, Receiver, Transmit};
use crate::model::{AgentId, GovernedKey, Obligation, ObligationId, Timestamp};
use crate::wire::{Message, ProtocolError};
use crate::{OfferError, PeerError};

/// Why [`Agent::offer`] refused an obligation; nothing was accepted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Refused {
    /// The custodian refused it.
    #[error(transparent)]
    Offer(#[from] OfferError),
    /// Its sequence is not newer than a lease renewal already sent on its
    /// key.
    #[error(transparent)]
    SupersededByRenewal(#[from] SupersededByRenewal),
}

/// What one incoming message did, for the driver to count or log.
#[derive(Debug, Clone, PartialEq)]
#[must_use]
#[non_exhaustive]
pub enum Handled {
    /// An obligation for the receiver, and what became of it.
    Obligation(Received),
    /// Acks for the custodian; those it ignored, with why.
    Acks(Vec<(ObligationId, IgnoredAck)>),
    /// A status query or reply, answered or applied.
    Status,
    /// The peer reported an error (handed to the custodian).
    PeerReported(ProtocolError),
    /// A message this agent does not take over a plain link (a relay
    /// message): the error frame to answer with, to send at once.
    Unsupported(Transmit),
}

/// Custodian, receiver and lease renewals of one agent. See the module
/// docs for the polling contract.
#[derive(Debug, Clone)]
pub struct Agent {
    custodian: Custodian,
    receiver: Receiver,
    renewals: Renewals,
}

impl Agent {
    /// The agent made of these machines (new or restored).
    pub fn new(custodian: Custodian, receiver: Receiver, renewals: Renewals) -> Self {
        Self {
            custodian,
            receiver,
            renewals,
        }
    }

    /// The custodian.
    pub fn custodian(&self) -> &Custodian {
        &self.custodian
    }

    /// The custodian, for inputs the agent does not wrap (decisions,
    /// commits, compaction).
    pub fn custodian_mut(&mut self) -> &mut Custodian {
        &mut self.custodian
    }

    /// The receiver.
    pub fn receiver(&self) -> &Receiver {
        &self.receiver
    }

    /// The receiver, for inputs the agent does not wrap (decisions,
    /// completions, commits, compaction).
    pub fn receiver_mut(&mut self) -> &mut Receiver {
        &mut self.receiver
    }

    /// The lease renewal chains (views and warnings).
    pub fn renewals(&self) -> &Renewals {
        &self.renewals
    }

    /// Offers `ob` as principal: refused when it would arrive behind a
    /// lease renewal already sent on its key; otherwise the custodian's
    /// answer, and a newly accepted obligation starts or ends the renewal
    /// chain on its key. An offer the custodian already knows is an
    /// idempotent repeat and concerns no chain.
    pub fn offer(&mut self, now: Timestamp, ob: Obligation) -> Result<Offered, Refused> {
        let known = |c: &Custodian| c.is_pending(ob.id()) || c.terminal(ob.id()).is_some();
        // Asked only when it might concern a chain: two lookups the offer
        // itself repeats.
        let admitted = if !self.renewals.may_concern(&ob) || known(&self.custodian) {
            Admitted::none()
        } else {
            self.renewals.admit(self.custodian.registry(), &ob)?
        };
        let copy = admitted.concerns_renewals().then(|| ob.clone());
        let offered = self.custodian.offer(now, ob)?;
        if let (Offered::Custody { .. } | Offered::BestEffort, Some(ob)) = (&offered, copy) {
            self.renewals
                .accepted(admitted, &ob, self.custodian.principal());
        }
        Ok(offered)
    }

    /// The next lease warning raised by an offer, for the driver to log.
    #[must_use]
    pub fn poll_warning(&mut self) -> Option<LeaseWarning> {
        self.renewals.poll_warning()
    }

    /// One decoded message from `peer`. An obligation is answered by
    /// `applier` at once, or, with `None`, asked of the embedding as an
    /// apply request ([`Receiver::poll_apply_request`]).
    pub fn handle_message(
        &mut self,
        now: Timestamp,
        peer: &AgentId,
        message: Message,
        applier: Option<&mut dyn Applier>,
    ) -> Handled {
        match message {
            Message::Obligation(o) => Handled::Obligation(match applier {
                Some(a) => self.receiver.handle_obligation(now, peer, o, a),
                None => self.receiver.receive(now, peer, o),
            }),
            Message::Acks(acks) => Handled::Acks(
                acks.iter()
                    .filter_map(|a| match self.custodian.handle_ack(now, peer, a) {
                        crate::custody::AckDisposition::Ignored(why) => {
                            Some((a.obligation_id.clone(), why))
                        }
                        _ => None,
                    })
                    .collect(),
            ),
            Message::StatusQuery(ids) => {
                self.receiver.handle_status_query(now, peer, &ids);
                Handled::Status
            }
            Message::StatusReply(r) => {
                self.custodian.handle_status_reply(now, peer, &r);
                Handled::Status
            }
            Message::Error(e) => {
                self.custodian.handle_error(now, peer, &e);
                Handled::PeerReported(e)
            }
            // A relayed link consumes relay messages before they reach the
            // agent; one that gets here came over a plain link and is
            // answered as a peer without relay support would.
            Message::Relay(_) => Handled::Unsupported(Transmit {
                to: peer.clone(),
                message: Message::Error(ProtocolError::from_peer_error(
                    &PeerError::UnknownMessageType,
                )),
            }),
        }
    }

    /// A link to `peer` came up: the status queries to send at once
    /// ([`Custodian::status_queries`]).
    #[must_use]
    pub fn handle_link_up(&mut self, peer: &AgentId) -> Vec<Transmit> {
        self.custodian.status_queries(peer)
    }

    /// When the agent next has timed work: the earliest of the
    /// custodian's, the receiver's and the renewals' timers.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        [
            self.custodian.poll_timeout(),
            self.receiver.poll_timeout(),
            self.renewals.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Runs the custodian's and the receiver's timers due at `now`. The
    /// renewals due are offered by the driver ([`Agent::poll_renewals`]),
    /// which knows whether the send queue can take them.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        if self.custodian.poll_timeout().is_some_and(|t| t <= now) {
            self.custodian.handle_timeout(now);
        }
        if self.receiver.poll_timeout().is_some_and(|t| t <= now) {
            self.receiver.handle_timeout(now);
        }
    }

    /// The lease renewals due at `now`, each to be offered with
    /// [`Agent::offer_renewal`] or put off with [`Agent::defer_renewal`].
    #[must_use]
    pub fn poll_renewals(&mut self, now: Timestamp) -> Vec<(GovernedKey, Obligation)> {
        self.renewals.poll_renewals(now, self.custodian.principal())
    }

    /// Offers a due renewal: accepted, it is the chain's latest grant (sent
    /// once its record commits); refused, the chain ends.
    pub fn offer_renewal(
        &mut self,
        now: Timestamp,
        key: GovernedKey,
        renewal: Obligation,
    ) -> Result<Offered, Refused> {
        match self.custodian.offer(now, renewal.clone()) {
            Ok(o @ (Offered::BestEffort | Offered::Custody { .. })) => {
                self.renewals.renewed(key, renewal);
                Ok(o)
            }
            other => {
                self.renewals.skipped(now, key, false);
                Ok(other?)
            }
        }
    }

    /// A due renewal the send queue cannot take now: tried again a renewal
    /// interval later (the lease may lapse meanwhile, which is safe).
    pub fn defer_renewal(&mut self, now: Timestamp, key: GovernedKey) {
        self.renewals.skipped(now, key, true);
    }

    /// The next frame to send: the custodian's, then the receiver's, each
    /// released only once the records it depends on are durable.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.custodian
            .poll_transmit()
            .or_else(|| self.receiver.poll_transmit())
    }
}
