//! The `[[peers]]` entries: pins, how each is reached (QUIC, WebSocket,
//! HTTP, through a relay) and what it may govern here.

use std::net::SocketAddr;

use abhyasa_core::{AgentId, Kind};
use abhyasa_identity::{Fingerprint, PeerPin};

use super::file::{bad, NodeConfig, PeerConfig};
use super::resolved::Peer;

/// Every `[[peers]]` entry, checked in order.
pub(super) fn resolve(c: &NodeConfig) -> Result<Vec<Peer>, String> {
    c.peers
        .iter()
        .enumerate()
        .map(|(i, p)| peer(c, i, p))
        .collect()
}

/// Entry `i`; `c` for what other keys say about it (the `[http]` section,
/// the entries that name it as their relay).
fn peer(c: &NodeConfig, i: usize, p: &PeerConfig) -> Result<Peer, String> {
    let key = |f: &str| format!("peers[{i}].{f}");
    let agent = AgentId::new(&p.agent).map_err(|e| bad(&key("agent"), e.to_string()))?;
    let fingerprint: Fingerprint = p
        .fingerprint
        .parse()
        .map_err(|e| bad(&key("fingerprint"), format!("{e}")))?;
    let addr = p
        .addr
        .as_deref()
        .map(|a| {
            a.parse::<SocketAddr>()
                .map_err(|e| bad(&key("addr"), format!("{a:?}: {e}")))
        })
        .transpose()?;
    let (http_url, ws_url) = match p.transport.as_deref() {
        None | Some("quic") => {
            if p.url.is_some() {
                return Err(bad(
                    &key("url"),
                    "only for transport = \"http\" or \"ws\"".into(),
                ));
            }
            (None, None)
        }
        Some("http") => {
            let url = p.url.as_deref().ok_or_else(|| {
                bad(
                    &key("url"),
                    "transport = \"http\" needs the peer's base URL".into(),
                )
            })?;
            if !(url.starts_with("https://") || url.starts_with("http://")) {
                return Err(bad(
                    &key("url"),
                    format!("{url:?} is not an http(s):// URL"),
                ));
            }
            if c.http.is_none() {
                return Err(bad(
                    &key("transport"),
                    "\"http\" needs an [http] section (this node serves the binding to get acks)"
                        .into(),
                ));
            }
            (Some(url.trim_end_matches('/').to_string()), None)
        }
        Some("ws") => {
            let url = p.url.as_deref().ok_or_else(|| {
                bad(
                    &key("url"),
                    "transport = \"ws\" needs the peer's ws:// URL".into(),
                )
            })?;
            if !url.starts_with("ws://") {
                return Err(bad(&key("url"), format!("{url:?} is not a ws:// URL")));
            }
            if p.addr.is_some() {
                return Err(bad(
                    &key("addr"),
                    "a QUIC address on a ws peer; use url".into(),
                ));
            }
            (None, Some(url.to_string()))
        }
        Some(other) => {
            return Err(bad(
                &key("transport"),
                format!("{other:?} is not a transport (quic | ws | http)"),
            ))
        }
    };
    if p.token.is_some() && http_url.is_none() {
        return Err(bad(&key("token"), "only for transport = \"http\"".into()));
    }
    if http_url.is_some() && p.addr.is_some() {
        return Err(bad(
            &key("addr"),
            "a QUIC address on an http peer; use url".into(),
        ));
    }
    let via = p
        .via
        .as_deref()
        .map(|v| AgentId::new(v).map_err(|e| bad(&key("via"), e.to_string())))
        .transpose()?;
    if via.is_some() && http_url.is_some() {
        return Err(bad(
            &key("via"),
            "a relay carries QUIC and WebSocket peers, not http ones".into(),
        ));
    }
    let kinds = checked_kinds(p.kinds.as_deref(), &key("kinds"))?;
    checked_key_prefixes(p.keys.as_deref(), &key("keys"))?;
    let named_as_relay = c
        .peers
        .iter()
        .any(|q| q.via.as_deref() == Some(p.agent.as_str()));
    Ok(Peer {
        pin: PeerPin { agent, fingerprint },
        addr,
        http_url,
        ws_url,
        token: p.token.clone(),
        via,
        authority: abhyasa_core::custody::PeerPolicy {
            relay: p.relay.unwrap_or(named_as_relay),
            kinds,
            keys: p.keys.clone(),
        },
    })
}

/// A relay named by `via` must itself be a pinned peer reached
/// directly over QUIC or WebSocket (it carries sealed binary
/// frames). Each peer names its own; a node may use several relays.
pub(super) fn check_relays(peers: &[Peer]) -> Result<(), String> {
    for (i, p) in peers.iter().enumerate() {
        if let Some(v) = &p.via {
            let relay = peers.iter().find(|q| &q.pin.agent == v);
            if relay.is_none_or(|r| {
                r.via.is_some() || r.http_url.is_some() || r.pin.agent == p.pin.agent
            }) {
                return Err(bad(
                    &format!("peers[{i}].via"),
                    format!("{v} is not a [[peers]] entry reached directly (quic or ws)"),
                ));
            }
        }
    }
    Ok(())
}

/// The `[mcp]` section as the MCP guard's policy for its custodian.
pub(super) fn mcp(c: &NodeConfig) -> Result<Option<abhyasa_core::custody::PeerPolicy>, String> {
    let Some(m) = &c.mcp else {
        return Ok(None);
    };
    let kinds = checked_kinds(m.kinds.as_deref(), "mcp.kinds")?;
    checked_key_prefixes(m.keys.as_deref(), "mcp.keys")?;
    Ok(Some(abhyasa_core::custody::PeerPolicy {
        relay: false,
        kinds,
        keys: m.keys.clone(),
    }))
}

/// A `kinds` list (`[[peers]]`, `[mcp]`) as kinds; `key` names it in the
/// error.
fn checked_kinds(kinds: Option<&[String]>, key: &str) -> Result<Option<Vec<Kind>>, String> {
    kinds
        .map(|ks| {
            ks.iter()
                .map(|k| Kind::new(k).map_err(|e| bad(key, e.to_string())))
                .collect()
        })
        .transpose()
}

/// A `keys` list of governed-key prefixes: none may be empty (it would
/// match every key).
fn checked_key_prefixes(keys: Option<&[String]>, key: &str) -> Result<(), String> {
    match keys.into_iter().flatten().find(|k| k.is_empty()) {
        Some(empty) => Err(bad(
            key,
            format!("{empty:?}: an empty prefix would match every key; omit keys instead"),
        )),
        None => Ok(()),
    }
}
