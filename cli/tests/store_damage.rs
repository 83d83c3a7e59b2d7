//! A damaged disk never silently loses acknowledged custody, with real
//! processes on the default store (the log store). 30 custody obligations
//! are acknowledged, the node killed, and one fault injected into synced
//! bytes of its current log; for each fault:
//!
//! - the node refuses to start, naming the file and the offset (C-SD-2);
//! - `abhyasa store check` reports it and changes no byte (C-SD-3);
//! - `abhyasa store repair` copies the files aside verbatim, salvages
//!   around the damage and names what it could not recover (C-SD-3);
//! - the node then starts, and every acknowledged obligation is pending
//!   again, escalated `store_damaged` with its fail-safe applied (its offer
//!   salvaged from the damaged commit), or named lost by the repair: none
//!   is silently absent (C-SD-4).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

mod process;
use process::{abhyasa, free_port, init, json, pin, spawn, wait_for, Children, Control};

const N: usize = 30;

/// The regular files under `dir`, with their bytes.
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).expect("dir") {
        let e = e.expect("entry");
        let t = e.file_type().expect("type");
        if t.is_file() {
            out.insert(e.path(), std::fs::read(e.path()).expect("read"));
        } else if t.is_dir() {
            out.extend(files(&e.path()));
        }
    }
    out
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("dir") {
        let e = e.expect("entry");
        let t = e.file_type().expect("type");
        if t.is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else if t.is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).expect("copy");
        }
    }
}

/// The newest log of the store in `store`, and its records' offsets (the
/// format `abhyasa-store/README.md` documents: a 64-byte header, then
/// `len | pcrc | hcrc | payload | mark` each).
fn current_log(store: &Path) -> (PathBuf, Vec<std::ops::Range<usize>>) {
    let gen = std::fs::read_dir(store)
        .expect("store dir")
        .filter_map(|e| {
            let n = e.expect("entry").file_name().into_string().expect("utf-8");
            n.strip_prefix("log-").and_then(|g| g.parse::<u64>().ok())
        })
        .max()
        .expect("a log");
    let path = store.join(format!("log-{gen}"));
    let b = std::fs::read(&path).expect("log");
    let mut recs = Vec::new();
    let mut at = 64;
    while let Some(h) = b.get(at..at + 4) {
        let len = u32::from_le_bytes(h.try_into().expect("4 bytes")) as usize;
        // Past the last record the bytes are fill, every one odd: read as
        // a length, at least 0x01010101, past the end of the file.
        let end = at + 12 + len + 4;
        if len == 0 || end > b.len() {
            break;
        }
        recs.push(at..end);
        at = end;
    }
    (path, recs)
}

