//! Not a stable API: the `config.toml` reader and the control-socket
//! request decoder, reachable from the cargo-fuzz targets (`fuzz/`) and
//! the regression tests, which live outside the crate. C-T-6: any bytes
//! get a value or a typed error, never a panic.

use std::path::Path;

use crate::config::NodeConfig;
use crate::control::{self, Command, Request};

/// What a `config.toml` text reads as, when it is accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigRead {
    /// The config written back as TOML, as `abhyasa init` writes one (an
    /// accepted config must be writable).
    pub written: Result<String, String>,
    /// The checked config (every resolved value, `Debug`-printed).
    pub resolved: String,
}

/// The directory a fuzzed config is resolved against: it does not exist,
/// so no file in it changes what the text means.
const DIR: &str = "/nonexistent/abhyasa-fuzz-node";

/// Reads `text` as `DIR/config.toml` the way every command does (parse,
/// then resolve), then derives what `abhyasa card` and `abhyasa node run`
/// take from it: the card's endpoints and kind profiles, and the node's
/// limits. `Err` is the one-line message the command would print.
pub fn read_config(text: &str) -> Result<ConfigRead, String> {
    let dir = Path::new(DIR);
    let cfg = NodeConfig::parse(text, &dir.join(crate::config::CONFIG_FILE))?;
    let mut resolved = cfg.resolve(dir)?;
    let written = toml::to_string(&resolved.raw).map_err(|e| e.to_string());
    let (_, obligation_endpoint) = resolved.card_endpoints();
    resolved.card_profiles(&obligation_endpoint)?;
    let mut options = abhyasa::NodeOptions::new(resolved.agent.clone());
    resolved.apply_limits(&mut options);
    // Without `postgres_holder` the holder name is made of the host, the
    // process and the clock: not part of what the text says.
    if let (Some(pg), None) = (&mut resolved.postgres, &resolved.raw.postgres_holder) {
        pg.options.holder.clear();
    }
    Ok(ConfigRead {
        written,
        resolved: format!("{resolved:?}"),
    })
}

/// A control request the socket refused: its error code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlRefusal {
    /// `bad_request` or `invalid_obligation`.
    pub code: String,
    /// The message sent back.
    pub message: String,
}

/// Reads one control-socket request line the way the socket does
/// (`from_utf8_lossy`, blank lines skipped). `Ok(None)`: a blank line, not
/// answered; `Ok(Some(line))`: the request is accepted, and `line` is the
/// command written back as a request (it must read as the same command).
pub fn read_control_request(bytes: &[u8]) -> Result<Option<String>, ControlRefusal> {
    let line = String::from_utf8_lossy(bytes);
    if line.trim().is_empty() {
        return Ok(None);
    }
    let cmd = control::parse(&line).map_err(|e| ControlRefusal {
        code: e.code,
        message: e.message,
    })?;
    let again = serde_json::to_string(&request_of(&cmd)).map_err(|e| ControlRefusal {
        code: "internal".into(),
        message: e.to_string(),
    })?;
    match control::parse(&again) {
        Ok(c) if c == cmd => Ok(Some(again)),
        other => Err(ControlRefusal {
            code: "internal".into(),
            message: format!("{again} reads as {other:?}, not {cmd:?}"),
        }),
    }
}

/// The request that asks for `cmd`.
fn request_of(cmd: &Command) -> Request {
    match cmd.clone() {
        Command::Offer { obligation, wait } => Request::Offer {
            obligation: obligation.to_json_value(),
            wait,
        },
        Command::Status { id } => Request::Status { id: id.to_string() },
        Command::List {
            state,
            limit,
            after,
        } => Request::List {
            state: state.map(|s| s.as_str().to_string()),
            limit: Some(limit),
            after: after.map(|a| a.to_string()),
        },
        Command::Inbox => Request::Inbox,
        Command::Escalations {
            limit,
            after,
            decisions_after,
        } => Request::Escalations {
            limit: Some(limit),
            after: after.map(|a| a.0),
            decisions_after: decisions_after.map(|a| a.to_string()),
        },
        Command::Decide {
            key,
            decision,
            sequence,
        } => Request::Decide {
            key: key.to_string(),
            decision,
            sequence: sequence.map(|s| s.0),
        },
        Command::Resolve { id, resolution } => Request::Resolve {
            obligation_id: id.to_string(),
            resolution,
        },
        Command::Metrics => Request::Metrics,
        Command::Authorizations => Request::Authorizations,
        Command::Leases => Request::Leases,
    }
}
