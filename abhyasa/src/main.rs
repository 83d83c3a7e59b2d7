//! The `abhyasa` command line.
//!
//! Read commands take `--json`. Errors print one clear line and exit
//! non-zero; nothing already accepted is lost.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cli;

/// Abhyasa: deliver-or-report custody of governance obligations.
#[derive(Debug, Parser)]
#[command(name = "abhyasa", version, about)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs a custodian and a receiver on loopback QUIC with durable stores,
    /// injects a partition, and shows every obligation reach its outcome.
    Demo(cli::demo::DemoArgs),
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match args.command {
        Command::Demo(a) => cli::demo::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("abhyasa: {e}");
            ExitCode::FAILURE
        }
    }
}
