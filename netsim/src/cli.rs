//! The `abhyasa-sim` command line.
//!
//! Exit status: 0 success; 1 an invariant was violated (the seed, the
//! failing transfers and their replay commands are on stderr); 2 a usage
//! or input error, or a subcommand that is not available yet.

use std::ffi::OsString;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};

use crate::merge::merge_files;
use crate::settings::{Fault, Model, SettingsError, SweepSettings};
use crate::shard::Shard;
use crate::summary::SweepSummary;
use crate::sweep::{default_threads, run_sweep, SweepPlan};

/// Exit status of a run that found an invariant violation.
pub const EXIT_VIOLATION: u8 = 1;
/// Exit status of a usage or input error.
pub const EXIT_USAGE: u8 = 2;

/// Partition simulator for Abhyasa: seeded, replayable deliver-or-report
/// sweeps over lossy channels, using the real custodian and receiver.
#[derive(Debug, Parser)]
#[command(name = "abhyasa-sim", version, max_term_width = 100)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Abstract sweep: N independent custody transfers over seeded lossy
    /// channels, every invariant checked on every transfer.
    Sweep(SweepArgs),
    /// Combine the --json outputs of every shard of a sweep (or the output
    /// directories of every shard of a study) into exactly the one-machine
    /// result.
    Merge(MergeArgs),
    /// Full-stack scenario under turmoil: the real node runtime and
    /// transports on simulated hosts, invariants checked on ground truth.
    Run(RunArgs),
    /// Parameter studies over full-stack scenarios: study.csv, summary.csv
    /// and study.svg.
    Study(StudyArgs),
}

/// The reference implementations whose random streams can be reproduced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Compat {
    /// The public Python reference harness (CPython MT19937, zero-latency
    /// round trips, no jitter), draw for draw.
    #[value(name = "reference-v1")]
    ReferenceV1,
}

/// Faults that can be injected (test-only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FaultArg {
    /// The receiver forgets its ledger before every delivery.
    #[value(name = "ledger-disabled")]
    LedgerDisabled,
}

/// `abhyasa-sim sweep`.
#[derive(Debug, Args)]
pub struct SweepArgs {
    /// Transfers in the whole sweep (e.g. 1000000, 1_000_000, 10M, 1G).
    #[arg(long, short = 'n', default_value = "100000", value_parser = parse_count)]
    pub transfers: u64,
    /// Master seed: the same seed gives the same result, transfer for
    /// transfer.
    #[arg(long, short = 's', default_value_t = crate::reference::REFERENCE_SEED)]
    pub seed: u64,
    /// Index of the first transfer (with --transfers 1: replay one
    /// transfer).
    #[arg(long, default_value_t = 0)]
    pub first: u64,
    /// Reproduce a reference implementation's random stream.
    #[arg(long, value_enum)]
    pub compat: Option<Compat>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Worker threads [default: one per core].
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// Run only shard I of N (0-based) of the transfer range; combine the
    /// --json outputs with `abhyasa-sim merge`.
    #[arg(long, value_name = "I/N")]
    pub shard: Option<Shard>,
    /// No progress bar.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Custody deadline, seconds [core default: 600].
    #[arg(long)]
    pub deadline_seconds: Option<u64>,
    /// Retries after the first attempt [core default: 64].
    #[arg(long)]
    pub max_retries: Option<u64>,
    /// First backoff interval, seconds [core default: 1].
    #[arg(long)]
    pub backoff_base_seconds: Option<f64>,
    /// Backoff cap, whole seconds [core default: 64].
    #[arg(long)]
    pub backoff_cap_seconds: Option<u64>,
    /// Backoff jitter fraction in [0, 1] [core default: 0.1].
    #[arg(long)]
    pub jitter: Option<f64>,
    /// Fraction of benign (best-effort) obligations [core default: 0.1].
    #[arg(long)]
    pub benign_fraction: Option<f64>,
    /// Probability that the receiver always defers [core default: 0].
    #[arg(long)]
    pub defer_probability: Option<f64>,
    /// TEST-ONLY: break the receiver to prove the checker catches it.
    #[arg(long, value_enum, hide = true)]
    pub dangerous_inject_fault: Option<FaultArg>,
}

