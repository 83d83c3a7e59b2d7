//! Store-and-forward frames (spec/protocol.md §7): [`Sealed`], relay
//! receipts and edge pull.
//!
//! A relay may route, hold, drop or replay a frame but never forge one: the
//! origin signs a [`Sealed`] wrapper over its own encoded envelope, and the
//! destination verifies it against the origin's **pinned** key before it
//! processes the inner envelope as if the origin had sent it. This module is
//! the pure part: the wire types, their codecs and the bytes the signature
//! covers ([`Sealed::signing_input`]); the checks that need no key
//! ([`Sealed::open`]) and the origin's dedup keys look inside an envelope
//! and live in `seal`. The signature scheme itself (ECDSA P-256 with the
//! node's identity key) lives with the keys, in `abhyasa-spool`.

use sha2::{Digest as _, Sha256};

use super::pb;
use crate::error::{FieldError, FieldProblem, PeerError};
use crate::model::{AgentId, Digest, ObligationId, Timestamp};

/// Domain tag that starts every signing input, so a signature over a sealed
/// frame can never be taken for a signature over anything else.
pub const SEAL_DOMAIN: &[u8] = b"abhyasa/sealed/v1\0";
/// Largest `dedup_key`, in bytes.
pub const MAX_DEDUP_KEY: usize = 64;
/// Largest `origin_cert` (DER), in bytes.
pub const MAX_ORIGIN_CERT: usize = 2048;
/// Largest `signature`, in bytes (an ASN.1 ECDSA P-256 signature is at most
/// 72).
pub const MAX_SIGNATURE: usize = 96;
/// Most keys one receipt or `Delivered` may name: bounds what a peer makes
/// us hold per frame.
pub const MAX_KEYS: usize = 4096;
/// Upper bound on what the wrapper adds around `inner` in a frame: the
/// outer envelope's version and hop sender, two agent ids, `expires_at`,
/// the largest dedup key, certificate and signature, and every protobuf tag
/// and length. A sealed frame whose inner envelope fits
/// [`max_inner`] always fits the frame limit (a test holds it to this).
pub const SEAL_OVERHEAD: usize = 3 * 256 + MAX_DEDUP_KEY + MAX_ORIGIN_CERT + MAX_SIGNATURE + 96;

/// The largest inner envelope that can be sealed into a frame of at most
/// `max_frame` bytes.
pub fn max_inner(max_frame: usize) -> usize {
    max_frame.saturating_sub(SEAL_OVERHEAD)
}

/// What a relay keys a spooled frame on: SHA-256 over the domain tag
/// `abhyasa/frame-key/v1`, origin, destination and dedup key. Receipts and
/// `Delivered` name frames by it; anyone can recompute it from the frame.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrameKey(pub [u8; 32]);

impl FrameKey {
    /// The key of a frame from `origin` to `destination` with `dedup_key`.
    pub fn of(origin: &AgentId, destination: &AgentId, dedup_key: &DedupKey) -> Self {
        let mut buf = Vec::with_capacity(24 + 2 * 256 + MAX_DEDUP_KEY);
        buf.extend_from_slice(b"abhyasa/frame-key/v1\0");
        put(&mut buf, origin.as_str().as_bytes());
        put(&mut buf, destination.as_str().as_bytes());
        put(&mut buf, dedup_key.as_bytes());
        FrameKey(Sha256::digest(&buf).into())
    }

    fn from_slice(field: &str, b: &[u8]) -> Result<Self, FieldError> {
        let arr: [u8; 32] = b
            .try_into()
            .map_err(|_| FieldError::invalid(field, format!("{} bytes, expected 32", b.len())))?;
        Ok(Self(arr))
    }

    /// Lowercase hex.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl std::fmt::Debug for FrameKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FrameKey({})", &self.to_hex()[..16])
    }
}

impl std::fmt::Display for FrameKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// The origin's deduplication key for a sealed frame: 1..=64 bytes. The
/// relay keeps one copy per (origin, destination, key), the newest, so
/// retransmissions while the destination is dark collapse to one entry.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DedupKey(pub(super) Vec<u8>);

impl DedupKey {
    /// Checks the length bound.
    pub fn new(field: &str, bytes: &[u8]) -> Result<Self, FieldError> {
        if bytes.is_empty() {
            return Err(FieldError::new(field, FieldProblem::Empty));
        }
        if bytes.len() > MAX_DEDUP_KEY {
            return Err(FieldError::new(
                field,
                FieldProblem::TooLong { max: MAX_DEDUP_KEY },
            ));
        }
        Ok(Self(bytes.to_vec()))
    }

