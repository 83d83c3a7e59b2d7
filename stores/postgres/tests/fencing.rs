//! Ownership, fencing and failover of `PgStore` (C-FL-1), and what a lost
//! connection leaves of a store.
#![allow(missing_docs, clippy::unwrap_used)]

use abhyasa_testkit::pg_cluster as cluster;
use abhyasa_testkit::pg_or_skip;
use abhyasa_testkit::store_world as common;

use std::sync::mpsc;
use std::time::Duration;

use abhyasa_core::custody::{Custodian, Record};
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::store::{Store, StoreError};
use abhyasa_pg::{PgOptions, PgStore, Takeover};
use common::{custodian_config, phala, EPOCH};
use postgres::{Client, NoTls};

/// The records of offering `id` (custody opened).
fn offer(id: &str) -> Vec<Record> {
    let mut c = Custodian::new(custodian_config(), PolarityRegistry::standard());
    c.offer(EPOCH, phala(id, -0.3)).unwrap();
    let b = c.poll_records().unwrap();
    b.records
}

fn options(holder: &str, lease: Duration, renew: Option<Duration>) -> PgOptions {
    let mut o = PgOptions::with_lease(lease);
    o.holder = holder.to_string();
    o.renew_every = renew;
    o
}

fn sql(url: &str) -> Client {
    Client::connect(url, NoTls).unwrap()
}

// C-FL-1: owner A's lease lapses (A paused, no renewal); standby B takes
// over and commits; A's next commit is refused with `Fenced` inside its own
// transaction and no row carries A's epoch after the takeover.
#[test]
fn stale_owner_is_fenced_after_takeover_c_fl_1() {
    let url = pg_or_skip!();
    let p = cluster::partition("fence");
    let lease = Duration::from_millis(400);
    let mut a = PgStore::open(url, &p, &options("node-a", lease, None)).unwrap();
    let _ = a.commit(EPOCH, &[&offer("before")]).unwrap();
    let a_rows = cluster::rows_with_epoch(url, p.as_str(), a.epoch() as i64);
    assert!(!a_rows.is_empty(), "A wrote nothing under its epoch");

    // While A's lease is live, B may not take over.
    match PgStore::open(url, &p, &options("node-b", lease, None)) {
        Err(StoreError::Owned { holder, .. }) => assert_eq!(holder, "node-a"),
        other => panic!("B took a live lease: {other:?}"),
    }
    // A is paused past its lease (no renewal, no commit).
    std::thread::sleep(lease + Duration::from_millis(200));
    let mut b = PgStore::open(url, &p, &options("node-b", lease, None)).unwrap();
    assert_eq!(b.epoch(), a.epoch() + 1);
    let _ = b.commit(EPOCH, &[&offer("by-b")]).unwrap();

    // A resumes: refused, and told who owns the partition now.
    match a.commit(EPOCH, &[&offer("stale")]) {
        Err(StoreError::Fenced {
            ours,
            current,
            holder,
        }) => {
            assert_eq!(ours, a.epoch());
            assert_eq!(current, b.epoch());
            assert_eq!(holder, "node-b");
        }
        other => panic!("stale owner's commit was not fenced: {other:?}"),
    }
    // It stays refused (the node stops), and nothing of it landed.
    assert!(matches!(
        a.commit(EPOCH, &[&offer("stale-2")]),
        Err(StoreError::Fenced { .. })
    ));
    assert!(a.lost_ownership());
    // B's commit rewrote some of A's rows; none was (re)written under A's.
    let after = cluster::rows_with_epoch(url, p.as_str(), a.epoch() as i64);
    assert!(
        after.is_subset(&a_rows),
        "a row carries the stale epoch after the takeover: {:?}",
        after.difference(&a_rows).collect::<Vec<_>>()
    );
    let s = b.load().unwrap();
    let mut ids: Vec<&str> = s.custodian.pending.keys().map(|k| k.as_str()).collect();
    ids.sort();
    assert_eq!(
        ids,
        ["before", "by-b"],
        "stale write landed or earlier lost"
    );
    // B loads A's pending obligation with its absolute deadline (the store
    // half of C-FL-2; the kill -9 process test is not written yet).
    let before = &s.custodian.pending[&common::oid("before")];
    assert_eq!(
        before.obligation.deadline_at(),
        phala("before", -0.3).deadline_at()
    );
}

