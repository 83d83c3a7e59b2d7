//! What every part of the harness shares: its error type and a lock that
//! survives a panicked holder.

use std::sync::{Mutex, MutexGuard};

/// A boxed error for the harness's own failures (setup, not the protocol).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
