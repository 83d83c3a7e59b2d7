//! The canonical fingerprint of a composed state.
//!
//! The core types do not implement `Hash`, and their maps iterate in a
//! per-instance order, so the checker builds its own canonical encoding and
//! hashes it (SHA-256, first 128 bits). The encoding covers:
//!
//! * both durable states, map entries sorted by key, principal writes
//!   folded into the state they restore;
//! * both write buffers (the uncommitted records, in order) and the inputs
//!   taken since the last commit — together with the durable state they
//!   determine everything volatile, including transmits still held behind
//!   the buffer;
//! * what the live state machines expose publicly (pending ids and their
//!   attempts, terminal summaries, the next timer, principal state, ledger
//!   outcomes, receiver effects, uncommitted/held counts), so a divergence
//!   between live and durable state can never be hashed away;
//! * the in-flight multiset, the clock, the adversary's budgets and the
//!   ghost state.
//!
//! # Data-only fields
//!
//! Some fields are carried and stored but never read by any decision of the
//! core nor by any property: the instants at which something was recorded
//! (`closed_at`, `escalated_at`, `recorded_at`, `acked_at`, `received_at`,
//! `raised_at`, `offered_at`, a principal write's `at`), free-text `detail`
//! and `last_error`, `receiver_instance`, and an obligation's content
//! beyond its id and digest (the digest covers it). The encoding leaves
//! them out: two states that differ only there have the same futures up to
//! those fields, so merging them loses no behaviour and no violation. The
//! network multiset is keyed the same way (see `system::frame_key`).
//! Everything a decision reads — deadlines, `next_at`, attempt counts,
//! sequences, statuses, reasons, digests, guard outcomes — is encoded.

use std::fmt::{self, Write as _};

use abhyasa_core::custody::{
    ClosedRecord, CustodianSnapshot, CustodyOutcome, LedgerRecord, PendingRecord, ReceiverSnapshot,
    Record, TerminalSummary,
};
use abhyasa_core::principal::{PrincipalState, PrincipalWrite, WeightRange};
use abhyasa_core::wire::Message;
use abhyasa_core::{Digest, Escalation, Obligation, Timestamp};
use sha2::{Digest as _, Sha256};

/// A `fmt::Write` that feeds a hasher.
pub(crate) struct Sink(pub(crate) Sha256);

impl fmt::Write for Sink {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.update(s.as_bytes());
        Ok(())
    }
}

pub(crate) fn t(x: Timestamp) -> i64 {
    x.unix_micros()
}

fn dg(d: &Digest) -> u64 {
    d.prefix_u64()
}

fn ob(w: &mut dyn fmt::Write, o: &Obligation) -> fmt::Result {
    write!(w, "{}#{:x}", o.id(), dg(&o.digest()))
}

fn pending(w: &mut dyn fmt::Write, p: &PendingRecord) -> fmt::Result {
    ob(w, &p.obligation)?;
    write!(w, " a{} n{} d{};", p.attempts, t(p.next_at), p.deferred)
}

pub(crate) fn summary(w: &mut dyn fmt::Write, s: &TerminalSummary) -> fmt::Result {
    write!(
        w,
        "{}#{:x} {:?} dl{} late{};",
        s.obligation_id,
        dg(&s.digest),
        s.state,
        t(s.deadline_at),
        s.late_ack_recorded
    )
}

fn escalation(w: &mut dyn fmt::Write, e: &Escalation) -> fmt::Result {
    write!(
        w,
        "{}#{:x} a{} {:?} {:?} {:?} dl{};",
        e.obligation_id,
        dg(&e.digest),
        e.attempts,
        e.cause,
        e.trigger,
        e.guard,
        t(e.deadline_at)
    )
}

fn principal_write(w: &mut dyn fmt::Write, p: &PrincipalWrite) -> fmt::Result {
    match p {
        PrincipalWrite::Authorization { key, entry } => write!(
            w,
            "auth {key} {:?} {:?} {:?};",
            entry.state, entry.sequence, entry.source
        ),
        PrincipalWrite::Weight { key, value } => write!(w, "weight {key} {value};"),
        PrincipalWrite::DecisionRaised(i) => {
            write!(w, "raise {} {:?};", i.obligation_id, i.reason)
        }
        PrincipalWrite::DecisionClosed { obligation_id } => write!(w, "close {obligation_id};"),
        PrincipalWrite::Issued {
            key,
            sequence,
            obligation_id,
        } => write!(w, "issued {key} {sequence} {obligation_id};"),
    }
}

fn closed(w: &mut dyn fmt::Write, c: &ClosedRecord) -> fmt::Result {
    write!(w, "closed {}#{:x} ", c.obligation_id, dg(&c.digest))?;
    match &c.outcome {
        CustodyOutcome::Applied => write!(w, "applied")?,
        CustodyOutcome::Declined {
            reason,
            disposition,
            ..
        } => write!(w, "declined {reason:?} {disposition:?}")?,
        CustodyOutcome::Escalated => write!(w, "escalated")?,
    }
    write!(w, " a{} dl{} [", c.attempts, t(c.deadline_at))?;
    for p in &c.principal {
        principal_write(w, p)?;
    }
    write!(w, "]")?;
    if let Some(e) = &c.escalation {
        escalation(w, e)?;
    }
    write!(w, ";")
}

fn ledger(w: &mut dyn fmt::Write, l: &LedgerRecord) -> fmt::Result {
    write!(
        w,
        "ledger {}/{}#{:x} {:?} {:?} {:?} {:?} dl{} kept{};",
        l.custodian,
        l.obligation_id,
        dg(&l.digest),
        l.outcome,
        l.reason,
        l.effect,
        l.key_sequence,
        t(l.deadline_at),
        l.obligation.as_ref().map(|o| dg(&o.digest())).unwrap_or(0)
    )
}

