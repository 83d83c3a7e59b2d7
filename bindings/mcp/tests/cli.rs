//! `abhyasa mcp` options: the clap definition is consistent, and every bad
//! `--require` is refused with a message naming it.

use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::AgentId;
use abhyasa_mcp::server::parse_require;
use abhyasa_mcp::{McpArgs, ToolPolicy};
use clap::{CommandFactory, Parser};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    mcp: McpArgs,
}

fn policy() -> ToolPolicy {
    ToolPolicy::new(
        AgentId::new("mcp-server").expect("agent id"),
        PolarityRegistry::standard(),
    )
}

#[test]
fn the_options_are_consistent() {
    Cli::command().debug_assert();
    let ok = Cli::try_parse_from([
        "mcp",
        "--agent",
        "a",
        "--custodian",
        "c",
        "--guard-store",
        "/tmp/guard",
        "--require",
        r#"decide=anumati.consent:{"scope":"abhyasa.decide"}"#,
    ]);
    assert!(ok.is_ok());
    let redb = Cli::try_parse_from([
        "mcp",
        "--agent",
        "a",
        "--custodian",
        "c",
        "--guard-store",
        "/tmp/x.redb",
        "--guard-store-kind",
        "redb",
    ]);
    assert!(redb.is_ok());
    let bogus = Cli::try_parse_from([
        "mcp",
        "--agent",
        "a",
        "--custodian",
        "c",
        "--guard-store",
        "/tmp/x",
        "--guard-store-kind",
        "mysql",
    ]);
    assert!(bogus.is_err());
    // The guard needs all three of agent, custodian and store.
    assert!(Cli::try_parse_from(["mcp", "--agent", "a"]).is_err());
    assert!(Cli::try_parse_from(["mcp", "--custodian", "c"]).is_err());
    assert!(Cli::try_parse_from(["mcp", "--dir", "d", "--socket", "s"]).is_err());
}

#[test]
fn require_specs() {
    let p = parse_require(
        policy(),
        r#"decide=anumati.consent:{"scope":"abhyasa.decide"}"#,
    )
    .unwrap();
    assert_eq!(
        p.key_for("decide").map(|k| k.as_str()),
        Some("anumati.consent/mcp-server/scope:abhyasa.decide")
    );
    for (spec, needle) in [
        ("decide", "TOOL=KIND:SELECTOR"),
        ("decide=anumati.consent", "TOOL=KIND:SELECTOR"),
        ("decide=anumati.consent:{scope}", "not JSON"),
        (r#"nope=anumati.consent:{"scope":"s"}"#, "no tool"),
        (r#"decide=no.such.kind:{"scope":"s"}"#, "no polarity rule"),
        ("decide=anumati.consent:{}", "scope"),
    ] {
        let e = parse_require(policy(), spec).unwrap_err();
        assert!(e.contains(needle), "{spec}: {e}");
    }
}
