//! Knobs shared by every transport.

use abhyasa_core::wire::DEFAULT_MAX_FRAME;

use crate::Backoff;

/// Queue sizes, frame limit and reconnect schedule common to all transports.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkConfig {
    /// Largest envelope accepted or sent, in bytes, without the length
    /// prefix. Default [`DEFAULT_MAX_FRAME`] (1 MiB).
    pub max_frame: usize,
    /// Frames queued per connection before [`send`](crate::TransportHandle::send)
    /// returns [`QueueFull`](crate::SendError::QueueFull). Default 65,536:
    /// one group commit can release tens of thousands of frames at once,
    /// and a queue shorter than a commit's release turns the overflow into
    /// custody retries a backoff later (and loses best-effort frames). The
    /// channel allocates as it fills, so an idle link costs nothing.
    pub send_queue: usize,
    /// Bytes queued per connection before `send` returns `QueueFull`
    /// (frames with their length prefix; a frame's bytes are given back
    /// when the connection writes it). Default 64 MiB. A single frame is
    /// always accepted by an empty queue, so a budget below
    /// [`max_frame`](Self::max_frame) still passes every frame.
    pub send_queue_bytes: usize,
    /// Capacity of the incoming channel. When the runtime falls behind,
    /// readers wait and the transport's flow control pushes back on the
    /// peer; nothing is dropped. Default 4096.
    pub incoming_queue: usize,
    /// Reconnect schedule for configured peers. Default 100 ms doubling to
    /// a 10 s cap, with jitter.
    pub backoff: Backoff,
}

impl Default for LinkConfig {
    fn default() -> Self {
        Self {
            max_frame: DEFAULT_MAX_FRAME,
            send_queue: 65_536,
            send_queue_bytes: 64 * 1024 * 1024,
            incoming_queue: 4096,
            backoff: Backoff::default(),
        }
    }
}
