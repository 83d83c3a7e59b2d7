//! Frames on a byte stream: one length-delimited (varint prefix) protobuf
//! `Envelope` per frame. A bad frame is consumed whole so the connection
//! can go on ([`FrameDecoder`]).

use bytes::{Buf, BytesMut};
use prost::Message as _;

use super::message::Envelope;
use super::protobuf::Names;
use crate::error::PeerError;

/// Default maximum frame size (1 MiB).
pub const DEFAULT_MAX_FRAME: usize = 1 << 20;

impl Envelope {
    /// Appends one frame (varint length prefix + envelope) to `buf`.
    pub fn encode_frame(&self, buf: &mut Vec<u8>) {
        let pb = self.to_pb();
        let len = pb.encoded_len();
        buf.reserve(len + 10);
        // Writing to a Vec cannot fail for lack of capacity.
        let _ = pb.encode_length_delimited(buf);
    }
}

/// Splits a byte stream into frames. A bad frame yields a typed error and
/// is consumed whole, so the frames after it still decode (C-T-4). A frame
/// over the limit is skipped as its bytes arrive, without buffering it.
#[derive(Debug, Clone)]
pub struct FrameDecoder {
    max_frame: usize,
    skipping: usize,
    /// Names earlier frames gave, reused while they repeat.
    names: Names,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_FRAME)
    }
}

impl FrameDecoder {
    /// A decoder with a frame-size limit.
    pub fn new(max_frame: usize) -> Self {
        Self {
            max_frame,
            skipping: 0,
            names: Names::default(),
        }
    }

    /// Decodes the next complete frame from `buf`, consuming its bytes.
    /// `None` means more bytes are needed.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Option<Result<Envelope, PeerError>> {
        if self.skipping > 0 {
            let n = self.skipping.min(buf.len());
            buf.advance(n);
            self.skipping -= n;
            if self.skipping > 0 {
                return None;
            }
        }
        let mut peek = &buf[..];
        let len = match prost::encoding::decode_varint(&mut peek) {
            Ok(l) => l,
            Err(_) if buf.len() < 10 => return None,
            Err(e) => {
                // Ten bytes that are not a varint: the stream cannot be
                // resynchronised; drop what we have.
                buf.clear();
                return Some(Err(PeerError::Malformed {
                    format: "protobuf",
                    detail: format!("bad frame length prefix: {e}"),
                }));
            }
        };
        let prefix = buf.len() - peek.len();
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len > self.max_frame {
            buf.advance(prefix);
            let n = len.min(buf.len());
            buf.advance(n);
            self.skipping = len - n;
            return Some(Err(PeerError::FrameTooLarge {
                size: len,
                max: self.max_frame,
            }));
        }
        if peek.len() < len {
            return None;
        }
        buf.advance(prefix);
        let frame = buf.split_to(len);
        Some(Envelope::decode_with(&frame, &mut self.names))
    }
}
