//! The damage table rerun with real processes on fjall, redb and sled
//! (`store = "..."`; the log store's run is `store_damage.rs`). One node
//! per store acknowledges custody obligations and is killed; each fault
//! goes into a copy of its store's largest file (a bit flipped at a third,
//! at two thirds and near the end of it, a zeroed 512-byte sector, a
//! truncation to half, a sector copied over another, the file removed).
//! Every fault must end one of these ways (C-SD-2, C-SD-3, C-SD-4):
//!
//! - the node starts and every obligation is pending (the fault hit bytes
//!   the store does not read);
//! - the node refuses to start with an error naming the store, and
//!   `abhyasa store check` changes no byte; if `abhyasa store repair`
//!   succeeds, the node then starts and every obligation is pending,
//!   escalated `store_damaged` or named lost by the repair; if it does not,
//!   the refusal stands (nothing was acknowledged into a store that
//!   opened without it).
//!
//! Never a start with an obligation silently absent.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod process;
use process::{
    abhyasa, free_port, init, json, pin, set_config, spawn, wait_for, Children, Control, BIN,
};

const N: usize = 12;

fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        if dir.is_file() {
            out.insert(dir.to_path_buf(), std::fs::read(dir).expect("read"));
        }
        return out;
    };
    for e in rd {
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

/// How a start ended: `Ok(child)` serving, `Err(stderr)` exited.
fn start(dir: &Path) -> Result<Children, String> {
    let err = dir.join("start.err");
    let mut child = Command::new(BIN)
        .args(["node", "run", "--dir", dir.to_str().expect("utf-8")])
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).expect("stderr file"))
        .spawn()
        .expect("node run");
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let text = std::fs::read_to_string(&err).unwrap_or_default();
            assert!(!status.success(), "the node exited 0: {text}");
            return Err(text);
        }
        // The control socket answers only once the store is open.
        if Control::connect(dir)
            .and_then(|mut c| c.call(&serde_json::json!({"op": "metrics"})))
            .is_ok()
        {
            return Ok(Children(vec![child]));
        }
        assert!(Instant::now() < until, "the node neither served nor exited");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Counts every id: pending, escalated `store_damaged`, or absent (not
/// pending, not escalated, not in `lost`).
fn accounted(dir: &Path, ids: &[String], lost: &[String], what: &str) -> (usize, usize, usize) {
    let ds = dir.to_str().expect("utf-8");
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
    let (mut pending, mut damaged, mut absent) = (0, 0, 0);
    for (i, id) in ids.iter().enumerate() {
        let out = abhyasa(&["status", "--dir", ds, id, "--json"]);
        let status: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        if status["custodian"] == "pending" {
            pending += 1;
        } else if let Some(e) = escalated.get(id) {
            assert_eq!(e["cause"], "store_damaged", "{what}: {id}: {e}");
            damaged += 1;
        } else if !lost.contains(id) {
            eprintln!("{what}: obligation #{i} of {} absent", ids.len());
            absent += 1;
        }
    }
    (pending, damaged, absent)
}

#[test]
fn every_fault_on_fjall_redb_and_sled_is_refused_or_accounted_for() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let b = tmp.path().join("bob");
    let snip_b = init(&b, "bob", free_port());
    let mut table = Vec::new();
    let mut silent = 0;
    for kind in ["fjall", "redb", "sled"] {
        let a = tmp.path().join(kind);
        init(&a, "alice", free_port());
        set_config(&a, "store", &format!("\"{kind}\""));
        pin(&a, &snip_b);
        let store = a.join(format!("store.{kind}"));
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
        // The largest file holds the rows (redb: the file; sled: `db`;
        // fjall: the journal or a table).
        let (big, len) = files(&store)
            .into_iter()
            .map(|(p, v)| (p, v.len()))
            .max_by_key(|(_, n)| *n)
            .expect("a file");
        let rel = big.strip_prefix(tmp.path()).expect("inside").to_path_buf();
        type Inject = Box<dyn Fn(&Path)>;
        type Edit = Box<dyn Fn(&mut Vec<u8>)>;
        let rw = |f: Edit| -> Inject {
            Box::new(move |p: &Path| {
                let mut v = std::fs::read(p).expect("read");
                f(&mut v);
                std::fs::write(p, v).expect("write");
            })
        };
        let sector = len / 2 / 512 * 512;
        let faults: Vec<(&str, Inject)> = vec![
            ("bit flip at 1/3", rw(Box::new(move |v| v[len / 3] ^= 0x02))),
            (
                "bit flip at 2/3",
                rw(Box::new(move |v| v[len * 2 / 3] ^= 0x01)),
            ),
            (
                "bit flip near the end",
                rw(Box::new(move |v| v[len.saturating_sub(64)] ^= 0x10)),
            ),
            (
                "zeroed 512-byte sector",
                rw(Box::new(move |v| {
                    let end = (sector + 512).min(v.len());
                    v[sector..end].fill(0)
                })),
            ),
            (
                "truncated to half",
                rw(Box::new(move |v| v.truncate(len / 2))),
            ),
            (
                "sector copied from elsewhere",
                rw(Box::new(move |v| {
                    let from = (len / 4 / 512 * 512).min(sector);
                    let end = (sector + 512).min(v.len());
                    let piece = v[from..from + (end - sector)].to_vec();
                    if from != sector {
                        v[sector..end].copy_from_slice(&piece);
                    } else {
                        v[sector] ^= 0xff;
                    }
                })),
            ),
            (
                "file missing",
                Box::new(|p: &Path| std::fs::remove_file(p).expect("remove")),
            ),
        ];
        for (k, (what, inject)) in faults.iter().enumerate() {
            let what = format!("{kind}: {what}");
            let d = tmp.path().join(format!("{kind}-{k}"));
            copy_dir(&a, &d);
            let target = tmp.path().join(
                PathBuf::from(format!("{kind}-{k}")).join(rel.strip_prefix(kind).expect("rel")),
            );
            inject(&target);
            let ds = d.to_str().expect("utf-8");
            let s = d.join(format!("store.{kind}"));
            let outcome = match start(&d) {
                Ok(_nodes) => {
                    let (pending, _, absent) = accounted(&d, &ids, &[], &what);
                    silent += absent;
                    if absent == 0 {
                        format!("opens, {pending} of {N} pending")
                    } else {
                        format!("OPENS, {pending} of {N} pending, {absent} SILENTLY ABSENT")
                    }
                }
                Err(err) => {
                    assert!(err.contains("store"), "{what}: untyped refusal: {err}");
                    let before = files(&s);
                    let check = abhyasa(&["store", "check", "--dir", ds]);
                    assert_eq!(files(&s), before, "{what}: check changed a byte");
                    let first = err.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
                    let first: String = first.chars().take(110).collect();
                    let repair = abhyasa(&["store", "repair", "--dir", ds, "--json"]);
                    if !repair.status.success() {
                        format!(
                            "refused ({first}); check exits {}; repair refuses too",
                            check.status.code().unwrap_or(-1)
                        )
                    } else {
                        let r: Value = serde_json::from_slice(&repair.stdout).expect("JSON");
                        let lost: Vec<String> = r["lost"]
                            .as_array()
                            .expect("lost")
                            .iter()
                            .map(|v| v.as_str().expect("id").to_string())
                            .collect();
                        match start(&d) {
                            Ok(_nodes) => {
                                let (pending, damaged, absent) = accounted(&d, &ids, &lost, &what);
                                silent += absent;
                                format!(
                                    "refused ({first}); repaired: {pending} pending, {damaged} \
                                     store_damaged, {} named lost, {absent} silently absent",
                                    lost.len()
                                )
                            }
                            Err(e) => {
                                let e: String = e.chars().take(110).collect();
                                format!("refused ({first}); after repair still refused ({e})")
                            }
                        }
                    }
                }
            };
            eprintln!("{what}: {outcome}");
            table.push(format!("{what}: {outcome}"));
        }
    }
    eprintln!("\n{}", table.join("\n"));
    assert_eq!(
        silent,
        0,
        "obligations silently absent:\n{}",
        table.join("\n")
    );
}
