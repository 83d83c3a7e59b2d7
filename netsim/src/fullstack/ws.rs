//! WebSocket over turmoil TCP.

use abhyasa_transport::{LinkConfig, Transport};

use super::host::{start_err, HostCtx, HostError};

/// Starts the WebSocket transport on turmoil TCP.
pub(crate) async fn start(ctx: &HostCtx, _link: LinkConfig) -> Result<Transport, HostError> {
    Err(start_err(
        &ctx.name,
        "WebSocket over turmoil TCP is not wired yet",
    ))
}
