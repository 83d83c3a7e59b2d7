//! The reply gate: an answer to a command that changed (or read) state is
//! held until every record emitted before it is durable (C-ND-2).
//!
//! The state machines release their own transmits and events behind their
//! records; replies to commands are the driver's, so the driver holds them
//! here. The rule is simple and conservative: a reply waits for the commit
//! that contains the last record emitted when the reply was made. Replies
//! whose records are already durable go out at once. If the node stops or a
//! commit fails first, the held replies are dropped and every caller gets
//! an error (`NodeError::Stopped`), never a success.

use std::collections::VecDeque;

/// A reply to send once its commit is durable; it reads the context `C`
/// (the driver) when it is sent, so it can report what the commit released.
pub(crate) type Held<C> = Box<dyn FnOnce(&C) + Send>;

/// Counts commit jobs and holds replies behind them.
pub(crate) struct ReplyGate<C> {
    /// Commit jobs handed to the store.
    sent: u64,
    /// Commit jobs that returned durable.
    done: u64,
    /// Records in the job in flight (0 when none is).
    in_flight_records: u64,
    /// Replies in commit order: `(job number that releases it, reply)`.
    held: VecDeque<(u64, Held<C>)>,
}

impl<C> Default for ReplyGate<C> {
    fn default() -> Self {
        Self {
            sent: 0,
            done: 0,
            in_flight_records: 0,
            held: VecDeque::new(),
        }
    }
}

impl<C> std::fmt::Debug for ReplyGate<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplyGate")
            .field("sent", &self.sent)
            .field("done", &self.done)
            .field("held", &self.held.len())
            .finish()
    }
}

impl<C> ReplyGate<C> {
    /// A commit job of `records` records was handed to the store.
    pub(crate) fn job_sent(&mut self, records: u64) {
        self.sent += 1;
        self.in_flight_records = records;
    }

    /// The job in flight committed: the replies it releases, in order.
    pub(crate) fn job_done(&mut self) -> Vec<Held<C>> {
        self.done = self.sent;
        self.in_flight_records = 0;
        let mut out = Vec::new();
        while self.held.front().is_some_and(|(n, _)| *n <= self.done) {
            if let Some((_, r)) = self.held.pop_front() {
                out.push(r);
            }
        }
        out
    }

    /// Gives `reply` back to be sent now if `uncommitted` (records emitted
    /// and not yet durable, both machines) is zero; otherwise holds it
    /// until the job that will contain the newest of them commits: the one
    /// in flight if every uncommitted record is in it, else the next one.
    #[must_use]
    pub(crate) fn hold(&mut self, uncommitted: u64, reply: Held<C>) -> Option<Held<C>> {
        if uncommitted == 0 {
            return Some(reply);
        }
        let in_flight = self.sent > self.done;
        let job = if in_flight && uncommitted <= self.in_flight_records {
            self.sent
        } else {
            self.sent + 1
        };
        self.held.push_back((job, reply));
        None
    }

    /// Replies waiting for a commit.
    pub(crate) fn held(&self) -> usize {
        self.held.len()
    }

    /// Drops every held reply (their callers see the node stopped).
    pub(crate) fn fail_all(&mut self) {
        self.held.clear();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    fn counter() -> (Arc<AtomicUsize>, impl Fn() -> Held<()>) {
        let n = Arc::new(AtomicUsize::new(0));
        let m = n.clone();
        (n, move || {
            let m = m.clone();
            Box::new(move |_: &()| {
                m.fetch_add(1, Ordering::SeqCst);
            })
        })
    }

    fn hold(g: &mut ReplyGate<()>, uncommitted: u64, r: Held<()>) {
        if let Some(r) = g.hold(uncommitted, r) {
            r(&());
        }
    }

    // C-ND-2: a reply behind unpolled records waits for the next job, not
    // the one in flight.
    #[test]
    fn c_nd_2_reply_waits_for_the_job_holding_its_records() {
        let (n, make) = counter();
        let mut g = ReplyGate::default();
        hold(&mut g, 0, make());
        assert_eq!(n.load(Ordering::SeqCst), 1, "nothing uncommitted: at once");
        g.job_sent(3);
        // Only the in-flight records are uncommitted.
        hold(&mut g, 3, make());
        // Two more emitted after the job was sent.
        hold(&mut g, 5, make());
        assert_eq!(n.load(Ordering::SeqCst), 1);
        for r in g.job_done() {
            r(&());
        }
        assert_eq!(n.load(Ordering::SeqCst), 2, "only the in-flight one");
        assert_eq!(g.held(), 1);
        g.job_sent(2);
        for r in g.job_done() {
            r(&());
        }
        assert_eq!(n.load(Ordering::SeqCst), 3);
        hold(&mut g, 1, make());
        g.fail_all();
        assert_eq!(g.held(), 0);
    }
}