/// The canonical form of one record.
pub(crate) fn record(w: &mut dyn fmt::Write, r: &Record) -> fmt::Result {
    match r {
        Record::CustodyOpened {
            pending: p,
            principal,
        } => {
            write!(w, "opened ")?;
            pending(w, p)?;
            for x in principal {
                principal_write(w, x)?;
            }
            Ok(())
        }
        Record::AttemptMade {
            obligation_id,
            attempts,
            next_at,
        } => write!(w, "attempt {obligation_id} a{attempts} n{};", t(*next_at)),
        Record::DeferralSeen { obligation_id } => write!(w, "deferral {obligation_id};"),
        Record::CustodyClosed(c) => closed(w, c),
        Record::BestEffortSent {
            summary: s,
            principal,
        } => {
            write!(w, "best-effort ")?;
            summary(w, s)?;
            for x in principal {
                principal_write(w, x)?;
            }
            Ok(())
        }
        Record::Principal { writes, .. } => {
            write!(w, "principal ")?;
            writes.iter().try_for_each(|x| principal_write(w, x))
        }
        Record::LateAck(rec) => write!(w, "late {} {:?};", rec.obligation_id, rec.status),
        Record::Ledger(l) => ledger(w, l),
        Record::Intent(i) => {
            write!(w, "intent {} ", i.custodian)?;
            ob(w, &i.obligation)?;
            write!(w, " {:?};", i.intent)
        }
    }
}

/// The canonical form of one message (see "Data-only fields").
pub(crate) fn message(w: &mut dyn fmt::Write, msg: &Message) -> fmt::Result {
    match msg {
        Message::Obligation(o) => {
            write!(w, "ob ")?;
            ob(w, o)
        }
        Message::Acks(acks) => {
            write!(w, "acks")?;
            for a in acks {
                write!(
                    w,
                    " {}@{} {:?} {:x} {:?};",
                    a.obligation_id,
                    a.target,
                    a.status,
                    a.digest.as_ref().map_or(0, dg),
                    a.reason
                )?;
            }
            Ok(())
        }
        Message::Error(e) => write!(
            w,
            "error {:?} {:?} {:x}",
            e.code,
            e.obligation_id,
            e.digest.as_ref().map_or(0, dg)
        ),
        Message::StatusQuery(ids) => write!(w, "query {ids:?}"),
        Message::StatusReply(r) => {
            write!(w, "reply {} {:?}", r.target, r.unknown)?;
            message(w, &Message::Acks(r.known.clone()))
        }
        // The checker's network never carries relay frames.
        Message::Relay(r) => write!(w, "relay {r:?}"),
    }
}

pub(crate) fn principal(w: &mut dyn fmt::Write, p: &PrincipalState) -> fmt::Result {
    let mut auth: Vec<_> = p.authorizations().collect();
    auth.sort_by(|a, b| a.0.cmp(b.0));
    for (k, e) in auth {
        write!(w, "A {k} {:?} {:?} {:?};", e.state, e.sequence, e.source)?;
    }
    let mut weights: Vec<_> = p.weights().collect();
    weights.sort_by(|a, b| a.0.cmp(b.0));
    write!(w, "W{weights:?}")?;
    for d in p.decisions() {
        write!(w, "D {} {:?};", d.obligation_id, d.reason)?;
    }
    write!(w, "|")
}

/// The principal state a restore from `d` rebuilds, weights clipped to
/// `range`.
pub(crate) fn fold_principal_in(d: &CustodianSnapshot, range: WeightRange) -> PrincipalState {
    let mut p = PrincipalState::new(range);
    for wr in &d.principal {
        p.apply_write(wr);
    }
    p
}

/// The canonical form of a custodian's durable state.
pub(crate) fn custodian_snapshot_in(
    w: &mut Sink,
    d: &CustodianSnapshot,
    range: WeightRange,
) -> fmt::Result {
    let mut p: Vec<_> = d.pending.iter().collect();
    p.sort_by(|a, b| a.0.cmp(b.0));
    write!(w, "P")?;
    for (_, x) in p {
        pending(w, x)?;
    }
    let mut term: Vec<_> = d.terminal.iter().collect();
    term.sort_by(|a, b| a.0.cmp(b.0));
    write!(w, "T")?;
    for (_, x) in term {
        summary(w, x)?;
    }
    principal(w, &fold_principal_in(d, range))?;
    write!(w, "E")?;
    for e in &d.escalations {
        escalation(w, e)?;
    }
    write!(w, "L")?;
    for r in &d.reconciliations {
        write!(w, "{} {:?};", r.obligation_id, r.status)?;
    }
    write!(w, "|")
}

/// The canonical form of a receiver's durable state.
pub(crate) fn receiver_snapshot(w: &mut Sink, d: &ReceiverSnapshot) -> fmt::Result {
    let mut l: Vec<_> = d.ledger.iter().collect();
    l.sort_by(|a, b| a.0.cmp(b.0));
    for (_, x) in l {
        ledger(w, x)?;
    }
    let mut seqs: Vec<_> = d.key_sequences.iter().collect();
    seqs.sort_by(|a, b| a.0.cmp(b.0));
    write!(w, "S{seqs:?} E{:?}", d.effects)?;
    let mut intents: Vec<_> = d.intents.iter().collect();
    intents.sort_by(|a, b| a.0.cmp(b.0));
    for (_, i) in intents {
        record(w, &Record::Intent(Box::new(i.clone())))?;
    }
    write!(w, "|")
}
