//! The composed system: the real custodian and receiver, each with its
//! durable state (the fold of its committed records) and its write buffer,
//! an adversarial network, a virtual clock and ghost state.
//!
//! Each side follows the polling contract of `abhyasa_core::custody`: after
//! every input the driver drains `poll_records` into the side's write
//! buffer and sends whatever `poll_transmit` releases; a separate commit
//! step folds the buffer into the durable state and hands the token back,
//! which releases what waited behind it. A crash discards the buffer and
//! every volatile structure and restores the side from its durable state.

use std::collections::BTreeMap;

use abhyasa_core::custody::{
    CommitToken, Custodian, CustodianSnapshot, LedgerOutcome, Receiver, ReceiverSnapshot, Record,
    Transmit,
};
use abhyasa_core::wire::Message;
use abhyasa_core::Timestamp;
use sha2::{Digest as _, Sha256};

use crate::encode::Sink;
use std::fmt::Write as _;

/// Transition properties that were broken on the way to a state (they are
/// checked on each step and remembered, so the state predicates can report
/// them).
pub mod flag {
    /// The principal's newest sequence on a key went down.
    pub const PRINCIPAL_REGRESSED: u16 = 1;
    /// The receiver's newest applied sequence on a key went down.
    pub const RECEIVER_REGRESSED: u16 = 2;
    /// A durable terminal state changed or disappeared.
    pub const TERMINAL_REOPENED: u16 = 4;
    /// A durable attempt count went down.
    pub const ATTEMPTS_RESET: u16 = 8;
    /// The custodian scheduled a retry at or after the absolute deadline.
    pub const RETRY_AFTER_DEADLINE: u16 = 16;
}

/// The custodian, its durable state and its driver's write buffer.
#[derive(Clone, Debug)]
pub struct CustodianSide {
    /// The live state machine.
    pub live: Custodian,
    /// The fold of every committed record (what survives a crash).
    pub durable: CustodianSnapshot,
    /// Records polled but not yet committed.
    pub buffer: Vec<Record>,
    pub(crate) token: Option<CommitToken>,
    /// Inputs taken since the last commit (canonical descriptions).
    pub inputs: Vec<String>,
    /// Crashes the adversary may still cause.
    pub crashes_left: u8,
}

/// The receiver, its durable state and its driver's write buffer.
#[derive(Clone, Debug)]
pub struct ReceiverSide {
    /// The live state machine.
    pub live: Receiver,
    /// The fold of every committed record.
    pub durable: ReceiverSnapshot,
    /// Records polled but not yet committed.
    pub buffer: Vec<Record>,
    pub(crate) token: Option<CommitToken>,
    /// Inputs taken since the last commit.
    pub inputs: Vec<String>,
    /// Crashes the adversary may still cause.
    pub crashes_left: u8,
    /// Applications whose effect rides in the buffer: they happen if and
    /// only if the buffer is committed. `(obligation index, late)`.
    pub provisional: Vec<(usize, bool)>,
}

/// A frame in flight.
#[derive(Clone, Debug)]
pub struct Frame {
    /// Towards the receiver (else towards the custodian).
    pub to_receiver: bool,
    /// The message.
    pub message: Message,
}

/// The adversarial network: a multiset of in-flight frames, keyed by a
/// canonical description (readable summary plus a hash of the full
/// message).
#[derive(Clone, Debug, Default)]
pub struct Network {
    /// Frame key → (frame, copies in flight).
    pub frames: BTreeMap<String, (Frame, u8)>,
}

impl Network {
    /// Puts one copy of a frame in flight.
    pub fn push(&mut self, frame: Frame) {
        let key = frame_key(&frame);
        self.frames
            .entry(key)
            .and_modify(|(_, n)| *n = n.saturating_add(1))
            .or_insert((frame, 1));
    }

    /// Takes one copy of a frame out of flight.
    pub fn take(&mut self, key: &str) -> Option<Frame> {
        let (frame, n) = self.frames.get_mut(key)?;
        let frame = frame.clone();
        *n -= 1;
        if *n == 0 {
            self.frames.remove(key);
        }
        Some(frame)
    }

    /// Adds a copy of a frame already in flight.
    pub fn duplicate(&mut self, key: &str) -> bool {
        match self.frames.get_mut(key) {
            Some((_, n)) => {
                *n = n.saturating_add(1);
                true
            }
            None => false,
        }
    }

    /// Frames in flight, counting copies.
    pub fn len(&self) -> usize {
        self.frames.values().map(|(_, n)| usize::from(*n)).sum()
    }

    /// True when nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }
}

/// The canonical key of a frame: a readable summary for traces, then a
/// hash of the message's canonical form (`encode::message`), so frames
/// that differ in anything a decision reads never share a key. Frames that
/// differ only in data-only fields (an ack's `acked_at`, `detail`) do: the
/// multiset then keeps one concrete frame with the summed count.
pub fn frame_key(frame: &Frame) -> String {
    let mut h = Sink(Sha256::new());
    // Writing into a hasher cannot fail.
    let _ = write!(h, "{}", frame.to_receiver);
    let _ = crate::encode::message(&mut h, &frame.message);
    let hash = h.0.finalize();
    format!(
        "{} #{:02x}{:02x}{:02x}{:02x}",
        describe_message(&frame.message),
        hash[0],
        hash[1],
        hash[2],
        hash[3]
    )
}

