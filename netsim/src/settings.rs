//! What a sweep simulates: the channel model, the custody settings and the
//! (test-only) faults. Two runs with equal [`Model`], seed, [`SweepSettings`]
//! and [`Fault`] draw the same random streams, so their per-transfer results
//! are identical and their shards can be merged.

use std::time::Duration;

use abhyasa_check::sim::SweepConfig;
use abhyasa_core::model::{KindProfile, RetryBackoff};
use abhyasa_core::polarity::PHALA_KIND;
use abhyasa_core::ProfileError;

/// The channel model and random stream of a sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Model {
    /// `abhyasa_check::sim`: per-transfer ChaCha8 streams, link rates (drop,
    /// duplicate, ack-drop, reorder) drawn uniformly in `[0, 1)`, 20 ms
    /// latency, jittered backoff, a fraction of benign (best-effort)
    /// obligations; checked by the one invariant checker (`abhyasa_check`).
    Core,
    /// The public Python reference harness, draw for draw: CPython's
    /// MT19937 master stream, zero-latency round trips, no jitter (see
    /// [`crate::reference`]).
    ReferenceV1,
}

impl Model {
    /// The name used on the command line and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Model::Core => "core",
            Model::ReferenceV1 => "reference-v1",
        }
    }
}

/// A deliberately broken component, to prove the invariant checker is not
/// vacuous. Test-only: a sweep with a fault is never a result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// The receiver forgets its ledger before every delivery (as if the
    /// AB-3 record were never made durable), so a redelivery is applied
    /// again.
    LedgerDisabled,
}

impl Fault {
    /// The name used on the command line and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::LedgerDisabled => "ledger-disabled",
        }
    }
}

/// Custody and workload settings of a sweep (all obligations alike).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SweepSettings {
    /// Deadline of every obligation, seconds (AB-1).
    pub deadline_seconds: u64,
    /// `max_retries` of every obligation (AB-2).
    pub max_retries: u64,
    /// First backoff interval, seconds.
    pub backoff_base_seconds: f64,
    /// Backoff cap, whole seconds.
    pub backoff_cap_seconds: u64,
    /// Backoff jitter fraction in `[0, 1]`.
    pub jitter: f64,
    /// Fraction of benign (best-effort) obligations, in `[0, 1]`.
    pub benign_fraction: f64,
    /// Probability that the receiver defers every time, in `[0, 1]`.
    pub defer_probability: f64,
}

/// Why sweep settings were refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SettingsError {
    /// The custody profile breaks a field range or the AB-2 sizing rule.
    #[error(transparent)]
    Profile(#[from] ProfileError),
    /// A probability or fraction is outside `[0, 1]`.
    #[error("{name} must be in [0, 1], got {value}")]
    Probability {
        /// The setting.
        name: &'static str,
        /// Its value.
        value: f64,
    },
    /// The model fixes its settings; they cannot be changed.
    #[error(
        "--compat {model} reproduces the reference harness exactly and fixes every \
         setting (deadline 600 s, max_retries 64, backoff 1 s..64 s, no jitter, no \
         benign or deferring transfers); drop {flag}"
    )]
    Fixed {
        /// The model.
        model: &'static str,
        /// The flag that tried to change a setting.
        flag: &'static str,
    },
}

impl SweepSettings {
    /// The core sweep's defaults ([`SweepConfig::default`]).
    pub fn core_default() -> Self {
        let c = SweepConfig::default();
        Self {
            deadline_seconds: u64::try_from(c.deadline_seconds).unwrap_or(600),
            max_retries: u64::try_from(c.max_retries).unwrap_or(64),
            backoff_base_seconds: c.backoff.base.as_secs_f64(),
            backoff_cap_seconds: c.backoff.cap.as_secs(),
            jitter: c.backoff.jitter,
            benign_fraction: c.benign_fraction,
            defer_probability: c.defer_probability,
        }
    }

    /// The reference harness's fixed settings: Phala corrective, deadline
    /// 600 s, `max_retries` 64, backoff base 1 s, cap 64 s, no jitter.
    pub fn reference_v1() -> Self {
        Self {
            deadline_seconds: 600,
            max_retries: 64,
            backoff_base_seconds: 1.0,
            backoff_cap_seconds: 64,
            jitter: 0.0,
            benign_fraction: 0.0,
            defer_probability: 0.0,
        }
    }

    /// The defaults of `model`.
    pub fn default_for(model: Model) -> Self {
        match model {
            Model::Core => Self::core_default(),
            Model::ReferenceV1 => Self::reference_v1(),
        }
    }

