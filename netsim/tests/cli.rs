//! The `abhyasa-sim` binary: JSON output, shard files and merge, exit
//! status and replay commands on a violation, and the subcommands that wait
//! for the node runtime.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

use abhyasa_netsim::SweepSummary;

fn sim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_abhyasa-sim"))
        .args(args)
        .output()
        .expect("run abhyasa-sim")
}

fn stdout_json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

#[test]
fn sweep_json_has_the_documented_fields() {
    let o = sim(&[
        "sweep",
        "--transfers",
        "3k",
        "--seed",
        "42",
        "--json",
        "--quiet",
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v = stdout_json(&o);
    for field in [
        "transfers",
        "applied",
        "declined",
        "escalated",
        "best_effort",
        "total_attempts",
        "mean_attempts",
        "violations",
        "seed",
        "elapsed_s",
        "spurious_escalations",
        "transfers_per_second",
        "shard",
        "outcome_digest",
    ] {
        assert!(v.get(field).is_some(), "missing {field}: {v}");
    }
    assert_eq!(v["transfers"], 3_000);
    assert_eq!(v["seed"], 42);
    assert_eq!(v["violations"], 0);
    assert_eq!(v["model"], "core");
    let sum: u64 = ["applied", "declined", "escalated", "best_effort"]
        .iter()
        .map(|k| v[k].as_u64().unwrap())
        .sum();
    assert_eq!(sum, 3_000);
    let mean = v["total_attempts"].as_f64().unwrap() / 3_000.0;
    assert!((v["mean_attempts"].as_f64().unwrap() - mean).abs() < 1e-12);
}

#[test]
fn compat_table_prints_the_reference_figures() {
    let o = sim(&[
        "sweep",
        "--compat",
        "reference-v1",
        "-n",
        "10000",
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(0));
    let text = String::from_utf8_lossy(&o.stdout);
    for want in [
        "5,289",
        "2,598",
        "2,113",
        "63,160",
        "6.3160",
        "seed 20260609",
    ] {
        assert!(text.contains(want), "{want} not in\n{text}");
    }
}

fn write(dir: &Path, name: &str, o: &Output) -> String {
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let p = dir.join(name);
    std::fs::write(&p, &o.stdout).unwrap();
    p.to_string_lossy().into_owned()
}

#[test]
fn shard_files_merge_into_the_one_machine_json() {
    let dir = tempfile::tempdir().unwrap();
    let base = [
        "sweep",
        "--transfers",
        "2500",
        "--seed",
        "9",
        "--json",
        "--quiet",
    ];
    let one: SweepSummary = serde_json::from_slice(&sim(&base).stdout).unwrap();
    let mut files = Vec::new();
    for i in 0..3 {
        let shard = format!("{i}/3");
        let mut args = base.to_vec();
        args.extend(["--shard", &shard, "--threads", "1"]);
        files.push(write(dir.path(), &format!("s{i}.json"), &sim(&args)));
    }
    let mut args = vec!["merge", "--json"];
    files.reverse();
    args.extend(files.iter().map(String::as_str));
    let o = sim(&args);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let merged: SweepSummary = serde_json::from_slice(&o.stdout).unwrap();
    assert!(merged.same_result(&one), "{merged:?}\n!=\n{one:?}");

    // Leave one shard out: a typed error naming it, exit 2.
    let o = sim(&["merge", &files[0], &files[1]]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("missing shards"), "{err}");
}

// A broken receiver makes the run fail with the seed, the failing
// transfer and a replay command that reproduces it.
#[test]
fn a_violation_exits_non_zero_with_a_working_replay_command() {
    let o = sim(&[
        "sweep",
        "--compat",
        "reference-v1",
        "--transfers",
        "400",
        "--dangerous-inject-fault",
        "ledger-disabled",
        "--json",
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let v = stdout_json(&o);
    assert!(v["violations"].as_u64().unwrap() > 0);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("seed 20260609"), "{err}");
    let first = &v["violation_details"][0];
    let transfer = first["transfer"].as_u64().unwrap();
    assert!(err.contains(&format!("transfer {transfer}:")), "{err}");
    let replay = first["replay"].as_str().unwrap();
    assert!(err.contains(replay), "{err}");
    assert!(replay.contains(&format!("--first {transfer} --transfers 1")));

    // The replay command replays exactly that violation.
    let args: Vec<&str> = replay
        .strip_prefix("abhyasa-sim ")
        .unwrap()
        .split_whitespace()
        .chain(["--json", "--quiet"])
        .collect();
    let o = sim(&args);
    assert_eq!(o.status.code(), Some(1));
    let r = stdout_json(&o);
    let of_transfer = |v: &serde_json::Value| -> Vec<String> {
        v["violation_details"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["transfer"] == transfer)
            .map(|d| d["what"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(of_transfer(&r), of_transfer(&v));
    assert_eq!(
        r["violations"].as_u64().unwrap(),
        of_transfer(&v).len() as u64
    );
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        vec!["sweep", "--shard", "3/3"],
        vec!["sweep", "--shard", "x"],
        vec!["sweep", "--transfers", "lots"],
        vec!["sweep", "--max-retries", "3"],
        vec!["sweep", "--compat", "reference-v1", "--jitter", "0.5"],
        vec![
            "sweep",
            "-n",
            "10",
            "--dangerous-inject-fault",
            "ledger-disabled",
        ],
        vec!["merge", "/nonexistent/shard.json"],
    ] {
        let o = sim(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(!o.stderr.is_empty(), "{args:?}");
    }
}

#[test]
fn run_prints_the_report_and_writes_report_json() {
    let scenario = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/clean-lan.toml");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = sim(&[
        "run",
        scenario,
        "--seed",
        "3",
        "--json",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let printed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(printed, written);
    assert_eq!(printed["scenario"], "clean-lan");
    assert_eq!(printed["seed"], 3);
    assert_eq!(printed["violation_count"], 0);
    let table = sim(&["run", scenario, "--seed", "3"]);
    assert_eq!(table.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&table.stdout).contains("violations 0"));
    let quiet = sim(&["run", scenario, "--seed", "3", "--quiet"]);
    assert_eq!(quiet.status.code(), Some(0));
    assert!(quiet.stdout.is_empty());
}

#[test]
fn run_input_errors_exit_2_naming_the_problem() {
    let o = sim(&["run", "/nonexistent/lossy-wan.toml", "--seed", "1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot read"));
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scenarios/clean-lan.toml"
    ))
    .unwrap()
    .replace("receivers = 1", "receivers = 0");
    std::fs::write(&bad, text).unwrap();
    let o = sim(&["run", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("hosts.receivers"));
}

#[test]
fn study_refuses_a_missing_scenario_file() {
    let args = [
        "study",
        "partition-duration",
        "long-partition.toml",
        "--from",
        "0s",
        "--to",
        "2h",
        "--steps",
        "5",
        "--seeds",
        "3",
        "--out",
        "study",
    ];
    let o = sim(&args);
    assert_eq!(o.status.code(), Some(2), "{args:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("long-partition.toml"), "{err}");
    assert!(o.stdout.is_empty());
}
