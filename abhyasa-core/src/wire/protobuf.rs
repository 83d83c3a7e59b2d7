//! The protobuf codec: an [`Envelope`] to and from one protobuf `Envelope`
//! (schema `spec/abhyasa.proto`, compiled at build time with `protox`, no
//! system `protoc`). Decoding never panics and never skips data silently:
//! an unknown version or message type is a typed [`PeerError`].

use prost::Message as _;

use super::code::ErrorCode;
use super::message::{Envelope, Message, ProtocolError, StatusReply};
use super::pb;
use super::relay::{self, RelayMessage};
use super::PROTOCOL_VERSION;
use crate::error::{FieldError, FieldProblem, PeerError};
use crate::model::{
    AckStatus, AgentId, CustodyAck, DeclineReason, Digest, Kind, Obligation, ObligationId, Payload,
    Timestamp,
};

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
            Some(DeclineReason::Unauthorized) => pb::DeclineReason::Unauthorized,
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
        Ok(pb::DeclineReason::Unauthorized) => Some(DeclineReason::Unauthorized),
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

/// The fields of a protobuf `Obligation`, borrowed from a decoded
/// message or straight from a frame's bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct ObligationFields<'a> {
    obligation_id: &'a str,
    kind: &'a str,
    target: &'a str,
    payload_json: &'a [u8],
    deadline_seconds: u64,
    max_retries: u32,
    created_at_micros: i64,
    sequence: Option<u64>,
    digest: &'a [u8],
}

impl<'a> ObligationFields<'a> {
    fn of(p: &'a pb::Obligation) -> Self {
        Self {
            obligation_id: &p.obligation_id,
            kind: &p.kind,
            target: &p.target,
            payload_json: &p.payload_json,
            deadline_seconds: p.deadline_seconds,
            max_retries: p.max_retries,
            created_at_micros: p.created_at_micros,
            sequence: p.sequence,
            digest: &p.digest,
        }
    }
}

fn obligation_from_pb(p: ObligationFields<'_>) -> Result<Obligation, PeerError> {
    obligation_from_pb_with(p, &mut Names::default())
}

/// The names one stream's frames repeat — its sender, and the target and
/// kind of its obligations — kept from the last frame that named them:
/// one that names the same again gets the same id (a reference count, not
/// a new allocation and another validation of the same text).
/// A name is reused only for the exact text it was validated from.
#[derive(Clone, Debug, Default)]
pub(crate) struct Names {
    sender: Option<AgentId>,
    target: Option<AgentId>,
    kind: Option<Kind>,
}

impl Names {
    /// The id `slot` holds if it was validated from `s`, else `s` parsed
    /// (and kept in `slot` for the next frame).
    fn reuse<T: Clone>(
        slot: &mut Option<T>,
        s: &str,
        text: fn(&T) -> &str,
        parse: impl FnOnce(&str) -> Result<T, FieldError>,
    ) -> Result<T, FieldError> {
        if let Some(id) = slot.as_ref().filter(|id| text(id) == s) {
            return Ok(id.clone());
        }
        let id = parse(s)?;
        *slot = Some(id.clone());
        Ok(id)
    }
}

fn obligation_from_pb_with(
    p: ObligationFields<'_>,
    names: &mut Names,
) -> Result<Obligation, PeerError> {
    let payload = Payload::from_json_bytes(p.payload_json)?;
    // Validated straight from the decoded strings (no copy into the
    // builder first), in the builder's order.
    let mut b = Obligation::builder()
        .with_id(ObligationId::parse_field("obligation_id", p.obligation_id)?)
        .with_kind(Names::reuse(&mut names.kind, p.kind, Kind::as_str, |s| {
            Kind::parse_field("kind", s)
        })?)
        .with_target(Names::reuse(
            &mut names.target,
            p.target,
            AgentId::as_str,
            |s| AgentId::parse_field("target", s),
        )?)
        .deadline_seconds(i64::try_from(p.deadline_seconds).unwrap_or(i64::MAX))
        .max_retries(i64::from(p.max_retries))
        .created_at(Timestamp::from_unix_micros(p.created_at_micros));
    if let Some(s) = p.sequence {
        b = b.sequence(s);
    }
    let ob = b.build_with_payload(payload)?;
    if let Some(claimed) = opt_digest("digest", p.digest)? {
        if claimed != ob.digest() {
            return Err(PeerError::DigestMismatch {
                claimed,
                computed: ob.digest(),
            });
        }
    }
    Ok(ob)
}

