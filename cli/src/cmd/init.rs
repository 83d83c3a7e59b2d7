//! `abhyasa init`: a new node directory with its config and identity.

use std::path::{Path, PathBuf};

use abhyasa_core::AgentId;
use abhyasa_identity::{generate_identity, Identity};

use crate::config::{NodeConfig, CONFIG_FILE};

/// Options of `abhyasa init`.
#[derive(Debug, clap::Args)]
pub(crate) struct InitArgs {
    /// The node directory to create.
    #[arg(long)]
    dir: PathBuf,
    /// This node's agent id.
    #[arg(long)]
    agent: String,
    /// QUIC listen address (UDP).
    #[arg(long, default_value = "0.0.0.0:7400")]
    listen: String,
}

/// Writes `DIR/config.toml` and `DIR/identity/{cert,key}.pem`.
pub(crate) fn run(a: InitArgs) -> Result<(), String> {
    let agent = AgentId::new(&a.agent).map_err(|e| format!("--agent: {e}"))?;
    a.listen
        .parse::<std::net::SocketAddr>()
        .map_err(|e| format!("--listen {:?}: {e}", a.listen))?;
    if a.dir.join(CONFIG_FILE).exists() || a.dir.join("identity").exists() {
        return Err(format!(
            "{} is already a node directory; refusing to overwrite it",
            a.dir.display()
        ));
    }
    if a.dir.exists()
        && std::fs::read_dir(&a.dir)
            .map_err(|e| format!("cannot read {}: {e}", a.dir.display()))?
            .next()
            .is_some()
    {
        return Err(format!(
            "{} exists and is not empty; refusing to overwrite it",
            a.dir.display()
        ));
    }
    let identity = create_identity(&a.dir, &agent)?;
    let config = NodeConfig::new(agent.as_str(), &a.listen);
    let text = toml::to_string(&config).map_err(|e| format!("config: {e}"))?;
    let header = "# Abhyasa node config. Every key but `agent` has a default; see\n\
                  # `abhyasa init --help` and docs/configuration.md.\n\
                  # Pin peers with [[peers]] entries (agent, fingerprint, addr).\n";
    write_config(&a.dir, header, &text)?;
    announce(
        "node",
        &a.dir,
        &agent,
        &identity,
        &a.listen,
        "each peer (fix addr to a reachable host)",
    );
    Ok(())
}

/// Creates `dir/identity` (mode 0700, as is `dir`: the key is secret) and
/// a fresh key and certificate for `agent` in it. Node and relay
/// directories share this layout.
pub(crate) fn create_identity(dir: &Path, agent: &AgentId) -> Result<Identity, String> {
    let ident_dir = dir.join("identity");
    std::fs::create_dir_all(&ident_dir)
        .map_err(|e| format!("cannot create {}: {e}", ident_dir.display()))?;
    {
        use std::os::unix::fs::PermissionsExt as _;
        for d in [dir, ident_dir.as_path()] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| format!("cannot restrict {}: {e}", d.display()))?;
        }
    }
    let identity = generate_identity(agent).map_err(|e| format!("key generation: {e}"))?;
    identity
        .save_pem(&ident_dir.join("cert.pem"), &ident_dir.join("key.pem"))
        .map_err(|e| e.to_string())?;
    Ok(identity)
}

/// Writes `dir/config.toml` as `header` followed by `text`.
pub(crate) fn write_config(dir: &Path, header: &str, text: &str) -> Result<(), String> {
    let path = dir.join(CONFIG_FILE);
    std::fs::write(&path, format!("{header}{text}"))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Prints the new directory's fingerprint and the `[[peers]]` entry the
/// other side pastes to pin it.
pub(crate) fn announce(
    what: &str,
    dir: &Path,
    agent: &AgentId,
    identity: &Identity,
    listen: &str,
    paste_into: &str,
) {
    let fp = identity.pin(agent.clone()).fingerprint;
    println!("Initialised {what} {agent} in {}", dir.display());
    println!("fingerprint: {fp}");
    println!();
    println!("Paste this into the config.toml of {paste_into}:");
    println!();
    println!("[[peers]]");
    println!("agent = {:?}", agent.as_str());
    println!("fingerprint = \"{fp}\"");
    println!("addr = {listen:?}");
}
