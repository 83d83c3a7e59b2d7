//! Paged reads benchmark: one page of `list`, `escalations`
//! and the inbox counters on a store holding many records, answered from
//! the indexes, next to the full `load` the node used to run for them.
//!
//! ```text
//! cargo run --release -p abhyasa-store --example reads                  # 1,000,000 records on redb
//! cargo run -p abhyasa-store --example reads -- --records 100000 --store sled
//! cargo run --release -p abhyasa-store --example reads -- --no-load     # skip the full-load baseline
//! ```
//!
//! The records: a quarter each pending, applied, declined (surfaced, so an
//! open decision each) and escalated, written in commits of 10,000
//! obligations. Prints the mean time of one call of each read (a page of
//! 100), then the time of one `load`.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use abhyasa_core::custody::{Custodian, CustodianConfig, CustodyProfile, Record};
use abhyasa_core::polarity::{PolarityRegistry, PHALA_KIND};
use abhyasa_core::store::{ListState, Store};
use abhyasa_core::{
    AckStatus, AgentId, CustodyAck, DeclinePolicy, DeclineReason, Obligation, ObligationId,
    RetryBackoff, Timestamp,
};
use abhyasa_store::{StoreKind, StoreOptions};
use serde_json::json;

const EPOCH: Timestamp = Timestamp::from_unix_seconds(1_780_000_000);
const CHUNK: u64 = 10_000;
const PAGE: usize = 100;

fn obligation(i: u64) -> Obligation {
    Obligation::builder()
        .id(format!("ob-{i:010}"))
        .kind(PHALA_KIND)
        .target("receiver")
        .payload(json!({"weight_delta": -0.25, "weight_key": format!("route-{}", i % 1000), "reason": "corrective"}))
        .deadline_seconds(600)
        .max_retries(64)
        .created_at(EPOCH)
        .build()
        .expect("valid obligation")
}

fn custodian() -> Custodian {
    let mut cfg = CustodianConfig::new(AgentId::new("custodian").expect("id"));
    cfg.max_pending = usize::MAX;
    cfg.default_profile = CustodyProfile {
        backoff: RetryBackoff::DEFAULT,
        decline_policy: DeclinePolicy::Surface,
    };
    Custodian::new(cfg, PolarityRegistry::standard())
}

fn drain(c: &mut Custodian) -> Vec<Record> {
    let mut out = Vec::new();
    while let Some(b) = c.poll_records() {
        c.handle_committed(b.token());
        out.extend(b.records);
    }
    while c.poll_transmit().is_some() {}
    while c.poll_event().is_some() {}
    out
}

/// The records of obligations `first..first + CHUNK`.
fn chunk(first: u64) -> Vec<Record> {
    let to = AgentId::new("receiver").expect("id");
    let (mut settled, mut escalating) = (custodian(), custodian());
    let mut out = Vec::new();
    for i in first..first + CHUNK {
        let ob = obligation(i);
        let status = match i % 4 {
            0 => None,
            1 => Some(AckStatus::Applied),
            2 => Some(AckStatus::Declined),
            _ => {
                escalating.offer(EPOCH, ob).expect("offer");
                continue;
            }
        };
        settled.offer(EPOCH, ob.clone()).expect("offer");
        if let Some(status) = status {
            let mut ack = CustodyAck::new(
                ob.id().clone(),
                to.clone(),
                status,
                EPOCH,
                Some(ob.digest()),
            );
            if status == AckStatus::Declined {
                ack.reason = Some(DeclineReason::Policy);
            }
            settled.handle_ack(EPOCH, &to, &ack);
        }
    }
    out.extend(drain(&mut settled));
    out.extend(drain(&mut escalating));
    escalating.handle_timeout(obligation(first).deadline_at());
    out.extend(drain(&mut escalating));
    out
}

/// Mean time of `f` over `n` calls.
fn mean(n: u32, mut f: impl FnMut()) -> Duration {
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed() / n
}

fn main() {
    let mut records: u64 = 1_000_000;
    let mut kind = StoreKind::Redb;
    let mut with_load = true;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--records" => {
                records = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--records N")
            }
            "--store" => {
                kind = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--store redb|sled|log")
            }
            "--no-load" => with_load = false,
            other => panic!("unknown argument {other}"),
        }
    }
    let records = records.div_ceil(CHUNK) * CHUNK;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = match kind {
        StoreKind::Redb => dir.path().join("reads.redb"),
        StoreKind::Sled => dir.path().join("reads.sled"),
        StoreKind::Log => dir.path().join("reads.log"),
        StoreKind::Fjall => dir.path().join("reads.fjall"),
    };
    let mut store = kind.open(&path, &StoreOptions::default()).expect("open");
    let t = Instant::now();
    for first in (0..records).step_by(CHUNK as usize) {
        let rs = chunk(first);
        let _ = store.commit(EPOCH, &[&rs]).expect("commit");
    }
    println!(
        "{kind}: {records} obligations written in {:.1} s (format {})",
        t.elapsed().as_secs_f64(),
        store.format_version()
    );
    let now = EPOCH.saturating_add(Duration::from_secs(700));
    let inbox = store.inbox(now).expect("inbox");
    println!("inbox: {inbox:?}");
    let mid = ObligationId::new(format!("ob-{:010}", records / 2)).expect("id");
    let n = 200;
    let rows: [(&str, Duration); 6] = [
        (
            "list --state pending (first page)",
            mean(n, || {
                let _ = store.list(Some(ListState::Pending), None, PAGE).unwrap();
            }),
        ),
        (
            "list --state escalated --after <middle>",
            mean(n, || {
                let _ = store
                    .list(Some(ListState::Escalated), Some(&mid), PAGE)
                    .unwrap();
            }),
        ),
        (
            "list (all states) --after <middle>",
            mean(n, || {
                let _ = store.list(None, Some(&mid), PAGE).unwrap();
            }),
        ),
        (
            "escalations (first page)",
            mean(n, || {
                let _ = store.escalations(None, PAGE).unwrap();
            }),
        ),
        (
            "decisions (first page)",
            mean(n, || {
                let _ = store.decisions(None, PAGE).unwrap();
            }),
        ),
        (
            "inbox counters",
            mean(n, || {
                let _ = store.inbox(now).unwrap();
            }),
        ),
    ];
    for (what, d) in rows {
        println!(
            "{what:<42} {:>10.1} µs per call (page of {PAGE})",
            d.as_secs_f64() * 1e6
        );
    }
    if with_load {
        let t = Instant::now();
        let s = store.load().expect("load");
        let d = t.elapsed();
        let inbox_by_fold = s.inbox(now);
        assert_eq!(
            inbox_by_fold, inbox,
            "indexed counters disagree with the records"
        );
        println!(
            "{:<42} {:>10.1} ms (what list/inbox/escalations used to run)",
            "full load (baseline)",
            d.as_secs_f64() * 1e3
        );
    }
}
