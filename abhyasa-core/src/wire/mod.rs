//! The wire: the protocol's messages and their two codecs.
//!
//! * `message` — what a frame carries ([`Envelope`], [`Message`]);
//! * `protobuf` — the binary codec, one protobuf `Envelope` per frame
//!   (schema `spec/abhyasa.proto`, compiled at build time with `protox`, no
//!   system `protoc`);
//! * `frame` — length-delimited frames on a byte stream ([`FrameDecoder`]);
//! * [`json`] — the other codec, JSON v1;
//! * [`relay`] — store-and-forward frames;
//! * [`shape`] — a coalesced message too large for a frame, sent in parts;
//! * `code` — the wire's [`ErrorCode`]s and the one mapping from errors to
//!   them.
//!
//! Decoding never panics and never skips data silently: an unknown version
//! or message type is a typed [`PeerError`](crate::PeerError), and the
//! frame it came in is consumed so the connection can go on
//! ([`FrameDecoder`]).

mod code;
mod frame;
pub mod json;
mod message;
#[allow(missing_docs, unreachable_pub, clippy::all, clippy::unwrap_used)]
mod pb;
mod protobuf;
pub mod relay;
mod seal;
pub mod shape;

pub use code::ErrorCode;
pub use frame::{FrameDecoder, DEFAULT_MAX_FRAME};
pub use message::{Envelope, Message, ProtocolError, StatusReply};
pub use relay::{
    DedupKey, FrameKey, Refusal, RefusalCode, RelayMessage, RelayReceipt, SealError, Sealed,
};

/// The protocol version this implementation speaks.
pub const PROTOCOL_VERSION: u32 = 1;
