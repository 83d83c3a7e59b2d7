//! `abhyasa-checker`: explores one configuration and prints distinct
//! states, depth, time and any counterexample trace.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use abhyasa_checker::hostile::{self, HostileConfig};
use abhyasa_checker::{check, CheckConfig, CheckReport, Preset, RunOptions, Search};
use clap::Parser;

/// Exhaustive bounded model check of the real abhyasa-core custodian and
/// receiver under loss, duplication, reordering and crashes.
#[derive(Parser, Debug)]
#[command(name = "abhyasa-checker")]
struct Args {
    /// Bounds to explore: small | default | large.
    #[arg(long, default_value = "default")]
    config: Preset,
    /// Check the hostile-relay model instead (C-OR-2, C-AZ-2):
    /// two-issuers | alice-only | regrant. `--set` then takes its keys
    /// (second_issuer, alice=grant,revoke (`grant@5`: a caller-given
    /// sequence), second_grant_sequence, replays, drops, deadline,
    /// max_retries, base, cap, skew, offer_window, horizon).
    #[arg(long, value_name = "CONFIG")]
    hostile: Option<String>,
    /// Worker threads (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// Run a mutation variant (needs `--features mutations`):
    /// ledger-split | decline-as-applied | deadline-restart | guard-off;
    /// with `--hostile`: issuer-out-of-key | no-default-sequence | guard-off.
    #[arg(long)]
    mutation: Option<String>,
    /// Stop after generating this many states (counting repeats).
    #[arg(long)]
    max_states: Option<usize>,
    /// Order of exploration: bfs | dfs (default: dfs for `large`, whose
    /// breadth-first frontier would need many gigabytes; bfs otherwise).
    #[arg(long)]
    search: Option<Search>,
    /// Print progress (distinct states, depth) to stderr every N seconds;
    /// 0 turns it off.
    #[arg(long, default_value_t = 30)]
    progress: u64,
    /// Override bounds of the preset, e.g. `--set deadline=4 --set dups=0`
    /// (keys: obligations=O1,O2,B1 deadline max_retries base cap skew
    /// offer_window horizon dups custodian_crashes receiver_crashes
    /// total_crashes defer defer_again benign_acks surface).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

#[cfg(feature = "mutations")]
fn mutated(config: CheckConfig, name: &str) -> Result<CheckConfig, String> {
    use abhyasa_core::mutations::{with, Mutation};
    let scope: abhyasa_checker::Scope = match name {
        "ledger-split" => |f| with(&[Mutation::LedgerNotCommittedWithEffect], f),
        "decline-as-applied" => |f| with(&[Mutation::DeclineAsApplied], f),
        "deadline-restart" => |f| with(&[Mutation::DeadlineRestartedOnRecovery], f),
        "guard-off" => |f| with(&[Mutation::SupersessionGuardOff], f),
        other => return Err(format!("unknown mutation {other:?}")),
    };
    Ok(config.with_scope(name, scope))
}

#[cfg(feature = "mutations")]
fn hostile_mutated(config: HostileConfig, name: &str) -> Result<HostileConfig, String> {
    use abhyasa_core::mutations::{with, Mutation};
    let scope: abhyasa_checker::Scope = match name {
        "issuer-out-of-key" => |f| with(&[Mutation::IssuerNotInKey], f),
        "no-default-sequence" => |f| with(&[Mutation::NoDefaultSequence], f),
        "guard-off" => |f| with(&[Mutation::SupersessionGuardOff], f),
        other => return Err(format!("unknown hostile mutation {other:?}")),
    };
    Ok(config.with_scope(name, scope))
}

#[cfg(not(feature = "mutations"))]
fn hostile_mutated(_: HostileConfig, _: &str) -> Result<HostileConfig, String> {
    Err("mutation variants need `cargo run -p abhyasa-checker --features mutations`".into())
}

#[cfg(not(feature = "mutations"))]
fn mutated(_: CheckConfig, _: &str) -> Result<CheckConfig, String> {
    Err("mutation variants need `cargo run -p abhyasa-checker --features mutations`".into())
}

fn run_hostile(args: &Args, name: &str, opts: RunOptions) -> Result<CheckReport, ExitCode> {
    let mut config = match name {
        "two-issuers" => HostileConfig::two_issuers(),
        "alice-only" => HostileConfig::alice_only(),
        "regrant" => HostileConfig::regrant(),
        other => {
            eprintln!(
                "unknown hostile configuration {other:?}: expected two-issuers | alice-only | \
                 regrant"
            );
            return Err(ExitCode::from(2));
        }
    };
    for kv in &args.set {
        if let Err(e) = config.set(kv) {
            eprintln!("--set {kv}: {e}");
            return Err(ExitCode::from(2));
        }
    }
    if let Some(m) = &args.mutation {
        config = hostile_mutated(config, m).map_err(|e| {
            eprintln!("{e}");
            ExitCode::from(2)
        })?;
    }
    hostile::check(config, opts).map_err(|e| {
        eprintln!("invalid configuration: {e}");
        ExitCode::from(2)
    })
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(name) = &args.hostile {
        let opts = RunOptions {
            threads: args.threads.unwrap_or(RunOptions::default().threads),
            max_states: args.max_states,
            search: args.search.unwrap_or_default(),
            progress: (args.progress > 0).then(|| std::time::Duration::from_secs(args.progress)),
            stop_at_first_failure: false,
        };
        return match run_hostile(&args, name, opts) {
            Ok(report) => {
                println!("{report}");
                if report.counterexamples.is_empty() == args.mutation.is_none() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            }
            Err(code) => code,
        };
    }
    let mut config = CheckConfig::preset(args.config);
    for kv in &args.set {
        if let Err(e) = config.set(kv) {
            eprintln!("--set {kv}: {e}");
            return ExitCode::from(2);
        }
    }
    let mut opts = RunOptions::default();
    if let Some(t) = args.threads {
        opts.threads = t;
    }
    opts.max_states = args.max_states;
    opts.search = args.search.unwrap_or(if args.config == Preset::Large {
        Search::DepthFirst
    } else {
        Search::BreadthFirst
    });
    opts.progress = (args.progress > 0).then(|| std::time::Duration::from_secs(args.progress));
    if let Some(name) = &args.mutation {
        config = match mutated(config, name) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(2);
            }
        };
        opts.stop_at_first_failure = true;
    }
    let report = match check(config, opts) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    println!("{report}");
    // A mutation run succeeds when it finds a counterexample; a normal run
    // when it finds none.
    if report.counterexamples.is_empty() == args.mutation.is_none() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
