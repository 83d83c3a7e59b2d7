//! Binary frames: one length-delimited protobuf `Envelope` per frame.
//!
//! Schema: `spec/abhyasa.proto`, compiled at build time with `protox` (no
//! system `protoc`). Decoding never panics and never skips data silently:
//! an unknown version or message type is a typed [`PeerError`], and the
//! frame it came in is consumed so the connection can go on
//! ([`FrameDecoder`]).

use bytes::{Buf, BytesMut};
use prost::Message as _;

use crate::error::{FieldError, FieldProblem, PeerError};
use crate::model::{
    AckStatus, AgentId, CustodyAck, DeclineReason, Digest, Obligation, ObligationId, Payload,
    Timestamp,
};

#[allow(missing_docs, unreachable_pub, clippy::all, clippy::unwrap_used)]
mod pb {
    include!(concat!(env!("OUT_DIR"), "/abhyasa.v1.rs"));
}

pub mod relay;

pub use relay::{
    DedupKey, FrameKey, Refusal, RefusalCode, RelayMessage, RelayReceipt, SealError, Sealed,
};

/// The protocol version this implementation speaks.
pub const PROTOCOL_VERSION: u32 = 1;
/// Default maximum frame size (1 MiB).
pub const DEFAULT_MAX_FRAME: usize = 1 << 20;

/// Typed protocol error codes (the wire's `ErrorCode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorCode {
    /// Not decodable.
    Malformed,
    /// Version not spoken.
    UnsupportedVersion,
    /// Message type not known.
    UnknownMessageType,
    /// Frame larger than the limit.
    FrameTooLarge,
    /// Digest does not match the content.
    DigestMismatch,
    /// The obligation breaks a rule (field error, polarity rule, target).
    InvalidObligation,
    /// The sender is not who it claims, or not allowed.
    Unauthorized,
    /// The receiver is overloaded; retry later.
    Overloaded,
}

impl ErrorCode {
    fn to_pb(self) -> pb::ErrorCode {
        match self {
            Self::Malformed => pb::ErrorCode::Malformed,
            Self::UnsupportedVersion => pb::ErrorCode::UnsupportedVersion,
            Self::UnknownMessageType => pb::ErrorCode::UnknownMessageType,
            Self::FrameTooLarge => pb::ErrorCode::FrameTooLarge,
            Self::DigestMismatch => pb::ErrorCode::DigestMismatch,
            Self::InvalidObligation => pb::ErrorCode::InvalidObligation,
            Self::Unauthorized => pb::ErrorCode::Unauthorized,
            Self::Overloaded => pb::ErrorCode::Overloaded,
        }
    }

    fn from_pb(v: i32) -> Result<Self, FieldError> {
        Ok(match pb::ErrorCode::try_from(v) {
            Ok(pb::ErrorCode::Malformed) => Self::Malformed,
            Ok(pb::ErrorCode::UnsupportedVersion) => Self::UnsupportedVersion,
            Ok(pb::ErrorCode::UnknownMessageType) => Self::UnknownMessageType,
            Ok(pb::ErrorCode::FrameTooLarge) => Self::FrameTooLarge,
            Ok(pb::ErrorCode::DigestMismatch) => Self::DigestMismatch,
            Ok(pb::ErrorCode::InvalidObligation) => Self::InvalidObligation,
            Ok(pb::ErrorCode::Unauthorized) => Self::Unauthorized,
            Ok(pb::ErrorCode::Overloaded) => Self::Overloaded,
            Ok(pb::ErrorCode::Unspecified) | Err(_) => {
                return Err(FieldError::new(
                    "error.code",
                    FieldProblem::UnknownValue {
                        value: v.to_string(),
                        expected: "a known ErrorCode",
                    },
                ))
            }
        })
    }
}

/// A typed protocol error, optionally about one obligation.
#[derive(Clone, Debug, PartialEq)]
pub struct ProtocolError {
    /// The code.
    pub code: ErrorCode,
    /// The obligation it is about, if any.
    pub obligation_id: Option<ObligationId>,
    /// That obligation's digest as received.
    pub digest: Option<Digest>,
    /// Human-readable message.
    pub message: String,
}