/// A one-line description of a message.
pub fn describe_message(m: &Message) -> String {
    match m {
        Message::Obligation(o) => format!("obligation {}", o.id()),
        Message::Acks(acks) => {
            let parts: Vec<String> = acks
                .iter()
                .map(|a| {
                    let mut s = format!("{} {}", a.obligation_id, a.status);
                    if let Some(r) = a.reason {
                        s.push_str(&format!("({r})"));
                    }
                    s
                })
                .collect();
            format!("ack[{}]", parts.join(", "))
        }
        Message::Error(e) => format!("error {:?} {:?}", e.code, e.obligation_id),
        Message::StatusQuery(ids) => format!("status-query {ids:?}"),
        Message::StatusReply(r) => format!("status-reply {} known", r.known.len()),
        Message::Relay(r) => format!("relay {r:?}"),
    }
}

/// What the model remembers beyond the two state machines: ground truth
/// and broken transition properties.
#[derive(Clone, Debug, Default)]
pub struct Ghost {
    /// Per obligation: applications that took effect (committed with their
    /// ledger record, or — if no record carries them — at once).
    pub applications: Vec<u8>,
    /// Applications that took effect at or after `deadline - skew`.
    pub late_applications: u8,
    /// Per obligation: obligation frames the custodian released, over all
    /// incarnations.
    pub frames_sent: Vec<u8>,
    /// Broken transition properties ([`flag`]).
    pub flags: u16,
}

/// The whole composed state.
#[derive(Clone)]
pub struct State {
    /// Seconds since time 0.
    pub now: u64,
    /// The custodian side.
    pub custodian: CustodianSide,
    /// The receiver side.
    pub receiver: ReceiverSide,
    /// Frames in flight.
    pub network: Network,
    /// Ground truth.
    pub ghost: Ghost,
    /// Duplications the network may still make.
    pub duplications_left: u8,
    /// Crashes (of either side) the adversary may still cause.
    pub crashes_left: u8,
    pub(crate) fp: u128,
}

impl State {
    /// The canonical fingerprint (see `encode`).
    pub fn fingerprint(&self) -> u128 {
        self.fp
    }
}

impl std::hash::Hash for State {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.fp.hash(h);
    }
}

impl PartialEq for State {
    fn eq(&self, other: &Self) -> bool {
        self.fp == other.fp
    }
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "State(t={}s, fp={:032x})", self.now, self.fp)
    }
}

impl CustodianSide {
    /// Drains records into the buffer (logging the input that made them)
    /// and returns the transmits released now.
    pub(crate) fn after_input(&mut self, input: Option<String>) -> Vec<Transmit> {
        if let Some(batch) = self.live.poll_records() {
            self.token = Some(batch.token());
            self.buffer.extend(batch.records);
        }
        if !self.buffer.is_empty() {
            self.inputs.extend(input);
        }
        self.release()
    }

    /// Folds the buffer into the durable state and releases what waited.
    pub(crate) fn commit(&mut self) -> Vec<Transmit> {
        for r in self.buffer.drain(..) {
            self.durable.apply(&r);
        }
        if let Some(t) = self.token.take() {
            self.live.handle_committed(t);
        }
        self.inputs.clear();
        self.release()
    }

    fn release(&mut self) -> Vec<Transmit> {
        let out: Vec<Transmit> = std::iter::from_fn(|| self.live.poll_transmit()).collect();
        while self.live.poll_event().is_some() {}
        out
    }
}

impl ReceiverSide {
    /// Drains records into the buffer and returns the transmits released
    /// now, plus the records this input emitted.
    pub(crate) fn after_input(&mut self, input: Option<String>) -> (Vec<Transmit>, Vec<Record>) {
        let mut emitted = Vec::new();
        if let Some(batch) = self.live.poll_records() {
            self.token = Some(batch.token());
            emitted = batch.records.clone();
            self.buffer.extend(batch.records);
        }
        if !self.buffer.is_empty() {
            self.inputs.extend(input);
        }
        (self.release(), emitted)
    }

    /// Folds the buffer into the durable state, returns the applications
    /// that thereby took effect and the transmits released.
    pub(crate) fn commit(&mut self) -> (Vec<(usize, bool)>, Vec<Transmit>) {
        for r in self.buffer.drain(..) {
            self.durable.apply(&r);
        }
        if let Some(t) = self.token.take() {
            self.live.handle_committed(t);
        }
        self.inputs.clear();
        let done = std::mem::take(&mut self.provisional);
        (done, self.release())
    }

    fn release(&mut self) -> Vec<Transmit> {
        let out: Vec<Transmit> = std::iter::from_fn(|| self.live.poll_transmit()).collect();
        while self.live.poll_event().is_some() {}
        out
    }
}

/// True when `records` carry an `applied` ledger entry for `id` (the
/// effect rides in it).
pub(crate) fn carries_application(records: &[Record], id: &str) -> bool {
    records.iter().any(|r| {
        matches!(r, Record::Ledger(l)
            if l.outcome == LedgerOutcome::Applied && l.obligation_id.as_str() == id)
    })
}

/// `t0 + seconds`.
pub(crate) fn at(t0: Timestamp, seconds: u64) -> Timestamp {
    t0.saturating_add(std::time::Duration::from_secs(seconds))
}
