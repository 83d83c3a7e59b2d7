//! The `[http]` section: serving the A2A HTTP binding beside QUIC.

use std::net::SocketAddr;
use std::time::Duration;

use abhyasa_core::AgentId;

use super::file::{bad, HttpSection};
use super::resolved::{HttpServe, Peer};

/// The section, checked; `peers` for the `bearer_only` entries (each must
/// be an HTTP peer with a token).
pub(super) fn resolve(h: &HttpSection, peers: &[Peer]) -> Result<HttpServe, String> {
    let listen: SocketAddr = h
        .listen
        .parse()
        .map_err(|e| bad("http.listen", format!("{:?}: {e}", h.listen)))?;
    if h.plain_http_loopback && !listen.ip().is_loopback() {
        return Err(bad(
            "http.plain_http_loopback",
            format!("plain HTTP is served only on loopback, not {listen}"),
        ));
    }
    let scheme = if h.plain_http_loopback {
        "http"
    } else {
        "https"
    };
    let base_url = h
        .public_url
        .clone()
        .unwrap_or_else(|| format!("{scheme}://{listen}"))
        .trim_end_matches('/')
        .to_string();
    if !base_url.starts_with(&format!("{scheme}://")) {
        return Err(bad(
            "http.public_url",
            format!("{base_url:?} must be a {scheme}:// URL"),
        ));
    }
    let mut bearer_only = Vec::new();
    for (i, b) in h.bearer_only.iter().enumerate() {
        let field = format!("http.bearer_only[{i}]");
        let agent = AgentId::new(b).map_err(|e| bad(&field, e.to_string()))?;
        let has_token = peers
            .iter()
            .any(|p| p.pin.agent == agent && p.http_url.is_some() && p.token.is_some());
        if !has_token {
            return Err(bad(
                &field,
                format!("{agent} is not a transport = \"http\" peer with a token"),
            ));
        }
        bearer_only.push(agent);
    }
    for (name, v) in [
        ("http.handshake_timeout_ms", h.handshake_timeout_ms),
        ("http.header_read_timeout_ms", h.header_read_timeout_ms),
    ] {
        if v == 0 {
            return Err(bad(name, "must be at least 1".to_string()));
        }
    }
    Ok(HttpServe {
        listen,
        base_url,
        plain_http_loopback: h.plain_http_loopback,
        bearer_only,
        handshake_timeout: Duration::from_millis(h.handshake_timeout_ms),
        header_read_timeout: Duration::from_millis(h.header_read_timeout_ms),
    })
}
