//! The outbound side: POSTs of final acks to a custodian's
//! `custody_ack_endpoint` and of obligations to an A2A receiver's
//! `obligation_endpoint`. Plain HTTP only (loopback), like the server.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

/// Largest response body read back (an ack is a few hundred bytes).
const MAX_RESPONSE: usize = 64 * 1024;

/// A small JSON-over-HTTP client.
#[derive(Clone, Debug)]
pub(crate) struct JsonClient {
    inner: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
}

/// What a POST got back.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) body: Bytes,
}

impl JsonClient {
    pub(crate) fn new(timeout: Duration) -> Self {
        Self {
            inner: Client::builder(TokioExecutor::new()).build_http(),
            timeout,
        }
    }

    /// POSTs `body` as JSON with an optional bearer token.
    pub(crate) async fn post(
        &self,
        url: &str,
        token: Option<&str>,
        body: String,
    ) -> Result<Reply, String> {
        let mut req = hyper::Request::post(url).header("content-type", "application/json");
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let req = req
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| format!("request to {url}: {e}"))?;
        let fut = async {
            let resp = self
                .inner
                .request(req)
                .await
                .map_err(|e| format!("POST {url}: {e}"))?;
            let status = resp.status().as_u16();
            let body = Limited::new(resp.into_body(), MAX_RESPONSE)
                .collect()
                .await
                .map_err(|e| format!("POST {url}: reading the response: {e}"))?
                .to_bytes();
            Ok(Reply { status, body })
        };
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| format!("POST {url}: no answer within {:?}", self.timeout))?
    }
}

/// Checks an outbound endpoint: `http://` only (this build has no TLS
/// client; HTTPS endpoints are refused at configuration, not at first use).
pub(crate) fn check_endpoint(url: &str) -> Result<(), String> {
    let uri: hyper::Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") if uri.host().is_some() => Ok(()),
        Some("https") => Err("https endpoints need the TLS client, not built yet".into()),
        _ => Err("must be an http:// URL with a host".into()),
    }
}
