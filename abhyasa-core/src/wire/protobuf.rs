//! The protobuf codec: an [`Envelope`] to and from one protobuf `Envelope`
//! (schema `spec/abhyasa.proto`, compiled at build time with `protox`, no
//! system `protoc`). Decoding never panics and never skips data silently:
//! an unknown version or message type is a typed [`PeerError`].

use prost::Message as _;

use super::code::ErrorCode;
use super::message::{Envelope, Message, ProtocolError, StatusReply};
use super::relay::{self, RelayMessage};
use super::PROTOCOL_VERSION;
use crate::error::{FieldError, FieldProblem, PeerError};
use crate::model::{
    AckStatus, AgentId, CustodyAck, DeclineReason, Digest, Kind, Obligation, ObligationId, Payload,
    Timestamp,
};

#[allow(missing_docs, unreachable_pub, clippy::all, clippy::unwrap_used)]
pub(super) mod pb {
    include!(concat!(env!("OUT_DIR"), "/abhyasa.v1.rs"));
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

// proto3: a string, bytes or scalar field at its default value is not
// written; an `optional` field is written whenever it is set.

fn bytes_len(tag: u32, n: usize) -> usize {
    use prost::encoding::{encoded_len_varint, key_len};
    if n == 0 {
        0
    } else {
        key_len(tag) + encoded_len_varint(n as u64) + n
    }
}

fn varint_len(tag: u32, v: u64) -> usize {
    use prost::encoding::{encoded_len_varint, key_len};
    if v == 0 {
        0
    } else {
        key_len(tag) + encoded_len_varint(v)
    }
}

fn put_bytes(out: &mut Vec<u8>, tag: u32, b: &[u8]) {
    use prost::encoding::{encode_key, encode_varint, WireType};
    if !b.is_empty() {
        encode_key(tag, WireType::LengthDelimited, out);
        encode_varint(b.len() as u64, out);
        out.extend_from_slice(b);
    }
}

fn put_varint(out: &mut Vec<u8>, tag: u32, v: u64) {
    use prost::encoding::{encode_key, encode_varint, WireType};
    if v != 0 {
        encode_key(tag, WireType::Varint, out);
        encode_varint(v, out);
    }
}

/// The encoded size of `obligation_to_pb(ob)`.
fn obligation_body_len(ob: &Obligation) -> usize {
    use prost::encoding::{encoded_len_varint, key_len};
    bytes_len(1, ob.id().as_str().len())
        + bytes_len(2, ob.kind().as_str().len())
        + bytes_len(3, ob.target().as_str().len())
        + bytes_len(4, ob.payload().canonical_json().len())
        + varint_len(5, ob.deadline_seconds())
        + varint_len(6, u64::from(ob.max_retries()))
        // int64 is written as the two's-complement u64.
        + varint_len(7, ob.created_at().unix_micros() as u64)
        + ob.sequence().map_or(0, |s| key_len(8) + encoded_len_varint(s.0))
        + bytes_len(9, ob.digest().0.len())
}

/// The encoded size of an obligation envelope from `sender` whose
/// obligation message is `body` bytes long.
fn obligation_frame_len(sender: &AgentId, body: usize) -> usize {
    use prost::encoding::{encoded_len_varint, key_len};
    varint_len(1, u64::from(PROTOCOL_VERSION))
        + bytes_len(2, sender.as_str().len())
        // The oneof member is written even when its message is empty.
        + key_len(10)
        + encoded_len_varint(body as u64)
        + body
}

/// `Envelope { sender, Obligation(ob) }` as prost encodes it (fields in
/// number order, defaults omitted), written straight from `ob`.
fn encode_obligation_frame(sender: &AgentId, ob: &Obligation) -> Vec<u8> {
    let body = obligation_body_len(ob);
    let mut out = Vec::with_capacity(obligation_frame_len(sender, body));
    write_obligation_frame(&mut out, sender, ob, body);
    out
}

/// Appends the frame of [`encode_obligation_frame`] to `out`; `body` is
/// [`obligation_body_len`] of `ob`.
fn write_obligation_frame(out: &mut Vec<u8>, sender: &AgentId, ob: &Obligation, body: usize) {
    use prost::encoding::{encode_key, encode_varint, WireType};
    put_varint(out, 1, u64::from(PROTOCOL_VERSION));
    put_bytes(out, 2, sender.as_str().as_bytes());
    encode_key(10, WireType::LengthDelimited, out);
    encode_varint(body as u64, out);
    put_bytes(out, 1, ob.id().as_str().as_bytes());
    put_bytes(out, 2, ob.kind().as_str().as_bytes());
    put_bytes(out, 3, ob.target().as_str().as_bytes());
    put_bytes(out, 4, ob.payload().canonical_json().as_bytes());
    put_varint(out, 5, ob.deadline_seconds());
    put_varint(out, 6, u64::from(ob.max_retries()));
    put_varint(out, 7, ob.created_at().unix_micros() as u64);
    if let Some(seq) = ob.sequence() {
        encode_key(8, WireType::Varint, out);
        encode_varint(seq.0, out);
    }
    put_bytes(out, 9, &ob.digest().0);
}

fn obligation_from_pb(p: &pb::Obligation) -> Result<Obligation, PeerError> {
    let payload = Payload::from_json_bytes(&p.payload_json)?;
    // Validated straight from the decoded strings (no copy into the
    // builder first), in the builder's order.
    let mut b = Obligation::builder()
        .with_id(ObligationId::parse_field(
            "obligation_id",
            &p.obligation_id,
        )?)
        .with_kind(Kind::parse_field("kind", &p.kind)?)
        .with_target(AgentId::parse_field("target", &p.target)?)
        .deadline_seconds(i64::try_from(p.deadline_seconds).unwrap_or(i64::MAX))
        .max_retries(i64::from(p.max_retries))
        .created_at(Timestamp::from_unix_micros(p.created_at_micros));
    if let Some(s) = p.sequence {
        b = b.sequence(s);
    }
    let ob = b.build_with_payload(payload)?;
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
    pub(super) fn to_pb(&self) -> pb::Envelope {
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
        match &self.message {
            // The hot frame: written field by field from the obligation,
            // the bytes prost writes for it (a unit property checks them),
            // without first copying every field into a message struct
            // (issue 14: encode each frame once, no copies per field).
            Message::Obligation(ob) => encode_obligation_frame(&self.sender, ob),
            _ => self.to_pb().encode_to_vec(),
        }
    }

    /// The frame as a stream carries it: the varint length of
    /// [`Envelope::encode`]'s bytes, then those bytes, written into one
    /// buffer sized for both (issue 14: a transport encoded the body, then
    /// copied it behind its prefix into a second buffer). Returns the
    /// buffer and the body's length (what a frame limit applies to).
    pub fn encode_length_delimited(&self) -> (Vec<u8>, usize) {
        use prost::encoding::{encode_varint, encoded_len_varint};
        match &self.message {
            Message::Obligation(ob) => {
                let body = obligation_body_len(ob);
                let len = obligation_frame_len(&self.sender, body);
                let mut out = Vec::with_capacity(encoded_len_varint(len as u64) + len);
                encode_varint(len as u64, &mut out);
                write_obligation_frame(&mut out, &self.sender, ob, body);
                (out, len)
            }
            _ => {
                let pb = self.to_pb();
                let len = pb.encoded_len();
                let mut out = Vec::with_capacity(encoded_len_varint(len as u64) + len);
                encode_varint(len as u64, &mut out);
                pb.encode_raw(&mut out);
                (out, len)
            }
        }
    }

    /// `Envelope::new(sender, Message::Obligation(ob)).encode().len()`,
    /// counted from the fields without building or encoding the frame: a
    /// node sizes every offer against its send queue's budget before it
    /// accepts it (issue 14: that was a second encode per obligation).
    pub fn obligation_len(sender: &AgentId, ob: &Obligation) -> usize {
        obligation_frame_len(sender, obligation_body_len(ob))
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The direct encoder writes exactly prost's bytes for every
        /// obligation frame: ids of any length (one- and two-byte length
        /// prefixes), payloads, scalars at and off their defaults,
        /// timestamps before and after the epoch, with and without a
        /// sequence (0 included).
        #[test]
        fn obligation_frames_are_prosts_bytes(
            id in "[a-z0-9-]{1,200}",
            sender in "[a-z]{1,150}",
            text in "[ -~]{0,300}",
            deadline in 1i64..100_000,
            retries in 0i64..64,
            created in -1_000_000_000_000_000i64..4_000_000_000_000_000,
            seq in proptest::option::of(prop_oneof![Just(0u64), any::<u64>()]),
        ) {
            let mut b = Obligation::builder()
                .id(id)
                .kind("anumati.consent")
                .target("receiver")
                .payload(serde_json::json!({"scope": text, "decision": "revoke"}))
                .deadline_seconds(deadline)
                .max_retries(retries)
                .created_at(crate::model::Timestamp::from_unix_micros(created));
            if let Some(s) = seq {
                b = b.sequence(s);
            }
            let Ok(ob) = b.build() else {
                return Ok(());
            };
            let Ok(sender) = AgentId::new(sender) else {
                return Ok(());
            };
            let env = Envelope::new(sender.clone(), Message::Obligation(ob.clone()));
            let direct = env.encode();
            prop_assert_eq!(&direct, &env.to_pb().encode_to_vec());
            prop_assert_eq!(direct.len(), Envelope::obligation_len(&sender, &ob));
            let (framed, len) = env.encode_length_delimited();
            prop_assert_eq!(len, direct.len());
            prop_assert_eq!(framed, env.to_pb().encode_length_delimited_to_vec());
        }
    }
}
