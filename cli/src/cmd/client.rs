//! Client subcommands: talk to a running node over its control socket,
//! plus `abhyasa card`, which reads the config only.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use abhyasa::clock::{Clock, SystemClock};
use abhyasa_core::{min_retries_to_span, RetryBackoff};
use serde_json::{json, Value};

use crate::config::NodeConfig;
use crate::control::{Request, STATES};

/// Where the node is: its directory or its socket.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Target {
    /// The node directory (its config names the control socket).
    #[arg(long, default_value = ".", conflicts_with = "socket")]
    dir: PathBuf,
    /// The control socket, instead of --dir.
    #[arg(long)]
    socket: Option<PathBuf>,
}

impl Target {
    pub(crate) fn socket(&self) -> Result<PathBuf, String> {
        match &self.socket {
            Some(s) => Ok(s.clone()),
            None => Ok(NodeConfig::load(&self.dir)?.socket),
        }
    }

    /// The node's backoff, when its config is at hand.
    fn backoff(&self) -> RetryBackoff {
        if self.socket.is_none() {
            if let Ok(c) = NodeConfig::load(&self.dir) {
                return c.backoff;
            }
        }
        RetryBackoff::DEFAULT
    }
}

/// One request, one response; the error is one line.
pub(crate) fn call(socket: &Path, req: &Request) -> Result<Value, String> {
    let mut stream = UnixStream::connect(socket).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => format!(
            "no node is running at {} (start one with `abhyasa node run --dir DIR`)",
            socket.display()
        ),
        _ => format!("cannot connect to {}: {e}", socket.display()),
    })?;
    let mut line = serde_json::to_string(req).map_err(|e| format!("request: {e}"))?;
    line.push('\n');
    stream
        .write_all(line.as_bytes())
        .map_err(|e| format!("control socket: {e}"))?;
    let mut resp = String::new();
    BufReader::new(&stream)
        .read_line(&mut resp)
        .map_err(|e| format!("control socket: {e}"))?;
    if resp.is_empty() {
        return Err("the node closed the control connection".into());
    }
    let v: Value =
        serde_json::from_str(&resp).map_err(|e| format!("bad response from the node: {e}"))?;
    if v["ok"] == true {
        Ok(v["result"].clone())
    } else {
        Err(format!(
            "node refused: {} ({})",
            v["error"]["message"].as_str().unwrap_or("unknown error"),
            v["error"]["code"].as_str().unwrap_or("?")
        ))
    }
}

pub(crate) fn print_json(v: &Value) -> Result<(), String> {
    let text = serde_json::to_string_pretty(v).map_err(|e| e.to_string())?;
    // A closed pipe (`| head`) is not an error worth a panic.
    let _ = writeln!(std::io::stdout(), "{text}");
    Ok(())
}

fn s(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Options of `abhyasa send`.
#[derive(Debug, clap::Args)]
pub(crate) struct SendArgs {
    #[command(flatten)]
    target: Target,
    /// The obligation as a v1 JSON file (created_at and obligation_id are
    /// filled in when absent).
    #[arg(long, conflicts_with_all = ["kind", "to", "payload"])]
    file: Option<PathBuf>,
    /// Obligation kind (e.g. anumati.consent).
    #[arg(long, required_unless_present = "file")]
    kind: Option<String>,
    /// The receiving agent.
    #[arg(
        long = "target",
        id = "to",
        value_name = "AGENT",
        required_unless_present = "file"
    )]
    to: Option<String>,
    /// Payload, a JSON object.
    #[arg(long, required_unless_present = "file")]
    payload: Option<String>,
    /// Custody deadline, seconds.
    #[arg(long, default_value_t = 300)]
    deadline: i64,
    /// Retry bound (default: the AB-2 minimum for the node's backoff, plus one).
    #[arg(long)]
    max_retries: Option<i64>,
    /// Obligation id (default: generated).
    #[arg(long)]
    id: Option<String>,
    /// Issuance order on the governed key (default: the node assigns the
    /// next sequence on the key, one above the newest it issued there).
    #[arg(long)]
    sequence: Option<u64>,
    /// Wait for the terminal outcome.
    #[arg(long)]
    wait: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn generated_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("ob-{nanos:x}-{:x}", std::process::id())
}

