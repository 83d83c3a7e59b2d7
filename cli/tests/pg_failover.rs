//! Failover of a custodian whose custody lives in PostgreSQL, with real
//! processes (issue 15): two node directories on loopback stand for two
//! machines running the same agent (same identity, same partition), one
//! owning the partition and one standing by (`postgres_standby = true`).
//!
//! * C-FL-2: the owner is SIGKILLed during thousands of obligations; the
//!   standby takes over when the lease lapses, resumes every pending
//!   obligation, and the run ends with every obligation terminal, none
//!   lost, none applied twice at the receiver (verdict from the stores).
//!   It prints kill → takeover and kill → the standby's first commit.
//! * C-FL-1: the owner is SIGSTOPped past its lease; the standby takes
//!   over and commits; on SIGCONT the stale owner finds itself fenced and
//!   its process exits with an error (even with nothing to commit), and no
//!   row carries its epoch beyond those it wrote before the takeover.
//!
//! The database is `ABHYASA_PG_URL` (CI starts a throwaway cluster) or a
//! cluster this test process starts when `initdb` is installed; without
//! either the tests are skipped, saying so.
#![allow(clippy::unwrap_used)]

mod process;

use abhyasa_testkit::pg_cluster as cluster;
use abhyasa_testkit::pg_or_skip;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use abhyasa_core::ObligationId;
use abhyasa_pg::{PgOptions, PgStore, Takeover};
use abhyasa_store::{StoreKind, StoreOptions};
use postgres::{Client, NoTls};
use process::{custody, free_port, init, linked, pin, serving, spawn, wait_for, Children, Control};
use serde_json::json;

const LEASE_MS: u64 = 2_000;

/// The custodian (owner and standby) and the receiver of one run.
struct Site {
    agent: String,
    owner: PathBuf,
    standby: PathBuf,
    bob: PathBuf,
    _tmp: tempfile::TempDir,
}

/// Adds top-level keys to a fresh `init` config (before any `[[peers]]`).
fn add_keys(dir: &Path, lines: &[String]) {
    let path = dir.join("config.toml");
    let mut text = std::fs::read_to_string(&path).unwrap();
    assert!(
        !text.lines().any(|l| l.starts_with("[[peers]]")),
        "add keys before pinning peers"
    );
    for l in lines {
        text.push_str(l);
        text.push('\n');
    }
    std::fs::write(&path, text).unwrap();
}

/// Copies a node directory (config and identity): the standby is the same
/// agent with the same key, on another machine.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.join("identity")).unwrap();
    for f in ["config.toml", "identity/cert.pem", "identity/key.pem"] {
        std::fs::copy(from.join(f), to.join(f)).unwrap();
    }
}

fn site(url: &str, name: &str, backoff: bool) -> Site {
    let tmp = tempfile::tempdir().unwrap();
    let agent = cluster::partition(name).to_string();
    let (owner, standby, bob) = (
        tmp.path().join("owner"),
        tmp.path().join("standby"),
        tmp.path().join("bob"),
    );
    let snip_a = init(&owner, &agent, free_port());
    let snip_b = init(&bob, "bob", free_port());
    copy_dir(&owner, &standby);
    process::set_config(
        &standby,
        "listen",
        &format!("\"127.0.0.1:{}\"", free_port()),
    );
    for (dir, holder, standby) in [(&owner, "host-a", false), (&standby, "host-b", true)] {
        process::set_config(dir, "store", "\"postgres\"");
        add_keys(
            dir,
            &[
                format!("postgres_url = \"{url}\""),
                format!("postgres_lease_ms = {LEASE_MS}"),
                format!("postgres_holder = \"{holder}\""),
                format!("postgres_standby = {standby}"),
            ],
        );
        if backoff {
            // Retries after the takeover come quickly.
            process::set_config(dir, "backoff_base_ms", "100");
            process::set_config(dir, "backoff_cap_ms", "1000");
        }
        pin(dir, &snip_b);
    }
    // Bob pins the agent without an address: whichever machine owns the
    // partition dials bob, and bob answers on that connection.
    let accept_only: String = snip_a
        .lines()
        .filter(|l| !l.starts_with("addr = "))
        .map(|l| format!("{l}\n"))
        .collect();
    pin(&bob, &accept_only);
    Site {
        agent,
        owner,
        standby,
        bob,
        _tmp: tmp,
    }
}

fn sql(url: &str) -> Client {
    Client::connect(url, NoTls).unwrap()
}

/// The partition's current (holder, epoch).
fn owner_row(db: &mut Client, agent: &str) -> Option<(String, i64)> {
    db.query_opt(
        "SELECT holder, epoch FROM abhyasa_owners WHERE partition = $1",
        &[&agent],
    )
    .unwrap()
    .map(|r| (r.get(0), r.get(1)))
}

fn pending(dir: &Path) -> Option<usize> {
    let mut c = Control::connect(dir).ok()?;
    let v = c.call(&json!({"op": "list", "state": "pending"})).ok()?;
    v["result"]["items"].as_array().map(Vec::len)
}

fn kill(c: &mut Child) {
    c.kill().unwrap();
    c.wait().unwrap();
}

