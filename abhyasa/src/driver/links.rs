//! What arrives from the transport (frames, link changes, misbehaving
//! peers) and what goes out to it.

use abhyasa_core::agent::Handled;
use abhyasa_core::custody::{Applier, TerminalState, Transmit};
use abhyasa_core::wire::{shape, Envelope, Message, ProtocolError};
use abhyasa_core::{AgentId, Timestamp};
use abhyasa_transport::{Incoming, SendError};

use super::Driver;
use crate::api::NodeEvent;

/// Most peer ids `Driver::own_peer_id` keeps copies of.
const PEER_IDS_MAX: usize = 4096;

impl Driver {
    pub(super) fn on_incoming(&mut self, i: Incoming) {
        let now = self.now();
        match i {
            Incoming::Frame { peer, envelope } => {
                self.metrics.frames_in += 1;
                let peer = self.own_peer_id(peer);
                self.on_message(now, &peer, envelope.message);
            }
            Incoming::Malformed { peer, error } => {
                self.metrics.frames_bad += 1;
                if let Some(held) = self.peer_warnings.allow() {
                    tracing::warn!(%peer, %error, held_back = held, "malformed frame");
                }
                let reply = ProtocolError::from_peer_error(&error);
                self.send(Transmit {
                    to: peer.clone(),
                    message: Message::Error(reply),
                });
                let _ = self.events.send(NodeEvent::PeerMisbehaved {
                    peer,
                    what: error.to_string(),
                });
            }
            Incoming::Unauthorized { peer, claimed } => {
                self.metrics.frames_bad += 1;
                if let Some(held) = self.peer_warnings.allow() {
                    tracing::warn!(%peer, %claimed, held_back = held, "frame with a foreign sender dropped");
                }
                let _ = self.events.send(NodeEvent::PeerMisbehaved {
                    peer,
                    what: format!("claimed to be {claimed}"),
                });
            }
            Incoming::Connected(peer) => {
                tracing::info!(%peer, "peer up");
                // Ask at once what became of what we hold for it, so a
                // healed partition discharges without waiting for backoff.
                for t in self.core.handle_link_up(&peer) {
                    self.send(t);
                }
                let _ = self.events.send(NodeEvent::PeerUp(peer));
            }
            Incoming::Disconnected(peer) => {
                tracing::info!(%peer, "peer down");
                let _ = self.events.send(NodeEvent::PeerDown(peer));
            }
            Incoming::RelayRefused {
                peer,
                destination,
                obligation_id,
                code,
                retry_after_seconds,
                ..
            } => {
                // Hop acceptance only: surfaced, never handed to the
                // custodian, which keeps its schedule (spec §7).
                self.metrics.relay_refused += 1;
                let _ = self.events.send(NodeEvent::RelayRefused {
                    relay: peer,
                    destination,
                    obligation_id,
                    code,
                    retry_after_seconds,
                });
            }
            other => tracing::debug!(?other, "transport"),
        }
    }

    /// One message from `peer`, handed to the agent; what it reports is
    /// counted and logged (rate-limited: a peer must not fill the log).
    pub(super) fn on_message(&mut self, now: Timestamp, peer: &AgentId, m: Message) {
        // With the asynchronous applier, an obligation is asked in `pump`
        // and answered later as an input.
        let applier = match self.apply {
            Some(_) => None,
            None => Some(self.applier.as_mut() as &mut dyn Applier),
        };
        match self.core.handle_message(now, peer, m, applier) {
            Handled::Obligation(got) => tracing::debug!(%peer, ?got, "obligation received"),
            Handled::Acks(ignored) => {
                for (id, why) in ignored {
                    if let Some(held) = self.peer_warnings.allow() {
                        tracing::warn!(%peer, %id, ?why, held_back = held, "ack ignored");
                    }
                }
            }
            Handled::PeerReported(e) => {
                if let Some(held) = self.peer_warnings.allow() {
                    tracing::warn!(%peer, code = ?e.code, message = %e.message, held_back = held, "peer reported an error");
                }
            }
            Handled::Unsupported(answer) => {
                self.metrics.frames_bad += 1;
                self.send(answer);
            }
            _ => {}
        }
    }

    /// Hands a frame to the transport. A frame it refuses was not sent
    /// (C-ND-4): a custody attempt is counted as refused (the schedule
    /// retries it), a best-effort obligation's offer is told so.
    pub(super) fn send(&mut self, t: Transmit) {
        let obligation = match &t.message {
            Message::Obligation(o) => Some(o.id().clone()),
            _ => None,
        };
        if let Some(id) = &obligation {
            self.unreleased.release(id);
        }
        let Err(e) = self.send_split(&t.to, t.message) else {
            return;
        };
        self.metrics.frames_unsent += 1;
        match &e {
            SendError::QueueFull(_) => self.metrics.send_queue_full += 1,
            SendError::FrameTooLarge { .. } => self.metrics.send_too_large += 1,
            _ => self.metrics.send_not_connected += 1,
        }
        tracing::debug!(peer = %t.to, error = %e, "frame not sent");
        let Some(id) = obligation else {
            return;
        };
        if self.core.custodian().is_pending(&id) {
            self.core.custodian_mut().handle_send_failed(&id);
        } else if self
            .core
            .custodian()
            .terminal(&id)
            .is_some_and(|t| t.state == TerminalState::BestEffort)
        {
            self.refused_best_effort.insert(id, e);
        }
    }

    /// Sends `message`, splitting a coalesced frame the transport finds
    /// too large into halves until each fits (C-ND-4).
    pub(super) fn send_split(&mut self, to: &AgentId, message: Message) -> Result<(), SendError> {
        let (transport, metrics) = (&self.transport, &mut self.metrics);
        let mut splits = 0;
        let sent = shape::send_in_parts(
            &self.agent,
            message,
            &mut |env: &Envelope| {
                transport.send(to, env)?;
                metrics.frames_out += 1;
                Ok(())
            },
            &|e: &SendError| matches!(e, SendError::FrameTooLarge { .. }),
            &mut splits,
        );
        self.metrics.frames_split += splits;
        sent
    }

    /// This driver's own copy of `peer`, the id its link gave a frame.
    /// The link's copy is shared with the link's reader and writer
    /// threads, and a frame's handling clones its sender's id into ledger
    /// keys, records, acks and events: every clone and drop of a shared
    /// copy is an atomic write to a cache line those threads use too
    ///. The copies are few (one per peer that sent a frame)
    /// and dropped all at once past `PEER_IDS_MAX`.
    pub(super) fn own_peer_id(&mut self, peer: AgentId) -> AgentId {
        if let Some(own) = self.peer_ids.get(&peer) {
            return own.clone();
        }
        if self.peer_ids.len() >= PEER_IDS_MAX {
            self.peer_ids.clear();
        }
        // A fresh copy of text already validated.
        let Ok(own) = AgentId::new(peer.as_str()) else {
            return peer;
        };
        self.peer_ids.insert(own.clone(), own.clone());
        own
    }
}