// Takeover is ordered against a commit in flight: a takeover that finds
// the owner row locked by the owner's transaction waits for it, and the
// owner's renewal in that commit keeps the partition.
#[test]
fn commit_renews_the_lease_so_a_busy_owner_keeps_it_c_fl_1() {
    let url = pg_or_skip!();
    let p = cluster::partition("busy");
    let lease = Duration::from_millis(500);
    let mut a = PgStore::open(url, &p, &options("node-a", lease, None)).unwrap();
    for i in 0..6 {
        std::thread::sleep(Duration::from_millis(150));
        let _ = a.commit(EPOCH, &[&offer(&format!("o{i}"))]).unwrap();
        assert!(
            matches!(
                PgStore::open(url, &p, &options("node-b", lease, None)),
                Err(StoreError::Owned { .. })
            ),
            "B took over from an owner that commits"
        );
    }
}

// A standby waits while the owner renews, takes over once the owner stops
// (a clean stop releases the lease at once), and the renewal thread of a
// superseded owner reports the loss.
#[test]
fn standby_waits_for_the_owner_and_takes_over_when_it_stops() {
    let url = pg_or_skip!();
    let p = cluster::partition("standby");
    let lease = Duration::from_millis(600);
    let a = PgStore::open(
        url,
        &p,
        &options("node-a", lease, Some(Duration::from_millis(100))),
    )
    .unwrap();
    let (tx, rx) = mpsc::channel();
    let (u, q) = (url.to_string(), p.clone());
    let standby = std::thread::spawn(move || {
        let mut o = options("node-b", lease, None);
        o.takeover = Takeover::Wait {
            poll: Duration::from_millis(50),
        };
        tx.send(PgStore::open(&u, &q, &o).map(|s| s.epoch()))
            .unwrap();
    });
    // Renewed every 100 ms: three leases pass and B still waits.
    assert!(
        rx.recv_timeout(lease * 3).is_err(),
        "standby took over a renewed lease"
    );
    let a_epoch = a.epoch();
    drop(a);
    let b_epoch = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("standby never took over")
        .unwrap();
    assert_eq!(b_epoch, a_epoch + 1);
    standby.join().unwrap();
}

// A node that stops on an error drops its store from async code: the
// release must not panic there (the synchronous client runs a runtime of
// its own), and it must still end the lease so a standby takes over at
// once rather than after a whole lease.
#[test]
fn a_store_dropped_inside_a_runtime_releases_its_lease() {
    let url = pg_or_skip!();
    let p = cluster::partition("droprt");
    let lease = Duration::from_secs(60);
    let a = PgStore::open(url, &p, &options("node-a", lease, None)).unwrap();
    let a_epoch = a.epoch();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async move { drop(a) });
    // Released: B takes over now, not a minute from now.
    let b = PgStore::open(url, &p, &options("node-b", lease, None)).unwrap();
    assert_eq!(b.epoch(), a_epoch + 1);
}

#[test]
fn renewal_thread_notices_a_takeover() {
    let url = pg_or_skip!();
    let p = cluster::partition("renew");
    let a = PgStore::open(
        url,
        &p,
        &options(
            "node-a",
            Duration::from_millis(300),
            Some(Duration::from_millis(50)),
        ),
    )
    .unwrap();
    assert!(!a.lost_ownership());
    // Another node takes over (as after a lapse the renewal could not stop).
    sql(url)
        .execute(
            "UPDATE abhyasa_owners SET epoch = epoch + 1, holder = 'node-x' WHERE partition = $1",
            &[&p.as_str()],
        )
        .unwrap();
    assert!(
        cluster::wait_for(Duration::from_secs(3), || a.lost_ownership()),
        "renewal never noticed"
    );
}

