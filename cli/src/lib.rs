//! The `abhyasa` command line, as a library: the binary (`src/main.rs`)
//! calls [`run`]. Not a stable API; the library exists so the config and
//! control-socket decoders are reachable from outside the crate
//! ([`fuzzing`], for the cargo-fuzz targets in `fuzz/`).
//!
//! Read commands take `--json`. Errors print one clear line and exit
//! non-zero; nothing already accepted is lost.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;
mod config;
mod control;
#[doc(hidden)]
pub mod fuzzing;

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
    Demo(cmd::demo::DemoArgs),
    /// Creates a node directory: config.toml and a key and certificate.
    Init(cmd::init::InitArgs),
    /// Runs a node.
    #[command(subcommand)]
    Node(cmd::node::NodeCommand),
    /// Offers an obligation to a running node (from a JSON file or flags).
    Send(cmd::client::SendArgs),
    /// Where an obligation stands.
    Status(cmd::client::StatusArgs),
    /// Obligations this node holds custody of, by state.
    List(cmd::client::ListArgs),
    /// Inbox counters.
    Inbox(cmd::client::ReadArgs),
    /// Escalations and surfaced declines awaiting a decision.
    Escalations(cmd::client::EscalationsArgs),
    /// The node's metrics snapshot.
    Metrics(cmd::client::ReadArgs),
    /// Principal-side state per governed key: granted or withheld, its
    /// sequence, and when and why it last changed (durable state only).
    Authorizations(cmd::client::ReadArgs),
    /// Leases: the leased grants this node holds as receiver
    /// (key, scope, lease end, active or lapsed), the leases it renews as
    /// principal, and lease warnings.
    Leases(cmd::client::ReadArgs),
    /// Records a principal decision on a key, or resolves a surfaced decline.
    Decide(cmd::client::DecideArgs),
    /// Prints the A2A AgentCard extension entry for this node (config only).
    Card(cmd::client::CardArgs),
    /// Checks or repairs a stopped node's store (unreadable rows, quarantine).
    #[command(subcommand)]
    Store(cmd::store::StoreCommand),
    /// Serves MCP on stdio: the v1 reference tools plus node tools.
    Mcp(abhyasa_mcp::McpArgs),
    /// The store-and-forward relay: holds sealed frames for edges that are
    /// reachable only sometimes; never takes custody, never acks.
    #[command(subcommand)]
    Relay(cmd::relay::RelayCommand),
}

/// Parses the command line and runs the command; the binary's `main`.
pub fn run() -> ExitCode {
    let args = Args::parse();
    let result = match args.command {
        Command::Demo(a) => cmd::demo::run(a).map_err(|e| e.to_string()),
        Command::Init(a) => cmd::init::run(a),
        Command::Node(c) => cmd::node::run(c),
        Command::Send(a) => cmd::client::send(a),
        Command::Status(a) => cmd::client::status(a),
        Command::List(a) => cmd::client::list(a),
        Command::Inbox(a) => cmd::client::inbox(a),
        Command::Escalations(a) => cmd::client::escalations(a),
        Command::Metrics(a) => cmd::client::metrics(a),
        Command::Decide(a) => cmd::client::decide(a),
        Command::Authorizations(a) => cmd::client::authorizations(a),
        Command::Leases(a) => cmd::leases::run(a),
        Command::Card(a) => cmd::client::card(a),
        Command::Store(c) => cmd::store::run(c),
        Command::Relay(c) => cmd::relay::run(c),
        Command::Mcp(a) => mcp(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("abhyasa: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `abhyasa mcp`. The guard's policy for its custodian is the `[mcp]`
/// section of the node directory's config, when there is one.
fn mcp(mut a: abhyasa_mcp::McpArgs) -> Result<(), String> {
    if a.agent.is_some() && a.socket.is_none() && a.dir.join(config::CONFIG_FILE).exists() {
        a.authority = config::NodeConfig::load(&a.dir)?.mcp;
    }
    a.run(|dir| config::NodeConfig::load(dir).map(|c| c.socket))
}
