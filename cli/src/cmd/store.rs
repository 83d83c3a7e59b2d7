//! `abhyasa store check | repair | quarantine | quarantined`: offline
//! inspection and repair of a node's store, for a node that refuses to
//! start because a file is damaged or a row does not decode. The node must
//! be stopped (the store is opened directly).

use std::path::PathBuf;

use abhyasa::clock::{Clock, SystemClock};
use abhyasa_store::{Damage, QuarantinedRow, StoreOptions};
use serde_json::{json, Value};

use crate::config::NodeConfig;

/// The `store` subcommands.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum StoreCommand {
    /// Lists every damaged place in the store's files (file, offset,
    /// obligations affected) and every row that does not decode; exits 1
    /// if there is any. Reads only: no byte of the store changes.
    Check(StoreArgs),
    /// Salvages a damaged store: copies its files verbatim into
    /// `<store>/damaged-<time>/`, keeps every record before and after each
    /// damaged place, quarantines rows that do not decode, hands custody
    /// whose offer it salvaged but cannot prove to the node (escalated
    /// `store_damaged` with its fail-safe at the next start), and lists the
    /// obligations it could not recover.
    Repair(StoreArgs),
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

/// The repair path printed when a node refuses to start on a damaged file.
pub(crate) fn damage_hint(dir: &std::path::Path) -> String {
    let d = dir.display();
    format!(
        "the node does not start on a damaged store, and nothing was changed. \
         `abhyasa store check --dir {d}` lists every damaged place (it only reads); \
         `abhyasa store repair --dir {d}` copies the files aside, keeps every record \
         around the damage and names the obligations it could not recover"
    )
}

fn damage_json(d: &Damage) -> Value {
    json!({
        "file": d.file,
        "offset": d.offset,
        "detail": d.detail,
        "obligations": d.obligations,
    })
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
        StoreCommand::Repair(a) => (a, 3),
    };
    let cfg = NodeConfig::load(&a.dir)?;
    if cfg.postgres.is_some() {
        return Err(
            "store check/repair/quarantine are for the embedded stores (redb, sled, log, \
             fjall); a PostgreSQL store is checked with the database's own tools"
                .into(),
        );
    }
    let fail = |e| format!("store {}: {e}", cfg.store_path.display());
    let options = StoreOptions::default();
    if what == 0 {
        // C-SD-3: opened to read only; damage is listed, not refused.
        let store = cfg
            .store
            .open_for_check(&cfg.store_path, &options)
            .map_err(fail)?;
        let damage = store.damage();
        let bad = store.check().map_err(fail)?;
        let v = Value::Array(
            damage
                .iter()
                .map(damage_json)
                .chain(
                    bad.iter()
                        .map(|b| json!({"table": b.table, "key": b.key, "detail": b.detail})),
                )
                .collect(),
        );
        let mut text = String::new();
        for d in &damage {
            text.push_str(&format!("damaged: {d}\n"));
        }
        for b in &bad {
            text.push_str(&format!("{}/{}: {}\n", b.table, b.key, b.detail));
        }
        if damage.is_empty() && bad.is_empty() {
            text.push_str("no file is damaged and every row decodes\n");
        }
        print(a.json, &v, &text)?;
        return if !damage.is_empty() {
            Err(format!(
                "{} damaged place(s); `abhyasa store repair --dir {}` salvages around them",
                damage.len(),
                a.dir.display()
            ))
        } else if bad.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{} unreadable row(s); `abhyasa store quarantine --dir {}` moves them aside",
                bad.len(),
                a.dir.display()
            ))
        };
    }
    if what == 3 {
        let r = cfg
            .store
            .repair(&cfg.store_path, &options, SystemClock.now())
            .map_err(fail)?;
        let v = json!({
            "saved_to": r.saved_to.as_ref().map(|p| p.display().to_string()),
            "damage": r.damage.iter().map(damage_json).collect::<Vec<_>>(),
            "quarantined": quarantined_json(&r.quarantined),
            "lost": r.lost,
            "escalated": r.escalated,
        });
        let mut text = String::new();
        for d in &r.damage {
            text.push_str(&format!("damaged: {d}\n"));
        }
        if let Some(p) = &r.saved_to {
            text.push_str(&format!("the files as they were are in {}\n", p.display()));
        }
        for q in &r.quarantined {
            text.push_str(&format!(
                "quarantined {}/{}: {}\n",
                q.table, q.key, q.detail
            ));
        }
        for o in &r.escalated {
            text.push_str(&format!(
                "escalated store_damaged at the next start, with its fail-safe: {o}\n"
            ));
        }
        for o in &r.lost {
            text.push_str(&format!("not recovered: {o}\n"));
        }
        if r.damage.is_empty() && r.quarantined.is_empty() {
            text.push_str("nothing to repair\n");
        } else {
            text.push_str(&format!(
                "{} damaged place(s) read around, {} row(s) quarantined, {} obligation(s) \
                 to escalate store_damaged, {} obligation(s) not recovered\n",
                r.damage.len(),
                r.quarantined.len(),
                r.escalated.len(),
                r.lost.len()
            ));
        }
        return print(a.json, &v, &text);
    }
    let mut store = cfg
        .store
        .open_for_repair(&cfg.store_path, &options)
        .map_err(|e| match e {
            e @ abhyasa_core::store::StoreError::Damaged { .. } => format!(
                "store {}: {e}; `abhyasa store repair --dir {}` salvages a damaged store",
                cfg.store_path.display(),
                a.dir.display()
            ),
            e => fail(e),
        })?;
    match what {
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