    /// Checks ranges and the AB-2 sizing rule (the custodian would refuse
    /// every offer otherwise).
    pub fn validate(&self) -> Result<(), SettingsError> {
        for (name, value) in [
            ("--jitter", self.jitter),
            ("--benign-fraction", self.benign_fraction),
            ("--defer-probability", self.defer_probability),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return Err(SettingsError::Probability { name, value });
            }
        }
        KindProfile {
            kind: abhyasa_core::model::Kind::new(PHALA_KIND)
                .map_err(|e| SettingsError::Profile(e.into()))?,
            obligation_endpoint: "netsim".into(),
            deadline_seconds: self.deadline_seconds,
            max_retries: self.max_retries,
            backoff: "exponential".into(),
            backoff_base_seconds: self.backoff_base_seconds,
            backoff_cap_seconds: self.backoff_cap_seconds,
        }
        .validate()?;
        // The obligation builder takes i64 and caps both fields.
        if self.deadline_seconds > abhyasa_core::model::MAX_DEADLINE_SECONDS {
            return Err(SettingsError::Profile(
                abhyasa_core::FieldError::new(
                    "deadline_seconds",
                    abhyasa_core::FieldProblem::OutOfRange {
                        allowed: format!("1..={}", abhyasa_core::model::MAX_DEADLINE_SECONDS),
                    },
                )
                .into(),
            ));
        }
        if self.max_retries > u64::from(abhyasa_core::model::MAX_RETRIES_LIMIT) {
            return Err(SettingsError::Profile(
                abhyasa_core::FieldError::new(
                    "max_retries",
                    abhyasa_core::FieldProblem::OutOfRange {
                        allowed: format!("0..={}", abhyasa_core::model::MAX_RETRIES_LIMIT),
                    },
                )
                .into(),
            ));
        }
        Ok(())
    }

    /// The custodian backoff.
    pub fn backoff(&self) -> RetryBackoff {
        RetryBackoff {
            base: Duration::from_secs_f64(self.backoff_base_seconds),
            cap: Duration::from_secs(self.backoff_cap_seconds),
            jitter: self.jitter,
        }
    }

    /// The core engine's configuration for `seed`.
    pub fn core_config(&self, seed: u64) -> SweepConfig {
        SweepConfig {
            seed,
            // validate() keeps both far below i64::MAX.
            deadline_seconds: i64::try_from(self.deadline_seconds).unwrap_or(i64::MAX),
            max_retries: i64::try_from(self.max_retries).unwrap_or(i64::MAX),
            backoff: self.backoff(),
            benign_fraction: self.benign_fraction,
            defer_probability: self.defer_probability,
            fixed_link: None,
        }
    }

    /// Command-line flags that reproduce these settings for `model`
    /// (only those that differ from the model's defaults).
    pub fn flags(&self, model: Model) -> Vec<String> {
        let d = Self::default_for(model);
        let mut out = Vec::new();
        let mut push = |differs: bool, flag: &str, value: String| {
            if differs {
                out.push(format!("{flag} {value}"));
            }
        };
        push(
            self.deadline_seconds != d.deadline_seconds,
            "--deadline-seconds",
            self.deadline_seconds.to_string(),
        );
        push(
            self.max_retries != d.max_retries,
            "--max-retries",
            self.max_retries.to_string(),
        );
        push(
            self.backoff_base_seconds != d.backoff_base_seconds,
            "--backoff-base-seconds",
            self.backoff_base_seconds.to_string(),
        );
        push(
            self.backoff_cap_seconds != d.backoff_cap_seconds,
            "--backoff-cap-seconds",
            self.backoff_cap_seconds.to_string(),
        );
        push(self.jitter != d.jitter, "--jitter", self.jitter.to_string());
        push(
            self.benign_fraction != d.benign_fraction,
            "--benign-fraction",
            self.benign_fraction.to_string(),
        );
        push(
            self.defer_probability != d.defer_probability,
            "--defer-probability",
            self.defer_probability.to_string(),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_core_config_round_trips() {
        let s = SweepSettings::core_default();
        s.validate().unwrap();
        let c = s.core_config(5);
        let d = SweepConfig::default();
        assert_eq!(c.deadline_seconds, d.deadline_seconds);
        assert_eq!(c.max_retries, d.max_retries);
        assert_eq!(c.backoff, d.backoff);
        assert_eq!(c.benign_fraction, d.benign_fraction);
        assert!(s.flags(Model::Core).is_empty());
        SweepSettings::reference_v1().validate().unwrap();
    }

    #[test]
    fn incoherent_settings_are_refused_naming_the_minimum() {
        let s = SweepSettings {
            max_retries: 3,
            ..SweepSettings::core_default()
        };
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("max_retries >= 15"), "{e}");
        let s = SweepSettings {
            jitter: 1.5,
            ..SweepSettings::core_default()
        };
        assert!(matches!(
            s.validate(),
            Err(SettingsError::Probability {
                name: "--jitter",
                ..
            })
        ));
        let s = SweepSettings {
            deadline_seconds: 900,
            max_retries: 20,
            ..SweepSettings::core_default()
        };
        s.validate().unwrap();
        assert_eq!(
            s.flags(Model::Core),
            ["--deadline-seconds 900", "--max-retries 20"]
        );
    }
}
