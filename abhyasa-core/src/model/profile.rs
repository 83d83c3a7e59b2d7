//! Per-kind custody profiles and the AB-2 sizing rule.

use std::time::Duration;

use super::Kind;
use crate::error::{FieldError, FieldProblem, ProfileError};

/// The custodian's retry backoff (AB-2): base, multiplier 2, cap, plus
/// bounded jitter. Not to be confused with the transports' reconnect
/// backoff (`abhyasa_transport::Backoff`), a different schedule.
///
/// The `k`-th interval (after attempt `k`, 1-based) is
/// `min(cap, base * 2^(k-1)) * (1 + jitter * u_k)` with `u_k` in `[0, 1)`
/// drawn from a seeded stream. Jitter only lengthens intervals, so the
/// deterministic schedule is a lower bound and the sizing rule
/// ([`min_retries_to_span`]) stays sufficient with jitter on.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RetryBackoff {
    /// First interval.
    pub base: Duration,
    /// Largest interval before jitter.
    pub cap: Duration,
    /// Jitter fraction in `[0, 1]`; `0` disables jitter.
    pub jitter: f64,
}

impl RetryBackoff {
    /// v1 default: base 1 s, cap 64 s, jitter 10 %.
    pub const DEFAULT: RetryBackoff = RetryBackoff {
        base: Duration::from_secs(1),
        cap: Duration::from_secs(64),
        jitter: 0.1,
    };

    /// The un-jittered interval after attempt `attempt` (1-based).
    pub fn nominal(&self, attempt: u32) -> Duration {
        let shift = attempt.saturating_sub(1).min(62);
        let base = self.base.as_micros().max(1);
        let raw = base.saturating_mul(1u128 << shift);
        Duration::from_micros(raw.min(self.cap.as_micros().max(1)) as u64)
    }

    /// The interval with jitter fraction `u` in `[0, 1)` applied.
    pub fn jittered(&self, attempt: u32, u: f64) -> Duration {
        let n = self.nominal(attempt);
        let extra = n.as_secs_f64() * self.jitter.clamp(0.0, 1.0) * u.clamp(0.0, 1.0);
        n + Duration::from_secs_f64(extra)
    }

    /// Checks base/cap positive and jitter in range.
    pub fn validate(&self) -> Result<(), FieldError> {
        if self.base.is_zero() {
            return Err(FieldError::new(
                "backoff_base_seconds",
                FieldProblem::OutOfRange {
                    allowed: "> 0".into(),
                },
            ));
        }
        if self.cap.is_zero() {
            return Err(FieldError::new(
                "backoff_cap_seconds",
                FieldProblem::OutOfRange {
                    allowed: "> 0".into(),
                },
            ));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(FieldError::new(
                "jitter",
                FieldProblem::OutOfRange {
                    allowed: "0..=1".into(),
                },
            ));
        }
        Ok(())
    }
}

impl Default for RetryBackoff {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The old name of [`RetryBackoff`]. Kept so code written against it (other
/// branches, embedders) still compiles while it moves to the new name.
#[deprecated(
    note = "renamed to `RetryBackoff` (the custody retry schedule, AB-2); \
            `abhyasa_transport::Backoff` is the transports' reconnect backoff"
)]
pub type Backoff = RetryBackoff;

/// The smallest `max_retries` whose capped schedule spans the deadline: the
/// least `n` with `sum_{k=1..n} min(cap, base * 2^(k-1)) >= deadline`.
///
/// Closed form: with `j` uncapped steps (`base * 2^(k-1) < cap`), the sum is
/// `base * (2^n - 1)` for `n <= j` and `base * (2^j - 1) + (n - j) * cap`
/// after. The float estimate is then corrected by at most a step or two
/// against that exact sum, so the answer is exact even at power-of-two edges.
/// This is the rule of the v1 reference (`KindProfile` validation).
pub fn min_retries_to_span(deadline_seconds: u64, base_seconds: f64, cap_seconds: f64) -> u64 {
    let d = deadline_seconds as f64;
    let (b, c) = (base_seconds, cap_seconds);
    if !(b > 0.0 && c > 0.0) || d <= 0.0 {
        return 0;
    }
    // Number of uncapped steps.
    let j: u64 = if b >= c {
        0
    } else {
        (c / b).log2().ceil().max(0.0) as u64
    };
    let j = j.min(1023);
    let sum = |n: u64| -> f64 {
        if n <= j {
            b * ((2f64).powi(n as i32) - 1.0)
        } else {
            b * ((2f64).powi(j as i32) - 1.0) + (n - j) as f64 * c
        }
    };
    let uncapped_total = sum(j);
    let mut n = if d <= uncapped_total {
        (d / b + 1.0).log2().ceil().max(0.0) as u64
    } else {
        j + ((d - uncapped_total) / c).ceil().max(0.0) as u64
    };
    while n > 0 && sum(n - 1) >= d {
        n -= 1;
    }
    while sum(n) < d {
        n += 1;
    }
    n
}

