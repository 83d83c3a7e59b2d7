//! SIGKILL a writer process mid-batch: every batch it reported durable is
//! present after reopen, and no batch is present in part.
//!
//! The test re-runs its own binary with `ABHYASA_STORE_KILL_WRITER` set;
//! that child commits batches of custody records through sled or redb as
//! fast as it can and prints `committed <n>` after each `commit` returns.
//! The parent kills it with SIGKILL (`Child::kill`) while it is writing,
//! reopens the database and checks.
#![allow(missing_docs, clippy::unwrap_used)]

use abhyasa_testkit::store_world as common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use abhyasa_core::custody::Custodian;
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::Timestamp;
use common::*;

const WRITER_ENV: &str = "ABHYASA_STORE_KILL_WRITER";
const TEST_NAME: &str = "sigkill_mid_batch_loses_no_reported_batch";
const BATCH: usize = 64;
/// Reports to wait for before the kill.
const KILL_AFTER: usize = 25;

fn writer(spec: &str) {
    let (kind, path) = spec.split_once(':').unwrap();
    let kind = Kind::from_name(kind);
    let mut store = open_disk(kind, std::path::Path::new(path)).unwrap();
    let mut c = Custodian::new(custodian_config(), PolarityRegistry::standard());
    let out = std::io::stdout();
    for n in 0..100_000u64 {
        for i in 0..BATCH {
            c.offer(EPOCH, phala(&format!("b{n}-{i}"), -0.3)).unwrap();
        }
        let b = c.poll_records().unwrap();
        let _ = store.commit(Timestamp::EPOCH, &[&b.records]).unwrap();
        c.handle_committed(b.token());
        let mut o = out.lock();
        writeln!(o, "committed {n}").unwrap();
        o.flush().unwrap();
    }
}

// C-ND-1 (store level): kill -9 of a writing process loses nothing it
// reported durable and tears no batch.
#[test]
fn sigkill_mid_batch_loses_no_reported_batch() {
    if let Ok(spec) = std::env::var(WRITER_ENV) {
        writer(&spec);
        return;
    }
    for kind in DISK {
        let dir = tempfile::tempdir().unwrap();
        let path = disk_path(kind, dir.path());
        let name = kind.name();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([TEST_NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env(WRITER_ENV, format!("{name}:{}", path.display()))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut reported = Vec::new();
        for line in lines.by_ref() {
            if let Some(n) = line.unwrap().strip_prefix("committed ") {
                reported.push(n.parse::<u64>().unwrap());
                if reported.len() == KILL_AFTER {
                    // The writer is inside its next commit (it never pauses).
                    child.kill().unwrap();
                    break;
                }
            }
        }
        // Reports already in the pipe were made before the kill.
        for line in lines {
            if let Some(n) = line.unwrap().strip_prefix("committed ") {
                reported.push(n.parse::<u64>().unwrap());
            }
        }
        let status = child.wait().unwrap();
        assert!(!status.success(), "{kind:?}: the writer was not killed");
        assert!(
            reported.len() >= KILL_AFTER,
            "{kind:?}: writer reported {}",
            reported.len()
        );

        let store = open_disk(kind, &path).unwrap();
        let s = store.load().unwrap();
        let mut per_batch: BTreeMap<u64, usize> = BTreeMap::new();
        for id in s.custodian.pending.keys() {
            let n = id.as_str()[1..]
                .split('-')
                .next()
                .unwrap()
                .parse::<u64>()
                .unwrap();
            *per_batch.entry(n).or_default() += 1;
        }
        for n in &reported {
            assert_eq!(
                per_batch.get(n).copied(),
                Some(BATCH),
                "{kind:?}: reported batch {n} lost"
            );
        }
        for (n, count) in &per_batch {
            assert_eq!(
                *count, BATCH,
                "{kind:?}: batch {n} torn ({count} of {BATCH})"
            );
        }
        let last = *reported.iter().max().unwrap();
        assert!(
            per_batch.keys().all(|n| *n <= last + 1),
            "{kind:?}: batches from nowhere"
        );
        eprintln!(
            "{kind:?}: {} batches reported, {} durable after SIGKILL",
            reported.len(),
            per_batch.len()
        );
    }
}
