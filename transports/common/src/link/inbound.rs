//! Bytes from a connection to [`Incoming`] items: the frame decoder and the
//! sender binding check, shared by every transport.

use abhyasa_core::wire::{Envelope, FrameDecoder};
use abhyasa_core::{AgentId, PeerError};
use bytes::BytesMut;
use tokio::sync::mpsc;

use std::sync::Arc;

use crate::stats::{bump, Counters};
use crate::Incoming;

/// The runtime dropped its incoming receiver; the connection should end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the incoming receiver was dropped")]
pub struct ReceiverGone;

/// Turns one connection's bytes into [`Incoming`] items for the runtime.
///
/// Every frame goes through a [`FrameDecoder`] with the configured size
/// limit; a bad frame becomes [`Incoming::Malformed`] and is consumed whole,
/// so the next frame still decodes (C-T-4). A good frame whose `sender` is
/// not the authenticated peer becomes [`Incoming::Unauthorized`] and is
/// never delivered. Pushing waits while the incoming channel is full: the
/// caller stops reading and the connection's flow control pushes back.
#[derive(Debug)]
pub struct InboundSink {
    peer: AgentId,
    tx: mpsc::Sender<Incoming>,
    decoder: FrameDecoder,
    buf: BytesMut,
    max_frame: usize,
    counters: Arc<Counters>,
}

impl InboundSink {
    pub(crate) fn new(
        peer: AgentId,
        tx: mpsc::Sender<Incoming>,
        max_frame: usize,
        counters: Arc<Counters>,
    ) -> Self {
        Self {
            peer,
            tx,
            decoder: FrameDecoder::new(max_frame),
            buf: BytesMut::new(),
            max_frame,
            counters,
        }
    }

    /// The authenticated peer.
    pub fn peer(&self) -> &AgentId {
        &self.peer
    }

    /// Feeds bytes of a stream (QUIC) in which frames follow one another.
    pub async fn push_stream(&mut self, data: &[u8]) -> Result<(), ReceiverGone> {
        self.buf.extend_from_slice(data);
        while let Some(result) = self.decoder.decode(&mut self.buf) {
            self.deliver(result).await?;
        }
        Ok(())
    }

    /// Feeds one message (WebSocket, in-memory) that must hold exactly one
    /// frame.
    pub async fn push_message(&mut self, message: &[u8]) -> Result<(), ReceiverGone> {
        let result = decode_message(message, self.max_frame);
        self.deliver(result).await
    }

    /// Reports a peer error found outside the frame decoder (e.g. a text
    /// message on a binary-only link).
    pub async fn report(&mut self, error: PeerError) -> Result<(), ReceiverGone> {
        self.deliver(Err(error)).await
    }

    async fn deliver(&mut self, result: Result<Envelope, PeerError>) -> Result<(), ReceiverGone> {
        let peer = self.peer.clone();
        let item = match result {
            Ok(envelope) if envelope.sender == peer => {
                bump(&self.counters.frames_received);
                Incoming::Frame { peer, envelope }
            }
            Ok(envelope) => {
                bump(&self.counters.unauthorized);
                tracing::warn!(
                    %peer,
                    claimed = %envelope.sender,
                    "dropping frame whose sender is not the authenticated peer"
                );
                Incoming::Unauthorized {
                    peer,
                    claimed: envelope.sender,
                }
            }
            Err(error) => {
                bump(&self.counters.malformed);
                tracing::debug!(%peer, %error, "malformed frame");
                Incoming::Malformed { peer, error }
            }
        };
        self.tx.send(item).await.map_err(|_| ReceiverGone)
    }
}

/// Decodes a message that must be exactly one length-delimited frame of at
/// most `max_frame` bytes.
pub fn decode_message(message: &[u8], max_frame: usize) -> Result<Envelope, PeerError> {
    let mut buf = BytesMut::from(message);
    match FrameDecoder::new(max_frame).decode(&mut buf) {
        None => Err(PeerError::Malformed {
            format: "protobuf",
            detail: format!("message of {} bytes ends inside a frame", message.len()),
        }),
        Some(Err(e)) => Err(e),
        Some(Ok(_)) if !buf.is_empty() => Err(PeerError::Malformed {
            format: "protobuf",
            detail: format!(
                "{} bytes after the frame; a message carries exactly one frame",
                buf.len()
            ),
        }),
        Some(Ok(envelope)) => Ok(envelope),
    }
}