// C-FL-2: kill -9 of the owning node during thousands of obligations; the
// standby finishes them all, zero lost, zero applied twice.
#[test]
fn c_fl_2_standby_finishes_every_obligation_after_kill_nine_of_the_owner() {
    let url = pg_or_skip!();
    const N: usize = 2_000;
    const KILL_AFTER: usize = 600;
    let s = site(url, "cfl2", true);
    let mut db = sql(url);

    let mut procs = Children(vec![spawn(&s.bob), spawn(&s.owner)]);
    serving(&s.bob);
    linked(&s.owner);
    let (_, first_epoch) = owner_row(&mut db, &s.agent).expect("the owner took the partition");
    // The standby: same agent, its own directory, waiting on the lease.
    procs.0.push(spawn(&s.standby));

    let at = Arc::new(Mutex::new(s.owner.clone()));
    let confirmed = Arc::new(AtomicUsize::new(0));
    let created_at = custody::created_at_now();
    let offers = {
        let (at, confirmed, target) = (at.clone(), confirmed.clone(), "bob");
        std::thread::spawn(move || {
            custody::offer_all(
                at,
                N,
                4,
                Arc::new(move |i| custody::obligation("cfl2", i, target, &created_at)),
                confirmed,
            )
        })
    };
    wait_for("offers before the kill", Duration::from_secs(120), || {
        confirmed.load(Ordering::SeqCst) >= KILL_AFTER
    });
    // Machine A is lost.
    kill(&mut procs.0[1]);
    let killed = Instant::now();
    *at.lock().unwrap() = s.standby.clone();

    // The takeover and the standby's first commit, seen in the database.
    let mut took_over = None;
    let mut first_commit = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    while first_commit.is_none() && Instant::now() < deadline {
        if let Some((holder, epoch)) = owner_row(&mut db, &s.agent) {
            if epoch > first_epoch {
                assert_eq!(holder, "host-b");
                took_over.get_or_insert_with(|| killed.elapsed());
                let n: i64 = db
                    .query_one(
                        "SELECT count(*) FROM abhyasa_rows WHERE partition = $1 AND epoch = $2",
                        &[&s.agent, &epoch],
                    )
                    .unwrap()
                    .get(0);
                if n > 0 {
                    first_commit = Some(killed.elapsed());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let took_over = took_over.expect("the standby took the partition over");
    let first_commit = first_commit.expect("the standby committed");
    eprintln!(
        "C-FL-2: lease {LEASE_MS} ms; kill -9 → takeover {} ms, → the standby's first \
         commit {} ms (confirmed before the kill: {KILL_AFTER}+ of {N})",
        took_over.as_millis(),
        first_commit.as_millis()
    );

    let offered = offers.join().expect("offer threads");
    wait_for(
        "the standby to discharge every obligation",
        Duration::from_secs(240),
        || pending(&s.standby) == Some(0),
    );
    kill(&mut procs.0[2]);
    kill(&mut procs.0[0]);

    // The verdict, from the partition and bob's store.
    let mut o = PgOptions::with_lease(Duration::from_millis(LEASE_MS));
    o.holder = "verdict".into();
    o.renew_every = None;
    o.takeover = Takeover::Wait {
        poll: Duration::from_millis(100),
    };
    let agent = abhyasa_core::AgentId::new(s.agent.clone()).unwrap();
    let alice = PgStore::open(url, &agent, &o).expect("the partition opens");
    let kind = StoreKind::default();
    let bob = kind
        .open(
            s.bob.join(format!("store.{kind}")),
            &StoreOptions::default(),
        )
        .expect("bob's store opens after kill -9");
    let ids: BTreeSet<ObligationId> = (0..N)
        .map(|i| ObligationId::new(custody::id("cfl2", i)).unwrap())
        .collect();
    let v = custody::verdict(&alice, &*bob, &agent, &ids);
    eprintln!(
        "C-FL-2: {} answers lost to the kill and offered again; verdict {v:?}",
        offered.re_offered
    );
    v.assert_deliver_or_report(N);
    assert_eq!(v.states.get("escalated"), None, "{v:?}");
}

// C-FL-1 with real processes: SIGSTOP the owner past its lease, the
// standby takes over and commits, SIGCONT the owner: it is fenced and
// exits; no row carries its epoch beyond what it wrote before.
#[test]
fn c_fl_1_sigstopped_owner_is_fenced_and_exits_after_the_takeover() {
    let url = pg_or_skip!();
    let s = site(url, "cfl1", false);
    let mut db = sql(url);
    let mut procs = Children(vec![spawn(&s.bob), spawn(&s.owner)]);
    serving(&s.bob);
    linked(&s.owner);
    let (_, stale) = owner_row(&mut db, &s.agent).unwrap();
    procs.0.push(spawn(&s.standby));

    let created_at = custody::created_at_now();
    let offer = |dir: &Path, i: usize| {
        let v = Control::connect(dir)
            .unwrap()
            .call(&json!({"op": "offer", "obligation":
                custody::obligation("cfl1", i, "bob", &created_at)}))
            .unwrap();
        assert_eq!(v["ok"], true, "{v}");
    };
    for i in 0..10 {
        offer(&s.owner, i);
    }
    wait_for("the owner to discharge", Duration::from_secs(30), || {
        pending(&s.owner) == Some(0)
    });

    let pid = procs.0[1].id().to_string();
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP");
    wait_for("the standby to take over", Duration::from_secs(30), || {
        owner_row(&mut db, &s.agent).is_some_and(|(_, e)| e > stale)
    });
    linked(&s.standby);
    for i in 10..20 {
        offer(&s.standby, i);
    }
    wait_for("the standby to discharge", Duration::from_secs(30), || {
        pending(&s.standby) == Some(0)
    });
    let before = cluster::rows_with_epoch(url, &s.agent, stale);

    signal("-CONT");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(st) = procs.0[1].try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "the fenced owner is still running 20 s after SIGCONT"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success(), "the fenced owner exits with an error");
    assert_eq!(
        cluster::rows_with_epoch(url, &s.agent, stale),
        before,
        "the stale owner wrote after the takeover"
    );
    // The standby still owns and serves.
    assert_eq!(owner_row(&mut db, &s.agent).unwrap().0, "host-b");
    serving(&s.standby);
}
