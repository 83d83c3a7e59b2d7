//! Bounds of one model-checking run: the obligations, the custody profile,
//! the clock and the adversary's budgets.

use std::fmt;
use std::str::FromStr;

use abhyasa_core::DeclinePolicy;

/// Wraps every step of the state machines; the mutation tests pass one that
/// switches a defect on (see `abhyasa_core::mutations`), normal runs pass
/// [`unmutated`].
pub type Scope = fn(&mut dyn FnMut());

/// The identity scope: the real, unmutated core.
pub fn unmutated(step: &mut dyn FnMut()) {
    step();
}

/// One obligation of the model: an Anumati consent decision on a scope.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObligationSpec {
    /// Short name used in traces (`O1`, `O2`, `B1`).
    pub label: &'static str,
    /// Its obligation id.
    pub id: &'static str,
    /// The consent scope (the governed key is derived from it).
    pub scope: &'static str,
    /// `revoke` / `restrict` (admissible) or `grant` (best-effort).
    pub decision: &'static str,
    /// Issuance order on its governed key.
    pub sequence: u64,
}

impl ObligationSpec {
    /// The two admissible obligations on one governed key (sequences 1, 2)
    /// and one benign grant on another key.
    pub fn standard() -> Vec<ObligationSpec> {
        vec![
            ObligationSpec {
                label: "O1",
                id: "o1",
                scope: "s",
                decision: "revoke",
                sequence: 1,
            },
            ObligationSpec {
                label: "O2",
                id: "o2",
                scope: "s",
                decision: "restrict",
                sequence: 2,
            },
            ObligationSpec {
                label: "B1",
                id: "b1",
                scope: "b",
                decision: "grant",
                sequence: 1,
            },
        ]
    }
}

/// The named preset configurations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// Seconds in debug; for quick iteration and the mutation tests.
    Small,
    /// The CI configuration: at least 31,250 distinct states, crashes on.
    Default,
    /// Larger bounds (deferral, a crash of each side), run behind
    /// `#[ignore]`; figures in `tla/README.md`.
    Large,
}

impl FromStr for Preset {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "small" => Ok(Preset::Small),
            "default" => Ok(Preset::Default),
            "large" => Ok(Preset::Large),
            other => Err(format!(
                "unknown configuration {other:?}: expected small | default | large"
            )),
        }
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Preset::Small => "small",
            Preset::Default => "default",
            Preset::Large => "large",
        })
    }
}

/// Bounds of one run. Every obligation is created at time 0 with the same
/// custody profile; time is whole seconds since then.
#[derive(Clone)]
pub struct CheckConfig {
    /// Name shown in reports.
    pub name: String,
    /// The obligations (admissibility comes from the real polarity rules).
    pub obligations: Vec<ObligationSpec>,
    /// `deadline_seconds` of every obligation.
    pub deadline_seconds: u64,
    /// `max_retries` of every obligation.
    pub max_retries: u32,
    /// Backoff base, seconds (no jitter: every timer falls on a whole second).
    pub backoff_base_seconds: u64,
    /// Backoff cap, seconds.
    pub backoff_cap_seconds: u64,
    /// The receiver's clock-skew margin, seconds.
    pub skew_margin_seconds: u64,
    /// Offers may happen while `now` is below this.
    pub offer_window_seconds: u64,
    /// The clock never passes this.
    pub horizon_seconds: u64,
    /// How many times the network may duplicate a frame in one run.
    pub duplications: u8,
    /// How many times the custodian may crash in one run.
    pub custodian_crashes: u8,
    /// How many times the receiver may crash in one run.
    pub receiver_crashes: u8,
    /// How many crashes, of either side, one run may have in all.
    pub total_crashes: u8,
    /// Whether the receiver's applier may answer `deferred`.
    pub allow_defer: bool,
    /// Whether it may answer `deferred` again when asked about an
    /// obligation it already deferred.
    pub defer_again: bool,
    /// Whether acks that only concern best-effort obligations stay in
    /// flight. The custodian ignores them (they carry no custody meaning),
    /// so leaving them out — as `Abhyasa.tla`'s `AckOut` does — removes
    /// only no-op deliveries.
    pub benign_acks_in_flight: bool,
    /// What the custodian does on a decline.
    pub decline_policy: DeclinePolicy,
    /// Wraps every state-machine step (mutation switch).
    pub scope: Scope,
}

impl fmt::Debug for CheckConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let labels: Vec<&str> = self.obligations.iter().map(|o| o.label).collect();
        write!(
            f,
            "{}: obligations {:?}, deadline {}s, max_retries {}, backoff {}s..{}s, \
             skew {}s, offers before {}s, horizon {}s, duplications {}, \
             crashes custodian {} receiver {} total {}, defer {} (again {}), \
             benign acks in flight {}, decline policy {:?}",
            self.name,
            labels,
            self.deadline_seconds,
            self.max_retries,
            self.backoff_base_seconds,
            self.backoff_cap_seconds,
            self.skew_margin_seconds,
            self.offer_window_seconds,
            self.horizon_seconds,
            self.duplications,
            self.custodian_crashes,
            self.receiver_crashes,
            self.total_crashes,
            self.allow_defer,
            self.defer_again,
            self.benign_acks_in_flight,
            self.decline_policy,
        )
    }
}

