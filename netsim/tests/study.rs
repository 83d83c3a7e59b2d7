//! The partition-duration study (`abhyasa-sim study partition-duration`):
//! rows, sharding and merging byte for byte, real escalation behaviour,
//! the plot, violations with replay commands, usage errors.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use abhyasa_netsim::fullstack::Scenario;
use abhyasa_netsim::shard::Shard;
use abhyasa_netsim::study::{merge_study, PartitionDurationStudy, StudyResult, CSV_HEADER};

const SCENARIO: &str = "tests/data/study-short-partition.toml";
const BIN: &str = env!("CARGO_BIN_EXE_abhyasa-sim");

fn scenario_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(SCENARIO)
}

/// 3 lengths (0 s, 5 s = the deadline, 10 s) x 2 seeds.
fn study(shard: Option<Shard>, threads: usize) -> PartitionDurationStudy {
    PartitionDurationStudy {
        scenario: Scenario::from_file(&scenario_path()).unwrap(),
        scenario_file: SCENARIO.to_string(),
        from: Duration::ZERO,
        to: Duration::from_secs(10),
        steps: 3,
        seeds: 2,
        base_seed: 7,
        shard,
        threads,
    }
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap()
}

#[test]
fn tiny_study_rows_rates_and_plot() {
    let r = study(None, 2).run(None).unwrap();
    assert!(r.is_complete());
    assert_eq!(r.rows.len(), 6);
    let grid: Vec<(u64, u64)> = r.rows.iter().map(|x| (x.duration_ms, x.seed)).collect();
    assert_eq!(
        grid,
        [
            (0, 7),
            (0, 8),
            (5_000, 7),
            (5_000, 8),
            (10_000, 7),
            (10_000, 8)
        ]
    );
    for row in &r.rows {
        assert_eq!(row.violations, 0, "{row:?}");
        assert_eq!(row.pending_at_end, 0);
        assert_eq!(row.custody, 20);
        assert_eq!(
            row.applied + row.declined + row.escalated,
            row.custody,
            "{row:?}"
        );
        assert!(row.spurious_escalations <= row.escalated);
    }
    // Real behaviour: a partition twice the deadline escalates what was
    // offered during it; no partition escalates (almost) nothing.
    let s = r.summary();
    assert_eq!(s.len(), 3);
    let (zero, _, _) = s[0].escalation_rate();
    let (long, _, _) = s[2].escalation_rate();
    assert!(
        long > zero + 0.2,
        "escalation {zero} at 0 s vs {long} at 10 s"
    );

    let dir = tempfile::tempdir().unwrap();
    let files = r.write(dir.path()).unwrap();
    assert_eq!(files.len(), 4);
    let csv = read(dir.path(), "study.csv");
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some(CSV_HEADER));
    assert_eq!(lines.count(), 6);
    assert!(csv.lines().nth(1).unwrap().starts_with("0,0,0,7,20,20,"));
    let summary = read(dir.path(), "summary.csv");
    assert_eq!(summary.lines().count(), 4);
    let svg = read(dir.path(), "study.svg");
    assert!(svg.starts_with("<svg"), "{}", &svg[..80]);
    for text in [
        "escalation rate (escalated / custody)",
        "spurious-escalation rate",
        "custody deadline (5s)",
        "partition duration (s)",
        "<polyline",
    ] {
        assert!(svg.contains(text), "study.svg lacks {text:?}");
    }
}

#[test]
fn shards_merge_to_the_unsharded_study_byte_for_byte() {
    let whole = study(None, 1).run(None).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let whole_dir = dir.path().join("whole");
    whole.write(&whole_dir).unwrap();
    let mut shard_dirs = Vec::new();
    for i in 0..2 {
        let part = study(Some(Shard::new(i, 2).unwrap()), 2).run(None).unwrap();
        assert!(!part.is_complete());
        assert_eq!(part.rows.len(), 3);
        let d = dir.path().join(format!("shard-{i}"));
        let files = part.write(&d).unwrap();
        // A shard writes its rows and identity, no partial plot.
        assert_eq!(files.len(), 2);
        shard_dirs.push(d);
    }
    // Any order; directories or their study.csv.
    let inputs = [shard_dirs[1].join("study.csv"), shard_dirs[0].clone()];
    let merged: StudyResult = merge_study(&inputs).unwrap();
    assert_eq!(merged, whole);
    let merged_dir = dir.path().join("merged");
    merged.write(&merged_dir).unwrap();
    for f in ["study.csv", "summary.csv", "study.svg", "study.json"] {
        assert_eq!(
            read(&whole_dir, f),
            read(&merged_dir, f),
            "{f} differs after merge"
        );
    }

    // Refusals: a missing shard (named), a shard twice, another study.
    let e = merge_study(&shard_dirs[..1]).unwrap_err().to_string();
    assert!(e.contains("missing shards: 1/2"), "{e}");
    let e = merge_study(&[&shard_dirs[0], &shard_dirs[0]])
        .unwrap_err()
        .to_string();
    assert!(e.contains("given twice"), "{e}");
    let other = PartitionDurationStudy {
        base_seed: 8,
        ..study(Some(Shard::new(1, 2).unwrap()), 1)
    };
    let other_dir = dir.path().join("other");
    other.run(None).unwrap().write(&other_dir).unwrap();
    let e = merge_study(&[&shard_dirs[0], &other_dir])
        .unwrap_err()
        .to_string();
    assert!(e.contains("another study"), "{e}");
}

