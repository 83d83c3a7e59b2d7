//! Tests of identities, signatures and pins (no network).

mod identity;

use abhyasa_core::AgentId;

use crate::{generate_identity, Identity};

pub(super) fn id(s: &str) -> AgentId {
    AgentId::new(s).expect("valid agent id")
}

pub(super) fn identity(agent: &AgentId) -> Identity {
    generate_identity(agent).expect("identity")
}