    /// The key of every sealed copy of obligation `id` with `digest`: what
    /// a relay recomputes from an ack passing back to drop the frame the
    /// ack answers.
    pub fn for_obligation(id: &ObligationId, digest: &Digest) -> Self {
        let mut h = Sha256::new();
        h.update(b"obligation\0");
        h.update(id.as_str().as_bytes());
        h.update([0]);
        h.update(digest.0);
        Self(h.finalize().to_vec())
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for DedupKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DedupKey({})", hex::encode(&self.0))
    }
}

/// An origin's envelope wrapped for a relay (spec/protocol.md §7).
#[derive(Clone, PartialEq, Eq)]
pub struct Sealed {
    /// Who wrote and signed `inner`.
    pub origin: AgentId,
    /// Who `inner` is for.
    pub destination: AgentId,
    /// The relay holds the frame until min(`expires_at`, its `max_hold`)
    /// and never delivers it later. The destination does not rely on it:
    /// its receiver declines expired obligations itself (C-DL-1).
    pub expires_at: Timestamp,
    /// See [`DedupKey`].
    pub dedup_key: DedupKey,
    /// The origin's encoded [`Envelope`](super::Envelope) (no length prefix).
    pub inner: Vec<u8>,
    /// The origin's DER certificate; the destination checks its SHA-256
    /// against the fingerprint it pinned for `origin`.
    pub origin_cert: Vec<u8>,
    /// The origin's signature over [`signing_input`](Self::signing_input).
    pub signature: Vec<u8>,
}

impl std::fmt::Debug for Sealed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealed")
            .field("origin", &self.origin)
            .field("destination", &self.destination)
            .field("expires_at", &self.expires_at)
            .field("dedup_key", &self.dedup_key)
            .field("inner_len", &self.inner.len())
            .field("cert_len", &self.origin_cert.len())
            .field("sig_len", &self.signature.len())
            .finish()
    }
}

fn put(out: &mut Vec<u8>, field: &[u8]) {
    // Lengths are bounded by the frame limit, far below 4 GiB.
    out.extend_from_slice(&(field.len() as u32).to_be_bytes());
    out.extend_from_slice(field);
}

/// Why a sealed frame is not accepted at its destination. Peer faults: the
/// relay (or whoever built the frame) is to blame; nothing is applied or
/// discharged.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SealError {
    /// The frame is addressed to another agent (a misrouted or replayed
    /// frame).
    #[error("sealed frame for {destination} arrived at {local}")]
    WrongDestination {
        /// The frame's destination.
        destination: AgentId,
        /// This node.
        local: AgentId,
    },
    /// No key is pinned for the claimed origin.
    #[error("sealed frame from {0}, which is not a pinned peer")]
    UnknownOrigin(AgentId),
    /// The carried certificate is not the one pinned for the origin (a
    /// replay under another key).
    #[error("sealed frame from {0} carries a certificate that is not its pinned one")]
    CertificateNotPinned(AgentId),
    /// The signature does not verify over the frame (tampered).
    #[error("sealed frame from {0}: signature does not verify")]
    BadSignature(AgentId),
    /// The inner envelope's sender is not the origin.
    #[error("sealed frame from {origin} wraps an envelope from {sender}")]
    InnerSender {
        /// The frame's origin.
        origin: AgentId,
        /// The inner envelope's sender.
        sender: AgentId,
    },
    /// The inner envelope is itself a relay message (no nesting).
    #[error("sealed frame from {0} wraps a relay message")]
    Nested(AgentId),
    /// The inner bytes do not decode.
    #[error("sealed frame from {origin}: inner envelope: {error}")]
    Inner {
        /// The frame's origin.
        origin: AgentId,
        /// The decode error.
        error: PeerError,
    },
}

impl Sealed {
    /// The bytes the origin signs: [`SEAL_DOMAIN`], then origin,
    /// destination, `expires_at` (8 bytes big-endian micros), dedup key,
    /// inner and certificate, each byte string preceded by its length as 4
    /// bytes big-endian. Every field but the signature is covered, so a
    /// change to any of them breaks the signature.
    pub fn signing_input(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            SEAL_DOMAIN.len() + 64 + self.inner.len() + self.origin_cert.len() + 128,
        );
        out.extend_from_slice(SEAL_DOMAIN);
        put(&mut out, self.origin.as_str().as_bytes());
        put(&mut out, self.destination.as_str().as_bytes());
        out.extend_from_slice(&self.expires_at.unix_micros().to_be_bytes());
        put(&mut out, self.dedup_key.as_bytes());
        put(&mut out, &self.inner);
        put(&mut out, &self.origin_cert);
        out
    }

    /// The relay's key for this frame.
    pub fn key(&self) -> FrameKey {
        FrameKey::of(&self.origin, &self.destination, &self.dedup_key)
    }
}

