//! `PgStore` behind the embedded stores' test interface ([`Backend`] of
//! `store_world`), so the shared two-node `World` drives the
//! real custodian and receiver through PostgreSQL, with crash points and
//! restarts (close and reopen, as on sled and redb).
#![allow(dead_code, unreachable_pub, missing_docs, clippy::unwrap_used)]

use std::time::Duration;

use abhyasa_core::custody::Record;
use abhyasa_core::store::{Committed, CrashTiming, Store, StoreError};
use abhyasa_core::{AgentId, Timestamp};
use abhyasa_pg::{PgOptions, PgStore, Takeover};

use crate::store_world::{Backend, Kind};

/// Options for tests: a fixed holder (a reopen takes the partition back at
/// once), a long lease, no renewal thread (commits renew).
pub fn test_options(holder: &str) -> PgOptions {
    let mut o = PgOptions::with_lease(Duration::from_secs(60));
    o.holder = holder.to_string();
    o.renew_every = None;
    o
}

pub struct PgBackend {
    url: String,
    agent: AgentId,
    holder: String,
    store: Option<PgStore>,
    commits: u64,
    armed: Option<(u64, CrashTiming)>,
    down: Option<u64>,
    /// Treat a failed commit (the database went away) as the node's crash:
    /// the side stops and restarts from a fresh open, as `abhyasa node run`
    /// would under a supervisor.
    pub crash_on_error: bool,
    lease: Duration,
}

impl PgBackend {
    pub fn new(url: &str, agent: AgentId) -> Self {
        Self::with_lease(url, agent, test_options("").lease)
    }

    /// A backend whose partition lease is `lease`: a restart after a crash
    /// that could not end the lease (the database went away) waits it out
    /// under the same holder name (C-PA-4), so a test that crashes the
    /// database keeps it short.
    pub fn with_lease(url: &str, agent: AgentId, lease: Duration) -> Self {
        let holder = format!("test-{}", agent.as_str());
        let mut options = test_options(&holder);
        options.lease = lease;
        let store = PgStore::open(url, &agent, &options).unwrap();
        Self {
            url: url.to_string(),
            agent,
            holder,
            lease,
            store: Some(store),
            commits: 0,
            armed: None,
            down: None,
            crash_on_error: false,
        }
    }

    pub fn pg(&mut self) -> &mut PgStore {
        self.store.as_mut().unwrap()
    }
}

impl Backend for PgBackend {
    fn kind(&self) -> Kind {
        // Closed and reopened on restart, as the disk stores are.
        Kind::Redb
    }
    fn store(&mut self) -> &mut dyn Store {
        self.store.as_mut().unwrap()
    }
    fn commit(&mut self, now: Timestamp, batches: &[&[Record]]) -> Result<Committed, StoreError> {
        if let Some(commit) = self.down {
            return Err(StoreError::Crashed { commit });
        }
        self.commits += 1;
        let n = self.commits;
        match self.armed {
            Some((k, timing)) if k == n => {
                if timing == CrashTiming::AfterDurable {
                    let _durable = self.store().commit(now, batches)?;
                }
                self.down = Some(n);
                Err(StoreError::Crashed { commit: n })
            }
            _ => match self.store().commit(now, batches) {
                Err(e) if self.crash_on_error && !matches!(e, StoreError::Fenced { .. }) => {
                    eprintln!("commit {n} failed ({e}); the node crashes");
                    self.down = Some(n);
                    Err(StoreError::Crashed { commit: n })
                }
                other => other,
            },
        }
    }
    fn arm(&mut self, k: u64, timing: CrashTiming) {
        self.armed = Some((self.commits + k, timing));
    }
    fn restart(&mut self) {
        self.store = None;
        let mut options = test_options(&self.holder);
        options.lease = self.lease;
        options.takeover = Takeover::Wait {
            poll: Duration::from_millis(50),
        };
        self.store = Some(PgStore::open(&self.url, &self.agent, &options).unwrap());
        self.armed = None;
        self.down = None;
    }
    fn commits(&self) -> u64 {
        self.commits
    }
}

/// A two-node world on PostgreSQL: custodian and receiver each in their
/// own partition of the shared database.
pub fn pg_world(url: &str, name: &str) -> crate::store_world::World {
    crate::store_world::World::with_backends(
        Box::new(PgBackend::new(
            url,
            crate::pg_cluster::partition(&format!("{name}-c")),
        )),
        Box::new(PgBackend::new(
            url,
            crate::pg_cluster::partition(&format!("{name}-r")),
        )),
    )
}