impl ProtocolError {
    /// The error frame answering a peer error.
    pub fn from_peer_error(e: &PeerError) -> Self {
        Self {
            code: e.code(),
            obligation_id: None,
            digest: None,
            message: e.to_string(),
        }
    }
}

/// Answer to a status query.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusReply {
    /// The receiver.
    pub target: AgentId,
    /// Ids it knows, with their current ack.
    pub known: Vec<CustodyAck>,
    /// Ids it has never seen (or compacted).
    pub unknown: Vec<ObligationId>,
}

/// A message body.
#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    /// An obligation.
    Obligation(Obligation),
    /// Acks from one receiver for one or more obligations.
    Acks(Vec<CustodyAck>),
    /// Status query by obligation id.
    StatusQuery(Vec<ObligationId>),
    /// Status reply.
    StatusReply(StatusReply),
    /// Protocol error.
    Error(ProtocolError),
    /// Store-and-forward: sealed frames, relay receipts, edge pull
    /// (spec/protocol.md §7). A node without a relayed link answers it
    /// `unknown_message_type`.
    Relay(RelayMessage),
}

/// A frame: the sender and one message.
#[derive(Clone, Debug, PartialEq)]
pub struct Envelope {
    /// The sender as it claims; transports bind it to the peer's key.
    pub sender: AgentId,
    /// The body.
    pub message: Message,
}

fn ack_member(a: &CustodyAck) -> pb::AckMember {
    pb::AckMember {
        obligation_id: a.obligation_id.to_string(),
        digest: a.digest.map(|d| d.0.to_vec()).unwrap_or_default(),
        status: match a.status {
            AckStatus::Applied => pb::AckStatus::Applied,
            AckStatus::Declined => pb::AckStatus::Declined,
            AckStatus::Deferred => pb::AckStatus::Deferred,
        } as i32,
        reason: match a.reason {
            None => pb::DeclineReason::Unspecified,
            Some(DeclineReason::Policy) => pb::DeclineReason::Policy,
            Some(DeclineReason::Expired) => pb::DeclineReason::Expired,
            Some(DeclineReason::Superseded) => pb::DeclineReason::Superseded,
            Some(DeclineReason::UnsupportedKind) => pb::DeclineReason::UnsupportedKind,
            Some(DeclineReason::Conflict) => pb::DeclineReason::Conflict,
        } as i32,
        detail: a.detail.clone().unwrap_or_default(),
        acked_at_micros: a.acked_at.unix_micros(),
    }
}

fn opt_digest(field: &str, b: &[u8]) -> Result<Option<Digest>, FieldError> {
    if b.is_empty() {
        Ok(None)
    } else {
        Digest::from_slice(field, b).map(Some)
    }
}

fn from_member(
    m: &pb::AckMember,
    target: &AgentId,
    instance: &str,
) -> Result<CustodyAck, FieldError> {
    let status = match pb::AckStatus::try_from(m.status) {
        Ok(pb::AckStatus::Applied) => AckStatus::Applied,
        Ok(pb::AckStatus::Declined) => AckStatus::Declined,
        Ok(pb::AckStatus::Deferred) => AckStatus::Deferred,
        Ok(pb::AckStatus::Unspecified) => return Err(FieldError::missing("status")),
        Err(_) => {
            return Err(FieldError::new(
                "status",
                FieldProblem::UnknownValue {
                    value: m.status.to_string(),
                    expected: "applied | declined | deferred",
                },
            ))
        }
    };
    let reason = match pb::DeclineReason::try_from(m.reason) {
        Ok(pb::DeclineReason::Unspecified) => None,
        Ok(pb::DeclineReason::Policy) => Some(DeclineReason::Policy),
        Ok(pb::DeclineReason::Expired) => Some(DeclineReason::Expired),
        Ok(pb::DeclineReason::Superseded) => Some(DeclineReason::Superseded),
        Ok(pb::DeclineReason::UnsupportedKind) => Some(DeclineReason::UnsupportedKind),
        Ok(pb::DeclineReason::Conflict) => Some(DeclineReason::Conflict),
        Err(_) => {
            return Err(FieldError::new(
                "reason",
                FieldProblem::UnknownValue {
                    value: m.reason.to_string(),
                    expected: "a known DeclineReason",
                },
            ))
        }
    };
    let ack = CustodyAck {
        obligation_id: ObligationId::parse_field("obligation_id", &m.obligation_id)?,
        target: target.clone(),
        status,
        acked_at: Timestamp::from_unix_micros(m.acked_at_micros),
        digest: opt_digest("digest", &m.digest)?,
        reason,
        detail: (!m.detail.is_empty()).then(|| m.detail.clone()),
        receiver_instance: (!instance.is_empty()).then(|| instance.to_string()),
    };
    ack.validate()?;
    Ok(ack)
}