/// Why a relay refused a frame (the wire's `RefusalCode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RefusalCode {
    /// The destination's queue is at its quota.
    DestinationQuota,
    /// The origin's share of the spool is at its quota.
    OriginQuota,
    /// The spool is full.
    SpoolFull,
    /// The frame had expired on arrival.
    Expired,
    /// The relay does not serve this destination.
    UnknownDestination,
    /// The frame is larger than the relay holds.
    TooLarge,
    /// The hop sender is not the origin or may not use this relay.
    Unauthorized,
}

impl RefusalCode {
    /// The snake_case name (as in JSON and metrics).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DestinationQuota => "destination_quota",
            Self::OriginQuota => "origin_quota",
            Self::SpoolFull => "spool_full",
            Self::Expired => "expired",
            Self::UnknownDestination => "unknown_destination",
            Self::TooLarge => "too_large",
            Self::Unauthorized => "unauthorized",
        }
    }

    fn to_pb(self) -> pb::RefusalCode {
        match self {
            Self::DestinationQuota => pb::RefusalCode::DestinationQuota,
            Self::OriginQuota => pb::RefusalCode::OriginQuota,
            Self::SpoolFull => pb::RefusalCode::SpoolFull,
            Self::Expired => pb::RefusalCode::Expired,
            Self::UnknownDestination => pb::RefusalCode::UnknownDestination,
            Self::TooLarge => pb::RefusalCode::TooLarge,
            Self::Unauthorized => pb::RefusalCode::Unauthorized,
        }
    }

    fn from_pb(v: i32) -> Result<Self, FieldError> {
        Ok(match pb::RefusalCode::try_from(v) {
            Ok(pb::RefusalCode::DestinationQuota) => Self::DestinationQuota,
            Ok(pb::RefusalCode::OriginQuota) => Self::OriginQuota,
            Ok(pb::RefusalCode::SpoolFull) => Self::SpoolFull,
            Ok(pb::RefusalCode::Expired) => Self::Expired,
            Ok(pb::RefusalCode::UnknownDestination) => Self::UnknownDestination,
            Ok(pb::RefusalCode::TooLarge) => Self::TooLarge,
            Ok(pb::RefusalCode::Unauthorized) => Self::Unauthorized,
            Ok(pb::RefusalCode::Unspecified) | Err(_) => {
                return Err(FieldError::new(
                    "refused.code",
                    FieldProblem::UnknownValue {
                        value: v.to_string(),
                        expected: "a known RefusalCode",
                    },
                ))
            }
        })
    }
}

/// One refused frame in a [`RelayReceipt`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The frame.
    pub key: FrameKey,
    /// Why.
    pub code: RefusalCode,
    /// Seconds after which a retry may succeed; 0 is no hint.
    pub retry_after_seconds: u32,
}

/// A relay's answer to sealed frames: **hop acceptance only**. It never
/// discharges or escalates custody; the custodian keeps its schedule.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct RelayReceipt {
    /// Frames now durable in the spool.
    pub accepted: Vec<FrameKey>,
    /// Frames refused, with a typed code.
    pub refused: Vec<Refusal>,
}

/// A relay message (spec/protocol.md §7).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum RelayMessage {
    /// An origin's sealed frame, origin → relay or relay → destination.
    Sealed(Box<Sealed>),
    /// Relay → origin: which frames are spooled, which refused.
    Receipt(RelayReceipt),
    /// Edge → relay: push me at most this much.
    Pull {
        /// Most frames to push.
        max_frames: u32,
        /// Most bytes (sum of frame sizes) to push.
        max_bytes: u64,
    },
    /// Relay → edge: the pull is served; this many frames still wait.
    PullDone {
        /// Frames left in the edge's queue.
        remaining: u64,
    },
    /// Edge → relay: these frames were handed to the node; drop them.
    Delivered(Vec<FrameKey>),
}