/// The hot frame read in place: an `Envelope { version, sender,
/// Obligation }` whose fields each appear at most once, with the wire
/// types the schema gives them and valid UTF-8 in its strings, borrowed
/// from `bytes` (prost copied every string and byte field into
/// a message of its own, six allocations per obligation, before they were
/// validated into the obligation). `None` for anything else — another
/// message, an unknown or repeated field, a bad key, varint or string —
/// which the caller decodes with prost, so every such frame gets prost's
/// reading and its error: where this accepts, it reads what prost reads
/// (a property test checks both on arbitrary and mutated frames).
fn obligation_frame(mut buf: &[u8]) -> Option<(u32, &str, ObligationFields<'_>)> {
    use prost::encoding::{decode_key, decode_varint, WireType};
    fn delimited<'a>(buf: &mut &'a [u8]) -> Option<&'a [u8]> {
        let n = usize::try_from(decode_varint(buf).ok()?).ok()?;
        let (head, rest) = buf.split_at_checked(n)?;
        *buf = rest;
        Some(head)
    }
    fn text<'a>(buf: &mut &'a [u8]) -> Option<&'a str> {
        std::str::from_utf8(delimited(buf)?).ok()
    }
    fn once(seen: &mut u16, tag: u32) -> Option<()> {
        let bit = 1u16 << tag;
        (*seen & bit == 0).then(|| *seen |= bit)
    }
    let (mut version, mut sender, mut body) = (0u32, "", None);
    let mut seen = 0u16;
    while !buf.is_empty() {
        let (tag, wire) = decode_key(&mut buf).ok()?;
        match (tag, wire) {
            (1, WireType::Varint) => {
                once(&mut seen, 1)?;
                // uint32: prost keeps the low 32 bits of the varint.
                version = decode_varint(&mut buf).ok()? as u32;
            }
            (2, WireType::LengthDelimited) => {
                once(&mut seen, 2)?;
                sender = text(&mut buf)?;
            }
            (10, WireType::LengthDelimited) => {
                once(&mut seen, 10)?;
                body = Some(delimited(&mut buf)?);
            }
            _ => return None,
        }
    }
    let mut buf = body?;
    let mut f = ObligationFields::default();
    let mut seen = 0u16;
    while !buf.is_empty() {
        let (tag, wire) = decode_key(&mut buf).ok()?;
        if tag > 9 {
            return None;
        }
        once(&mut seen, tag)?;
        match (tag, wire) {
            (1, WireType::LengthDelimited) => f.obligation_id = text(&mut buf)?,
            (2, WireType::LengthDelimited) => f.kind = text(&mut buf)?,
            (3, WireType::LengthDelimited) => f.target = text(&mut buf)?,
            (4, WireType::LengthDelimited) => f.payload_json = delimited(&mut buf)?,
            (5, WireType::Varint) => f.deadline_seconds = decode_varint(&mut buf).ok()?,
            (6, WireType::Varint) => f.max_retries = decode_varint(&mut buf).ok()? as u32,
            (7, WireType::Varint) => f.created_at_micros = decode_varint(&mut buf).ok()? as i64,
            (8, WireType::Varint) => f.sequence = Some(decode_varint(&mut buf).ok()?),
            (9, WireType::LengthDelimited) => f.digest = delimited(&mut buf)?,
            _ => return None,
        }
    }
    Some((version, sender, f))
}

