//! Bounds and switches of one hostile-relay run.

use std::fmt;

use crate::config::{unmutated, Scope};

/// Who the second issuer is to the edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecondIssuer {
    /// No second issuer: alice alone, over the hostile network.
    None,
    /// A pinned peer of the edge that issues a consent grant in its own
    /// name on alice's scope (what a relay holding its own pinned key can
    /// do).
    Peer,
}

/// One of alice's decisions on scope `s`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Grant (best-effort, widening) or revoke (under custody, withholding).
    pub grant: bool,
    /// The sequence her caller gives it (`None`: none, as `abhyasa send`
    /// does by default, so whatever it carries is what her node assigns;
    /// `Some`: a caller-sequenced decision, as a leased grant's renewal
    /// chain is).
    pub caller_sequence: Option<u64>,
}

impl Decision {
    /// A grant without a caller-given sequence.
    pub const GRANT: Decision = Decision {
        grant: true,
        caller_sequence: None,
    };
    /// A revoke without a caller-given sequence.
    pub const REVOKE: Decision = Decision {
        grant: false,
        caller_sequence: None,
    };

    /// `grant` / `revoke`, optionally `@SEQUENCE`.
    fn parse(s: &str) -> Result<Self, String> {
        let (word, seq) = match s.split_once('@') {
            Some((w, q)) => (w, Some(q.parse::<u64>().map_err(|e| format!("{q}: {e}"))?)),
            None => (s, None),
        };
        let grant = match word {
            "grant" => true,
            "revoke" => false,
            other => return Err(format!("{other:?}: expected grant | revoke")),
        };
        Ok(Self {
            grant,
            caller_sequence: seq,
        })
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.grant { "grant" } else { "revoke" })?;
        match self.caller_sequence {
            Some(q) => write!(f, "@{q}"),
            None => Ok(()),
        }
    }
}

/// Bounds of one run. Every obligation is an Anumati consent decision on
/// scope `s` for the edge, created at time 0 with the same custody profile.
#[derive(Clone, Debug)]
pub struct HostileConfig {
    /// Name shown in reports.
    pub name: String,
    /// The second issuer, if any.
    pub second_issuer: SecondIssuer,
    /// Alice's decisions on scope `s`, in the order she issues them; the
    /// last is her latest decision.
    pub alice: Vec<Decision>,
    /// The sequence the second issuer puts on its grant. The second issuer
    /// is hostile: it may claim any sequence, so the default is far above
    /// anything alice issues.
    pub second_grant_sequence: Option<u64>,
    /// How many copies of frames it saw the relay may put back in flight
    /// (a duplicate of a frame in flight, or a replay of one delivered or
    /// lost).
    pub replays: u8,
    /// Whether the relay may lose frames.
    pub drops: bool,
    /// `deadline_seconds` of every obligation.
    pub deadline_seconds: u64,
    /// `max_retries` of every obligation.
    pub max_retries: u32,
    /// Backoff base, seconds (no jitter).
    pub backoff_base_seconds: u64,
    /// Backoff cap, seconds.
    pub backoff_cap_seconds: u64,
    /// The edge's clock-skew margin, seconds.
    pub skew_margin_seconds: u64,
    /// Offers may happen while `now` is below this.
    pub offer_window_seconds: u64,
    /// The clock never passes this.
    pub horizon_seconds: u64,
    /// Wraps every state-machine step: [`unmutated`] for the real core,
    /// or a switch that takes a protection out (see [`Self::with_scope`]).
    pub scope: Scope,
}

impl fmt::Display for HostileConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: second issuer {:?}, alice decides {}, second issuer's grant \
             sequence {:?}, replays {}, drops {}, deadline {}s, max_retries {}, backoff \
             {}s..{}s, skew {}s, offers before {}s, horizon {}s",
            self.name,
            self.second_issuer,
            self.alice
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" then "),
            self.second_grant_sequence,
            self.replays,
            self.drops,
            self.deadline_seconds,
            self.max_retries,
            self.backoff_base_seconds,
            self.backoff_cap_seconds,
            self.skew_margin_seconds,
            self.offer_window_seconds,
            self.horizon_seconds,
        )
    }
}

