//! Test-only defect injection for the model checker's mutation tests
//! (`tla/checker`).
//!
//! Compiled only with the `mutations` cargo feature, which no production
//! build enables. Even when compiled in, every switch is off: a test turns
//! defects on for the current thread only, for the duration of one closure
//! ([`with`]), so other tests in the same process — and other crates whose
//! test build unifies the feature in — run the real behaviour.
//!
//! Each [`Mutation`] re-introduces one defect the protocol rules forbid, so
//! the checker can show that it finds a counterexample for it.

use std::cell::Cell;
use std::time::Duration;

use crate::model::Timestamp;

/// A known defect the model checker must catch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mutation {
    /// AB-3 broken: the receiver's `applied` ledger record (which carries the
    /// effect) is never emitted, so the effect is not committed with the
    /// ledger entry and the ack is released with nothing durable behind it.
    LedgerNotCommittedWithEffect,
    /// "Declined ≠ applied" broken: the custodian closes a declined
    /// obligation as applied, without `safe(O)`.
    DeclineAsApplied,
    /// AB-2 broken: recovery restarts the custody window instead of
    /// resuming the remaining one.
    DeadlineRestartedOnRecovery,
    /// Supersession broken: the receiver-side sequence guard is off.
    SupersessionGuardOff,
    /// C-AZ-2 broken: the receiver holds a governed key without its
    /// issuer, so every peer writes the same state.
    IssuerNotInKey,
    /// C-OR-1 broken: the custodian assigns no default sequence to an
    /// obligation its caller gave none.
    NoDefaultSequence,
}

impl Mutation {
    /// Every mutation.
    pub const ALL: [Mutation; 6] = [
        Mutation::LedgerNotCommittedWithEffect,
        Mutation::DeclineAsApplied,
        Mutation::DeadlineRestartedOnRecovery,
        Mutation::SupersessionGuardOff,
        Mutation::IssuerNotInKey,
        Mutation::NoDefaultSequence,
    ];

    fn bit(self) -> u8 {
        match self {
            Mutation::LedgerNotCommittedWithEffect => 1,
            Mutation::DeclineAsApplied => 2,
            Mutation::DeadlineRestartedOnRecovery => 4,
            Mutation::SupersessionGuardOff => 8,
            Mutation::IssuerNotInKey => 16,
            Mutation::NoDefaultSequence => 32,
        }
    }
}

thread_local! {
    static ACTIVE: Cell<u8> = const { Cell::new(0) };
}

/// Restores the previous switch set when dropped (also on panic).
struct Restore(u8);

impl Drop for Restore {
    fn drop(&mut self) {
        ACTIVE.with(|a| a.set(self.0));
    }
}

/// Runs `f` with `mutations` switched on for the current thread, then
/// restores the previous set.
pub fn with<R>(mutations: &[Mutation], f: impl FnOnce() -> R) -> R {
    let bits = mutations.iter().fold(0u8, |b, m| b | m.bit());
    let _restore = Restore(ACTIVE.with(|a| a.replace(bits)));
    f()
}

/// Whether `m` is switched on for the current thread.
pub fn active(m: Mutation) -> bool {
    ACTIVE.with(|a| a.get() & m.bit() != 0)
}

/// The deadline a restored pending transfer gets: the real absolute one,
/// or — under [`Mutation::DeadlineRestartedOnRecovery`] — a fresh window.
/// `restore` has no clock, so the transfer's next scheduled attempt (at or
/// after the last one made before the crash) stands in for the restart
/// instant.
pub(crate) fn deadline_on_recovery(
    deadline_at: Timestamp,
    next_at: Timestamp,
    deadline_seconds: u64,
) -> Timestamp {
    if active(Mutation::DeadlineRestartedOnRecovery) {
        next_at.saturating_add(Duration::from_secs(deadline_seconds))
    } else {
        deadline_at
    }
}