pub(super) fn to_pb(m: &RelayMessage) -> pb::envelope::Body {
    use pb::envelope::Body;
    match m {
        RelayMessage::Sealed(s) => Body::Sealed(pb::Sealed {
            origin: s.origin.to_string(),
            destination: s.destination.to_string(),
            expires_at_micros: s.expires_at.unix_micros(),
            dedup_key: s.dedup_key.as_bytes().to_vec(),
            inner: s.inner.clone(),
            origin_cert: s.origin_cert.clone(),
            signature: s.signature.clone(),
        }),
        RelayMessage::Receipt(r) => Body::RelayReceipt(pb::RelayReceipt {
            accepted: r.accepted.iter().map(|k| k.0.to_vec()).collect(),
            refused: r
                .refused
                .iter()
                .map(|x| pb::Refusal {
                    key: x.key.0.to_vec(),
                    code: x.code.to_pb() as i32,
                    retry_after_seconds: x.retry_after_seconds,
                })
                .collect(),
        }),
        RelayMessage::Pull {
            max_frames,
            max_bytes,
        } => Body::Pull(pb::Pull {
            max_frames: *max_frames,
            max_bytes: *max_bytes,
        }),
        RelayMessage::PullDone { remaining } => Body::PullDone(pb::PullDone {
            remaining: *remaining,
        }),
        RelayMessage::Delivered(keys) => Body::Delivered(pb::Delivered {
            keys: keys.iter().map(|k| k.0.to_vec()).collect(),
        }),
    }
}

fn bounded_bytes(field: &str, b: Vec<u8>, max: usize) -> Result<Vec<u8>, FieldError> {
    if b.is_empty() {
        return Err(FieldError::new(field, FieldProblem::Empty));
    }
    if b.len() > max {
        return Err(FieldError::new(field, FieldProblem::TooLong { max }));
    }
    Ok(b)
}

fn keys(field: &str, raw: &[Vec<u8>]) -> Result<Vec<FrameKey>, FieldError> {
    if raw.len() > MAX_KEYS {
        return Err(FieldError::new(
            field,
            FieldProblem::OutOfRange {
                allowed: format!("at most {MAX_KEYS} keys"),
            },
        ));
    }
    raw.iter().map(|k| FrameKey::from_slice(field, k)).collect()
}

pub(super) fn sealed_from_pb(s: pb::Sealed) -> Result<RelayMessage, PeerError> {
    Ok(RelayMessage::Sealed(Box::new(Sealed {
        origin: AgentId::parse_field("sealed.origin", &s.origin)?,
        destination: AgentId::parse_field("sealed.destination", &s.destination)?,
        expires_at: Timestamp::from_unix_micros(s.expires_at_micros),
        dedup_key: DedupKey::new("sealed.dedup_key", &s.dedup_key)?,
        // The outer frame limit already bounds the inner envelope.
        inner: bounded_bytes("sealed.inner", s.inner, usize::MAX)?,
        origin_cert: bounded_bytes("sealed.origin_cert", s.origin_cert, MAX_ORIGIN_CERT)?,
        signature: bounded_bytes("sealed.signature", s.signature, MAX_SIGNATURE)?,
    })))
}

pub(super) fn receipt_from_pb(r: pb::RelayReceipt) -> Result<RelayMessage, PeerError> {
    if r.refused.len() > MAX_KEYS {
        return Err(FieldError::new(
            "refused",
            FieldProblem::OutOfRange {
                allowed: format!("at most {MAX_KEYS} refusals"),
            },
        )
        .into());
    }
    let refused = r
        .refused
        .iter()
        .map(|x| {
            Ok(Refusal {
                key: FrameKey::from_slice("refused.key", &x.key)?,
                code: RefusalCode::from_pb(x.code)?,
                retry_after_seconds: x.retry_after_seconds,
            })
        })
        .collect::<Result<Vec<_>, FieldError>>()?;
    Ok(RelayMessage::Receipt(RelayReceipt {
        accepted: keys("accepted", &r.accepted)?,
        refused,
    }))
}

pub(super) fn pull_from_pb(p: pb::Pull) -> Result<RelayMessage, PeerError> {
    if p.max_frames == 0 {
        return Err(FieldError::new(
            "pull.max_frames",
            FieldProblem::OutOfRange {
                allowed: "at least 1".into(),
            },
        )
        .into());
    }
    Ok(RelayMessage::Pull {
        max_frames: p.max_frames,
        max_bytes: p.max_bytes,
    })
}

pub(super) fn delivered_from_pb(d: pb::Delivered) -> Result<RelayMessage, PeerError> {
    if d.keys.is_empty() {
        return Err(FieldError::new("delivered.keys", FieldProblem::Empty).into());
    }
    Ok(RelayMessage::Delivered(keys("delivered.keys", &d.keys)?))
}
