//! What a world's nodes are opened from, and how each node is opened on
//! its cell's transport and store.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use abhyasa::{Node, NodeOptions};
use abhyasa_a2a::{HttpConfig, HttpPeer};
use abhyasa_core::custody::{CustodyProfile, StandardApplier};
use abhyasa_core::store::Store;
use abhyasa_core::{DeclinePolicy, Kind, Obligation, RetryBackoff};
use abhyasa_identity::Identity;
use abhyasa_quic::QuicConfig;
use abhyasa_spool::{RelayHandle, RelayedConfig};
use abhyasa_store::StoreOptions;
use abhyasa_transport::mem::MemNetwork;
use abhyasa_transport::{LinkConfig, Transport};
// The HTTP cells fix both nodes' ports up front (each node's configuration
// names the other's endpoint, and a restart must come back on the same
// one): ports the kernel never hands to another socket in the meantime.
use abhyasa_testkit::loopback_port;
use abhyasa_ws::WsConfig;

use crate::applier::{Applies, Scripted};
use crate::common::BoxError;
use crate::matrix::{postgres_url, Backend, Disk, Net};
use crate::peers::{agent, token, Schedule, ALICE, BOB, CUSTODIAN_SEED, RELAY, SURFACE_KIND};
use crate::plug::Plug;
use crate::probe::{Probe, Probed, SharedSim};

/// What a world's nodes are opened from: identities, stores that outlive
/// the nodes, the in-memory network and bob's address.
pub(crate) struct Env {
    pub(crate) backend: Backend,
    pub(crate) schedule: Schedule,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) mem: MemNetwork,
    pub(crate) alice_id: Identity,
    pub(crate) bob_id: Identity,
    pub(crate) bob_addr: Option<SocketAddr>,
    pub(crate) sims: [SharedSim; 2],
    pub(crate) alice_plug: Plug,
    pub(crate) bob_plug: Plug,
    /// The relay daemon of the [`Net::Relayed`] cells (it outlives both
    /// nodes' restarts) and its identity.
    pub(crate) relay: Option<RelayHandle>,
    pub(crate) relay_id: Identity,
    /// Alice's and bob's HTTP ports ([`Net::Http`]), fixed for the world.
    pub(crate) http_ports: [u16; 2],
    /// This world's partitions' prefix on PostgreSQL: unique per world, so
    /// cells sharing the database never see each other's rows.
    pub(crate) pg_prefix: String,
    /// Bob's applier's decisions to apply, across restarts.
    pub(crate) applies: Applies,
    /// What alice's store made durable (every store of hers is wrapped).
    pub(crate) probe: Probe,
    /// How many times alice's store was lost ([`World::reopen_alice_on_fresh_store`]):
    /// her current store's generation, part of its file or partition name.
    pub(crate) alice_generation: u32,
    /// Every obligation a scenario built (the candidates for the trace's
    /// offers: those alice holds or closed were offered).
    pub(crate) made: Arc<Mutex<Vec<Obligation>>>,
}

impl Env {
    pub(crate) fn options(&self, name: &str) -> NodeOptions {
        let mut o = NodeOptions::new(agent(name));
        let backoff = RetryBackoff {
            base: self.schedule.base,
            cap: self.schedule.cap,
            jitter: self.schedule.jitter,
        };
        o.custodian.seed = CUSTODIAN_SEED;
        o.custodian.default_profile = CustodyProfile {
            backoff,
            ..CustodyProfile::default()
        };
        o.custodian.profiles.insert(
            Kind::new(SURFACE_KIND).unwrap_or_else(|e| panic!("kind {SURFACE_KIND}: {e}")),
            CustodyProfile {
                backoff,
                decline_policy: DeclinePolicy::Surface,
            },
        );
        o.receiver.skew_margin = Duration::from_millis(100);
        o.applier = Box::new(Scripted(StandardApplier::default(), self.applies.clone()));
        o
    }

    /// The name of `name`'s current store (file or partition): alice's
    /// carries her store's generation once it was lost.
    pub(crate) fn store_name(&self, name: &str) -> String {
        match self.alice_generation {
            g if g > 0 && name == ALICE => format!("{name}-{g}"),
            _ => name.to_string(),
        }
    }

    pub(crate) fn store_path(&self, name: &str) -> PathBuf {
        self.dir
            .path()
            .join(format!("{}.db", self.store_name(name)))
    }

    pub(crate) async fn store(&self, name: &str) -> Result<Box<dyn Store>, BoxError> {
        let i = usize::from(name == BOB);
        Ok(match self.backend.disk {
            Disk::Sim => Box::new(self.sims[i].clone()),
            Disk::Embedded(kind) => kind.open(self.store_path(name), &StoreOptions::default())?,
            Disk::Postgres => {
                let url = postgres_url().ok_or("ABHYASA_PG_URL is not set")?;
                let mut o = abhyasa_pg::PgOptions::default();
                let partition = format!("{}-{}", self.pg_prefix, self.store_name(name));
                // One holder name per node: a restart takes its partition
                // back at once (the previous store ended its lease anyway).
                o.holder = partition.clone();
                o.partition = Some(partition);
                let agent = agent(name);
                // The synchronous client runs its own runtime: off this one.
                Box::new(
                    tokio::task::spawn_blocking(move || {
                        abhyasa_pg::PgStore::open(&url, &agent, &o)
                    })
                    .await??,
                )
            }
        })
    }