impl CheckConfig {
    /// A preset.
    pub fn preset(p: Preset) -> Self {
        match p {
            Preset::Small => Self::small(),
            Preset::Default => Self::default_ci(),
            Preset::Large => Self::large(),
        }
    }

    /// Small: the two admissible obligations on one key, no benign one;
    /// deadline 3 s, `max_retries` 2 (the minimum that spans it with base
    /// 1 s, cap 2 s); loss and reordering; one crash of either side.
    pub fn small() -> Self {
        Self {
            name: "small".into(),
            obligations: ObligationSpec::standard()
                .into_iter()
                .filter(|o| o.label != "B1")
                .collect(),
            ..Self::default_ci()
        }
    }

    /// The CI configuration: O1, O2 (sequences 1, 2 on one key) and the
    /// benign B1; deadline 3 s, `max_retries` 2, skew 1 s; loss and
    /// reordering of any frame; one crash, of the custodian or of the
    /// receiver, at any commit point; the applier applies or declines.
    pub fn default_ci() -> Self {
        Self {
            name: "default".into(),
            obligations: ObligationSpec::standard(),
            deadline_seconds: 3,
            max_retries: 2,
            backoff_base_seconds: 1,
            backoff_cap_seconds: 2,
            skew_margin_seconds: 1,
            offer_window_seconds: 1,
            horizon_seconds: 4,
            duplications: 0,
            custodian_crashes: 1,
            receiver_crashes: 1,
            total_crashes: 1,
            allow_defer: false,
            defer_again: false,
            benign_acks_in_flight: false,
            decline_policy: DeclinePolicy::ApplySafe,
            scope: unmutated,
        }
    }

    /// The large configuration (behind `#[ignore]`): the CI bounds plus
    /// deferral (the applier may defer each obligation once, and a deferral
    /// may be completed by applying or declining) and a crash of each side
    /// in the same run. Every default behaviour is also a large one. Run
    /// depth-first: it is exhaustive and complete in minutes, but its
    /// breadth-first frontier would need many gigabytes. Adding a duplication
    /// multiplies it by about 4 (tens of minutes); see `tla/README.md`. The
    /// mutation tests search it for their counterexamples.
    pub fn large() -> Self {
        Self {
            name: "large".into(),
            total_crashes: 2,
            allow_defer: true,
            ..Self::default_ci()
        }
    }

    /// Overrides one bound from `key=value` (see the binary's `--set`).
    pub fn set(&mut self, kv: &str) -> Result<(), String> {
        let (k, v) = kv.split_once('=').ok_or("expected KEY=VALUE")?;
        let num = |v: &str| v.parse::<u64>().map_err(|e| format!("{v}: {e}"));
        let small = |v: &str| v.parse::<u8>().map_err(|e| format!("{v}: {e}"));
        let flag = |v: &str| v.parse::<bool>().map_err(|e| format!("{v}: {e}"));
        match k {
            "obligations" => {
                let all = ObligationSpec::standard();
                self.obligations = v
                    .split(',')
                    .map(|l| {
                        all.iter()
                            .find(|o| o.label == l)
                            .cloned()
                            .ok_or_else(|| format!("unknown obligation {l}"))
                    })
                    .collect::<Result<_, _>>()?;
            }
            "deadline" => self.deadline_seconds = num(v)?,
            "max_retries" => self.max_retries = small(v)?.into(),
            "base" => self.backoff_base_seconds = num(v)?,
            "cap" => self.backoff_cap_seconds = num(v)?,
            "skew" => self.skew_margin_seconds = num(v)?,
            "offer_window" => self.offer_window_seconds = num(v)?,
            "horizon" => self.horizon_seconds = num(v)?,
            "dups" => self.duplications = small(v)?,
            "custodian_crashes" => self.custodian_crashes = small(v)?,
            "receiver_crashes" => self.receiver_crashes = small(v)?,
            "defer" => self.allow_defer = flag(v)?,
            "defer_again" => self.defer_again = flag(v)?,
            "total_crashes" => self.total_crashes = small(v)?,
            "benign_acks" => self.benign_acks_in_flight = flag(v)?,
            "surface" => {
                self.decline_policy = if flag(v)? {
                    DeclinePolicy::Surface
                } else {
                    DeclinePolicy::ApplySafe
                }
            }
            other => return Err(format!("unknown key {other}")),
        }
        self.name = format!("{}[{kv}]", self.name);
        Ok(())
    }

    /// The same bounds with a mutation scope.
    pub fn with_scope(mut self, name: &str, scope: Scope) -> Self {
        self.name = format!("{}+{name}", self.name);
        self.scope = scope;
        self
    }
}
