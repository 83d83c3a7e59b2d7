//! The fingerprint of a composed state: its canonical encoding (`encode`)
//! hashed (SHA-256, first 128 bits). What the encoding covers and leaves
//! out is said in `encode`.

use std::fmt::{self, Write as _};

use abhyasa_core::principal::WeightRange;
use abhyasa_core::{AgentId, Obligation};
use sha2::{Digest as _, Sha256};

use crate::encode::{
    custodian_snapshot_in, principal, receiver_snapshot, record, summary, t, Sink,
};
use crate::system::State;

/// What the model fixes for every state it fingerprints.
pub(crate) struct Fixed<'a> {
    /// The principal's weight range (clips restored weights).
    pub(crate) range: WeightRange,
    /// Every obligation of the configuration.
    pub(crate) obligations: &'a [Obligation],
    /// The custodian's agent id (the receiver's ledger is keyed by it).
    pub(crate) custodian: &'a AgentId,
}

/// Computes the fingerprint of `s`.
pub(crate) fn fingerprint(m: &Fixed<'_>, s: &State) -> u128 {
    let mut w = Sink(Sha256::new());
    // Writing into a hasher cannot fail.
    let _ = write_state(&mut w, m, s);
    let d = w.0.finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(&d[..16]);
    u128::from_le_bytes(b)
}

fn write_state(w: &mut Sink, m: &Fixed<'_>, s: &State) -> fmt::Result {
    write!(
        w,
        "t{} d{} x{} g{:?}|",
        s.now, s.duplications_left, s.crashes_left, s.ghost
    )?;

    let c = &s.custodian;
    write!(w, "C x{}|", c.crashes_left)?;
    custodian_snapshot_in(w, &c.durable, m.range)?;
    write!(w, "buf")?;
    for r in &c.buffer {
        record(w, r)?;
    }
    write!(w, "in{:?}|", c.inputs)?;
    for o in m.obligations {
        let id = o.id();
        write!(
            w,
            "{id}:{} {:?} ",
            c.live.is_pending(id),
            c.live.attempts(id)
        )?;
        if let Some(x) = c.live.terminal(id) {
            summary(w, x)?;
        }
    }
    write!(
        w,
        "timer{:?} u{} q{}|",
        c.live.poll_timeout().map(t),
        c.live.uncommitted_records(),
        c.live.queued_transmits()
    )?;
    principal(w, c.live.principal())?;

    let r = &s.receiver;
    write!(w, "R x{}|", r.crashes_left)?;
    receiver_snapshot(w, &r.durable)?;
    write!(w, "buf")?;
    for x in &r.buffer {
        record(w, x)?;
    }
    write!(w, "in{:?} prov{:?}|", r.inputs, r.provisional)?;
    for o in m.obligations {
        write!(
            w,
            "{}:{:?};",
            o.id(),
            r.live.ledger_outcome(m.custodian, o.id())
        )?;
    }
    write!(
        w,
        "eff{:?} u{}|",
        r.live.effects(),
        r.live.uncommitted_records()
    )?;

    write!(w, "N")?;
    for (k, (_, n)) in &s.network.frames {
        write!(w, "{k}*{n};")?;
    }
    Ok(())
}
