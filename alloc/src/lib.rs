//! The allocator of Abhyasa's binaries: the node CLI
//! (`abhyasa node run`, the demo) and the benchmarks run on
//! [mimalloc](https://github.com/microsoft/mimalloc) instead of the system
//! allocator. The libraries set no allocator: an embedder picks its own.
//!
//! Why: a custody obligation allocates and frees a few dozen buffers on its
//! way through both nodes, and glibc's malloc spent about a fifth of the
//! throughput example's CPU in `malloc`, `free` and the consolidation of
//! its bins (perf). Under callgrind the same run executes 13% fewer
//! instructions on mimalloc, and takes about 41,000 page faults instead
//! of 57,000 (`perf stat`).
//!
//! It is built without transparent huge pages (the `no_thp` feature, in
//! `Cargo.toml`: mimalloc reads the option at process load, before `main`
//! could set it). With them a growing node faults in and zeroes 2 MiB at
//! a time: the throughput example peaked at 1.5x the memory and spent a
//! tenth of its CPU in `clear_page`.
//!
//! mimalloc gives freed memory back to the system after a delay (its
//! "purge", 1 s by default in v3). A node under load frees and reuses
//! memory continuously, and a purged page costs a page fault and a
//! zeroed page when it is used again: with huge pages on, the default
//! delay took 5,000–11,000 page faults per run against about 550 at
//! 10 s, and more CPU. [`tune`] sets the delay to [`PURGE_DELAY_MS`]
//! (10 s), so a busy node keeps its memory and an idle one still returns
//! it. An operator's own `MIMALLOC_PURGE_DELAY` wins.
//!
//! ```no_run
//! #[global_allocator]
//! static ALLOC: abhyasa_alloc::Allocator = abhyasa_alloc::Allocator;
//!
//! fn main() {
//!     abhyasa_alloc::tune(); // first, before any thread starts
//!     // ...
//! }
//! ```

/// The global allocator of the binaries.
pub use mimalloc::MiMalloc as Allocator;

/// mimalloc v3's index of `mi_option_purge_delay` (the crate exposes no
/// constant for it; `mimalloc.h`, `mi_option_e`). The test checks it reads
/// back as that option's default.
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// The purge delay [`tune`] sets, in milliseconds.
pub const PURGE_DELAY_MS: i64 = 10_000;

/// The environment variables by which an operator sets the delay (the
/// second is mimalloc's older name for it).
const PURGE_DELAY_ENV: [&str; 2] = ["MIMALLOC_PURGE_DELAY", "MIMALLOC_RESET_DELAY"];

/// What [`tune`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tuned {
    /// The purge delay is now [`PURGE_DELAY_MS`].
    PurgeDelaySet,
    /// The environment sets the delay; it was left alone.
    PurgeDelayFromEnv,
}

/// Sets mimalloc's purge delay to [`PURGE_DELAY_MS`] unless the
/// environment sets it. Call it first thing in `main`, before any thread
/// is started: mimalloc's option setter is not thread-safe.
pub fn tune() -> Tuned {
    if delay_from_env() {
        return Tuned::PurgeDelayFromEnv;
    }
    set_option(PURGE_DELAY, PURGE_DELAY_MS);
    Tuned::PurgeDelaySet
}

/// Whether the environment sets the purge delay.
fn delay_from_env() -> bool {
    PURGE_DELAY_ENV
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

/// mimalloc's current purge delay, in milliseconds (`-1`: never purge).
pub fn purge_delay_ms() -> i64 {
    get_option(PURGE_DELAY)
}

/// Gives back to the system, now, the memory freed and not yet purged
/// (mimalloc's `mi_collect(true)`): for after a burst whose garbage will
/// not be reused soon, such as a node's recovery, which decodes every
/// stored row once.
#[allow(unsafe_code)]
pub fn collect() {
    // SAFETY: `mi_collect` takes a flag and frees only blocks mimalloc
    // already owns as free; it is thread-safe.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

#[allow(unsafe_code)]
fn set_option(option: libmimalloc_sys::mi_option_t, value: i64) {
    // SAFETY: `mi_option_set` stores an integer in mimalloc's option table;
    // it touches no caller memory and any value is valid for this option.
    // It is not synchronised, which is why `tune` must run before other
    // threads start (documented there).
    unsafe { libmimalloc_sys::mi_option_set(option, value as std::ffi::c_long) }
}

// `c_long` is 64 bits here but 32 on Windows: the conversion is not
// useless everywhere.
#[allow(unsafe_code, clippy::useless_conversion)]
fn get_option(option: libmimalloc_sys::mi_option_t) -> i64 {
    // SAFETY: `mi_option_get` reads an integer from mimalloc's option table
    // (initialised at process load); no caller memory is involved.
    i64::from(unsafe { libmimalloc_sys::mi_option_get(option) })
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test, so no other test thread touches the options meanwhile.
    #[test]
    fn tune_sets_the_purge_delay_and_the_index_is_that_option() {
        if delay_from_env() {
            assert_eq!(tune(), Tuned::PurgeDelayFromEnv);
            return;
        }
        // v3's default purge delay (options.c): a wrong index reads another
        // option's default (14: 1, 16: 0).
        assert_eq!(
            purge_delay_ms(),
            1000,
            "index {PURGE_DELAY} is not the purge delay"
        );
        assert_eq!(tune(), Tuned::PurgeDelaySet);
        assert_eq!(purge_delay_ms(), PURGE_DELAY_MS);
    }
}