#[test]
fn every_fault_is_refused_checked_without_a_write_and_repaired_by_name() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (a, b) = (tmp.path().join("alice"), tmp.path().join("bob"));
    init(&a, "alice", free_port());
    let snip_b = init(&b, "bob", free_port());
    pin(&a, &snip_b);

    // Bob never runs: every revocation stays pending at alice.
    let mut ids = Vec::new();
    {
        let _nodes = Children(vec![spawn(&a)]);
        wait_for("alice serves", Duration::from_secs(20), || {
            Control::connect(&a).is_ok()
        });
        for i in 0..N {
            let payload = format!(r#"{{"decision": "revoke", "scope": "scope.{i}"}}"#);
            let sent = json(&[
                "send",
                "--dir",
                a.to_str().expect("utf-8"),
                "--kind",
                "anumati.consent",
                "--target",
                "bob",
                "--payload",
                &payload,
                "--deadline",
                "3600",
                "--json",
            ]);
            ids.push(sent["obligation_id"].as_str().expect("an id").to_string());
        }
    }
    let store = |d: &Path| d.join("store.log");
    let (_, recs) = current_log(&store(&a));
    assert!(recs.len() >= N, "{} records for {N} offers", recs.len());
    let mid = recs[recs.len() / 2].clone();
    let last = recs[recs.len() - 1].clone();

    // Each fault with the bytes it destroys: a commit they hit may have
    // nothing left to name its obligation by.
    type Inject = Box<dyn Fn(&mut Vec<u8>)>;
    let sector = mid.start / 512 * 512;
    let faults: Vec<(&str, Inject, std::ops::Range<usize>)> = vec![
        (
            "a bit of a record's length",
            {
                let at = mid.start + 1;
                Box::new(move |b| b[at] ^= 0x02)
            },
            0..0,
        ),
        (
            "a 512-byte sector zeroed mid-file",
            Box::new(move |b| b[sector..sector + 512].fill(0)),
            sector..sector + 512,
        ),
        (
            "the file truncated",
            {
                let at = mid.start;
                Box::new(move |b| b.truncate(at))
            },
            mid.start..usize::MAX,
        ),
        (
            "a bit of the last record",
            {
                let at = last.start + 12 + (last.len() - 16) / 2;
                Box::new(move |b| b[at] ^= 0x10)
            },
            0..0,
        ),
        (
            "a bit of a record's payload",
            {
                let at = mid.start + 12 + (mid.len() - 16) / 2;
                Box::new(move |b| b[at] ^= 0x01)
            },
            0..0,
        ),
        (
            "a bit at the end of a record's payload (past its pending row)",
            {
                let at = mid.end - 4 - 8;
                Box::new(move |b| b[at] ^= 0x04)
            },
            0..0,
        ),
    ];

    for (k, (what, inject, destroyed)) in faults.iter().enumerate() {
        let hit_commits = recs
            .iter()
            .filter(|r| r.start < destroyed.end && destroyed.start < r.end)
            .count();
        let d = tmp.path().join(format!("alice-{k}"));
        copy_dir(&a, &d);
        let ds = d.to_str().expect("utf-8");
        let (log, _) = current_log(&store(&d));
        let mut bytes = std::fs::read(&log).expect("log");
        inject(&mut bytes);
        std::fs::write(&log, &bytes).expect("inject");
        let log_name = log.file_name().and_then(|n| n.to_str()).expect("name");

        // C-SD-2: refused, naming the file and the offset.
        let before = files(&store(&d));
        let refused = abhyasa(&["node", "run", "--dir", ds]);
        let err = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success(), "{what}: the node started");
        assert!(
            err.contains(&format!("damaged store file {log_name} at byte ")),
            "{what}: {err}"
        );
        assert!(err.contains("abhyasa store repair --dir"), "{what}: {err}");
        assert_eq!(files(&store(&d)), before, "{what}: the refused start wrote");

        // C-SD-3: the check reports it and changes no byte.
        let check = abhyasa(&["store", "check", "--dir", ds, "--json"]);
        assert!(!check.status.success(), "{what}: check passed");
        assert_eq!(files(&store(&d)), before, "{what}: check changed a byte");
        let listed: Value = serde_json::from_slice(&check.stdout).expect("JSON");
        let damage = listed.as_array().expect("a list");
        assert!(
            damage
                .iter()
                .any(|x| x["file"] == log_name && x["offset"].is_u64()),
            "{what}: {listed}"
        );

        // C-SD-3: the repair copies aside, salvages and names.
        let repaired = json(&["store", "repair", "--dir", ds, "--json"]);
        let aside = PathBuf::from(repaired["saved_to"].as_str().expect("saved_to"));
        let kept: BTreeMap<PathBuf, Vec<u8>> = files(&aside)
            .into_iter()
            .map(|(p, v)| (store(&d).join(p.file_name().expect("name")), v))
            .collect();
        for (p, v) in &before {
            let n = p.file_name().and_then(|n| n.to_str()).expect("name");
            if n.starts_with("log-") || n.starts_with("snap-") {
                assert_eq!(kept.get(p), Some(v), "{what}: {n} not copied verbatim");
            }
        }
        let named = |field: &str| -> Vec<String> {
            repaired[field]
                .as_array()
                .expect(field)
                .iter()
                .map(|v| v.as_str().expect("an id").to_string())
                .collect()
        };
        let (lost, handed) = (named("lost"), named("escalated"));
        let out = abhyasa(&["store", "check", "--dir", ds]);
        assert!(out.status.success(), "{what}: still damaged after repair");

        // C-SD-4: the node starts; every obligation is pending again,
        // escalated `store_damaged` with its fail-safe, or named lost.
        let _nodes = Children(vec![spawn(&d)]);
        wait_for("the repaired node serves", Duration::from_secs(20), || {
            Control::connect(&d).is_ok()
        });
        let esc = json(&["escalations", "--dir", ds, "--json"]);
        let escalated: BTreeMap<String, Value> = esc["escalations"]
            .as_array()
            .expect("escalations")
            .iter()
            .map(|e| {
                (
                    e["obligation_id"].as_str().expect("id").to_string(),
                    e.clone(),
                )
            })
            .collect();
        // A commit whose key bytes were destroyed (in a zeroed sector, past
        // a cut) cannot be named: the repair reports its place.
        let mut unnamed = 0;
        let mut pending = 0;
        for id in &ids {
            let out = abhyasa(&["status", "--dir", ds, id, "--json"]);
            let status: Value = if out.status.success() {
                serde_json::from_slice(&out.stdout).expect("JSON")
            } else {
                Value::String(String::from_utf8_lossy(&out.stderr).into_owned())
            };
            if status["custodian"] == "pending" {
                assert!(
                    !handed.contains(id),
                    "{what}: {id} handed over, still pending"
                );
                pending += 1;
            } else if handed.contains(id) {
                assert_eq!(status["custodian"], "escalated", "{what}: {id}: {status}");
                let e = &escalated[id];
                assert_eq!(e["cause"], "store_damaged", "{what}: {e}");
                assert_eq!(e["trigger"], "store_repair", "{what}: {e}");
                // The offer's withhold was in the damaged commit: the
                // fail-safe writes it again.
                assert_eq!(e["guard"]["outcome"], "applied", "{what}: {e}");
                assert_eq!(e["safe_action"]["effect"], "fail_closed", "{what}: {e}");
            } else if !lost.contains(id) {
                unnamed += 1;
            }
        }
        assert!(
            unnamed <= hit_commits,
            "{what}: {unnamed} obligations silently absent, but only {hit_commits} \
             commits were hit; repair named {lost:?}"
        );
        if what.contains("past its pending row") {
            assert_eq!(handed.len(), 1, "{what}: {repaired}");
        }
        eprintln!(
            "{what}: {pending} of {N} pending after repair, {} escalated store_damaged, \
             {} named lost, {unnamed} in {hit_commits} hit commit(s), reported by place only",
            handed.len(),
            lost.len()
        );
    }
}
