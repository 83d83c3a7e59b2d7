//! Counters, gauges and histograms of a node, as a serializable snapshot.

use std::time::Duration;

use abhyasa_core::custody::CustodianStats;

/// A histogram with power-of-two buckets.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Histogram {
    /// `buckets[i]` counts values in `[2^i, 2^(i+1))` (bucket 0 also counts 0).
    pub buckets: Vec<u64>,
    /// Number of values.
    pub count: u64,
    /// Sum of values.
    pub sum: u64,
    /// Largest value.
    pub max: u64,
}

impl Histogram {
    /// Records one value.
    pub fn record(&mut self, v: u64) {
        let i = (64 - v.leading_zeros()).saturating_sub(1) as usize;
        if self.buckets.len() <= i {
            self.buckets.resize(i + 1, 0);
        }
        self.buckets[i] += 1;
        self.count += 1;
        self.sum = self.sum.saturating_add(v);
        self.max = self.max.max(v);
    }

    /// Upper bound of the bucket holding quantile `q` (0..=1).
    pub fn quantile(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let target = ((self.count as f64) * q.clamp(0.0, 1.0)).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= target {
                return (1u64 << (i + 1)).min(self.max.max(1));
            }
        }
        self.max
    }

    /// Mean value.
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum as f64 / self.count as f64
        }
    }
}

/// A point-in-time view of the node's metrics.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MetricsSnapshot {
    /// Obligations under custody now.
    pub pending: u64,
    /// Custody taken.
    pub opened: u64,
    /// Sent best-effort.
    pub best_effort: u64,
    /// Obligation transmissions (attempts).
    pub attempts_sent: u64,
    /// Discharged applied.
    pub applied: u64,
    /// Discharged declined.
    pub declined: u64,
    /// Escalated.
    pub escalated: u64,
    /// Late acks recorded.
    pub late_acks: u64,
    /// Acks ignored because they did not bind (wrong digest/receiver, unknown, invalid).
    pub acks_ignored: u64,
    /// Receiver-side applications.
    pub receiver_applied: u64,
    /// Receiver: obligations declined (any reason).
    #[serde(default)]
    pub receiver_declined: u64,
    /// Receiver: obligations declined `unauthorized`, from a peer whose
    /// policy does not let it issue them (C-AZ-1).
    #[serde(default)]
    pub receiver_unauthorized: u64,
    /// Frames received.
    pub frames_in: u64,
    /// Frames sent.
    pub frames_out: u64,
    /// Frames a transport could not queue (peer down, queue full).
    pub frames_unsent: u64,
    /// Malformed or unauthorized frames received.
    pub frames_bad: u64,
    /// Durable commits.
    pub commits: u64,
    /// Records per commit.
    pub commit_batch_records: Histogram,
    /// Commit latency, microseconds.
    pub commit_latency_us: Histogram,
    /// Offer-to-applied latency, microseconds.
    pub ack_latency_us: Histogram,
    /// Callers waiting in `outcome()` (abandoned ones are swept).
    #[serde(default)]
    pub outcome_waiters: u64,
    /// Replies held until their records commit.
    #[serde(default)]
    pub replies_held: u64,
    /// Best-effort obligations whose one send the transport refused.
    #[serde(default)]
    pub best_effort_refused: u64,
    /// Custody attempts the transport refused (retried on schedule).
    #[serde(default)]
    pub attempts_refused: u64,
    /// Frames refused: send queue full.
    #[serde(default)]
    pub send_queue_full: u64,
    /// Frames refused: peer unknown or not connected.
    #[serde(default)]
    pub send_not_connected: u64,
    /// Frames refused: larger than the frame limit.
    #[serde(default)]
    pub send_too_large: u64,
    /// Coalesced frames split in two to fit the frame limit.
    #[serde(default)]
    pub frames_split: u64,
    /// Frames a store-and-forward relay refused (any code; custody kept).
    #[serde(default)]
    pub relay_refused: u64,
    /// Peers with an authenticated direct connection up now (a gauge read
    /// from the transport when the snapshot is taken).
    #[serde(default)]
    pub peers_connected: u64,
}

impl MetricsSnapshot {
    pub(crate) fn absorb_custodian(&mut self, s: CustodianStats, pending: usize) {
        self.pending = pending as u64;
        self.opened = s.opened;
        self.best_effort = s.best_effort;
        self.attempts_sent = s.attempts_sent;
        self.attempts_refused = s.attempts_refused;
        self.applied = s.applied;
        self.declined = s.declined;
        self.escalated = s.escalated;
        self.late_acks = s.late_acks;
        self.acks_ignored = s.acks_unknown
            + s.acks_wrong_receiver
            + s.acks_wrong_digest
            + s.acks_missing_digest
            + s.acks_invalid;
    }

    pub(crate) fn record_ack_latency(&mut self, d: Duration) {
        self.ack_latency_us
            .record(u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_bound_the_values() {
        let mut h = Histogram::default();
        for v in 1..=1000u64 {
            h.record(v);
        }
        assert_eq!(h.count, 1000);
        let p50 = h.quantile(0.5);
        assert!((500..=1024).contains(&p50), "{p50}");
        assert_eq!(h.quantile(1.0), 1000);
        assert!((h.mean() - 500.5).abs() < 1e-9);
    }
}
