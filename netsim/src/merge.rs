//! `abhyasa-sim merge`: combines the `--json` outputs of a sharded sweep
//! into exactly the result one machine would have produced.
//!
//! Inputs must be shards of the same sweep (format, model, seed, range,
//! settings and fault all equal) whose transfer ranges tile the sweep
//! exactly: no gap, no overlap, no shard twice. Anything else is a typed
//! [`MergeError`] naming the file at fault.

use std::collections::BTreeSet;
use std::fmt::Display;
use std::path::{Path, PathBuf};

use crate::shard::Shard;
use crate::summary::{SweepSummary, Tally, ViolationDetail, SWEEP_FORMAT};

/// Why shard outputs could not be merged.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MergeError {
    /// No input was given.
    #[error("nothing to merge: give the --json output file of every shard")]
    Empty,
    /// A file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file is not sweep JSON.
    #[error("{path}: not the --json output of abhyasa-sim sweep: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The JSON error.
        source: serde_json::Error,
    },
    /// A file has another format version.
    #[error("{path}: format {found:?}, this abhyasa-sim merges {SWEEP_FORMAT:?}")]
    Format {
        /// The file.
        path: PathBuf,
        /// Its format tag.
        found: String,
    },
    /// A file belongs to another sweep.
    #[error(
        "{path}: {field} is {found}, but {reference} has {expected}: \
         shards of different sweeps cannot be merged"
    )]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// The field that differs.
        field: &'static str,
        /// Its value in the first file.
        expected: String,
        /// Its value here.
        found: String,
        /// The first file.
        reference: PathBuf,
    },
    /// A file contradicts itself (edited, truncated or from a failed run).
    #[error("{path}: inconsistent shard output: {what}")]
    Inconsistent {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// The same shard was given twice.
    #[error("shard {shard} is given twice: {first} and {second}")]
    DuplicateShard {
        /// The shard.
        shard: Shard,
        /// One file.
        first: PathBuf,
        /// The other.
        second: PathBuf,
    },
    /// Two inputs cover the same transfers.
    #[error("transfers {start}..{end} are covered by both {first} and {second}")]
    Overlap {
        /// First overlapping index.
        start: u64,
        /// One past the last.
        end: u64,
        /// One file.
        first: PathBuf,
        /// The other.
        second: PathBuf,
    },
    /// Some transfers are covered by no input.
    #[error("transfers {start}..{end} are covered by no input{}", missing_hint(.missing))]
    Gap {
        /// First missing index.
        start: u64,
        /// One past the last.
        end: u64,
        /// The shards missing, when the inputs are labelled `I/N`.
        missing: Vec<Shard>,
    },
}

fn missing_hint(missing: &[Shard]) -> String {
    if missing.is_empty() {
        String::new()
    } else {
        let list: Vec<String> = missing.iter().map(Shard::to_string).collect();
        format!(" (missing shards: {})", list.join(", "))
    }
}

/// Reads and merges shard output files.
pub fn merge_files<P: AsRef<Path>>(paths: &[P]) -> Result<SweepSummary, MergeError> {
    let mut inputs = Vec::with_capacity(paths.len());
    for p in paths {
        let path = p.as_ref().to_path_buf();
        let text = std::fs::read_to_string(&path).map_err(|source| MergeError::Read {
            path: path.clone(),
            source,
        })?;
        // `format` first, so a future format is named rather than
        // misreported as a parse error.
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
            if let Some(f) = v.get("format").and_then(|f| f.as_str()) {
                if f != SWEEP_FORMAT {
                    return Err(MergeError::Format {
                        path,
                        found: f.to_string(),
                    });
                }
            }
        }
        let summary: SweepSummary =
            serde_json::from_str(&text).map_err(|source| MergeError::Parse {
                path: path.clone(),
                source,
            })?;
        inputs.push((path, summary));
    }
    merge(inputs)
}

