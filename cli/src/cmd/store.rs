//! `abhyasa store check | quarantine | quarantined`: offline inspection and
//! repair of a node's store, for a node that refuses to start because a
//! row does not decode. The node must be stopped (the store is opened
//! directly).

use std::path::PathBuf;

use abhyasa::clock::{Clock, SystemClock};
use abhyasa_store::{QuarantinedRow, StoreOptions};
use serde_json::{json, Value};

use crate::config::NodeConfig;

/// The `store` subcommands.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum StoreCommand {
    /// Lists every row of the node's store that does not decode; exits 1 if
    /// there is any.
    Check(StoreArgs),
    /// Moves every row that does not decode into the store's `quarantine`
    /// table (bytes kept verbatim), so the node starts on all the others.
    Quarantine(StoreArgs),
    /// Lists the rows moved into quarantine.
    Quarantined(StoreArgs),
}

/// Options of the `store` subcommands.
#[derive(Debug, clap::Args)]
pub(crate) struct StoreArgs {
    /// The node directory (the node must not be running).
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

/// The repair path printed when a node refuses to start on a corrupt row.
pub(crate) fn repair_hint(dir: &std::path::Path) -> String {
    let d = dir.display();
    format!(
        "the node does not start on a store it cannot read whole. \
         `abhyasa store check --dir {d}` lists every unreadable row; \
         `abhyasa store quarantine --dir {d}` moves them aside (kept verbatim, \
         listed by `abhyasa store quarantined --dir {d}`) and keeps every other row"
    )
}

fn quarantined_json(rows: &[QuarantinedRow]) -> Value {
    Value::Array(
        rows.iter()
            .map(|q| {
                json!({
                    "table": q.table,
                    "key": q.key,
                    "detail": q.detail,
                    "quarantined_at": q.quarantined_at.to_rfc3339(),
                    "bytes": q.raw_value.len(),
                })
            })
            .collect(),
    )
}

fn print(json_out: bool, v: &Value, text: &str) -> Result<(), String> {
    if json_out {
        let s = serde_json::to_string_pretty(v).map_err(|e| format!("json: {e}"))?;
        println!("{s}");
    } else {
        print!("{text}");
    }
    Ok(())
}

/// Runs a `store` subcommand.
pub(crate) fn run(c: StoreCommand) -> Result<(), String> {
    let (a, what) = match c {
        StoreCommand::Check(a) => (a, 0),
        StoreCommand::Quarantine(a) => (a, 1),
        StoreCommand::Quarantined(a) => (a, 2),
    };
    let cfg = NodeConfig::load(&a.dir)?;
    if cfg.postgres.is_some() {
        return Err(
            "store check/quarantine are for the embedded stores (redb, sled, log, fjall); \
                    a PostgreSQL store is checked with the database's own tools"
                .into(),
        );
    }
    let mut store = cfg
        .store
        .open_for_repair(&cfg.store_path, &StoreOptions::default())
        .map_err(|e| format!("store {}: {e}", cfg.store_path.display()))?;
    let fail = |e| format!("store {}: {e}", cfg.store_path.display());
    match what {
        0 => {
            let bad = store.check().map_err(fail)?;
            let v = Value::Array(
                bad.iter()
                    .map(|b| json!({"table": b.table, "key": b.key, "detail": b.detail}))
                    .collect(),
            );
            let mut text = String::new();
            for b in &bad {
                text.push_str(&format!("{}/{}: {}\n", b.table, b.key, b.detail));
            }
            if bad.is_empty() {
                text.push_str("every row decodes\n");
            }
            print(a.json, &v, &text)?;
            if bad.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "{} unreadable row(s); `abhyasa store quarantine --dir {}` moves them aside",
                    bad.len(),
                    a.dir.display()
                ))
            }
        }
        1 => {
            let moved = store.quarantine(SystemClock.now()).map_err(fail)?;
            let mut text = String::new();
            for q in &moved {
                text.push_str(&format!(
                    "quarantined {}/{}: {}\n",
                    q.table, q.key, q.detail
                ));
            }
            text.push_str(&format!("{} row(s) moved aside\n", moved.len()));
            print(a.json, &quarantined_json(&moved), &text)
        }
        _ => {
            let rows = store.quarantined().map_err(fail)?;
            let mut text = String::new();
            for q in &rows {
                text.push_str(&format!(
                    "{}/{} ({} bytes, {}): {}\n",
                    q.table,
                    q.key,
                    q.raw_value.len(),
                    q.quarantined_at,
                    q.detail
                ));
            }
            if rows.is_empty() {
                text.push_str("quarantine is empty\n");
            }
            print(a.json, &quarantined_json(&rows), &text)
        }
    }
}
