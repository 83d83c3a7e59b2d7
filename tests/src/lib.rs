//! # abhyasa-conformance
//!
//! One scenario body per conformance id (`shared/CONFORMANCE.md`), run
//! through [`abhyasa::Node`] over every transport × every store
//! ([`Net`] × [`Disk`]): the in-memory network, QUIC (mutual TLS, pinned
//! keys), WebSocket (signed hello), store-and-forward through a relay
//! daemon (sealed frames over QUIC, the relay's spool on redb) and the A2A
//! HTTP binding (plain loopback, per-peer bearer credentials), each over
//! SimStore, redb, sled, the log store, fjall and PostgreSQL (the last only with
//! `ABHYASA_PG_URL`). The scenarios live in `tests/conformance.rs`; this
//! crate is the world they run in.
//!
//! Faults are injected the same way on every transport, at the edge of a
//! node: a [`Plug`] sits between a transport's `incoming` channel and the
//! node's driver and drops, duplicates or cuts the frames the node
//! receives. So "the link dropped the obligation" and "the link dropped
//! the ack" mean the same thing whether the frame crossed a QUIC stream, a
//! WebSocket or the in-memory network, and a scenario body is written once.
//!
//! Two more hooks sit at a node's edge and store, for the ids about
//! what happens inside the node: [`Plug::observe`] sees every item that
//! reaches the edge before the faults and [`Plug::inject`] hands the node
//! an item no transport produced (a forged ack, C-TR-2); alice's store is
//! always wrapped by a [`Probe`] that can slow each commit and records
//! what each commit made durable, after it returned (C-AB1-2: nothing is
//! sent before its commit; C-AB2-2: the durable retry schedule).
//! [`World::reopen_alice_on_fresh_store`] is a custodian that lost its
//! disk (C-AB3-4: an id reused with other content).
//!
//! Ids shown (one body each in `tests/conformance.rs`): C-AB1-1, C-AB1-2,
//! C-AB2-1, C-AB2-2, C-AB2-3, C-AB3-1, C-AB3-2, C-AB3-3, C-AB3-4, C-AB4-1,
//! C-AB4-2, C-AB4-3, C-AB4-4, C-AC-1, C-DC-1, C-DC-2, C-DL-1, C-SS-1,
//! C-SS-2, C-SS-3, C-SS-4, C-TR-2, and C-TR-1 across them all.
//!
//! Every scenario ends ([`World::close`]) with the one invariant checker,
//! `abhyasa_check::check`, over the world's [`World::trace`]: the checker
//! the abstract sweep and the full-stack simulator use.
//!
//! A [`World`] is two nodes: `alice` (custodian) and `bob` (receiver),
//! each with a store that outlives it, so either can be stopped and
//! reopened on the same records (a crash at a commit boundary). A reopened
//! node comes back where its peer looks for it: bob on the same QUIC,
//! WebSocket or HTTP port, alice on the same HTTP port (bob's late acks go
//! there), either with a fresh link to the same relay (which kept what it
//! held). Bob's applier is scripted per obligation ([`SCRIPT`]: decline or
//! defer), and alice holds one kind ([`SURFACE_KIND`]) under the
//! "surface" decline policy.
//!
//! The parts: `matrix` (the cells), `plug` (faults and hooks at a node's
//! edge), `probe` (alice's store as the harness sees it), `applier`
//! (bob's scripted answers), `peers` (names and the custody schedule),
//! `env` (opening a node on its cell) and `world` (the two nodes and what
//! a scenario asks of them).

mod applier;
mod common;
mod env;
mod matrix;
mod peers;
mod plug;
mod probe;
mod world;

pub use applier::{DECLINE_DETAIL, SCRIPT};
pub use common::BoxError;
pub use matrix::{postgres_url, Backend, Disk, Net};
pub use peers::{agent, Schedule, CUSTODIAN_SEED, SURFACE_KIND};
pub use plug::{Observer, Plug};
pub use probe::{DurableAttempt, Probe, Probed, SharedSim};
pub use world::World;
