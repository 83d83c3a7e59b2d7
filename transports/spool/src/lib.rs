//! # abhyasa-spool
//!
//! Store-and-forward for Abhyasa (spec/protocol.md §7, DESIGN.md §2
//! "End-to-end custody"). A relay holds frames across an edge's absence but
//! **never takes custody and never acks**: custody stays with the
//! endpoints, and the relay's receipt is hop acceptance only.
//!
//! * [`seal`]: an origin wraps its envelope in a signed
//!   [`Sealed`](abhyasa_core::wire::Sealed) frame ([`Sealer`]); the
//!   destination verifies it against the origin's pinned certificate
//!   fingerprint ([`Opener`]) before processing the inner envelope as if the
//!   origin had sent it (C-TR-5).
//! * [`spool`]: the relay daemon's durable spool on redb: written before
//!   the receipt, one copy per frame key, held until min(deadline,
//!   `max_hold`), quotas with typed refusals (C-TR-3).
//! * [`relay`]: the relay daemon over QUIC (feature `quic`) and/or
//!   WebSocket, enrolling and unenrolling peers while it runs: receipts
//!   after the commit, push within the destination's pull budget, drop on
//!   `Delivered`, on a sealed ack passing back or at the hold time.
//! * [`link`]: a node's relayed link, a wrapper around any transport
//!   (direct first, the relay as fallback), over one relay or several.
#![forbid(unsafe_code)]

pub mod link;
pub mod relay;
pub mod seal;
pub mod spool;

pub use link::{relayed, relayed_via, RelayedConfig, RelayedStats};
pub use relay::{
    start, start_with, system_clock, Clock, RelayConfig, RelayError, RelayHandle, RelayParts,
};
pub use seal::{Opener, SealFailure, Sealer};
pub use spool::{DamagedFrame, DestinationStatus, Spool, SpoolError, SpoolLimits, SpoolStatus};