/// The version check both readings share: an absent version (proto3
/// reads it as 0) is a malformed frame, another one a version we do not
/// speak.
fn check_version(version: u32) -> Result<(), PeerError> {
    if version == 0 {
        return Err(PeerError::Malformed {
            format: "protobuf",
            detail: "envelope has no protocol version".into(),
        });
    }
    if version != PROTOCOL_VERSION {
        return Err(PeerError::UnsupportedVersion {
            found: version,
            supported: PROTOCOL_VERSION,
        });
    }
    Ok(())
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
            // (encode each frame once, no copies per field).
            Message::Obligation(ob) => encode_obligation_frame(&self.sender, ob),
            _ => self.to_pb().encode_to_vec(),
        }
    }

    /// The frame as a stream carries it: the varint length of
    /// [`Envelope::encode`]'s bytes, then those bytes, written into one
    /// buffer sized for both (a transport encoded the body, then
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
    /// accepts it (that was a second encode per obligation).
    pub fn obligation_len(sender: &AgentId, ob: &Obligation) -> usize {
        obligation_frame_len(sender, obligation_body_len(ob))
    }

    /// Decodes an envelope (no length prefix).
    pub fn decode(bytes: &[u8]) -> Result<Envelope, PeerError> {
        Self::decode_with(bytes, &mut Names::default())
    }

    /// [`Envelope::decode`], reusing the names `names` holds from earlier
    /// frames of the same stream (a [`super::FrameDecoder`]'s).
    pub(crate) fn decode_with(bytes: &[u8], names: &mut Names) -> Result<Envelope, PeerError> {
        if let Some((version, sender, ob)) = obligation_frame(bytes) {
            check_version(version)?;
            let sender = Names::reuse(&mut names.sender, sender, AgentId::as_str, |s| {
                AgentId::parse_field("sender", s)
            })?;
            let message = Message::Obligation(obligation_from_pb_with(ob, names)?);
            return Ok(Envelope { sender, message });
        }
        Self::decode_prost(bytes)
    }

    /// Decodes an envelope with prost (every message but the hot frame
    /// [`obligation_frame`] reads in place).
    fn decode_prost(bytes: &[u8]) -> Result<Envelope, PeerError> {
        let p = pb::Envelope::decode(bytes).map_err(|e| PeerError::Malformed {
            format: "protobuf",
            detail: e.to_string(),
        })?;
        check_version(p.version)?;
        let sender = AgentId::parse_field("sender", &p.sender)?;
        use pb::envelope::Body;
        let message = match p.body {
            None => return Err(PeerError::UnknownMessageType),
            Some(Body::Obligation(o)) => {
                Message::Obligation(obligation_from_pb(ObligationFields::of(&o))?)
            }
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

    /// One field of a generated frame: a tag, a wire type and its bytes
    /// (a varint's value or a length-delimited field's content).
    #[derive(Debug, Clone)]
    enum Field {
        Varint(u32, u64),
        Delimited(u32, Vec<u8>),
        /// Raw bytes: a broken key, a fixed-width field, garbage.
        Raw(Vec<u8>),
    }

    fn put(out: &mut Vec<u8>, f: &Field) {
        use prost::encoding::{encode_key, encode_varint, WireType};
        match f {
            Field::Varint(t, v) => {
                encode_key(*t, WireType::Varint, out);
                encode_varint(*v, out);
            }
            Field::Delimited(t, b) => {
                encode_key(*t, WireType::LengthDelimited, out);
                encode_varint(b.len() as u64, out);
                out.extend_from_slice(b);
            }
            Field::Raw(b) => out.extend_from_slice(b),
        }
    }

    fn encode(fields: &[Field]) -> Vec<u8> {
        let mut out = Vec::new();
        for f in fields {
            put(&mut out, f);
        }
        out
    }

    /// Tags near the schema's (its own, its neighbours, a far one).
    fn tag() -> impl Strategy<Value = u32> {
        prop_oneof![4 => 1u32..=11, 1 => Just(20u32), 1 => 1u32..=1_000]
    }

    /// A string field's content: an id-like text, any text, or bytes
    /// that need not be UTF-8.
    fn text() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            "[a-z0-9.-]{0,40}".prop_map(String::into_bytes),
            ".{0,8}".prop_map(String::into_bytes),
            proptest::collection::vec(any::<u8>(), 0..12),
        ]
    }

    fn varint() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(0u64),
            1u64..100,
            Just(u64::from(u32::MAX) + 7),
            any::<u64>()
        ]
    }

    /// A field of an `Obligation` message: mostly the schema's, some
    /// with the wrong wire type, unknown tags and raw bytes.
    fn obligation_field() -> impl Strategy<Value = Field> {
        prop_oneof![
            6 => (prop_oneof![Just(1u32), Just(2), Just(3)], text())
                .prop_map(|(t, b)| Field::Delimited(t, b)),
            2 => Just(Field::Delimited(4, br#"{"weight_delta":-0.1}"#.to_vec())),
            1 => proptest::collection::vec(any::<u8>(), 0..24)
                .prop_map(|b| Field::Delimited(4, b)),
            4 => (prop_oneof![Just(5u32), Just(6), Just(7), Just(8)], varint())
                .prop_map(|(t, v)| Field::Varint(t, v)),
            2 => prop_oneof![
                proptest::collection::vec(any::<u8>(), 32),
                proptest::collection::vec(any::<u8>(), 0..40),
            ]
            .prop_map(|b| Field::Delimited(9, b)),
            1 => (tag(), varint()).prop_map(|(t, v)| Field::Varint(t, v)),
            1 => (tag(), text()).prop_map(|(t, b)| Field::Delimited(t, b)),
            1 => proptest::collection::vec(any::<u8>(), 1..6).prop_map(Field::Raw),
        ]
    }

    /// A Phala update to `receiver`, as the properties below send it.
    fn phala(
        id: String,
        delta: f64,
        deadline: i64,
        retries: i64,
        seq: Option<u64>,
        created: i64,
    ) -> Obligation {
        let mut b = Obligation::builder()
            .id(id)
            .kind(crate::polarity::PHALA_KIND)
            .target("receiver")
            .payload(serde_json::json!({"weight_delta": delta}))
            .deadline_seconds(deadline)
            .max_retries(retries)
            .created_at(crate::model::Timestamp::from_unix_micros(created));
        if let Some(s) = seq {
            b = b.sequence(s);
        }
        b.build().expect("a valid obligation")
    }

    /// A valid obligation's fields as a node writes them (digest and
    /// all), in the schema's order.
    fn valid_obligation() -> impl Strategy<Value = Vec<Field>> {
        (
            "[a-z0-9-]{1,40}",
            -1.0f64..1.0,
            1i64..100_000,
            0i64..20,
            proptest::option::of(any::<u64>()),
            0i64..4_000_000_000_000_000,
        )
            .prop_map(|(id, delta, deadline, retries, seq, created)| {
                let ob = phala(id, delta, deadline, retries, seq, created);
                let mut fs = vec![
                    Field::Delimited(1, ob.id().as_str().into()),
                    Field::Delimited(2, ob.kind().as_str().into()),
                    Field::Delimited(3, ob.target().as_str().into()),
                    Field::Delimited(4, ob.payload().canonical_json().into()),
                    Field::Varint(5, ob.deadline_seconds()),
                    Field::Varint(6, u64::from(ob.max_retries())),
                    Field::Varint(7, ob.created_at().unix_micros() as u64),
                ];
                if let Some(s) = ob.sequence() {
                    fs.push(Field::Varint(8, s.0));
                }
                fs.push(Field::Delimited(9, ob.digest().0.to_vec()));
                fs
            })
    }

    /// One change to a list of fields: a field inserted (or repeated), one
    /// removed or given another tag, two swapped (prost reads fields in
    /// any order).
    #[derive(Debug, Clone)]
    enum Edit {
        Insert(proptest::sample::Index, Field),
        Retag(proptest::sample::Index, u32),
        Repeat(proptest::sample::Index),
        Remove(proptest::sample::Index),
        Swap(proptest::sample::Index, proptest::sample::Index),
    }

    fn edit(field: impl Strategy<Value = Field>) -> impl Strategy<Value = Edit> {
        use proptest::sample::Index;
        prop_oneof![
            (any::<Index>(), field).prop_map(|(i, f)| Edit::Insert(i, f)),
            any::<Index>().prop_map(Edit::Repeat),
            (any::<Index>(), tag()).prop_map(|(i, t)| Edit::Retag(i, t)),
            any::<Index>().prop_map(Edit::Remove),
            (any::<Index>(), any::<Index>()).prop_map(|(i, j)| Edit::Swap(i, j)),
        ]
    }

    fn apply(fs: &mut Vec<Field>, edits: &[Edit]) {
        for e in edits {
            let n = fs.len();
            match e {
                Edit::Insert(i, f) => fs.insert(i.index(n + 1), f.clone()),
                Edit::Repeat(i) if n > 0 => {
                    let f = fs[i.index(n)].clone();
                    fs.push(f);
                }
                Edit::Retag(i, t) if n > 0 => match &mut fs[i.index(n)] {
                    Field::Varint(tag, _) | Field::Delimited(tag, _) => *tag = *t,
                    Field::Raw(_) => {}
                },
                Edit::Remove(i) if n > 0 => {
                    fs.remove(i.index(n));
                }
                Edit::Swap(i, j) if n > 0 => fs.swap(i.index(n), j.index(n)),
                _ => {}
            }
        }
    }

    /// An envelope as a node writes it — version, sender, a valid
    /// obligation — or with edits to either level's fields, then perhaps
    /// a byte changed or the frame cut short; now and then any bytes.
    fn frame() -> impl Strategy<Value = Vec<u8>> {
        let envelope_field = prop_oneof![
            prop_oneof![Just(1u64), Just(0), varint()].prop_map(|v| Field::Varint(1, v)),
            text().prop_map(|b| Field::Delimited(2, b)),
            proptest::collection::vec(obligation_field(), 0..12)
                .prop_map(|fs| Field::Delimited(10, encode(&fs))),
            (tag(), varint()).prop_map(|(t, v)| Field::Varint(t, v)),
            (tag(), text()).prop_map(|(t, b)| Field::Delimited(t, b)),
            proptest::collection::vec(any::<u8>(), 1..6).prop_map(Field::Raw),
        ];
        let edits = |f| {
            prop_oneof![
                2 => Just(Vec::new()),
                1 => proptest::collection::vec(edit(f), 1..3),
            ]
        };
        let built = (
            valid_obligation(),
            edits(obligation_field().boxed()),
            edits(envelope_field.boxed()),
            prop_oneof![3 => Just(None), 1 => any::<(proptest::sample::Index, u8)>().prop_map(Some)],
            prop_oneof![3 => Just(None), 1 => any::<proptest::sample::Index>().prop_map(Some)],
        )
            .prop_map(|(mut ob, ob_edits, env_edits, flip, cut)| {
                apply(&mut ob, &ob_edits);
                let mut env = vec![
                    Field::Varint(1, u64::from(PROTOCOL_VERSION)),
                    Field::Delimited(2, b"sender".to_vec()),
                    Field::Delimited(10, encode(&ob)),
                ];
                apply(&mut env, &env_edits);
                let mut b = encode(&env);
                if let (Some((i, x)), false) = (flip, b.is_empty()) {
                    let i = i.index(b.len());
                    b[i] ^= x;
                }
                if let (Some(i), false) = (cut, b.is_empty()) {
                    b.truncate(i.index(b.len()));
                }
                b
            });
        prop_oneof![
            8 => built,
            1 => proptest::collection::vec(any::<u8>(), 0..64),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// Where the in-place reading of the hot frame accepts a frame,
        /// it reads what prost reads, field for field; and the envelope
        /// decoded either way is the same envelope or the same error, on
        /// well-formed frames and on every kind of damaged one.
        #[test]
        fn the_in_place_reading_is_prosts(bytes in frame()) {
            let prost = pb::Envelope::decode(&bytes[..]);
            if let Some((version, sender, fields)) = obligation_frame(&bytes) {
                let p = prost.as_ref().expect("prost reads a frame the fast path reads");
                prop_assert_eq!(version, p.version);
                prop_assert_eq!(sender, p.sender.as_str());
                match &p.body {
                    Some(pb::envelope::Body::Obligation(o)) => {
                        prop_assert_eq!(fields, ObligationFields::of(o));
                    }
                    other => prop_assert!(false, "prost read {other:?}"),
                }
            }
            prop_assert_eq!(Envelope::decode(&bytes), Envelope::decode_prost(&bytes));
        }

        /// Every obligation frame a node writes is read in place.
        #[test]
        fn written_obligation_frames_are_read_in_place(
            id in "[a-z0-9-]{1,64}",
            delta in -1.0f64..1.0,
            seq in proptest::option::of(any::<u64>()),
        ) {
            let ob = phala(id, delta, 60, 3, seq, 1_700_000_000_000_000);
            let env = Envelope::new(AgentId::new("sender").unwrap(), Message::Obligation(ob));
            let bytes = env.encode();
            prop_assert!(obligation_frame(&bytes).is_some());
            prop_assert_eq!(Envelope::decode(&bytes), Ok(env));
        }
    }

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
