//! A small client of a running node's control socket: newline-delimited
//! JSON over a Unix domain socket, one request line and one response line
//! (`{"ok": true, "result": ...}` or `{"ok": false, "error": {"code",
//! "message"}}`), as the node documents it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

/// Longest response line read from the node.
pub const MAX_RESPONSE: u64 = 16 * 1024 * 1024;

/// Why a control call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// No node answers on the socket.
    #[error(
        "no node is running at {socket} (start one with `abhyasa node run --dir DIR`): {detail}"
    )]
    NotRunning {
        /// The socket path.
        socket: PathBuf,
        /// The OS error.
        detail: String,
    },
    /// Where the socket is could not be worked out.
    #[error("{0}")]
    Locate(String),
    /// The connection failed mid-call.
    #[error("control socket {socket}: {detail}")]
    Io {
        /// The socket path.
        socket: PathBuf,
        /// What failed.
        detail: String,
    },
    /// The node did not answer in time.
    #[error("the node did not answer within {0:?}")]
    Timeout(Duration),
    /// The node answered something that is not a control response.
    #[error("bad response from the node: {0}")]
    BadResponse(String),
    /// The node refused the request.
    #[error("node refused: {message} ({code})")]
    Refused {
        /// The node's error code (`bad_request`, `unknown`, ...).
        code: String,
        /// The node's message.
        message: String,
    },
}

/// Where the node's control socket is: a fixed path, or resolved from a
/// node directory when a tool first needs it (so the server starts even
/// before the node exists).
pub type SocketResolver = std::sync::Arc<dyn Fn() -> Result<PathBuf, String> + Send + Sync>;

/// Sends one request and reads its response, within `timeout`.
pub async fn call(
    socket: &Path,
    request: &Value,
    timeout: Duration,
) -> Result<Value, ControlError> {
    match tokio::time::timeout(timeout, call_inner(socket, request)).await {
        Ok(r) => r,
        Err(_) => Err(ControlError::Timeout(timeout)),
    }
}

async fn call_inner(socket: &Path, request: &Value) -> Result<Value, ControlError> {
    let io = |e: std::io::Error| ControlError::Io {
        socket: socket.to_path_buf(),
        detail: e.to_string(),
    };
    let stream = UnixStream::connect(socket)
        .await
        .map_err(|e| ControlError::NotRunning {
            socket: socket.to_path_buf(),
            detail: e.to_string(),
        })?;
    let (r, mut w) = stream.into_split();
    let mut line = request.to_string();
    line.push('\n');
    w.write_all(line.as_bytes()).await.map_err(io)?;
    let mut buf = Vec::new();
    BufReader::new(r)
        .take(MAX_RESPONSE)
        .read_until(b'\n', &mut buf)
        .await
        .map_err(io)?;
    if buf.is_empty() {
        return Err(ControlError::BadResponse(
            "the node closed the control connection".into(),
        ));
    }
    if buf.last() != Some(&b'\n') {
        return Err(ControlError::BadResponse(format!(
            "response longer than {MAX_RESPONSE} bytes or cut short"
        )));
    }
    let v: Value =
        serde_json::from_slice(&buf).map_err(|e| ControlError::BadResponse(e.to_string()))?;
    match v.get("ok") {
        Some(Value::Bool(true)) => Ok(v.get("result").cloned().unwrap_or(Value::Null)),
        Some(Value::Bool(false)) => {
            let s = |k: &str| {
                v.pointer(&format!("/error/{k}"))
                    .and_then(Value::as_str)
                    .unwrap_or("?")
                    .to_string()
            };
            Err(ControlError::Refused {
                code: s("code"),
                message: s("message"),
            })
        }
        _ => Err(ControlError::BadResponse(format!(
            "no boolean \"ok\" in {}",
            truncate(&v.to_string(), 200)
        ))),
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_string();
    }
    let mut end = n;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}
