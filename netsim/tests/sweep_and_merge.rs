//! Sweeps are seeded and replayable (C-DOR-3), independent of the thread
//! count, and shards merge into exactly the one-machine result.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use abhyasa_netsim::merge::{merge, MergeError};
use abhyasa_netsim::{run_sweep, Fault, Model, Shard, SweepPlan, SweepSummary};

fn plan(model: Model, seed: u64, transfers: u64) -> SweepPlan {
    SweepPlan {
        threads: 2,
        ..SweepPlan::new(model, seed, transfers)
    }
}

fn shards(p: &SweepPlan, n: u32) -> Vec<(PathBuf, SweepSummary)> {
    (0..n)
        .map(|i| {
            let shard = Shard::new(i, n).unwrap();
            let s = run_sweep(
                &SweepPlan {
                    shard: Some(shard),
                    ..p.clone()
                },
                None,
            )
            .unwrap();
            (PathBuf::from(format!("shard-{i}.json")), s)
        })
        .collect()
}

// C-DOR-3: same seed, identical report; another seed, another outcome
// list; the thread count changes nothing.
#[test]
fn c_dor_3_same_seed_same_report_for_any_thread_count() {
    let p = plan(Model::Core, 99, 6_000);
    let a = run_sweep(&p, None).unwrap();
    let b = run_sweep(&p, None).unwrap();
    assert!(a.same_result(&b));
    assert_eq!(a.violations, 0, "{:?}", a.violation_details);
    assert_eq!(a.transfers, 6_000);
    assert_eq!(
        a.applied + a.declined + a.escalated + a.best_effort,
        a.transfers
    );
    assert!(a.applied > 0 && a.declined > 0 && a.escalated > 0 && a.best_effort > 0);
    for threads in [1, 3] {
        let c = run_sweep(
            &SweepPlan {
                threads,
                ..p.clone()
            },
            None,
        )
        .unwrap();
        assert!(a.same_result(&c), "{threads} threads");
    }
    let other = run_sweep(&plan(Model::Core, 100, 6_000), None).unwrap();
    assert_ne!(other.outcome_digest, a.outcome_digest);

    let r = plan(Model::ReferenceV1, 7, 2_000);
    let x = run_sweep(&r, None).unwrap();
    let y = run_sweep(&SweepPlan { threads: 1, ..r }, None).unwrap();
    assert!(x.same_result(&y));
    assert_eq!(x.violations, 0, "{:?}", x.violation_details);
}

// Three shards merged == one run, in both models, in any input order.
#[test]
fn three_shards_merge_into_the_one_machine_result() {
    for p in [
        plan(Model::Core, 5, 5_000),
        plan(Model::ReferenceV1, 20_260_609, 3_001),
    ] {
        let one = run_sweep(&p, None).unwrap();
        let mut parts = shards(&p, 3);
        let merged = merge(parts.clone()).unwrap();
        assert!(merged.same_result(&one), "{:?}\n!=\n{:?}", merged, one);
        assert_eq!(merged.merged_shards, Some(3));
        parts.reverse();
        assert!(merge(parts).unwrap().same_result(&one));
    }
}

// A sweep offset with --first shards and merges too; a one-transfer
// replay equals that transfer's part of the big run.
#[test]
fn offset_sweeps_shard_and_replay() {
    let p = SweepPlan {
        first: 1_000,
        ..plan(Model::Core, 11, 900)
    };
    let one = run_sweep(&p, None).unwrap();
    assert_eq!((one.start, one.end), (1_000, 1_900));
    assert!(merge(shards(&p, 4)).unwrap().same_result(&one));
    let singles: Vec<(PathBuf, SweepSummary)> = (0..3)
        .map(|k| {
            let s = run_sweep(
                &SweepPlan {
                    first: 1_000 + k,
                    transfers: 1,
                    ..p.clone()
                },
                None,
            )
            .unwrap();
            (PathBuf::from(format!("t{k}")), s)
        })
        .collect();
    let three = run_sweep(
        &SweepPlan {
            transfers: 3,
            ..p.clone()
        },
        None,
    )
    .unwrap();
    let digests: u64 = singles
        .iter()
        .map(|(_, s)| u64::from_str_radix(&s.outcome_digest, 16).unwrap())
        .fold(0, u64::wrapping_add);
    assert_eq!(format!("{digests:016x}"), three.outcome_digest);
}

#[test]
fn merge_refuses_what_is_not_one_sweep() {
    let p = plan(Model::Core, 5, 600);
    let parts = shards(&p, 3);

    // A missing shard is a gap that names it.
    let e = merge(vec![parts[0].clone(), parts[2].clone()]).unwrap_err();
    assert!(
        matches!(&e, MergeError::Gap { missing, .. } if missing == &[Shard::new(1, 3).unwrap()]),
        "{e}"
    );
    assert!(e.to_string().contains("missing shards: 1/3"), "{e}");

    // The same shard twice.
    let e = merge(vec![parts[0].clone(), parts[1].clone(), parts[1].clone()]).unwrap_err();
    assert!(matches!(e, MergeError::DuplicateShard { .. }), "{e}");

    // Another seed.
    let other = shards(&plan(Model::Core, 6, 600), 3);
    let e = merge(vec![parts[0].clone(), other[1].clone(), parts[2].clone()]).unwrap_err();
    assert!(
        matches!(&e, MergeError::Mismatch { field: "seed", .. }),
        "{e}"
    );

    // Another split of the same sweep overlaps.
    let halves = shards(&p, 2);
    let e = merge(vec![parts[0].clone(), halves[0].clone(), parts[2].clone()]).unwrap_err();
    assert!(matches!(e, MergeError::Overlap { .. }), "{e}");

    // An edited file contradicts itself.
    let mut bad = parts[1].clone();
    bad.1.transfers += 1;
    let e = merge(vec![parts[0].clone(), bad, parts[2].clone()]).unwrap_err();
    assert!(matches!(e, MergeError::Inconsistent { .. }), "{e}");

    // Another model.
    let mut m = parts[1].clone();
    m.1.model = Model::ReferenceV1;
    let e = merge(vec![parts[0].clone(), m, parts[2].clone()]).unwrap_err();
    assert!(
        matches!(&e, MergeError::Mismatch { field: "model", .. }),
        "{e}"
    );

    assert!(matches!(merge(Vec::new()), Err(MergeError::Empty)));
}

// The checker is not vacuous: a receiver whose ledger is disabled applies
// redeliveries again, and every such transfer is reported.
#[test]
fn a_receiver_without_ledger_is_caught() {
    let p = SweepPlan {
        fault: Some(Fault::LedgerDisabled),
        ..plan(Model::ReferenceV1, 20_260_609, 2_000)
    };
    let s = run_sweep(&p, None).unwrap();
    assert!(s.violations > 0);
    let v = &s.violation_details[0];
    assert!(v.what.contains("AB-3"), "{v:?}");
    assert!(
        v.replay.ends_with(&format!(
            "--dangerous-inject-fault ledger-disabled --first {} --transfers 1",
            v.transfer
        )),
        "{v:?}"
    );
    // The same transfers without the fault are clean.
    let clean = run_sweep(&SweepPlan { fault: None, ..p }, None).unwrap();
    assert_eq!(clean.violations, 0);
}
