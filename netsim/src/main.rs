//! `abhyasa-sim`: see `abhyasa-sim --help` and netsim/README.md.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    abhyasa_netsim::cli::main_with_args(std::env::args_os())
}
