//! What arrives from the transport (frames, link changes, misbehaving
//! peers) and what goes out to it.

use abhyasa_core::custody::{AckDisposition, TerminalState, Transmit};
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
                for t in self.custodian.status_queries(&peer) {
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

    pub(super) fn on_message(&mut self, now: Timestamp, peer: &AgentId, m: Message) {
        match m {
            Message::Obligation(o) => {
                let got = if self.apply.is_some() {
                    // Asked in `pump`, answered later as an input.
                    self.receiver.receive(now, peer, o)
                } else {
                    self.receiver
                        .handle_obligation(now, peer, o, self.applier.as_mut())
                };
                tracing::debug!(%peer, ?got, "obligation received");
            }
            Message::Acks(acks) => {
                for a in &acks {
                    let d = self.custodian.handle_ack(now, peer, a);
                    if let AckDisposition::Ignored(why) = d {
                        if let Some(held) = self.peer_warnings.allow() {
                            tracing::warn!(%peer, id = %a.obligation_id, ?why, held_back = held, "ack ignored");
                        }
                    }
                }
            }
            Message::StatusQuery(ids) => self.receiver.handle_status_query(now, peer, &ids),
            Message::StatusReply(r) => self.custodian.handle_status_reply(now, peer, &r),
            Message::Error(e) => {
                if let Some(held) = self.peer_warnings.allow() {
                    tracing::warn!(%peer, code = ?e.code, message = %e.message, held_back = held, "peer reported an error");
                }
                self.custodian.handle_error(now, peer, &e);
            }
            // A relayed link (abhyasa-spool) consumes relay messages before
            // they reach the driver; one that gets here came over a plain
            // link and is answered as a peer without relay support would.
            Message::Relay(_) => {
                self.metrics.frames_bad += 1;
                self.send(Transmit {
                    to: peer.clone(),
                    message: Message::Error(ProtocolError::from_peer_error(
                        &abhyasa_core::PeerError::UnknownMessageType,
                    )),
                });
            }
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
        if self.custodian.is_pending(&id) {
            self.custodian.handle_send_failed(&id);
        } else if self
            .custodian
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