    pub(crate) async fn transport(&mut self, name: &str) -> Result<Transport, BoxError> {
        let is_bob = name == BOB;
        let (me, peer) = if is_bob { (BOB, ALICE) } else { (ALICE, BOB) };
        let (my_id, peer_id) = if is_bob {
            (self.bob_id.clone(), self.alice_id.clone())
        } else {
            (self.alice_id.clone(), self.bob_id.clone())
        };
        // Over QUIC and WebSocket bob listens (on the same port across
        // restarts, one the kernel hands no other socket while he is down);
        // alice dials him.
        let listen = || -> SocketAddr {
            match (is_bob, self.bob_addr) {
                (true, Some(a)) => a,
                (true, None) => SocketAddr::from(([127, 0, 0, 1], loopback_port())),
                (false, _) => SocketAddr::from(([127, 0, 0, 1], 0)),
            }
        };
        let dial = if is_bob { None } else { self.bob_addr };
        let t = match self.backend.net {
            Net::Mem => self.mem.join(agent(me), LinkConfig::default()).await?,
            Net::Quic => {
                abhyasa_quic::start(
                    QuicConfig::new(agent(me), my_id, listen())
                        .with_peer(peer_id.pin(agent(peer)), dial),
                )
                .await?
            }
            Net::Ws => {
                abhyasa_ws::start(
                    WsConfig::new(agent(me), my_id, Some(listen()))
                        .with_peer(peer_id.pin(agent(peer)), dial.map(|a| format!("ws://{a}"))),
                )
                .await?
            }
            Net::Relayed => {
                // Both nodes dial out to the relay; neither needs an address
                // the other knows. A reopened node gets a fresh link to the
                // same relay, which kept what it held for it.
                let relay_addr = self
                    .relay
                    .as_ref()
                    .and_then(RelayHandle::local_addr)
                    .ok_or("the relay is not running")?;
                let quic = abhyasa_quic::start(
                    QuicConfig::new(agent(me), my_id.clone(), "127.0.0.1:0".parse()?)
                        .with_peer(self.relay_id.pin(agent(RELAY)), Some(relay_addr)),
                )
                .await?;
                let (t, _stats) = abhyasa_spool::relayed(
                    quic,
                    RelayedConfig::new(agent(RELAY), vec![peer_id.pin(agent(peer))], my_id),
                );
                t
            }
            Net::Http => {
                let (mine, theirs) = if is_bob {
                    (self.http_ports[1], self.http_ports[0])
                } else {
                    (self.http_ports[0], self.http_ports[1])
                };
                let base = format!("http://127.0.0.1:{theirs}");
                let peer_cfg = HttpPeer {
                    agent: agent(peer),
                    token: Some(token(peer)),
                    fingerprint: None,
                    // Bob pushes late final acks to alice; alice POSTs
                    // obligations to bob.
                    custody_ack_endpoint: (is_bob).then(|| format!("{base}/abhyasa/custody_ack")),
                    obligation_endpoint: (!is_bob).then(|| format!("{base}/abhyasa/obligations")),
                    outbound_token: Some(token(me)),
                };
                // The card must advertise at least one kind; it restricts
                // nothing the binding accepts.
                let mut profiles = Vec::new();
                for k in ["anumati.consent", SURFACE_KIND] {
                    profiles.push(abhyasa_a2a::card::kind_profile(
                        Kind::new(k)?,
                        "",
                        600,
                        &RetryBackoff::DEFAULT,
                    )?);
                }
                let mut cfg = HttpConfig::loopback(me, vec![peer_cfg], profiles);
                cfg.listen = SocketAddr::from(([127, 0, 0, 1], mine));
                // A request whose frame the plug dropped is answered 202
                // after this; the custodian's retry is the redelivery.
                cfg.sync_wait = Duration::from_millis(500);
                cfg.client_timeout = Duration::from_secs(2);
                // Alice's client opens a connection per concurrent request,
                // all from 127.0.0.1: a burst of offers would meet the
                // per-source cap on handshakes, which bounds anonymous
                // floods (C-PA-1, shown in cli/tests/preauth.rs) and is not
                // what this suite measures.
                cfg.max_handshakes_per_source = cfg.max_handshakes;
                let (t, _server) = abhyasa_a2a::start(agent(me), cfg).await?;
                t
            }
        };
        if is_bob && matches!(self.backend.net, Net::Quic | Net::Ws) {
            self.bob_addr = t.handle.local_addr();
        }
        let plug = if is_bob {
            &self.bob_plug
        } else {
            &self.alice_plug
        };
        Ok(plug.wrap(t))
    }

    pub(crate) async fn open_node(&mut self, name: &str) -> Result<Node, BoxError> {
        // A restarted bob rebinds his port: the previous endpoint's socket
        // is closed by `shutdown`, but the kernel may take a moment to let
        // the address go (UDP for QUIC). Retry the bind briefly.
        let mut tries = 0;
        let t = loop {
            match self.transport(name).await {
                Ok(t) => break t,
                Err(e) if tries < 40 && e.to_string().contains("in use") => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(e),
            }
        };
        let mut store = self.store(name).await?;
        if name == ALICE {
            store = Box::new(Probed {
                inner: store,
                probe: self.probe.clone(),
            });
        }
        Ok(Node::open(self.options(name), store, t).await?)
    }
}

/// A name no other world (in this or another test process) uses.
pub(crate) fn unique_prefix() -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("conformance-{}-{nanos}-{n}", std::process::id())
}