fn obligation_to_pb(o: &Obligation) -> pb::Obligation {
    pb::Obligation {
        obligation_id: o.id().to_string(),
        kind: o.kind().to_string(),
        target: o.target().to_string(),
        payload_json: o.payload().canonical_json().as_bytes().to_vec(),
        deadline_seconds: o.deadline_seconds(),
        max_retries: o.max_retries(),
        created_at_micros: o.created_at().unix_micros(),
        sequence: o.sequence().map(|s| s.0),
        digest: o.digest().0.to_vec(),
    }
}

fn obligation_from_pb(p: &pb::Obligation) -> Result<Obligation, PeerError> {
    let payload = Payload::from_json_bytes(&p.payload_json)?;
    let mut b = Obligation::builder()
        .id(p.obligation_id.as_str())
        .kind(p.kind.as_str())
        .target(p.target.as_str())
        .payload(serde_json::Value::Object(payload.as_map().clone()))
        .deadline_seconds(i64::try_from(p.deadline_seconds).unwrap_or(i64::MAX))
        .max_retries(i64::from(p.max_retries))
        .created_at(Timestamp::from_unix_micros(p.created_at_micros));
    if let Some(s) = p.sequence {
        b = b.sequence(s);
    }
    let ob = b.build()?;
    if let Some(claimed) = opt_digest("digest", &p.digest)? {
        if claimed != ob.digest() {
            return Err(PeerError::DigestMismatch {
                claimed,
                computed: ob.digest(),
            });
        }
    }
    Ok(ob)
}

impl Envelope {
    /// A new envelope.
    pub fn new(sender: AgentId, message: Message) -> Self {
        Self { sender, message }
    }

    fn to_pb(&self) -> pb::Envelope {
        use pb::envelope::Body;
        let body = match &self.message {
            Message::Obligation(o) => Body::Obligation(obligation_to_pb(o)),
            Message::Acks(acks) => Body::Ack(pb::CustodyAck {
                target: acks
                    .first()
                    .map(|a| a.target.to_string())
                    .unwrap_or_default(),
                members: acks.iter().map(ack_member).collect(),
                receiver_instance: acks
                    .first()
                    .and_then(|a| a.receiver_instance.clone())
                    .unwrap_or_default(),
            }),
            Message::StatusQuery(ids) => Body::StatusQuery(pb::StatusQuery {
                obligation_ids: ids.iter().map(ToString::to_string).collect(),
            }),
            Message::StatusReply(r) => Body::StatusReply(pb::StatusReply {
                target: r.target.to_string(),
                known: r.known.iter().map(ack_member).collect(),
                unknown: r.unknown.iter().map(ToString::to_string).collect(),
                receiver_instance: r
                    .known
                    .first()
                    .and_then(|a| a.receiver_instance.clone())
                    .unwrap_or_default(),
            }),
            Message::Error(e) => Body::Error(pb::Error {
                code: e.code.to_pb() as i32,
                obligation_id: e
                    .obligation_id
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default(),
                digest: e.digest.map(|d| d.0.to_vec()).unwrap_or_default(),
                message: e.message.clone(),
            }),
            Message::Relay(r) => relay::to_pb(r),
        };
        pb::Envelope {
            version: PROTOCOL_VERSION,
            sender: self.sender.to_string(),
            body: Some(body),
        }
    }