/// `abhyasa send`.
pub(crate) fn send(a: SendArgs) -> Result<(), String> {
    let mut ob = match &a.file {
        Some(f) => {
            let text = std::fs::read_to_string(f)
                .map_err(|e| format!("cannot read {}: {e}", f.display()))?;
            let v: Value = serde_json::from_str(&text)
                .map_err(|e| format!("{}: not JSON: {e}", f.display()))?;
            if !v.is_object() {
                return Err(format!("{}: not a JSON object", f.display()));
            }
            v
        }
        None => {
            let payload: Value = serde_json::from_str(a.payload.as_deref().unwrap_or("{}"))
                .map_err(|e| format!("--payload: not JSON: {e}"))?;
            let max_retries = match a.max_retries {
                Some(r) => r,
                None => {
                    let b = a.target.backoff();
                    let d = u64::try_from(a.deadline.max(1)).unwrap_or(1);
                    let n = min_retries_to_span(d, b.base.as_secs_f64(), b.cap.as_secs_f64());
                    i64::try_from(n).unwrap_or(i64::MAX).saturating_add(1)
                }
            };
            let mut v = json!({
                "kind": a.kind,
                "target": a.to,
                "payload": payload,
                "deadline_seconds": a.deadline,
                "max_retries": max_retries,
            });
            if let Some(sq) = a.sequence {
                v["sequence"] = json!(sq);
            }
            v
        }
    };
    if let Some(id) = &a.id {
        ob["obligation_id"] = json!(id);
    }
    if ob.get("obligation_id").is_none() {
        ob["obligation_id"] = json!(generated_id());
    }
    if ob.get("created_at").is_none() {
        ob["created_at"] = json!(SystemClock.now().to_rfc3339());
    }
    // Check it here so a bad file is reported before anything is sent.
    abhyasa_core::Obligation::from_json(ob.to_string().as_bytes())
        .map_err(|e| format!("invalid obligation: {e}"))?;
    let r = call(
        &a.target.socket()?,
        &Request::Offer {
            obligation: ob,
            wait: a.wait,
        },
    )?;
    if r["connected"] == false && r.get("outcome").is_none() {
        eprintln!(
            "note: the target is not connected now; custody retries until the deadline, then reports"
        );
    }
    if a.json {
        return print_json(&r);
    }
    println!("{} offered ({})", s(&r["obligation_id"]), s(&r["mode"]));
    if let Some(o) = r.get("outcome") {
        println!(
            "{} {} (attempts {}{})",
            s(&o["obligation_id"]),
            s(&o["state"]),
            s(&o["attempts"]),
            match &o["reason"] {
                Value::String(r) => format!(", reason {r}"),
                _ => String::new(),
            }
        );
    }
    Ok(())
}