impl HostileConfig {
    /// The CI configuration: alice grants then revokes scope `s` with the
    /// default sequences of her node; a second pinned peer grants `s` in
    /// its own name with a sequence of its choosing; the relay holds,
    /// reorders, loses and replays (one extra copy) any frame; deadline 3 s,
    /// `max_retries` 2 (the minimum spanning it with base 1 s, cap 2 s),
    /// skew 1 s, clock up to 4 s.
    pub fn two_issuers() -> Self {
        Self {
            name: "hostile-relay".into(),
            second_issuer: SecondIssuer::Peer,
            alice: vec![Decision::GRANT, Decision::REVOKE],
            second_grant_sequence: Some(1_000),
            replays: 1,
            drops: true,
            deadline_seconds: 3,
            max_retries: 2,
            backoff_base_seconds: 1,
            backoff_cap_seconds: 2,
            skew_margin_seconds: 1,
            offer_window_seconds: 1,
            horizon_seconds: 4,
            scope: unmutated,
        }
    }

    /// Alice alone over the hostile relay (the reordering attack without
    /// a second issuer).
    pub fn alice_only() -> Self {
        Self {
            name: "hostile-relay-alice".into(),
            second_issuer: SecondIssuer::None,
            ..Self::two_issuers()
        }
    }

    /// Alice revokes, then grants again (her latest decision widens): the
    /// guard must never refuse her newest decision, held, reordered or
    /// replayed as anything may be; with the second issuer.
    pub fn regrant() -> Self {
        Self {
            name: "hostile-relay-regrant".into(),
            alice: vec![Decision::REVOKE, Decision::GRANT],
            ..Self::two_issuers()
        }
    }

    /// The same bounds with a switch around every step of the core (the
    /// mutation tests take the issuer out of the governed key, or the
    /// default sequence out of the custodian, this way).
    pub fn with_scope(mut self, name: &str, scope: Scope) -> Self {
        self.name = format!("{}+{name}", self.name);
        self.scope = scope;
        self
    }

    /// Overrides one bound from `key=value` (see the binary's `--set`).
    pub fn set(&mut self, kv: &str) -> Result<(), String> {
        let (k, v) = kv.split_once('=').ok_or("expected KEY=VALUE")?;
        let num = |v: &str| v.parse::<u64>().map_err(|e| format!("{v}: {e}"));
        let small = |v: &str| v.parse::<u8>().map_err(|e| format!("{v}: {e}"));
        let flag = |v: &str| v.parse::<bool>().map_err(|e| format!("{v}: {e}"));
        let seq = |v: &str| match v {
            "none" => Ok(None),
            n => n.parse::<u64>().map(Some).map_err(|e| format!("{n}: {e}")),
        };
        match k {
            "second_issuer" => {
                self.second_issuer = match v {
                    "none" => SecondIssuer::None,
                    "peer" => SecondIssuer::Peer,
                    other => return Err(format!("{other:?}: expected none | peer")),
                }
            }
            "alice" => {
                self.alice = v
                    .split(',')
                    .map(Decision::parse)
                    .collect::<Result<_, _>>()?;
                if self.alice.is_empty() {
                    return Err("alice needs at least one decision".into());
                }
            }
            "second_grant_sequence" => self.second_grant_sequence = seq(v)?,
            "replays" => self.replays = small(v)?,
            "drops" => self.drops = flag(v)?,
            "deadline" => self.deadline_seconds = num(v)?,
            "max_retries" => self.max_retries = small(v)?.into(),
            "base" => self.backoff_base_seconds = num(v)?,
            "cap" => self.backoff_cap_seconds = num(v)?,
            "skew" => self.skew_margin_seconds = num(v)?,
            "offer_window" => self.offer_window_seconds = num(v)?,
            "horizon" => self.horizon_seconds = num(v)?,
            other => return Err(format!("unknown key {other}")),
        }
        self.name = format!("{}[{kv}]", self.name);
        Ok(())
    }
}
