//! The node's compaction schedule: compaction runs as a command to the
//! driver ([`Command::Compact`]), on a timer or when the embedder asks.

use tokio::sync::{mpsc, oneshot};

use crate::command::Command;
use crate::compaction::{finish, CompactionPolicy, CompactionReport};

/// Runs one compaction through the driver's command queue.
pub(crate) async fn run(
    commands: &mpsc::Sender<Command>,
    retention: std::time::Duration,
) -> Result<CompactionReport, crate::NodeError> {
    let (reply, rx) = oneshot::channel();
    commands
        .send(Command::Compact { retention, reply })
        .await
        .map_err(|_| crate::NodeError::Stopped)?;
    finish(rx.await.map_err(|_| crate::NodeError::Stopped)?).await
}

/// Starts the schedule: every `policy.interval`, one run. The task holds
/// only a weak handle on the command queue, so it never keeps a node alive;
/// it ends when the node stops.
pub(crate) fn spawn_schedule(commands: &mpsc::Sender<Command>, policy: CompactionPolicy) {
    if policy.interval.is_zero() {
        return;
    }
    let weak = commands.downgrade();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(policy.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is immediate: a node reopened after a long stop
        // drops what expired meanwhile right away.
        loop {
            tick.tick().await;
            let Some(commands) = weak.upgrade() else {
                return;
            };
            match run(&commands, policy.retention).await {
                Ok(r) => tracing::debug!(report = ?r, "compacted"),
                Err(crate::NodeError::Stopped) => return,
                Err(e) => tracing::warn!(error = %e, "compaction failed"),
            }
        }
    });
}