/// `abhyasa-sim merge`.
#[derive(Debug, Args)]
pub struct MergeArgs {
    /// The --json output of every shard of a sweep, or the output
    /// directory (or study.csv) of every shard of a study (any order).
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Studies: directory to write the merged study.csv, study.json,
    /// summary.csv and study.svg into.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// `abhyasa-sim run` (designed; needs the node runtime).
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Scenario file (netsim/scenarios/*.toml).
    #[arg(value_name = "SCENARIO.toml")]
    pub scenario: PathBuf,
    /// Master seed.
    #[arg(long, short = 's', default_value_t = crate::reference::REFERENCE_SEED)]
    pub seed: u64,
    /// Print one JSON object instead of the report.
    #[arg(long)]
    pub json: bool,
    /// Directory to write report.json into (created if missing).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print nothing but violations (and the JSON with --json).
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Make every partition of the scenario last this long (0s: no
    /// partition), as the partition-duration study does; replays a study
    /// run.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub partition_duration: Option<Duration>,
}

/// `abhyasa-sim study`.
#[derive(Debug, Args)]
pub struct StudyArgs {
    /// Which study.
    #[command(subcommand)]
    pub study: Study,
}

/// Studies.
#[derive(Debug, Subcommand)]
pub enum Study {
    /// Spurious-escalation and escalation rates against partition length,
    /// with the deadline marked (study.csv + study.svg).
    PartitionDuration(PartitionDurationArgs),
    /// Escalation and spurious-escalation rates against contact-window
    /// length, relayed against direct (window.csv + window.svg).
    WindowLength(WindowLengthArgs),
}

/// `abhyasa-sim study window-length`.
#[derive(Debug, Args)]
pub struct WindowLengthArgs {
    /// A relayed scenario with `[[relay.window]]`s, whose length is swept.
    #[arg(value_name = "SCENARIO.toml")]
    pub scenario: PathBuf,
    /// Shortest window.
    #[arg(long, value_parser = parse_duration, default_value = "500ms")]
    pub from: Duration,
    /// Longest window.
    #[arg(long, value_parser = parse_duration, default_value = "8s")]
    pub to: Duration,
    /// Window lengths: K points evenly spaced from --from to --to.
    #[arg(long, default_value_t = 5)]
    pub steps: u32,
    /// Seeds per length and mode: seed index j runs seed --seed + j.
    #[arg(long, default_value_t = 3)]
    pub seeds: u32,
    /// Base seed.
    #[arg(long, short = 's', default_value_t = 1)]
    pub seed: u64,
    /// Output directory.
    #[arg(long)]
    pub out: PathBuf,
}

/// `abhyasa-sim study partition-duration`.
#[derive(Debug, Args)]
pub struct PartitionDurationArgs {
    /// Scenario file whose partition length is swept.
    #[arg(value_name = "SCENARIO.toml")]
    pub scenario: PathBuf,
    /// Shortest partition (e.g. 0s, 90s, 5m, 2h).
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    pub from: Duration,
    /// Longest partition.
    #[arg(long, value_parser = parse_duration, default_value = "2h")]
    pub to: Duration,
    /// Partition lengths: K points evenly spaced from --from to --to, both
    /// included (K = 1: --from alone).
    #[arg(long, default_value_t = 25)]
    pub steps: u32,
    /// Seeds per partition length: seed index j runs seed --seed + j.
    #[arg(long, default_value_t = 20)]
    pub seeds: u32,
    /// Base seed (seed of seed index 0).
    #[arg(long, short = 's', default_value_t = crate::reference::REFERENCE_SEED)]
    pub seed: u64,
    /// Worker threads [default: one per core]; the result does not depend
    /// on it.
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// Output directory.
    #[arg(long)]
    pub out: PathBuf,
    /// Run only shard I of N of the (length, seed) grid.
    #[arg(long, value_name = "I/N")]
    pub shard: Option<Shard>,
    /// No progress bar.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

/// Parses a count: digits with optional `_` or `,` separators, or a number
/// with a `k`/`M`/`G` suffix (10M = 10,000,000).
pub fn parse_count(s: &str) -> Result<u64, String> {
    let t: String = s
        .trim()
        .chars()
        .filter(|c| *c != '_' && *c != ',')
        .collect();
    let (num, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1_000u64),
        Some((i, 'M')) => (&t[..i], 1_000_000),
        Some((i, 'G')) => (&t[..i], 1_000_000_000),
        _ => (&t[..], 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("expected a count like 100000, 1_000_000, 10M or 1G, got {s:?}"))
}

/// Parses a duration: a number and a unit (`ms`, `s`, `m`, `h`, `d`);
/// the same syntax as scenario files.
pub use crate::fullstack::parse_duration;

/// Parses `args` (program name first) and runs the command.
pub fn main_with_args<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { EXIT_USAGE } else { 0 });
        }
    };
    match cli.command {
        Command::Sweep(a) => sweep(a),
        Command::Merge(a) => merge(a),
        Command::Run(a) => run(a),
        Command::Study(StudyArgs {
            study: Study::PartitionDuration(a),
        }) => study_partition_duration(a),
        Command::Study(StudyArgs {
            study: Study::WindowLength(a),
        }) => study_window_length(a),
    }
}

fn usage(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {msg}");
    ExitCode::from(EXIT_USAGE)
}

/// The command that replays a run.
pub fn run_replay_command(scenario: &std::path::Path, seed: u64) -> String {
    format!("abhyasa-sim run {} --seed {seed}", scenario.display())
}

fn run(a: RunArgs) -> ExitCode {
    use crate::fullstack::{run_scenario, Scenario};
    let scenario = match Scenario::from_file(&a.scenario) {
        Ok(s) => s,
        Err(e) => return usage(e),
    };
    let scenario = match a.partition_duration {
        Some(d) => scenario.with_partition_duration(d),
        None => scenario,
    };
    let report = match run_scenario(&scenario, a.seed) {
        Ok(r) => r,
        Err(e) => return usage(format_args!("scenario {}: {e}", scenario.name)),
    };
    if let Some(dir) = &a.out {
        let write = std::fs::create_dir_all(dir).and_then(|()| {
            let json = serde_json::to_string_pretty(&report).map_err(std::io::Error::other)?;
            std::fs::write(dir.join("report.json"), json + "\n")
        });
        if let Err(e) = write {
            return usage(format_args!(
                "cannot write {}: {e}",
                dir.join("report.json").display()
            ));
        }
    }
    if a.json {
        match serde_json::to_string(&report) {
            Ok(j) => println!("{j}"),
            Err(e) => return usage(e),
        }
    } else if !a.quiet {
        println!("{report}");
    }
    if report.passed() {
        return ExitCode::SUCCESS;
    }
    let mut replay = run_replay_command(&a.scenario, a.seed);
    if let Some(d) = a.partition_duration {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        replay = format!(
            "{replay} --partition-duration {}",
            crate::study::format_ms(ms)
        );
    }
    eprintln!(
        "INVARIANT VIOLATED: {} violation(s) in scenario {}, seed {}",
        report.violation_count, report.scenario, report.seed
    );
    for v in &report.violations {
        match &v.obligation {
            Some(o) => eprintln!("  [{}] {o}: {}", v.invariant, v.detail),
            None => eprintln!("  [{}] {}", v.invariant, v.detail),
        }
    }
    eprintln!("  replay: {replay}");
    ExitCode::from(EXIT_VIOLATION)
}

/// The plan `args` describe.
pub fn plan_from_args(a: &SweepArgs) -> Result<SweepPlan, SettingsError> {
    let model = match a.compat {
        Some(Compat::ReferenceV1) => Model::ReferenceV1,
        None => Model::Core,
    };
    let mut settings = SweepSettings::default_for(model);
    let overrides: [(&'static str, bool); 7] = [
        ("--deadline-seconds", a.deadline_seconds.is_some()),
        ("--max-retries", a.max_retries.is_some()),
        ("--backoff-base-seconds", a.backoff_base_seconds.is_some()),
        ("--backoff-cap-seconds", a.backoff_cap_seconds.is_some()),
        ("--jitter", a.jitter.is_some()),
        ("--benign-fraction", a.benign_fraction.is_some()),
        ("--defer-probability", a.defer_probability.is_some()),
    ];
    if model == Model::ReferenceV1 {
        if let Some((flag, _)) = overrides.iter().find(|(_, set)| *set) {
            return Err(SettingsError::Fixed {
                model: "reference-v1",
                flag,
            });
        }
    }
    settings.deadline_seconds = a.deadline_seconds.unwrap_or(settings.deadline_seconds);
    settings.max_retries = a.max_retries.unwrap_or(settings.max_retries);
    settings.backoff_base_seconds = a
        .backoff_base_seconds
        .unwrap_or(settings.backoff_base_seconds);
    settings.backoff_cap_seconds = a
        .backoff_cap_seconds
        .unwrap_or(settings.backoff_cap_seconds);
    settings.jitter = a.jitter.unwrap_or(settings.jitter);
    settings.benign_fraction = a.benign_fraction.unwrap_or(settings.benign_fraction);
    settings.defer_probability = a.defer_probability.unwrap_or(settings.defer_probability);
    settings.validate()?;
    Ok(SweepPlan {
        model,
        seed: a.seed,
        first: a.first,
        transfers: a.transfers,
        shard: a.shard,
        settings,
        fault: a.dangerous_inject_fault.map(|f| match f {
            FaultArg::LedgerDisabled => Fault::LedgerDisabled,
        }),
        threads: a.threads.unwrap_or_else(default_threads).max(1),
    })
}

fn progress_bar(quiet: bool) -> Option<ProgressBar> {
    if quiet {
        return None;
    }
    // Draws to stderr, and only when stderr is a terminal.
    let bar = ProgressBar::new(0);
    if let Ok(style) = ProgressStyle::with_template(
        "{spinner} {elapsed_precise} [{wide_bar}] {human_pos}/{human_len} \
         ({rate} transfers/s, eta {eta})",
    ) {
        bar.set_style(
            style
                .with_key(
                    "rate",
                    |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                        let _ = write!(w, "{:.0}", s.per_sec());
                    },
                )
                .progress_chars("=> "),
        );
    }
    Some(bar)
}

fn sweep(a: SweepArgs) -> ExitCode {
    let plan = match plan_from_args(&a) {
        Ok(p) => p,
        Err(e) => return usage(e),
    };
    let bar = progress_bar(a.quiet);
    let summary = match run_sweep(&plan, bar.as_ref()) {
        Ok(s) => s,
        Err(e) => return usage(e),
    };
    report(&summary, a.json)
}

fn merge(a: MergeArgs) -> ExitCode {
    let studies = a
        .files
        .iter()
        .filter(|f| crate::study::is_study_input(f))
        .count();
    if studies == a.files.len() {
        return merge_study(a);
    }
    if studies > 0 {
        return usage(
            "give either sweep --json files or study output directories (or their study.csv), not both",
        );
    }
    if a.out.is_some() {
        return usage("--out is for merging studies; sweeps merge to stdout");
    }
    match merge_files(&a.files) {
        Ok(s) => report(&s, a.json),
        Err(e) => usage(e),
    }
}

fn study_partition_duration(a: PartitionDurationArgs) -> ExitCode {
    use crate::study::PartitionDurationStudy;
    let scenario = match crate::fullstack::Scenario::from_file(&a.scenario) {
        Ok(s) => s,
        Err(e) => return usage(e),
    };
    let study = PartitionDurationStudy {
        scenario,
        scenario_file: a.scenario.display().to_string(),
        from: a.from,
        to: a.to,
        steps: a.steps,
        seeds: a.seeds,
        base_seed: a.seed,
        shard: a.shard,
        threads: a.threads.unwrap_or_else(default_threads).max(1),
    };
    // Checks the grid and the scenario at every length before running.
    if let Err(e) = study.identity() {
        return usage(e);
    }
    let bar = study_progress_bar(a.quiet);
    let result = study.run(bar.as_ref());
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    match result {
        Ok(r) => finish_study(&r, &a.out, a.quiet),
        Err(e) => usage(e),
    }
}

fn study_window_length(a: WindowLengthArgs) -> ExitCode {
    use crate::study::window::{write_window_study, WindowLengthStudy};
    let scenario = match crate::fullstack::Scenario::from_file(&a.scenario) {
        Ok(s) => s,
        Err(e) => return usage(e),
    };
    if a.steps == 0 || a.seeds == 0 || a.from > a.to || a.from.is_zero() {
        return usage("--steps and --seeds must be at least 1, and 0 < --from <= --to");
    }
    let lengths = (0..a.steps)
        .map(|i| {
            if a.steps == 1 {
                a.from
            } else {
                a.from + (a.to - a.from) * i / (a.steps - 1)
            }
        })
        .collect();
    let study = WindowLengthStudy {
        scenario,
        lengths,
        seeds: a.seeds,
        base_seed: a.seed,
    };
    let name = study.scenario.name.clone();
    match study
        .run()
        .and_then(|rows| write_window_study(&name, &rows, &a.out).map(|t| (t, rows)))
    {
        Ok((table, rows)) => {
            print!("{table}");
            if rows.iter().any(|r| r.violations > 0) {
                eprintln!("INVARIANT VIOLATED in the window-length study (see window.csv)");
                return ExitCode::from(1);
            }
            ExitCode::SUCCESS
        }
        Err(e) => usage(e),
    }
}

fn study_progress_bar(quiet: bool) -> Option<ProgressBar> {
    if quiet {
        return None;
    }
    // Draws to stderr, and only when stderr is a terminal.
    let bar = ProgressBar::new(0);
    if let Ok(style) = ProgressStyle::with_template(
        "{spinner} {elapsed_precise} [{wide_bar}] {pos}/{len} runs (eta {eta})",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    Some(bar)
}

fn merge_study(a: MergeArgs) -> ExitCode {
    let Some(out) = &a.out else {
        return usage("merging a study needs --out DIR for the merged study.csv and plot");
    };
    match crate::study::merge_study(&a.files) {
        Ok(r) => finish_study(&r, out, false),
        Err(e) => usage(e),
    }
}

/// Writes a study's files, prints its table (unless quiet) and, if a run
/// broke an invariant, the replay report; returns the exit status.
fn finish_study(r: &crate::study::StudyResult, out: &std::path::Path, quiet: bool) -> ExitCode {
    let files = match r.write(out) {
        Ok(f) => f,
        Err(e) => return usage(e),
    };
    if !quiet {
        let mut o = std::io::stdout().lock();
        let _ = write!(o, "{}", r.table());
        let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
        let _ = writeln!(o, "wrote {}", names.join(", "));
        let _ = o.flush();
    }
    if r.violating().next().is_some() {
        eprint!("{}", r.violation_report());
        return ExitCode::from(EXIT_VIOLATION);
    }
    ExitCode::SUCCESS
}

/// Prints a summary (JSON or table) to stdout and, if it has violations,
/// the replay report to stderr; returns the exit status.
fn report(s: &SweepSummary, json: bool) -> ExitCode {
    let mut out = std::io::stdout().lock();
    let written = if json {
        match serde_json::to_string(s) {
            Ok(j) => writeln!(out, "{j}"),
            Err(e) => return usage(format_args!("could not encode the result: {e}")),
        }
    } else {
        writeln!(out, "{s}")
    };
    let _ = written.and_then(|()| out.flush());
    if s.violations > 0 {
        eprint!("{}", s.violation_report());
        return ExitCode::from(EXIT_VIOLATION);
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_durations_parse() {
        assert_eq!(parse_count("10M"), Ok(10_000_000));
        assert_eq!(parse_count("1_000_000"), Ok(1_000_000));
        assert_eq!(parse_count("2k"), Ok(2_000));
        assert_eq!(parse_count("1G"), Ok(1_000_000_000));
        assert!(parse_count("ten").is_err());
        assert!(parse_count("99999999999999999999G").is_err());
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("1.5m"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("5y").is_err());
    }

    #[test]
    fn compat_fixes_its_settings() {
        let cli = Cli::try_parse_from([
            "abhyasa-sim",
            "sweep",
            "--compat",
            "reference-v1",
            "--jitter",
            "0.2",
        ])
        .unwrap();
        let Command::Sweep(a) = cli.command else {
            panic!("not a sweep")
        };
        assert!(matches!(
            plan_from_args(&a),
            Err(SettingsError::Fixed {
                flag: "--jitter",
                ..
            })
        ));
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
