//! Support shared by the binding's integration tests.

use std::time::Duration;

/// Whether `cond` holds within ~3 s, polled every 10 ms: for state another
/// task moves after the step the test awaited (a server's counters, a
/// delivery into a stash).
pub(crate) async fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..300 {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cond()
}