#[test]
fn cli_study_shards_and_merge() {
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| dir.path().join(n);
    let study_cmd = |out: &Path, extra: &[&str]| {
        let o = Command::new(BIN)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args([
                "study",
                "partition-duration",
                SCENARIO,
                "--from",
                "0s",
                "--to",
                "10s",
                "--steps",
                "3",
                "--seeds",
                "2",
                "--seed",
                "7",
                "--quiet",
                "--out",
            ])
            .arg(out)
            .args(extra)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(o.stdout.is_empty(), "--quiet printed something");
    };
    study_cmd(&d("whole"), &[]);
    study_cmd(&d("s0"), &["--shard", "0/2", "--threads", "1"]);
    study_cmd(&d("s1"), &["--shard", "1/2", "--threads", "1"]);
    let o = Command::new(BIN)
        .args(["merge", "--out"])
        .arg(d("merged"))
        .arg(d("s1"))
        .arg(d("s0").join("study.csv"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.contains("3 lengths x 2 seeds"), "{table}");
    for f in ["study.csv", "summary.csv", "study.svg"] {
        assert_eq!(read(&d("whole"), f), read(&d("merged"), f), "{f}");
    }

    // Usage errors exit 2.
    let status = |args: &[&str]| {
        Command::new(BIN)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(args)
            .output()
            .unwrap()
    };
    let out = d("bad");
    let out = out.to_str().unwrap();
    for args in [
        &[
            "study",
            "partition-duration",
            SCENARIO,
            "--steps",
            "0",
            "--out",
            out,
        ][..],
        &[
            "study",
            "partition-duration",
            SCENARIO,
            "--from",
            "9s",
            "--to",
            "1s",
            "--out",
            out,
        ],
        &["study", "partition-duration", "no-such.toml", "--out", out],
        &[
            "study",
            "partition-duration",
            "scenarios/clean-lan.toml",
            "--out",
            out,
        ],
        &[
            "study",
            "partition-duration",
            SCENARIO,
            "--shard",
            "2/2",
            "--out",
            out,
        ],
    ] {
        let o = status(args);
        assert_eq!(
            o.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let o = Command::new(BIN)
        .args(["merge", "--out"])
        .arg(d("m2"))
        .arg(d("s0"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("missing shards: 1/2"));
    // Sweep JSON and study outputs do not mix.
    std::fs::write(d("sweep.json"), "{}").unwrap();
    let o = Command::new(BIN)
        .args(["merge", "--out"])
        .arg(d("m3"))
        .arg(d("s0"))
        .arg(d("sweep.json"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not both"));

    // The replay form of a study run: `run --partition-duration`.
    let o = status(&[
        "run",
        SCENARIO,
        "--seed",
        "7",
        "--partition-duration",
        "10s",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let csv = read(&d("whole"), "study.csv");
    let row: Vec<&str> = csv.lines().nth(5).unwrap().split(',').collect();
    assert_eq!(row[1], "10000");
    assert_eq!(row[3], "7");
    assert_eq!(report["custody"].to_string(), row[5]);
    assert_eq!(report["outcomes"]["escalated"].to_string(), row[10]);
}

// A broken receiver (its `applied` ledger record never committed) makes
// every run of the study violate; the report names seed, scenario, length
// and the replay command.
#[test]
fn violations_name_the_run_and_its_replay() {
    use abhyasa_core::mutations::{with, Mutation};
    let s = PartitionDurationStudy {
        steps: 2,
        seeds: 1,
        ..study(None, 1)
    };
    // One thread: the run stays on this thread, where the defect is on.
    let r = with(&[Mutation::LedgerNotCommittedWithEffect], || s.run(None)).unwrap();
    assert!(r.violating().count() > 0, "{r:?}");
    let report = r.violation_report();
    assert!(report.contains("INVARIANT VIOLATED"), "{report}");
    assert!(
        report.contains(&format!(
            "replay: abhyasa-sim run {SCENARIO} --seed 7 --partition-duration 10s"
        )),
        "{report}"
    );
    assert!(report.contains("scenario study-short-partition, partition 10s, seed 7"));
}
