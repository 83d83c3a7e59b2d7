//! The database itself crashes (`pg_ctl stop -m immediate`) mid-run and
//! restarts: no commit reported durable is lost, the one in flight lands
//! whole or not at all, and every obligation still ends terminal, none
//! applied twice. Each test runs its own throwaway cluster (it must crash
//! it), so these need `initdb`; they skip, saying so, without it.
#![allow(missing_docs, clippy::unwrap_used)]

use abhyasa_testkit::pg_backend as backend;
use abhyasa_testkit::pg_cluster as cluster;
use abhyasa_testkit::store_world as common;

use std::sync::mpsc;
use std::time::Duration;

use abhyasa_core::custody::{Custodian, EffectValue, Record, TerminalState};
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::store::Store;
use abhyasa_pg::{PgStore, Takeover};
use backend::{test_options, PgBackend};
use cluster::Cluster;
use common::*;

fn offer(id: &str) -> Vec<Record> {
    let mut c = Custodian::new(custodian_config(), PolarityRegistry::standard());
    c.offer(EPOCH, phala(id, -0.3)).unwrap();
    c.poll_records().unwrap().records
}

#[test]
fn database_crash_mid_commits_loses_nothing_reported_durable() {
    let Some(db) = Cluster::start_new() else {
        eprintln!("SKIPPED: needs initdb to crash a private cluster");
        return;
    };
    let p = cluster::partition("dbcrash");
    // No renewals: the lease lapses this long after the open, and the
    // restart after the crash (same holder name) waits for that (C-PA-4).
    let mut opts = test_options("node");
    opts.lease = Duration::from_secs(2);
    let mut s = PgStore::open(&db.url, &p, &opts).unwrap();
    let (started, rx) = mpsc::channel();
    let writer = std::thread::spawn(move || {
        let mut ok = Vec::new();
        for i in 0.. {
            let id = format!("o{i:06}");
            match s.commit(EPOCH, &[&offer(&id)]) {
                Ok(_) => ok.push(id),
                Err(e) => {
                    // In doubt or not, the store stays stopped.
                    assert!(s.commit(EPOCH, &[&offer("after")]).is_err());
                    return (ok, id, e.to_string());
                }
            }
            if i == 20 {
                started.send(()).unwrap();
            }
        }
        unreachable!()
    });
    rx.recv().unwrap();
    std::thread::sleep(Duration::from_millis(150));
    db.crash();
    let (ok, in_flight, err) = writer.join().unwrap();
    eprintln!("{} commits reported durable, then: {err}", ok.len());
    assert!(db.start(), "cluster did not restart");
    let mut restart = opts.clone();
    restart.takeover = Takeover::Wait {
        poll: Duration::from_millis(50),
    };
    let s = PgStore::open(&db.url, &p, &restart).unwrap();
    let state = s.load().unwrap();
    for id in &ok {
        assert!(
            state.custodian.pending.contains_key(&oid(id)),
            "{id} was reported durable and is gone"
        );
    }
    let n = state.custodian.pending.len();
    if n == ok.len() + 1 {
        assert!(state.custodian.pending.contains_key(&oid(&in_flight)));
    } else {
        assert_eq!(n, ok.len(), "rows beyond the commits made");
    }
    // The log agrees with the rows: one event per record, none torn.
    assert_eq!(state.next_event.0, n as u64);
}

#[test]
fn database_crash_mid_run_every_obligation_terminal_none_twice() {
    let Some(db) = Cluster::start_new() else {
        eprintln!("SKIPPED: needs initdb to crash a private cluster");
        return;
    };
    let lease = Duration::from_secs(2);
    let mut c = PgBackend::with_lease(&db.url, cluster::partition("dbrun-c"), lease);
    let mut r = PgBackend::with_lease(&db.url, cluster::partition("dbrun-r"), lease);
    c.crash_on_error = true;
    r.crash_on_error = true;
    let mut w = World::with_backends(Box::new(c), Box::new(r));
    let obs: Vec<_> = (0..30).map(|i| phala(&format!("ob{i}"), -0.1)).collect();
    w.partitioned = true;
    for ob in &obs {
        w.offer(ob.clone());
    }
    w.run(Duration::from_secs(5));
    // The database dies with retries pending, then comes back.
    db.crash();
    assert!(db.start(), "cluster did not restart");
    w.partitioned = false;
    w.run(Duration::from_secs(600));
    assert!(w.crashes >= 1, "no side noticed the database crash");
    let cs = w.cstore.load();
    let rs = w.rstore.load();
    assert!(
        cs.custodian.pending.is_empty(),
        "still pending after the run"
    );
    for ob in &obs {
        let t = cs.custodian.terminal.get(ob.id()).expect("obligation lost");
        assert_eq!(t.state, TerminalState::Applied, "{}", ob.id());
        let count = match rs.receiver.effects.get(&counter_key(ob.id())) {
            Some(EffectValue::Json(v)) => v.as_u64().unwrap(),
            _ => 0,
        };
        assert_eq!(count, 1, "{} applied {count} times", ob.id());
    }
}