    /// Encodes the envelope without a length prefix.
    pub fn encode(&self) -> Vec<u8> {
        self.to_pb().encode_to_vec()
    }

    /// Appends one frame (varint length prefix + envelope) to `buf`.
    pub fn encode_frame(&self, buf: &mut Vec<u8>) {
        let pb = self.to_pb();
        let len = pb.encoded_len();
        buf.reserve(len + 10);
        // Writing to a Vec cannot fail for lack of capacity.
        let _ = pb.encode_length_delimited(buf);
    }

    /// Decodes an envelope (no length prefix).
    pub fn decode(bytes: &[u8]) -> Result<Envelope, PeerError> {
        let p = pb::Envelope::decode(bytes).map_err(|e| PeerError::Malformed {
            format: "protobuf",
            detail: e.to_string(),
        })?;
        if p.version == 0 {
            // proto3 reads an absent field as 0: no version at all is a
            // malformed frame, not a version we do not speak.
            return Err(PeerError::Malformed {
                format: "protobuf",
                detail: "envelope has no protocol version".into(),
            });
        }
        if p.version != PROTOCOL_VERSION {
            return Err(PeerError::UnsupportedVersion {
                found: p.version,
                supported: PROTOCOL_VERSION,
            });
        }
        let sender = AgentId::parse_field("sender", &p.sender)?;
        use pb::envelope::Body;
        let message = match p.body {
            None => return Err(PeerError::UnknownMessageType),
            Some(Body::Obligation(o)) => Message::Obligation(obligation_from_pb(&o)?),
            Some(Body::Ack(a)) => {
                if a.members.is_empty() {
                    return Err(FieldError::new("members", FieldProblem::Empty).into());
                }
                let target = AgentId::parse_field("target", &a.target)?;
                let acks = a
                    .members
                    .iter()
                    .map(|m| from_member(m, &target, &a.receiver_instance))
                    .collect::<Result<Vec<_>, _>>()?;
                Message::Acks(acks)
            }
            Some(Body::StatusQuery(q)) => Message::StatusQuery(
                q.obligation_ids
                    .iter()
                    .map(|s| ObligationId::parse_field("obligation_ids", s))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            Some(Body::StatusReply(r)) => {
                let target = AgentId::parse_field("target", &r.target)?;
                Message::StatusReply(StatusReply {
                    known: r
                        .known
                        .iter()
                        .map(|m| from_member(m, &target, &r.receiver_instance))
                        .collect::<Result<Vec<_>, _>>()?,
                    unknown: r
                        .unknown
                        .iter()
                        .map(|s| ObligationId::parse_field("unknown", s))
                        .collect::<Result<Vec<_>, _>>()?,
                    target,
                })
            }
            Some(Body::Error(e)) => Message::Error(ProtocolError {
                code: ErrorCode::from_pb(e.code)?,
                obligation_id: if e.obligation_id.is_empty() {
                    None
                } else {
                    Some(ObligationId::parse_field(
                        "obligation_id",
                        &e.obligation_id,
                    )?)
                },
                digest: opt_digest("digest", &e.digest)?,
                message: e.message,
            }),
            Some(Body::Sealed(s)) => Message::Relay(relay::sealed_from_pb(s)?),
            Some(Body::RelayReceipt(r)) => Message::Relay(relay::receipt_from_pb(r)?),
            Some(Body::Pull(p)) => Message::Relay(relay::pull_from_pb(p)?),
            Some(Body::PullDone(d)) => Message::Relay(RelayMessage::PullDone {
                remaining: d.remaining,
            }),
            Some(Body::Delivered(d)) => Message::Relay(relay::delivered_from_pb(d)?),
        };
        Ok(Envelope { sender, message })
    }
}

/// Splits a byte stream into frames. A bad frame yields a typed error and
/// is consumed whole, so the frames after it still decode (C-T-4). A frame
/// over the limit is skipped as its bytes arrive, without buffering it.
#[derive(Debug, Clone)]
pub struct FrameDecoder {
    max_frame: usize,
    skipping: usize,
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
        Some(Envelope::decode(&frame))
    }
}