/// Merges shard summaries (each with the file it came from, for errors).
pub fn merge(inputs: Vec<(PathBuf, SweepSummary)>) -> Result<SweepSummary, MergeError> {
    let Some((ref_path, reference)) = inputs.first().cloned() else {
        return Err(MergeError::Empty);
    };
    let mut shards: Vec<(Shard, PathBuf)> = Vec::new();
    for (path, s) in &inputs {
        validate_one(path, s)?;
        let mismatch = |field: &'static str, expected: &dyn Display, found: &dyn Display| {
            MergeError::Mismatch {
                path: path.clone(),
                field,
                expected: expected.to_string(),
                found: found.to_string(),
                reference: ref_path.clone(),
            }
        };
        if s.model != reference.model {
            return Err(mismatch(
                "model",
                &reference.model.as_str(),
                &s.model.as_str(),
            ));
        }
        if s.seed != reference.seed {
            return Err(mismatch("seed", &reference.seed, &s.seed));
        }
        if s.first != reference.first {
            return Err(mismatch("first", &reference.first, &s.first));
        }
        if s.transfers_total != reference.transfers_total {
            return Err(mismatch(
                "transfers_total",
                &reference.transfers_total,
                &s.transfers_total,
            ));
        }
        if s.settings != reference.settings {
            return Err(mismatch(
                "settings",
                &format!("{:?}", reference.settings),
                &format!("{:?}", s.settings),
            ));
        }
        if s.fault != reference.fault {
            return Err(mismatch(
                "fault",
                &format!("{:?}", reference.fault),
                &format!("{:?}", s.fault),
            ));
        }
        if let Some(shard) = s.shard {
            if let Some((_, first)) = shards.iter().find(|(x, _)| *x == shard) {
                return Err(MergeError::DuplicateShard {
                    shard,
                    first: first.clone(),
                    second: path.clone(),
                });
            }
            shards.push((shard, path.clone()));
        }
    }
    // The ranges must tile first..first + total exactly.
    let mut order: Vec<&(PathBuf, SweepSummary)> = inputs.iter().collect();
    order.sort_by_key(|(_, s)| (s.start, s.end));
    let start = reference.first;
    let end = reference.first + reference.transfers_total;
    let missing = || missing_shards(&shards);
    let mut next = start;
    let mut prev: Option<&PathBuf> = None;
    for (path, s) in &order {
        if s.start < next {
            return Err(MergeError::Overlap {
                start: s.start,
                end: next.min(s.end),
                first: prev.cloned().unwrap_or_default(),
                second: path.clone(),
            });
        }
        if s.start > next {
            return Err(MergeError::Gap {
                start: next,
                end: s.start,
                missing: missing(),
            });
        }
        next = s.end;
        prev = Some(path);
    }
    if next != end {
        return Err(MergeError::Gap {
            start: next,
            end,
            missing: missing(),
        });
    }
    let mut tally = Tally::default();
    let (mut threads, mut elapsed, mut cpu) = (0, 0.0, Some(0.0));
    for (_, s) in &inputs {
        tally.add(Tally {
            transfers: s.transfers,
            applied: s.applied,
            declined: s.declined,
            escalated: s.escalated,
            best_effort: s.best_effort,
            total_attempts: s.total_attempts,
            spurious_escalations: s.spurious_escalations,
            late_acks: s.late_acks,
            violations: s.violations,
            details: s
                .violation_details
                .iter()
                .map(|v| ViolationDetail {
                    replay: String::new(),
                    ..v.clone()
                })
                .collect(),
            digest: u64::from_str_radix(&s.outcome_digest, 16).unwrap_or(0),
        });
        threads += s.threads;
        elapsed += s.elapsed_s;
        cpu = cpu.zip(s.cpu_s).map(|(a, b)| a + b);
    }
    let mut id = reference.identity();
    id.shard = None;
    let mut merged = SweepSummary::from_tally(&id, start, end, tally, threads, elapsed);
    merged.merged_shards = u32::try_from(inputs.len()).ok();
    merged.cpu_s = cpu;
    merged.finish();
    Ok(merged)
}

fn validate_one(path: &Path, s: &SweepSummary) -> Result<(), MergeError> {
    let bad = |what: String| MergeError::Inconsistent {
        path: path.to_path_buf(),
        what,
    };
    if s.format != SWEEP_FORMAT {
        return Err(MergeError::Format {
            path: path.to_path_buf(),
            found: s.format.clone(),
        });
    }
    if s.start > s.end || s.transfers != s.end - s.start {
        return Err(bad(format!(
            "transfers {} for range {}..{}",
            s.transfers, s.start, s.end
        )));
    }
    let whole_end = s.first.checked_add(s.transfers_total);
    let expected = match s.shard {
        Some(shard) => Some(shard.range(s.first, s.transfers_total)),
        None => whole_end.map(|e| s.first..e),
    };
    if expected != Some(s.start..s.end) {
        return Err(bad(format!(
            "range {}..{} is not {} of transfers {}..{}",
            s.start,
            s.end,
            s.shard
                .map_or("the whole".to_string(), |x| format!("shard {x}")),
            s.first,
            whole_end.map_or("overflow".to_string(), |e| e.to_string()),
        )));
    }
    let ended = s.applied + s.declined + s.escalated + s.best_effort;
    if ended > s.transfers {
        return Err(bad(format!(
            "{ended} outcomes for {} transfers",
            s.transfers
        )));
    }
    if s.violation_details.len() as u64 > s.violations {
        return Err(bad(format!(
            "{} violations listed but {} counted",
            s.violation_details.len(),
            s.violations
        )));
    }
    if u64::from_str_radix(&s.outcome_digest, 16).is_err() {
        return Err(bad(format!(
            "outcome_digest {:?} is not hex",
            s.outcome_digest
        )));
    }
    Ok(())
}

/// The shards absent from labelled inputs of one count.
fn missing_shards(given: &[(Shard, PathBuf)]) -> Vec<Shard> {
    let counts: BTreeSet<u32> = given.iter().map(|(s, _)| s.count()).collect();
    let Some(&n) = counts.first() else {
        return Vec::new();
    };
    if counts.len() != 1 {
        return Vec::new();
    }
    (0..n)
        .filter_map(|i| Shard::new(i, n).ok())
        .filter(|s| !given.iter().any(|(g, _)| g == s))
        .collect()
}
