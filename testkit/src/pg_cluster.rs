//! Where the PostgreSQL tests find a database: `ABHYASA_PG_URL` if set
//! (CI starts one), else a throwaway cluster this process starts itself
//! when `initdb` is installed (as user `postgres` when running as root:
//! initdb refuses root), on 127.0.0.1, fsync on, removed when the test
//! process ends. Tests skip, saying why, only when neither is possible.
#![allow(dead_code, unreachable_pub, missing_docs, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The directory holding `initdb`, `pg_ctl` and `postgres`.
pub fn pg_bin() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("ABHYASA_PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    if let Ok(path) = std::env::var("PATH") {
        for d in std::env::split_paths(&path) {
            if d.join("initdb").exists() && d.join("pg_ctl").exists() {
                return Some(d);
            }
        }
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("bin"))
        .filter(|d| d.join("initdb").exists())
        .collect();
    found.sort();
    found.pop()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Runs a PostgreSQL tool as the user that owns the cluster.
fn as_owner(bin: &Path, tool: &str) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin.join(tool));
        c
    } else {
        Command::new(bin.join(tool))
    }
}

/// A throwaway cluster under a temporary directory.
pub struct Cluster {
    pub url: String,
    pub dir: PathBuf,
    bin: PathBuf,
    port: u16,
}

impl Cluster {
    /// Initializes and starts a new cluster; `None` (with the reason on
    /// stderr) when `initdb` is not installed or fails.
    pub fn start_new() -> Option<Cluster> {
        let Some(bin) = pg_bin() else {
            eprintln!("no initdb found (set ABHYASA_PG_URL or install postgresql)");
            return None;
        };
        let dir = std::env::temp_dir().join(format!(
            "abhyasa-pg-test-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        if is_root() {
            let ok = Command::new("chown")
                .args(["postgres:postgres"])
                .arg(&dir)
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if !ok {
                eprintln!("cannot hand {} to user postgres", dir.display());
                return None;
            }
        }
        let data = dir.join("data");
        let out = as_owner(&bin, "initdb")
            .args([
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-instructions",
            ])
            .arg("-D")
            .arg(&data)
            .stdout(Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => {
                eprintln!("initdb failed: {}", String::from_utf8_lossy(&o.stderr));
                return None;
            }
            Err(e) => {
                eprintln!("cannot run initdb: {e}");
                return None;
            }
        }
        let c = Cluster {
            url: String::new(),
            dir,
            bin,
            // Told to postgres on its command line before it binds.
            port: crate::loopback_port(),
        };
        let c = Cluster {
            url: format!("postgres://postgres@127.0.0.1:{}/postgres", c.port),
            ..c
        };
        if !c.start() {
            return None;
        }
        c.watch();
        Some(c)
    }

    /// Starts the server (again); true once it accepts connections.
    pub fn start(&self) -> bool {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=on -c max_connections=200",
            self.port,
            self.dir.display()
        );
        let st = as_owner(&self.bin, "pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-o", &opts, "-l"])
            .arg(self.dir.join("log"))
            .args(["-w", "-t", "60", "start"])
            .stdout(Stdio::null())
            .status();
        let ok = st.map(|s| s.success()).unwrap_or(false);
        if !ok {
            let log = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
            eprintln!("postgres did not start: {log}");
        }
        ok
    }

    /// Crashes the server: `pg_ctl stop -m immediate` (no checkpoint; the
    /// next start replays the WAL).
    pub fn crash(&self) {
        let _ = as_owner(&self.bin, "pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }

    /// A detached watcher stops the server and removes its directory when
    /// this test process exits (tests never run destructors of statics).
    fn watch(&self) {
        let pg_ctl = self.bin.join("pg_ctl");
        let stop = if is_root() {
            format!(
                "runuser -u postgres -- {} -D {}/data -m immediate stop",
                pg_ctl.display(),
                self.dir.display()
            )
        } else {
            format!(
                "{} -D {}/data -m immediate stop",
                pg_ctl.display(),
                self.dir.display()
            )
        };
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; {stop} >/dev/null 2>&1; rm -rf {dir}",
            pid = std::process::id(),
            dir = self.dir.display()
        );
        let _ = Command::new("setsid")
            .args(["sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
    }
}

/// The database every test of this process shares (`None`: skip).
pub fn url() -> Option<&'static str> {
    static URL: OnceLock<Option<String>> = OnceLock::new();
    URL.get_or_init(|| {
        if let Ok(u) = std::env::var("ABHYASA_PG_URL") {
            if !u.is_empty() {
                return Some(u);
            }
        }
        let c = Cluster::start_new()?;
        let url = c.url.clone();
        // The watcher removes it at exit.
        std::mem::forget(c);
        Some(url)
    })
    .as_deref()
}

/// The shared database, or prints why the calling test is skipped.
#[macro_export]
macro_rules! pg_or_skip {
    () => {
        match $crate::pg_cluster::url() {
            Some(u) => u,
            None => {
                eprintln!("SKIPPED: no PostgreSQL (ABHYASA_PG_URL unset and no initdb)");
                return;
            }
        }
    };
}

/// A partition name no other test (or test process) uses.
pub fn partition(name: &str) -> abhyasa_core::AgentId {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    abhyasa_core::AgentId::new(format!("{name}-{}-{nanos}-{n}", std::process::id())).unwrap()
}

/// Waits until `f` holds or `limit` passes.
pub fn wait_for(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

/// Every row of `partition` written under owner `epoch`: (table, key,
/// value). What fencing tests compare before and after a takeover.
pub fn rows_with_epoch(
    url: &str,
    partition: &str,
    epoch: i64,
) -> std::collections::BTreeSet<(String, Vec<u8>, Vec<u8>)> {
    postgres::Client::connect(url, postgres::NoTls)
        .unwrap()
        .query(
            "SELECT tbl, key, value FROM abhyasa_rows WHERE partition = $1 AND epoch = $2",
            &[&partition, &epoch],
        )
        .unwrap()
        .into_iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}
