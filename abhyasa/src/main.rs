//! The `abhyasa` command line.
//!
//! Read commands take `--json`. Errors print one clear line and exit
//! non-zero; nothing already accepted is lost.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cli;
mod config;
mod control;

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
    /// Creates a node directory: config.toml and a key and certificate.
    Init(cli::init::InitArgs),
    /// Runs a node.
    #[command(subcommand)]
    Node(cli::node::NodeCommand),
    /// Offers an obligation to a running node (from a JSON file or flags).
    Send(cli::client::SendArgs),
    /// Where an obligation stands.
    Status(cli::client::StatusArgs),
    /// Obligations this node holds custody of, by state.
    List(cli::client::ListArgs),
    /// Inbox counters.
    Inbox(cli::client::ReadArgs),
    /// Escalations and surfaced declines awaiting a decision.
    Escalations(cli::client::ReadArgs),
    /// The node's metrics snapshot.
    Metrics(cli::client::ReadArgs),
    /// Principal-side state per governed key: granted or withheld, its
    /// sequence, and when and why it last changed (durable state only).
    Authorizations(cli::client::ReadArgs),
    /// Records a principal decision on a key, or resolves a surfaced decline.
    Decide(cli::client::DecideArgs),
    /// Prints the A2A AgentCard extension entry for this node (config only).
    Card(cli::client::CardArgs),
    /// Checks or repairs a stopped node's store (unreadable rows, quarantine).
    #[command(subcommand)]
    Store(cli::store::StoreCommand),
    /// Serves MCP on stdio: the v1 reference tools plus node tools.
    Mcp(abhyasa_mcp::McpArgs),
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match args.command {
        Command::Demo(a) => cli::demo::run(a).map_err(|e| e.to_string()),
        Command::Init(a) => cli::init::run(a),
        Command::Node(c) => cli::node::run(c),
        Command::Send(a) => cli::client::send(a),
        Command::Status(a) => cli::client::status(a),
        Command::List(a) => cli::client::list(a),
        Command::Inbox(a) => cli::client::inbox(a),
        Command::Escalations(a) => cli::client::escalations(a),
        Command::Metrics(a) => cli::client::metrics(a),
        Command::Decide(a) => cli::client::decide(a),
        Command::Authorizations(a) => cli::client::authorizations(a),
        Command::Card(a) => cli::client::card(a),
        Command::Store(c) => cli::store::run(c),
        Command::Mcp(a) => a.run(|dir| config::NodeConfig::load(dir).map(|c| c.socket)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("abhyasa: {e}");
            ExitCode::FAILURE
        }
    }
}
