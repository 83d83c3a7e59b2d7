//! The matrix a scenario runs over: transports × stores.

use abhyasa_store::StoreKind;

/// The transports a scenario runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Net {
    /// `abhyasa_transport::mem`.
    Mem,
    /// `abhyasa-quic` on loopback.
    Quic,
    /// `abhyasa-ws` on loopback.
    Ws,
    /// Store-and-forward: each node dials only a relay daemon
    /// (`abhyasa_spool::start`, QUIC on loopback, its spool in the world's
    /// temporary directory) and reaches its peer through it, sealed
    /// (`abhyasa_spool::relayed`). The relay outlives node restarts.
    Relayed,
    /// The A2A HTTP binding (`abhyasa_a2a::transport`), plain HTTP on
    /// loopback with a per-peer bearer credential each way: alice POSTs
    /// obligations to bob's `/abhyasa/obligations` and gets the ack in the
    /// answer (or later at her `/abhyasa/custody_ack`). Both ports are
    /// fixed for the world, so a restarted node is found where it was.
    Http,
}

/// The stores a scenario runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disk {
    /// `SimStore`, shared across restarts of the node using it.
    Sim,
    /// One of `abhyasa-store`'s embedded stores (redb, sled, the log
    /// store, fjall), in a temporary directory.
    Embedded(StoreKind),
    /// `abhyasa-pg` on the database named by `ABHYASA_PG_URL` (CI starts
    /// one), a fresh partition per node per world. Without the variable
    /// the cell is skipped, saying so ([`postgres_url`]).
    Postgres,
}

/// The database of the [`Disk::Postgres`] cells, if any.
pub fn postgres_url() -> Option<String> {
    std::env::var(abhyasa_pg::URL_ENV)
        .ok()
        .filter(|u| !u.is_empty())
}

/// One cell of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backend {
    /// Transport.
    pub net: Net,
    /// Store.
    pub disk: Disk,
}

impl Backend {
    /// A cell.
    pub fn new(net: Net, disk: Disk) -> Self {
        Self { net, disk }
    }
}