// Many agents share one database: each partition sees only its own rows.
#[test]
fn partitions_are_isolated() {
    let url = pg_or_skip!();
    let (p1, p2) = (cluster::partition("iso-a"), cluster::partition("iso-b"));
    let mut s1 = PgStore::open(url, &p1, &options("n1", Duration::from_secs(30), None)).unwrap();
    let mut s2 = PgStore::open(url, &p2, &options("n2", Duration::from_secs(30), None)).unwrap();
    let _ = s1.commit(EPOCH, &[&offer("only-1")]).unwrap();
    let _ = s2.commit(EPOCH, &[&offer("only-2")]).unwrap();
    let mut k1: Vec<String> = s1
        .load()
        .unwrap()
        .custodian
        .pending
        .keys()
        .map(|k| k.to_string())
        .collect();
    k1.sort();
    assert_eq!(k1, ["only-1"]);
    assert_eq!(
        s1.events(abhyasa_core::store::EventId(0), 10)
            .unwrap()
            .len(),
        1
    );
    assert_eq!(s2.load().unwrap().custodian.pending.len(), 1);
}

// A lost connection: the commit fails, the store refuses every later call
// (the node stops), and a restart loads exactly what was durable.
#[test]
fn lost_connection_stops_the_store_and_restart_loads_what_is_durable() {
    let url = pg_or_skip!();
    let p = cluster::partition("lost");
    let lease = Duration::from_millis(800);
    let opts = options("node-a", lease, None);
    let mut a = PgStore::open(url, &p, &opts).unwrap();
    let _ = a.commit(EPOCH, &[&offer("durable")]).unwrap();
    let pid = a.backend_pid().unwrap();
    sql(url)
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .unwrap();
    assert!(a.commit(EPOCH, &[&offer("lost")]).is_err());
    let again = a.commit(EPOCH, &[&offer("after")]);
    assert!(again.is_err(), "a broken store accepted a commit");
    assert!(a.load().is_err(), "a broken store answered a read");
    drop(a);
    // The broken store could not end its lease: the same holder name is
    // refused while it is live (C-PA-4), and takes the partition back
    // once it lapses.
    std::thread::sleep(lease + Duration::from_millis(200));
    let b = PgStore::open(url, &p, &opts).unwrap();
    let ids: Vec<String> = b
        .load()
        .unwrap()
        .custodian
        .pending
        .keys()
        .map(|k| k.to_string())
        .collect();
    assert_eq!(ids, ["durable"]);
}

// C-PA-4: a holder name copied between two configurations does not take
// the partition from the live owner under that name: a typed refusal, the
// owner keeps writing under its epoch. A clean stop ends the lease, so the
// same name restarts at once; a standby under that name takes over only
// once the lease lapses (an explicit, fenced takeover).
#[test]
fn c_pa_4_holder_name_owning_a_live_partition_is_refused() {
    let url = pg_or_skip!();
    let p = cluster::partition("holder");
    let lease = Duration::from_millis(600);
    let opts = options("host-a", lease, None);
    let mut a = PgStore::open(url, &p, &opts).unwrap();
    let _ = a.commit(EPOCH, &[&offer("by-a")]).unwrap();
    match PgStore::open(url, &p, &opts) {
        Err(StoreError::HolderInUse {
            holder,
            remaining_ms,
        }) => {
            assert_eq!(holder, "host-a");
            assert!(remaining_ms > 0 && remaining_ms <= 600, "{remaining_ms}");
        }
        other => panic!("a copied holder name took a live partition: {other:?}"),
    }
    // The owner was not fenced: it still writes under its epoch.
    let _ = a.commit(EPOCH, &[&offer("still-a")]).unwrap();
    drop(a);
    // A clean stop released the lease: the same name restarts at once.
    let b = PgStore::open(url, &p, &opts).unwrap();
    let mut ids: Vec<String> = b
        .load()
        .unwrap()
        .custodian
        .pending
        .keys()
        .map(|k| k.to_string())
        .collect();
    ids.sort();
    assert_eq!(ids, ["by-a", "still-a"]);
    // Held without renewal: a standby under the same name waits for the
    // lease to lapse, then takes over with a new epoch and fences b.
    let mut standby = options("host-a", lease, None);
    standby.takeover = Takeover::Wait {
        poll: Duration::from_millis(50),
    };
    let c = PgStore::open(url, &p, &standby).unwrap();
    assert_eq!(c.epoch(), b.epoch() + 1);
    let mut b = b;
    assert!(matches!(
        b.commit(EPOCH, &[&offer("stale")]),
        Err(StoreError::Fenced { .. })
    ));
}

