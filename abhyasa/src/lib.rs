//! # abhyasa
//!
//! The Abhyasa node: one tokio process per agent hosting the sans-IO
//! custodian and receiver of [`abhyasa_core`], a durable store, and a
//! transport. Embed it with [`Node::builder`]; run it with the `abhyasa` CLI.
//!
//! The driver feeds inputs to the state machines, arms one timer for the
//! next timeout, commits the records they emit as one group commit on a
//! store thread (many obligations per fsync), and only then releases the
//! transmits, acks and events that depend on them.
//!
//! ## Embedding a node
//!
//! Build a node with a store and a transport, offer obligations, await
//! their outcomes. The same example is in the README (a test keeps the
//! two identical); here it compiles and runs as a doctest.
//!
//! ```rust
//! use abhyasa::{Node, NodeError};
//! use abhyasa_core::custody::TerminalState;
//! use abhyasa_core::store::SimStore;
//! use abhyasa_core::{AgentId, Obligation};
//! use abhyasa_transport::{mem::MemNetwork, LinkConfig};
//! use serde_json::json;
//!
//! #[tokio::main(flavor = "current_thread")]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // Two agents on an in-memory network. QUIC, WebSocket and the A2A
//!     // HTTP binding plug in the same way; their pinned peers are the
//!     // targets `offer` accepts.
//!     let net = MemNetwork::new(7);
//!     let (alice, bob) = (AgentId::new("alice")?, AgentId::new("bob")?);
//!     let _bob = Node::builder(bob.clone())
//!         .store(SimStore::new()) // or abhyasa_store::RedbStore::open(path)?
//!         .transport(net.join(bob, LinkConfig::default()).await?)
//!         .open()
//!         .await?;
//!     let node = Node::builder(alice.clone())
//!         .store(SimStore::new())
//!         .transport(net.join(alice, LinkConfig::default()).await?)
//!         .configure(|o| o.receiver.skew_margin = std::time::Duration::from_secs(1))
//!         .open() // options are checked here: NodeError::InvalidOptions
//!         .await?;
//!
//!     let revoke = Obligation::builder()
//!         .id("consent-42").kind("anumati.consent").target("bob")
//!         .payload(json!({"decision": "revoke", "scope": "email.read"}))
//!         .deadline_seconds(3600).max_retries(100).created_at(node.now())
//!         .build()?;
//!     node.offer(revoke.clone()).await?; // returns once custody is durable (AB-1)
//!     let outcome = node.outcome(revoke.id()).await?; // applied, declined or escalated
//!     assert_eq!(outcome.state, TerminalState::Applied);
//!
//!     // A target outside the peer table is refused; nothing is accepted.
//!     let stray = Obligation::builder()
//!         .id("consent-43").kind("anumati.consent").target("mallory")
//!         .payload(json!({"decision": "revoke", "scope": "email.read"}))
//!         .deadline_seconds(3600).max_retries(100).created_at(node.now())
//!         .build()?;
//!     assert!(matches!(node.offer(stray).await, Err(NodeError::UnknownPeer(_))));
//!     node.shutdown().await?;
//!     Ok(())
//! }
//! ```
//!
//! Every async method documents what dropping its future means (see
//! [`Node`]'s *Cancellation*): no command is ever half done.
#![forbid(unsafe_code)]

mod api;
pub mod applier;
pub mod clock;
mod command;
pub mod compaction;
mod driver;
mod gate;
pub mod leases;
pub mod metrics;
mod node;
mod schedule;
mod store_thread;
pub mod subscription;

pub use api::{
    CustodianState, NodeBuilder, NodeError, NodeEvent, NodeOptions, Outcome, StatusView,
};
pub use applier::{AsyncApplier, AsyncApplierHandle};
pub use compaction::{CompactionPolicy, CompactionReport};
pub use node::Node;
pub use subscription::{Subscription, SubscriptionError};
