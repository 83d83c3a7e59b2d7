//! The embedding agent's asynchronous applier.
//!
//! The receiver never runs user code inside its state machine: it emits an
//! [`ApplyRequest`] and takes the [`ApplyDecision`] back as an input
//! ([`abhyasa_core::custody::Receiver::decide`]). The node's driver hands
//! each request to an [`AsyncApplier`] on its own task, so an agent that
//! asks a human, a policy engine or a model never stalls the driver loop,
//! its timers or other obligations. Effect and ledger entry still commit as
//! one record when the decision returns (AB-3).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use abhyasa_core::custody::{ApplyDecision, ApplyRequest};

/// Decides obligations asynchronously for the node's receiver.
///
/// Like [`abhyasa_core::custody::Applier`], it must not perform external
/// side effects itself: it returns the receiver-owned writes to commit, or
/// an external intent the node records durably before it is executed.
/// Decisions may come back in any order. One computed from a governed
/// key's value that changed meanwhile is asked again with the new value;
/// one that comes after the deadline is declined `expired`.
///
/// Cancellation: when the node stops, decisions still running are
/// dropped; nothing durable was written for them, and the custodian's
/// redelivery asks again after a restart.
pub trait AsyncApplier: Send + Sync + 'static {
    /// Decides one obligation.
    fn decide(&self, request: ApplyRequest) -> impl Future<Output = ApplyDecision> + Send;
}

/// A decision on its way back.
pub(crate) type DecisionFuture = Pin<Box<dyn Future<Output = ApplyDecision> + Send + 'static>>;

/// The object-safe form of [`AsyncApplier`] the driver holds.
trait ErasedApplier: Send + Sync + 'static {
    fn decide_boxed(self: Arc<Self>, request: ApplyRequest) -> DecisionFuture;
}

impl<A: AsyncApplier> ErasedApplier for A {
    fn decide_boxed(self: Arc<Self>, request: ApplyRequest) -> DecisionFuture {
        Box::pin(async move { self.decide(request).await })
    }
}

/// An [`AsyncApplier`] ready for [`crate::NodeOptions::async_applier`],
/// with the most decisions the node runs at once.
#[derive(Clone)]
pub struct AsyncApplierHandle {
    inner: Arc<dyn ErasedApplier>,
    concurrency: usize,
}

impl AsyncApplierHandle {
    /// Default for [`AsyncApplierHandle::with_concurrency`].
    pub const DEFAULT_CONCURRENCY: usize = 64;

    /// Wraps `applier`; at most [`Self::DEFAULT_CONCURRENCY`] decisions run
    /// at once.
    pub fn new(applier: impl AsyncApplier) -> Self {
        Self {
            inner: Arc::new(applier),
            concurrency: Self::DEFAULT_CONCURRENCY,
        }
    }

    /// At most `n` decisions run at once (at least one); the rest wait in
    /// the node's queue, which the receiver bounds
    /// ([`abhyasa_core::custody::ReceiverConfig::max_outstanding_requests`]).
    #[must_use]
    pub fn with_concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Decisions run at once.
    pub fn concurrency(&self) -> usize {
        self.concurrency
    }

    pub(crate) fn start(&self, request: ApplyRequest) -> DecisionFuture {
        self.inner.clone().decide_boxed(request)
    }
}

impl std::fmt::Debug for AsyncApplierHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncApplierHandle")
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}
