//! The `abhyasa` command line (the library's [`abhyasa_cli::run`]).

use std::process::ExitCode;

// mimalloc, tuned for a busy node (see `abhyasa_alloc`): the allocator
// the throughput figures were measured with.
#[global_allocator]
static ALLOC: abhyasa_alloc::Allocator = abhyasa_alloc::Allocator;

fn main() -> ExitCode {
    abhyasa_alloc::tune();
    abhyasa_cli::run()
}