/// Options of read commands.
#[derive(Debug, clap::Args)]
pub(crate) struct ReadArgs {
    #[command(flatten)]
    pub(crate) target: Target,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Options of `abhyasa status`.
#[derive(Debug, clap::Args)]
pub(crate) struct StatusArgs {
    /// The obligation id.
    id: String,
    #[command(flatten)]
    read: ReadArgs,
}

/// `abhyasa status ID`.
pub(crate) fn status(a: StatusArgs) -> Result<(), String> {
    let r = call(&a.read.target.socket()?, &Request::Status { id: a.id })?;
    if a.read.json {
        return print_json(&r);
    }
    println!("obligation  {}", s(&r["obligation_id"]));
    println!("custodian   {}", s(&r["custodian"]));
    println!("attempts    {}", s(&r["attempts"]));
    println!("deadline    {}", s(&r["deadline_at"]));
    match r["receiver"].as_array() {
        Some(rs) if !rs.is_empty() => {
            for e in rs {
                println!("received    from {}: {}", s(&e[0]), s(&e[1]));
            }
        }
        _ => println!("received    -"),
    }
    for d in r["declines"].as_array().into_iter().flatten() {
        println!(
            "declined    from {}: {} ({})",
            s(&d[0]),
            s(&d[1]),
            d[2].as_str().unwrap_or("-")
        );
    }
    Ok(())
}

/// Options of `abhyasa list`.
#[derive(Debug, clap::Args)]
pub(crate) struct ListArgs {
    /// Only this state: pending, applied, declined, escalated, best_effort.
    #[arg(long)]
    state: Option<String>,
    /// Most obligations on this page (at most 10000).
    #[arg(long, default_value_t = crate::control::DEFAULT_LIMIT)]
    limit: usize,
    /// Start after this obligation id (the `next` of the previous page).
    #[arg(long)]
    after: Option<String>,
    #[command(flatten)]
    read: ReadArgs,
}

/// `abhyasa list`.
pub(crate) fn list(a: ListArgs) -> Result<(), String> {
    if let Some(st) = &a.state {
        if !STATES.contains(&st.as_str()) {
            return Err(format!("--state {st:?}: one of {}", STATES.join(", ")));
        }
    }
    let r = call(
        &a.read.target.socket()?,
        &Request::List {
            state: a.state,
            limit: Some(a.limit),
            after: a.after,
        },
    )?;
    if a.read.json {
        return print_json(&r);
    }
    let rows = r["items"].as_array().cloned().unwrap_or_default();
    println!(
        "{:<36} {:<12} {:<16} {:>8}  deadline",
        "id", "state", "target", "attempts"
    );
    for row in &rows {
        println!(
            "{:<36} {:<12} {:<16} {:>8}  {}",
            s(&row["obligation_id"]),
            s(&row["state"]),
            s(&row["target"]),
            s(&row["attempts"]),
            s(&row["deadline_at"])
        );
    }
    match r["next"].as_str() {
        Some(next) => println!("{} obligation(s); more after: --after {next}", rows.len()),
        None => println!("{} obligation(s)", rows.len()),
    }
    Ok(())
}

/// `abhyasa inbox`.
pub(crate) fn inbox(a: ReadArgs) -> Result<(), String> {
    let r = call(&a.target.socket()?, &Request::Inbox)?;
    if a.json {
        return print_json(&r);
    }
    if let Some(m) = r.as_object() {
        for (k, v) in m {
            println!("{k:<24} {}", s(v));
        }
    }
    Ok(())
}

/// `abhyasa metrics`.
pub(crate) fn metrics(a: ReadArgs) -> Result<(), String> {
    let r = call(&a.target.socket()?, &Request::Metrics)?;
    if a.json {
        return print_json(&r);
    }
    if let Some(m) = r.as_object() {
        for (k, v) in m {
            if !v.is_object() && !v.is_array() {
                println!("{k:<28} {}", s(v));
            }
        }
    }
    Ok(())
}

/// `abhyasa authorizations`: the durable principal-side state per
/// governed key, and when and why it last changed.
pub(crate) fn authorizations(a: ReadArgs) -> Result<(), String> {
    let r = call(&a.target.socket()?, &Request::Authorizations)?;
    if a.json {
        return print_json(&r);
    }
    let rows = r.as_array().cloned().unwrap_or_default();
    for row in &rows {
        let seq = row["sequence"]
            .as_u64()
            .map_or_else(|| "-".to_string(), |n| n.to_string());
        let by = row["obligation_id"]
            .as_str()
            .map(|id| format!(" ({id})"))
            .unwrap_or_default();
        println!(
            "{:<32} {:<9} seq {:<6} {}{} at {}",
            s(&row["key"]),
            s(&row["state"]),
            seq,
            s(&row["why"]),
            by,
            row["changed_at"].as_str().unwrap_or("unknown")
        );
    }
    println!("{} governed key(s)", rows.len());
    Ok(())
}

/// Options of `abhyasa escalations`.
#[derive(Debug, clap::Args)]
pub(crate) struct EscalationsArgs {
    /// Most escalations (and decisions) on this page (at most 10000).
    #[arg(long, default_value_t = crate::control::DEFAULT_LIMIT)]
    limit: usize,
    /// Start after this log position (the `next` of the previous page).
    #[arg(long)]
    after: Option<u64>,
    /// Start the decisions after this obligation id (`decisions_next`).
    #[arg(long)]
    decisions_after: Option<String>,
    #[command(flatten)]
    read: ReadArgs,
}

/// `abhyasa escalations`.
pub(crate) fn escalations(a: EscalationsArgs) -> Result<(), String> {
    let r = call(
        &a.read.target.socket()?,
        &Request::Escalations {
            limit: Some(a.limit),
            after: a.after,
            decisions_after: a.decisions_after,
        },
    )?;
    if a.read.json {
        return print_json(&r);
    }
    let es = r["escalations"].as_array().cloned().unwrap_or_default();
    match r["next"].as_u64() {
        Some(next) => println!("{} escalation(s); more after: --after {next}", es.len()),
        None => println!("{} escalation(s)", es.len()),
    }
    for e in &es {
        println!(
            "  {}  {} -> {}  after {} attempts: {}; fail-safe on {} ({})",
            s(&e["obligation_id"]),
            s(&e["kind"]),
            s(&e["target"]),
            s(&e["attempts"]),
            s(&e["cause"]),
            s(&e["safe_action"]["key"]),
            s(&e["guard"]["outcome"])
        );
    }
    let ds = r["decisions"].as_array().cloned().unwrap_or_default();
    match r["decisions_next"].as_str() {
        Some(next) => println!(
            "{} decision(s) required; more after: --decisions-after {next}",
            ds.len()
        ),
        None => println!("{} decision(s) required", ds.len()),
    }
    for d in &ds {
        println!("  {}", d);
    }
    Ok(())
}

/// Options of `abhyasa decide`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["key", "obligation"])))]
pub(crate) struct DecideArgs {
    /// A governed key: record the principal's own decision on it.
    #[arg(long, requires = "auth")]
    key: Option<String>,
    /// Grant authority on the key.
    #[arg(long, group = "auth", requires = "key")]
    grant: bool,
    /// Withhold authority on the key (fail-closed).
    #[arg(long, group = "auth", requires = "key")]
    withhold: bool,
    /// Principal sequence number guarding the decision.
    #[arg(long, requires = "key")]
    sequence: Option<u64>,
    /// A surfaced decline to resolve.
    #[arg(long, requires = "res")]
    obligation: Option<String>,
    /// Apply the fail-safe for the surfaced decline.
    #[arg(long, group = "res", requires = "obligation")]
    apply_safe: bool,
    /// Accept the decline without a fail-safe.
    #[arg(long, group = "res", requires = "obligation")]
    dismiss: bool,
    #[command(flatten)]
    read: ReadArgs,
}

/// `abhyasa decide`.
pub(crate) fn decide(a: DecideArgs) -> Result<(), String> {
    use abhyasa_core::principal::{Authorization, Resolution};
    if a.key.is_some() && (a.apply_safe || a.dismiss) {
        return Err("--apply-safe/--dismiss go with --obligation, not --key".into());
    }
    if a.obligation.is_some() && (a.grant || a.withhold || a.sequence.is_some()) {
        return Err("--grant/--withhold/--sequence go with --key, not --obligation".into());
    }
    let req = match (a.key, a.obligation) {
        (Some(key), None) => Request::Decide {
            key,
            decision: if a.grant {
                Authorization::Granted
            } else {
                Authorization::Withheld
            },
            sequence: a.sequence,
        },
        (None, Some(id)) => Request::Resolve {
            obligation_id: id,
            resolution: if a.apply_safe {
                Resolution::ApplySafe
            } else {
                Resolution::Dismiss
            },
        },
        _ => return Err("give either --key or --obligation".into()),
    };
    let r = call(&a.read.target.socket()?, &req)?;
    if a.read.json {
        return print_json(&r);
    }
    match &r {
        Value::Null => println!("recorded"),
        v => println!("recorded: {}", s(&v["outcome"])),
    }
    Ok(())
}

/// Options of `abhyasa card`.
#[derive(Debug, clap::Args)]
pub(crate) struct CardArgs {
    /// The node directory.
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// Accepted for symmetry with the other read commands: the card is JSON.
    #[arg(long)]
    json: bool,
}

/// `abhyasa card`: the A2A AgentCard extension entry, from the config.
pub(crate) fn card(a: CardArgs) -> Result<(), String> {
    let _ = a.json;
    let cfg = NodeConfig::load(&a.dir)?;
    // The HTTP binding's URLs when the node serves it.
    let (ack_endpoint, obligation_endpoint) = cfg.card_endpoints();
    let kinds = cfg.card_profiles(&obligation_endpoint)?;
    let service = abhyasa_a2a::AbhyasaServiceRef::new(ack_endpoint, kinds)
        .map_err(|e| format!("agent card: {e}"))?;
    let entry = service.to_extension(format!(
        "Abhyasa custody (deliver-or-report) for governance obligations; agent {}",
        cfg.agent
    ));
    print_json(&serde_json::to_value(entry).map_err(|e| e.to_string())?)
}
