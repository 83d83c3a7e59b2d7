//! Reopening a raw sled database in the store tests (not shared with the
//! PostgreSQL tests, which include `common` but do not link sled).
#![allow(dead_code, clippy::unwrap_used)]

use std::time::Duration;

/// Opens the raw sled database at `path` that a store has just let go of.
/// sled releases its file lock only when its flusher thread has wound
/// down, a moment after the store is dropped, so an open at once can find
/// the lock still held (seen about once in twenty runs): retry briefly.
pub(crate) fn reopen_sled(path: &std::path::Path) -> sled::Db {
    let mut tries = 0;
    loop {
        match sled::open(path) {
            Ok(db) => return db,
            Err(e) if tries < 300 => {
                tries += 1;
                if tries == 1 {
                    eprintln!("sled at {} is still locked ({e}); retrying", path.display());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("sled at {} does not reopen: {e}", path.display()),
        }
    }
}