/// What the custodian does when a receiver declines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeclinePolicy {
    /// Apply `safe(O)` principal-side (the default).
    #[default]
    ApplySafe,
    /// Surface the decline with its reason as a decision-required item.
    Surface,
}

/// The v1 AgentCard per-kind custody profile (`KindProfile`).
#[derive(Clone, Debug, PartialEq)]
pub struct KindProfile {
    /// Obligation kind.
    pub kind: Kind,
    /// Where obligations of this kind are POSTed.
    pub obligation_endpoint: String,
    /// AB-1 custody deadline.
    pub deadline_seconds: u64,
    /// AB-2 retry bound.
    pub max_retries: u64,
    /// Backoff strategy; only `exponential` is defined in v1.
    pub backoff: String,
    /// First interval, seconds.
    pub backoff_base_seconds: f64,
    /// Interval cap, seconds.
    pub backoff_cap_seconds: u64,
}

impl KindProfile {
    /// Checks field ranges and the AB-2 sizing rule; the error names the
    /// minimum `max_retries`.
    pub fn validate(&self) -> Result<(), ProfileError> {
        if self.deadline_seconds == 0 {
            return Err(FieldError::new(
                "deadline_seconds",
                FieldProblem::OutOfRange {
                    allowed: "> 0".into(),
                },
            )
            .into());
        }
        if self.backoff != "exponential" {
            return Err(FieldError::new(
                "backoff",
                FieldProblem::UnknownValue {
                    value: self.backoff.clone(),
                    expected: "exponential",
                },
            )
            .into());
        }
        if !(self.backoff_base_seconds.is_finite() && self.backoff_base_seconds > 0.0) {
            return Err(FieldError::new(
                "backoff_base_seconds",
                FieldProblem::OutOfRange {
                    allowed: "> 0".into(),
                },
            )
            .into());
        }
        if self.backoff_cap_seconds == 0 {
            return Err(FieldError::new(
                "backoff_cap_seconds",
                FieldProblem::OutOfRange {
                    allowed: "> 0".into(),
                },
            )
            .into());
        }
        check_sizing(
            self.deadline_seconds,
            self.max_retries,
            self.backoff_base_seconds,
            self.backoff_cap_seconds as f64,
        )
    }

    /// The custodian backoff this profile describes (with `jitter`).
    pub fn backoff_with_jitter(&self, jitter: f64) -> RetryBackoff {
        RetryBackoff {
            base: Duration::from_secs_f64(self.backoff_base_seconds),
            cap: Duration::from_secs(self.backoff_cap_seconds),
            jitter,
        }
    }
}

/// The AB-2 sizing rule as a check.
pub(crate) fn check_sizing(
    deadline_seconds: u64,
    max_retries: u64,
    base_seconds: f64,
    cap_seconds: f64,
) -> Result<(), ProfileError> {
    let minimum = min_retries_to_span(deadline_seconds, base_seconds, cap_seconds);
    if max_retries < minimum {
        return Err(ProfileError::RetriesTooFew {
            max_retries,
            minimum,
            deadline_seconds,
            base_seconds,
            cap_seconds,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The v1 reference's loop, as an oracle.
    fn loop_min(d: u64, b: f64, c: f64) -> u64 {
        let (mut elapsed, mut n) = (0.0f64, 0u64);
        while elapsed < d as f64 {
            n += 1;
            elapsed += c.min(b * 2f64.powi((n - 1) as i32));
        }
        n
    }

    // C-AC-4: the closed form equals the reference loop.
    #[test]
    fn closed_form_matches_loop() {
        for d in [1u64, 2, 3, 7, 8, 63, 64, 65, 600, 3600, 86_400, 100_000] {
            for b in [0.1, 0.5, 1.0, 2.0, 3.0, 64.0] {
                for c in [1.0, 2.0, 30.0, 64.0, 300.0, 3600.0] {
                    assert_eq!(
                        min_retries_to_span(d, b, c),
                        loop_min(d, b, c),
                        "d={d} b={b} c={c}"
                    );
                }
            }
        }
        // Large deadline: no million-step loop needed.
        assert_eq!(min_retries_to_span(315_000_000, 1.0, 1.0), 315_000_000);
    }

    #[test]
    fn nominal_doubles_and_caps() {
        let b = RetryBackoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(10),
            jitter: 0.0,
        };
        let got: Vec<u64> = (1..=6).map(|k| b.nominal(k).as_secs()).collect();
        assert_eq!(got, vec![1, 2, 4, 8, 10, 10]);
        assert_eq!(b.nominal(500), Duration::from_secs(10));
    }
}
