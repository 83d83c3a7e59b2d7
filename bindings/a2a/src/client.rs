//! The outbound side: POSTs of final acks to a custodian's
//! `custody_ack_endpoint` and of obligations to an A2A receiver's
//! `obligation_endpoint`.
//!
//! `https://` endpoints are reached with mutual TLS: we present our node
//! certificate and accept only the server certificate pinned for that peer
//! (the same identities and pins as QUIC). `http://` endpoints are allowed
//! only when plain HTTP is explicitly configured, and only to a loopback
//! host ([`check_endpoint`]).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// Largest response body read back (an ack is a few hundred bytes).
const MAX_RESPONSE: usize = 64 * 1024;

/// A small JSON-over-HTTP(S) client: one connection per request, so a
/// timed-out request leaves nothing behind.
#[derive(Clone, Debug)]
pub struct JsonClient {
    timeout: Duration,
}

/// What a POST got back.
#[derive(Debug)]
pub struct Reply {
    /// The HTTP status.
    pub status: u16,
    /// The body (at most 64 KiB are read).
    pub body: Bytes,
}

/// Aborts the connection task when the request is done or dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl JsonClient {
    /// A client whose every POST (connect, TLS, request, response) ends
    /// within `timeout`.
    pub fn new(timeout: Duration) -> Self {
        Self { timeout }
    }

    /// POSTs `body` as JSON with an optional bearer token. An `https://`
    /// URL needs `tls`: the pinned client configuration for that peer
    /// (`abhyasa_identity::dangerous_pinned_client_tls`); without it the POST
    /// is refused before anything is sent.
    pub async fn post(
        &self,
        url: &str,
        token: Option<&str>,
        body: String,
        tls: Option<&Arc<rustls::ClientConfig>>,
    ) -> Result<Reply, String> {
        let uri: hyper::Uri = url.parse().map_err(|e| format!("{url}: not a URL: {e}"))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(format!("{url}: must be an http:// or https:// URL")),
        };
        let authority = uri
            .authority()
            .ok_or_else(|| format!("{url}: no host"))?
            .clone();
        let host = authority.host().trim_matches(['[', ']']).to_string();
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
        let mut req = hyper::Request::post(path)
            .header(HOST, authority.as_str())
            .header(CONTENT_TYPE, "application/json");
        if let Some(t) = token {
            req = req.header(AUTHORIZATION, format!("Bearer {t}"));
        }
        let req = req
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| format!("request to {url}: {e}"))?;
        let connector = match (https, tls) {
            (true, Some(cfg)) => Some(tokio_rustls::TlsConnector::from(cfg.clone())),
            (true, None) => {
                return Err(format!(
                    "POST {url}: https needs the peer's pinned certificate fingerprint"
                ))
            }
            (false, _) => None,
        };
        let fut = async {
            let tcp = TcpStream::connect((host.as_str(), port))
                .await
                .map_err(|e| format!("POST {url}: connect: {e}"))?;
            let _ = tcp.set_nodelay(true);
            match connector {
                Some(c) => {
                    let name = rustls::pki_types::ServerName::try_from(
                        abhyasa_identity::PINNED_SERVER_NAME,
                    )
                    .map_err(|e| format!("POST {url}: {e}"))?;
                    let tls = c
                        .connect(name, tcp)
                        .await
                        .map_err(|e| format!("POST {url}: TLS: {e}"))?;
                    exchange(url, tls, req).await
                }
                None => exchange(url, tcp, req).await,
            }
        };
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| format!("POST {url}: no answer within {:?}", self.timeout))?
    }
}

/// One HTTP/1.1 request on a fresh connection.
async fn exchange<I>(url: &str, io: I, req: hyper::Request<Full<Bytes>>) -> Result<Reply, String>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| format!("POST {url}: {e}"))?;
    let _conn = AbortOnDrop(tokio::spawn(async move {
        let _ = conn.await;
    }));
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("POST {url}: {e}"))?;
    let status = resp.status().as_u16();
    let body = Limited::new(resp.into_body(), MAX_RESPONSE)
        .collect()
        .await
        .map_err(|e| format!("POST {url}: reading the response: {e}"))?
        .to_bytes();
    Ok(Reply { status, body })
}

/// Checks an outbound endpoint at configuration (not at first use):
/// `https://` needs a pinned certificate for the peer (`pinned`); `http://`
/// needs plain HTTP explicitly allowed (`plain_allowed`) and a loopback
/// host.
pub(crate) fn check_endpoint(url: &str, pinned: bool, plain_allowed: bool) -> Result<(), String> {
    let uri: hyper::Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
    let Some(host) = uri.host() else {
        return Err("must be an http:// or https:// URL with a host".into());
    };
    match uri.scheme_str() {
        Some("https") if pinned => Ok(()),
        Some("https") => Err("https needs the peer's pinned certificate fingerprint".into()),
        Some("http") if !plain_allowed => {
            Err("plain http is not enabled (plain_http_loopback); use https with mTLS".into())
        }
        Some("http") if is_loopback_host(host) => Ok(()),
        Some("http") => Err("plain http is allowed only to a loopback host".into()),
        _ => Err("must be an http:// or https:// URL with a host".into()),
    }
}

fn is_loopback_host(host: &str) -> bool {
    let h = host.trim_matches(['[', ']']);
    h.eq_ignore_ascii_case("localhost")
        || h.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::check_endpoint;

    #[test]
    fn endpoints_plain_only_on_loopback_https_only_pinned() {
        assert!(check_endpoint("http://127.0.0.1:9/x", false, true).is_ok());
        assert!(check_endpoint("http://[::1]:9/x", false, true).is_ok());
        assert!(check_endpoint("http://localhost:9/x", false, true).is_ok());
        assert!(check_endpoint("http://192.0.2.7:9/x", true, true).is_err());
        assert!(check_endpoint("http://127.0.0.1:9/x", true, false).is_err());
        assert!(check_endpoint("https://192.0.2.7:9/x", true, false).is_ok());
        assert!(check_endpoint("https://192.0.2.7:9/x", false, true).is_err());
        assert!(check_endpoint("ftp://127.0.0.1/x", true, true).is_err());
        assert!(check_endpoint("not a url", true, true).is_err());
    }
}