// format_version is checked as on the embedded stores.
#[test]
fn newer_format_version_is_refused() {
    let url = pg_or_skip!();
    let p = cluster::partition("format");
    let opts = options("n", Duration::from_secs(30), None);
    let s = PgStore::open(url, &p, &opts).unwrap();
    assert_eq!(s.format_version(), abhyasa_store::FORMAT_VERSION);
    drop(s);
    let newer = (abhyasa_store::FORMAT_VERSION + 1).to_be_bytes().to_vec();
    let n = sql(url)
        .execute(
            "UPDATE abhyasa_rows SET value = $2
             WHERE partition = $1 AND tbl = 'meta' AND key = 'format_version'::bytea",
            &[&p.as_str(), &newer],
        )
        .unwrap();
    assert_eq!(n, 1);
    match PgStore::open(url, &p, &opts) {
        Err(StoreError::NewerFormat { found, supported }) => {
            assert_eq!(found, abhyasa_store::FORMAT_VERSION + 1);
            assert_eq!(supported, abhyasa_store::FORMAT_VERSION);
        }
        other => panic!("newer format opened: {other:?}"),
    }
}

/// A TCP proxy to the database that, once armed, passes the client's
/// `COMMIT` to the server and then cuts the connection before the answer
/// comes back: the commit is in doubt for the client.
fn cutting_proxy(url: &str) -> (String, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let cfg: postgres::Config = url.parse().unwrap();
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let local = listener.local_addr().unwrap().port();
    let armed = Arc::new(AtomicBool::new(false));
    let flag = armed.clone();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { return };
            let mut server = TcpStream::connect(("127.0.0.1", port)).unwrap();
            let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(n) = s2.read(&mut buf) {
                    if n == 0 || c2.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
            let flag = flag.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(n) = client.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let cut =
                        flag.load(Ordering::SeqCst) && buf[..n].windows(6).any(|w| w == b"COMMIT");
                    if cut {
                        // Stop relaying answers first, then let COMMIT through.
                        let _ = client.shutdown(Shutdown::Both);
                        let _ = server.write_all(&buf[..n]);
                        std::thread::sleep(Duration::from_millis(300));
                        let _ = server.shutdown(Shutdown::Both);
                        break;
                    }
                    if server.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    let user = cfg.get_user().unwrap_or("postgres").to_string();
    let db = cfg.get_dbname().unwrap_or("postgres").to_string();
    (format!("postgres://{user}@127.0.0.1:{local}/{db}"), armed)
}

// The connection drops during COMMIT: the outcome is unknown to the node,
// so the commit fails as in doubt and the store refuses everything after
// it (the node stops); a restart learns the outcome by loading, never by
// guessing (here the server did commit it).
#[test]
fn commit_in_doubt_stops_the_store_and_restart_loads_the_truth() {
    let url = pg_or_skip!();
    let (proxied, armed) = cutting_proxy(url);
    let p = cluster::partition("doubt");
    let opts = options("node-a", Duration::from_millis(800), None);
    let mut a = PgStore::open(&proxied, &p, &opts).unwrap();
    let _ = a.commit(EPOCH, &[&offer("first")]).unwrap();
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let e = a
        .commit(EPOCH, &[&offer("doubt")])
        .expect_err("a commit whose answer was lost reported success");
    assert!(e.to_string().contains("in doubt"), "{e}");
    assert!(a.commit(EPOCH, &[&offer("after")]).is_err());
    assert!(a.load().is_err());
    drop(a);
    // The broken store could not end its lease: the restart under the
    // same holder name waits it out (C-PA-4).
    let mut restart = opts.clone();
    restart.takeover = Takeover::Wait {
        poll: Duration::from_millis(50),
    };
    let b = PgStore::open(url, &p, &restart).unwrap();
    let mut ids: Vec<String> = b
        .load()
        .unwrap()
        .custodian
        .pending
        .keys()
        .map(|k| k.to_string())
        .collect();
    ids.sort();
    assert_eq!(ids, ["doubt", "first"], "the in-doubt commit's outcome");
}
