//! The store boundary for engine panics. sled, redb and fjall may panic on
//! pages they do not expect (damage their own checks miss): every call
//! into an engine that reads or writes the files runs through [`guarded`],
//! so a damaged database is a typed [`StoreError::Backend`] that says so,
//! and the node refuses to start instead of dying on a panic.

use std::panic::{catch_unwind, AssertUnwindSafe};

use abhyasa_core::store::StoreError;

/// Runs `f`; a panic inside it becomes [`StoreError::Backend`] naming the
/// backend and the operation. The engine's handle is not used again after
/// a panic on open; after one on a read or commit the caller gets the
/// error and the node stops (its store thread treats every store error as
/// fatal to the commit).
pub(crate) fn guarded<T>(
    backend: &'static str,
    op: &'static str,
    f: impl FnOnce() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    // AssertUnwindSafe: on a panic nothing `f` touched is read again by
    // this call; the error tells the caller the engine is in doubt.
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "no message".into());
        Err(StoreError::Backend {
            backend,
            op,
            source: format!("the storage engine panicked ({msg}): the database is damaged").into(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_a_typed_error() {
        let r: Result<(), StoreError> = guarded("sled", "open", || panic!("bad page"));
        match r {
            Err(StoreError::Backend {
                backend,
                op,
                source,
            }) => {
                assert_eq!((backend, op), ("sled", "open"));
                assert!(source.to_string().contains("bad page"), "{source}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(guarded("redb", "read", || Ok(3)).unwrap(), 3);
    }
}
