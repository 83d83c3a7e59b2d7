//! Merging the outputs of a sharded study into exactly the one-machine
//! result: the same `study.csv`, byte for byte, and the plot re-rendered.

use std::path::{Path, PathBuf};

use super::csv::{parse_csv, StudyRow};
use super::{io_err, StudyError, StudyIdentity, StudyResult, STUDY_FORMAT};
use crate::shard::Shard;

/// The `study.csv` and `study.json` of one input: a study output
/// directory, or its `study.csv` (the `study.json` beside it).
fn locate(input: &Path) -> (PathBuf, PathBuf) {
    if input.is_dir() {
        (input.join("study.csv"), input.join("study.json"))
    } else {
        let dir = input.parent().unwrap_or(Path::new("."));
        (input.to_path_buf(), dir.join("study.json"))
    }
}

/// True when `input` looks like study output (a directory, or a `.csv`
/// file), not sweep JSON.
pub(crate) fn is_study_input(input: &Path) -> bool {
    input.is_dir() || input.extension().is_some_and(|e| e == "csv")
}

fn read(input: &Path) -> Result<(PathBuf, StudyIdentity, Vec<StudyRow>), StudyError> {
    let (csv_path, json_path) = locate(input);
    let json = std::fs::read_to_string(&json_path).map_err(io_err(&json_path))?;
    let bad_json = |problem: String| StudyError::Input {
        path: json_path.display().to_string(),
        problem,
    };
    let v: serde_json::Value =
        serde_json::from_str(&json).map_err(|e| bad_json(format!("not a study.json: {e}")))?;
    match v.get("format").and_then(|f| f.as_str()) {
        Some(STUDY_FORMAT) => {}
        Some(f) => {
            return Err(bad_json(format!(
                "format {f:?}, this abhyasa-sim merges {STUDY_FORMAT:?}"
            )))
        }
        None => return Err(bad_json("no format: not a study.json".into())),
    }
    let id: StudyIdentity =
        serde_json::from_value(v).map_err(|e| bad_json(format!("not a study.json: {e}")))?;
    let text = std::fs::read_to_string(&csv_path).map_err(io_err(&csv_path))?;
    let rows = parse_csv(&text).map_err(|problem| StudyError::Input {
        path: csv_path.display().to_string(),
        problem,
    })?;
    // Every row must be a run of this shard, with the grid's length and seed.
    for r in &rows {
        let bad = |what: String| StudyError::Input {
            path: csv_path.display().to_string(),
            problem: what,
        };
        if r.step >= id.steps || r.seed_index >= id.seeds {
            return Err(bad(format!(
                "run (step {}, seed index {}) is outside the {}x{} grid",
                r.step, r.seed_index, id.steps, id.seeds
            )));
        }
        let run = u64::from(r.step) * u64::from(id.seeds) + u64::from(r.seed_index);
        if !StudyIdentity::in_shard(run, id.shard) {
            return Err(bad(format!(
                "run (step {}, seed index {}) does not belong to shard {}",
                r.step,
                r.seed_index,
                id.shard.map_or("-".into(), |s| s.to_string())
            )));
        }
        if r.duration_ms != id.duration_ms(r.step) || r.seed != id.seed(r.seed_index) {
            return Err(bad(format!(
                "run (step {}, seed index {}) has partition {} ms and seed {}, \
                 but the study's grid gives {} ms and seed {}",
                r.step,
                r.seed_index,
                r.duration_ms,
                r.seed,
                id.duration_ms(r.step),
                id.seed(r.seed_index)
            )));
        }
    }
    Ok((csv_path, id, rows))
}

/// Reads the outputs of every shard of one study (directories or their
/// `study.csv`) and combines them. Refuses, naming the file, inputs of
/// different studies, a shard given twice, runs given twice, and missing
/// runs (naming the missing shards).
pub fn merge_study<P: AsRef<Path>>(inputs: &[P]) -> Result<StudyResult, StudyError> {
    let mut parts = Vec::with_capacity(inputs.len());
    for p in inputs {
        parts.push(read(p.as_ref())?);
    }
    let Some((ref_path, reference, _)) = parts.first().cloned() else {
        return Err(StudyError::Merge(
            "nothing to merge: give the output directory of every shard".into(),
        ));
    };
    let same = |a: &StudyIdentity| StudyIdentity {
        shard: None,
        scenario_file: String::new(),
        ..a.clone()
    };
    let mut shards: Vec<(Shard, PathBuf)> = Vec::new();
    let mut rows: Vec<(StudyRow, PathBuf)> = Vec::new();
    for (path, id, r) in parts {
        if same(&id) != same(&reference) {
            return Err(StudyError::Merge(format!(
                "{} is from another study than {}: {} vs {} \
                 (scenario, its digest, deadline, grid and base seed must all be equal)",
                path.display(),
                ref_path.display(),
                describe(&id),
                describe(&reference)
            )));
        }
        let shard = id.shard.unwrap_or(Shard::WHOLE);
        if let Some((_, first)) = shards.iter().find(|(s, _)| *s == shard) {
            return Err(StudyError::Merge(format!(
                "shard {shard} is given twice: {} and {}",
                first.display(),
                path.display()
            )));
        }
        shards.push((shard, path.clone()));
        rows.extend(r.into_iter().map(|x| (x, path.clone())));
    }
    rows.sort_by_key(|(r, _)| (r.step, r.seed_index));
    for w in rows.windows(2) {
        if let [(a, pa), (b, pb)] = w {
            if (a.step, a.seed_index) == (b.step, b.seed_index) {
                return Err(StudyError::Merge(format!(
                    "run (step {}, seed index {}) is in both {} and {}",
                    a.step,
                    a.seed_index,
                    pa.display(),
                    pb.display()
                )));
            }
        }
    }
    let total = reference.total_runs();
    if rows.len() as u64 != total {
        let counts: std::collections::BTreeSet<u32> =
            shards.iter().map(|(s, _)| s.count()).collect();
        let missing = match (counts.len(), counts.first()) {
            (1, Some(&n)) => (0..n)
                .filter_map(|i| Shard::new(i, n).ok())
                .filter(|s| !shards.iter().any(|(g, _)| g == s))
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            _ => String::new(),
        };
        return Err(StudyError::Merge(format!(
            "{} of the study's {total} runs are covered by no input{}",
            total - rows.len() as u64,
            if missing.is_empty() {
                String::new()
            } else {
                format!(" (missing shards: {missing})")
            }
        )));
    }
    Ok(StudyResult {
        identity: StudyIdentity {
            shard: None,
            ..reference
        },
        rows: rows.into_iter().map(|(r, _)| r).collect(),
    })
}

fn describe(id: &StudyIdentity) -> String {
    format!(
        "scenario {} ({}), deadline {} ms, {}..{} ms in {} steps, {} seeds from {}",
        id.scenario,
        id.scenario_digest,
        id.deadline_ms,
        id.from_ms,
        id.to_ms,
        id.steps,
        id.seeds,
        id.base_seed
    )
}
