//! Authority belongs to its issuer (C-AZ-1, C-AZ-2): what each
//! authenticated peer may govern at this receiver.
//!
//! Every governed key is held under the peer that issued the obligation
//! ([`GovernedKey::issued_by`]): the issuer is the authenticated peer, never
//! a field of the obligation, so a peer can only ever write state under its
//! own identity and one peer's grant never touches another's revoke. On top
//! of that, a per-peer [`PeerPolicy`] narrows which kinds and which
//! (issuer-less) keys a peer may issue at all, and marks relays, which
//! govern nothing. A refusal is the typed decline `unauthorized`.

use crate::model::{AgentId, GovernedKey, Kind};

/// What one peer may issue at this receiver.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerPolicy {
    /// A relay (or broker) forwards other agents' sealed frames and governs
    /// nothing in its own name: every obligation it issues is declined
    /// `unauthorized`.
    pub relay: bool,
    /// The kinds it may issue; `None`: every kind.
    pub kinds: Option<Vec<Kind>>,
    /// Prefixes of the issuer-less governed keys (`kind/target/name`) it
    /// may issue on; `None`: every key. An obligation that governs no key
    /// is refused when prefixes are given. Whatever they say, the key is
    /// held under the peer's own identity.
    pub keys: Option<Vec<String>>,
}

impl PeerPolicy {
    /// A relay: governs nothing.
    pub fn relay() -> Self {
        Self {
            relay: true,
            ..Self::default()
        }
    }

    /// Why this policy refuses an obligation of `kind` on the issuer-less
    /// `key`, if it does.
    fn refuses(&self, kind: &Kind, key: Option<&GovernedKey>) -> Option<String> {
        if self.relay {
            return Some("the peer is a relay, which governs nothing in its own name".into());
        }
        if let Some(kinds) = &self.kinds {
            if !kinds.contains(kind) {
                let list: Vec<&str> = kinds.iter().map(Kind::as_str).collect();
                return Some(format!(
                    "the peer may not issue {kind} (it may issue: {})",
                    if list.is_empty() {
                        "nothing".to_string()
                    } else {
                        list.join(", ")
                    }
                ));
            }
        }
        if let Some(prefixes) = &self.keys {
            let Some(key) = key else {
                return Some(format!(
                    "the peer may issue only on listed governed keys and this {kind} names none"
                ));
            };
            let k = key.unqualified();
            if !prefixes.iter().any(|p| k.starts_with(p.as_str())) {
                return Some(format!(
                    "the peer may not govern {k} (its key prefixes: {})",
                    prefixes.join(", ")
                ));
            }
        }
        None
    }
}

/// The receiver's authority policy: a [`PeerPolicy`] per peer, and the one
/// for every peer not listed. The default lets every peer issue every kind
/// on keys held under its own identity, and nothing else.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuthorityPolicy {
    peers: crate::Map<AgentId, PeerPolicy>,
    default: PeerPolicy,
}

impl AuthorityPolicy {
    /// Sets the policy of `peer`.
    pub fn set_peer(&mut self, peer: AgentId, policy: PeerPolicy) -> &mut Self {
        self.peers.insert(peer, policy);
        self
    }

    /// Sets the policy of every peer not listed.
    pub fn set_default(&mut self, policy: PeerPolicy) -> &mut Self {
        self.default = policy;
        self
    }

    /// The policy that applies to `peer`.
    pub fn of(&self, peer: &AgentId) -> &PeerPolicy {
        self.peers.get(peer).unwrap_or(&self.default)
    }

    /// Why `peer` may not issue an obligation of `kind` on the issuer-less
    /// `key`, if it may not.
    pub fn refuses(
        &self,
        peer: &AgentId,
        kind: &Kind,
        key: Option<&GovernedKey>,
    ) -> Option<String> {
        self.of(peer)
            .refuses(kind, key)
            .map(|why| format!("{peer} is not authorized: {why}"))
    }
}
