//! The node directory and its `config.toml`.
//!
//! A node directory holds `config.toml`, `identity/{cert.pem,key.pem}`, the
//! store and (while the node runs) `control.sock`. Every key but `agent` has
//! a default; unknown keys are rejected, naming the key.
//!
//! ```toml
//! agent = "alice"                 # this node's agent id (required)
//! listen = "0.0.0.0:7400"         # QUIC listen address (UDP)
//! store = "log"                   # "log" (default), "fjall", "redb", "sled" or "postgres"
//! store_path = "store.log"        # relative to the node directory (default store.<store>)
//! postgres_url = "postgres://…"  # store = "postgres": the database (else env ABHYASA_PG_URL)
//! postgres_lease_ms = 10000       # store = "postgres": ownership lease (a standby takes over after it)
//! postgres_standby = false        # store = "postgres": wait for the owner's lease instead of failing
//! postgres_holder = "host-a"      # store = "postgres": this node's owner name (default: host:pid:start)
//! retention_seconds = 604800      # terminal records kept this long (7 days)
//! compaction_interval_seconds = 3600 # how often they are compacted (0: never)
//! max_created_at_skew_seconds = 60   # receiver: created_at at most this far ahead
//! max_deadline_seconds = 2592000  # receiver: longest deadline accepted (30 days)
//! ledger_quota = 1000000          # receiver: ledger entries held per custodian
//! max_pending = 1000000           # admission bound on pending obligations
//! skew_margin_ms = 2000           # receiver clock-skew margin
//! backoff_base_ms = 1000          # retry backoff: first interval
//! backoff_cap_ms = 64000          # retry backoff: largest interval
//! backoff_jitter = 0.1            # retry backoff: jitter fraction, [0, 1]
//! seed = 0                        # seed of the jitter stream
//! decline_policy = "apply_safe"   # default: "apply_safe" or "surface"
//! control_socket = "control.sock" # relative to the node directory
//! card_endpoint = "https://…"    # advertised in `abhyasa card` (default: the [http] URLs, else quic://<listen>)
//! card_deadline_seconds = 300     # advertised custody deadline per kind (a leased grant longer than it warns)
//!
//! [kind_decline_policy]           # per-kind override of decline_policy
//! "anumati.consent" = "surface"
//!
//! [http]                          # optional: serve the A2A HTTP binding too
//! listen = "127.0.0.1:7443"       # TCP address (HTTPS, mutual TLS with the node identity)
//! public_url = "https://…"        # base URL the card advertises (default https://<listen>)
//! plain_http_loopback = false     # plain HTTP instead of HTTPS: loopback listen only
//! bearer_only = ["carol"]         # peers that may present only their token over HTTPS (default
//!                                 # none: a pinned client certificate is mandatory)
//! handshake_timeout_ms = 5000     # a connection not authenticated by then is closed
//! header_read_timeout_ms = 5000   # request headers must arrive within this
//!
//! [limits]                        # optional: bounds before authentication (defaults shown)
//! descriptor_reserve = 64         # descriptors kept back from the listeners (control socket,
//!                                 # store, dials); listeners hold at most RLIMIT_NOFILE minus it
//! max_handshakes = 64             # unauthenticated connections per listener (QUIC, WebSocket, HTTP)
//! max_handshakes_per_source = 8   # of those, from one address (an IPv4 address or an IPv6 /64)
//! allow_plaintext_ws = false      # allow ws:// peer URLs whose host is not loopback
//!
//! [mcp]                           # optional: what `abhyasa mcp --custodian C` lets C govern
//! kinds = ["anumati.consent"]     # optional: the kinds C may issue to the guard (default: every kind)
//! keys = ["anumati.consent/mcp-server/scope:"] # optional: key prefixes C may govern (default: every key)
//!
//! [[peers]]
//! agent = "bob"
//! fingerprint = "3f…"             # SHA-256 of bob's certificate (hex)
//! addr = "192.0.2.7:7400"         # optional: omit for accept-only peers
//!
//! [[peers]]                       # a peer reached over the HTTP binding
//! agent = "carol"
//! fingerprint = "9a…"             # pinned for mTLS, both directions
//! transport = "http"              # "quic" (default), "ws" or "http"; "http" needs [http]
//! url = "https://192.0.2.8:7443"  # carol's base URL (…/abhyasa/obligations, …/custody_ack)
//! token = "…"                     # optional: a bearer credential carol may present instead of mTLS
//! via = "relay-1"                 # optional: also reach carol through this relay peer
//! kinds = ["anumati.consent"]     # optional: the kinds carol may issue here (default: every kind)
//! keys = ["anumati.consent/alice/scope:"] # optional: key prefixes carol may govern (default: every key)
//!
//! [[peers]]                       # a peer (here a relay) reached over WebSocket
//! agent = "relay-2"
//! fingerprint = "5c…"
//! transport = "ws"                # dial ws://… (this node only dials WebSocket; it listens on QUIC)
//! url = "ws://192.0.2.9:7501/"
//! relay = true                    # governs nothing here (default: true when a `via` names it)
//! ```
//!
//! Each `via` names a `[[peers]]` entry reached directly (QUIC or
//! WebSocket); different peers may name different relays.
//!
//! Authority (C-AZ-1): an obligation is applied only from the peer that
//! issued it, on state held under that peer's own identity; a peer never
//! governs another's keys. `kinds` and `keys` narrow what a peer may issue
//! (`keys` are prefixes of the issuer-less key `kind/target/name`); a
//! relay governs nothing. Anything else is declined `unauthorized`.

mod custody;
mod file;
mod http;
mod peers;
mod resolved;
mod store;

use std::net::SocketAddr;
use std::path::Path;

use abhyasa_core::AgentId;

use file::bad;
pub(crate) use file::{NodeConfig, PeerConfig, CONFIG_FILE};
pub(crate) use resolved::{HttpServe, PgSettings, Resolved};

impl NodeConfig {
    /// Reads and checks `DIR/config.toml`.
    pub(crate) fn load(dir: &Path) -> Result<Resolved, String> {
        let path = dir.join(CONFIG_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => format!(
                "{} is not a node directory (no {CONFIG_FILE}; create one with `abhyasa init`)",
                dir.display()
            ),
            _ => format!("cannot read {}: {e}", path.display()),
        })?;
        Self::parse(&text, &path)?.resolve(dir)
    }

    /// Parses config text; the error is one line naming the file, line and key.
    pub(crate) fn parse(text: &str, path: &Path) -> Result<NodeConfig, String> {
        toml::from_str(text).map_err(|e| {
            let msg = e.message().replace('\n', " ");
            let Some(span) = e.span() else {
                return format!("{}: {msg}", path.display());
            };
            let line_no = text[..span.start.min(text.len())].matches('\n').count() + 1;
            let line = text.lines().nth(line_no - 1).unwrap_or("");
            match line.split_once('=') {
                Some((k, _)) if !msg.contains("unknown field") => format!(
                    "{}:{line_no}: key `{}`: {msg}",
                    path.display(),
                    k.trim().trim_matches('"')
                ),
                _ => format!("{}:{line_no}: {msg}", path.display()),
            }
        })
    }

    /// Checks every value; the error names the key.
    pub(crate) fn resolve(self, dir: &Path) -> Result<Resolved, String> {
        let agent = AgentId::new(&self.agent).map_err(|e| bad("agent", e.to_string()))?;
        let listen: SocketAddr = self
            .listen
            .parse()
            .map_err(|e| bad("listen", format!("{:?}: {e}", self.listen)))?;
        let (store, store_path, postgres) = store::resolve(&self, dir)?;
        let socket = dir.join(
            self.control_socket
                .clone()
                .unwrap_or_else(|| "control.sock".into()),
        );
        let backoff = custody::backoff(&self)?;
        custody::bounds(&self)?;
        let (decline_policy, kind_policies) = custody::policies(&self)?;
        let peers = peers::resolve(&self)?;
        let mcp = peers::mcp(&self)?;
        let http = self
            .http
            .as_ref()
            .map(|h| http::resolve(h, &peers))
            .transpose()?;
        peers::check_relays(&peers)?;
        Ok(Resolved {
            agent,
            listen,
            store,
            store_path,
            postgres,
            socket,
            backoff,
            decline_policy,
            kind_policies,
            peers,
            http,
            limits: self.limits.clone().unwrap_or_default(),
            mcp,
            raw: self,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use abhyasa_store::StoreKind;

    use super::*;

    #[test]
    fn defaults_and_unknown_keys() {
        let p = Path::new("config.toml");
        let c = NodeConfig::parse("agent = \"a\"\n", p).expect("parses");
        assert_eq!(c.store, None);
        let dir = tempfile::tempdir().expect("tempdir");
        let r = c.clone().resolve(dir.path()).expect("resolves");
        assert_eq!(r.store, StoreKind::Log, "the default store");
        assert_eq!(r.store_path, dir.path().join("store.log"));
        // A node from when redb was the default, its config naming no store,
        // keeps its store.redb rather than start on a new, empty store.
        std::fs::write(dir.path().join("store.redb"), b"").expect("write");
        let r = c.clone().resolve(dir.path()).expect("resolves");
        assert_eq!(r.store, StoreKind::Redb, "a legacy node keeps redb");
        assert_eq!(r.store_path, dir.path().join("store.redb"));
        // One from when fjall was (it may hold both): the newer, fjall.
        std::fs::create_dir(dir.path().join("store.fjall")).expect("mkdir");
        let r = c.clone().resolve(dir.path()).expect("resolves");
        assert_eq!(r.store, StoreKind::Fjall, "a legacy node keeps fjall");
        assert_eq!(r.store_path, dir.path().join("store.fjall"));
        // Once a store of the default is there, it is the node's.
        std::fs::create_dir(dir.path().join("store.log")).expect("mkdir");
        let r = c.clone().resolve(dir.path()).expect("resolves");
        assert_eq!(r.store, StoreKind::Log);
        // Named, the store is what the config says; a new node names it.
        let named = NodeConfig::parse("agent = \"a\"\nstore = \"redb\"\n", p).expect("parses");
        assert_eq!(
            named.resolve(dir.path()).expect("resolves").store,
            StoreKind::Redb
        );
        let new = NodeConfig::new("a", "127.0.0.1:7400");
        assert_eq!(new.store.as_deref(), Some("log"), "init writes the store");
        assert_eq!(c.max_pending, 1_000_000);
        // C-ND-5 defaults: documented in the module docs.
        assert_eq!(c.retention_seconds, 604_800);
        assert_eq!(c.compaction_interval_seconds, 3600);
        assert_eq!(c.max_created_at_skew_seconds, 60);
        assert_eq!(c.max_deadline_seconds, 2_592_000);
        assert_eq!(c.ledger_quota, 1_000_000);
        let e = NodeConfig::parse("agent = \"a\"\nbogus_key = 1\n", p).expect_err("rejected");
        assert!(e.contains("bogus_key") && !e.contains('\n'), "{e}");
        let e = NodeConfig::parse("agent = \"a\"\nmax_pending = \"x\"\n", p).expect_err("bad");
        assert!(e.contains("max_pending"), "{e}");
        let dir = Path::new("/tmp");
        let e = NodeConfig::parse("agent = \"a\"\nstore = \"mysql\"\n", p)
            .expect("parses")
            .resolve(dir)
            .expect_err("bad store");
        assert!(e.contains("`store`"), "{e}");
    }

    // C-AZ-1: `[[peers]]` authority: a peer another names in `via` is a
    // relay unless it says `relay = false`; `kinds` and `keys` narrow what
    // a peer may issue; a bad kind or an empty prefix is refused naming
    // the field.
    #[test]
    fn peer_authority_keys() {
        let p = Path::new("config.toml");
        let dir = Path::new("/tmp");
        let fp = |n: u8| format!("{n:02x}").repeat(32);
        let load = |extra: &str| {
            NodeConfig::parse(&format!("agent = \"a\"\n{extra}"), p).and_then(|c| c.resolve(dir))
        };
        let cfg = format!(
            "[[peers]]\nagent = \"relay-1\"\nfingerprint = \"{}\"\naddr = \"127.0.0.1:7500\"\n\
             [[peers]]\nagent = \"edge\"\nfingerprint = \"{}\"\nvia = \"relay-1\"\n\
             kinds = [\"anumati.consent\"]\nkeys = [\"anumati.consent/a/scope:mail.\"]\n\
             [[peers]]\nagent = \"hub\"\nfingerprint = \"{}\"\naddr = \"127.0.0.1:7501\"\nrelay = true\n",
            fp(1),
            fp(2),
            fp(3),
        );
        let r = load(&cfg).expect("resolves");
        let a: Vec<_> = r.peers.iter().map(|p| p.authority.clone()).collect();
        assert!(a[0].relay, "named in via: a relay by default");
        assert!(!a[1].relay);
        assert_eq!(
            a[1].kinds.as_deref().map(|k| k[0].as_str()),
            Some("anumati.consent")
        );
        assert_eq!(
            a[1].keys.as_deref(),
            Some(&["anumati.consent/a/scope:mail.".to_string()][..])
        );
        assert!(a[2].relay && a[2].kinds.is_none() && a[2].keys.is_none());
        let mut o = abhyasa::NodeOptions::new(AgentId::new("a").expect("id"));
        r.apply_limits(&mut o);
        assert!(
            o.receiver
                .authority
                .of(&AgentId::new("relay-1").expect("id"))
                .relay
        );
        let not_relay = cfg.replace(
            "addr = \"127.0.0.1:7500\"\n",
            "addr = \"127.0.0.1:7500\"\nrelay = false\n",
        );
        assert!(!load(&not_relay).expect("resolves").peers[0].authority.relay);
        for (bad, field) in [
            (
                cfg.replace("[\"anumati.consent\"]", "[\" x\"]"),
                "peers[1].kinds",
            ),
            (
                cfg.replace("[\"anumati.consent/a/scope:mail.\"]", "[\"\"]"),
                "peers[1].keys",
            ),
        ] {
            let e = load(&bad).expect_err("refused");
            assert!(e.contains(field), "{field}: {e}");
        }
    }

    // Several relays per node: each `[[peers]]` entry names its own `via`,
    // a relay may be reached over WebSocket, and every `via` must name a
    // peer reached directly over QUIC or WebSocket.
    #[test]
    fn relays_per_peer_and_websocket_peers() {
        let p = Path::new("config.toml");
        let dir = Path::new("/tmp");
        let fp = |n: u8| format!("{n:02x}").repeat(32);
        let load = |extra: &str| {
            NodeConfig::parse(&format!("agent = \"a\"\n{extra}"), p).and_then(|c| c.resolve(dir))
        };
        let two = format!(
            "[[peers]]\nagent = \"relay-1\"\nfingerprint = \"{}\"\naddr = \"127.0.0.1:7500\"\n\
             [[peers]]\nagent = \"relay-2\"\nfingerprint = \"{}\"\ntransport = \"ws\"\nurl = \"ws://127.0.0.1:7501/\"\n\
             [[peers]]\nagent = \"edge-a\"\nfingerprint = \"{}\"\nvia = \"relay-1\"\n\
             [[peers]]\nagent = \"edge-b\"\nfingerprint = \"{}\"\nvia = \"relay-2\"\n",
            fp(1),
            fp(2),
            fp(3),
            fp(4)
        );
        let c = load(&two).expect("two relays, one over WebSocket");
        let via: Vec<Option<&str>> = c
            .peers
            .iter()
            .map(|p| p.via.as_ref().map(AgentId::as_str))
            .collect();
        assert_eq!(via, [None, None, Some("relay-1"), Some("relay-2")]);
        assert_eq!(c.peers[1].ws_url.as_deref(), Some("ws://127.0.0.1:7501/"));
        assert!(c.peers[1].addr.is_none() && c.peers[1].http_url.is_none());
        // Each mistake names its key.
        let relay_http = format!(
            "[http]\nlisten = \"127.0.0.1:7443\"\n\
             [[peers]]\nagent = \"relay-1\"\nfingerprint = \"{}\"\ntransport = \"http\"\nurl = \"https://x\"\n\
             [[peers]]\nagent = \"edge\"\nfingerprint = \"{}\"\nvia = \"relay-1\"\n",
            fp(1),
            fp(3)
        );
        let chained = format!(
            "[[peers]]\nagent = \"relay-1\"\nfingerprint = \"{}\"\nvia = \"relay-2\"\n\
             [[peers]]\nagent = \"relay-2\"\nfingerprint = \"{}\"\naddr = \"127.0.0.1:1\"\n\
             [[peers]]\nagent = \"edge\"\nfingerprint = \"{}\"\nvia = \"relay-1\"\n",
            fp(1),
            fp(2),
            fp(3)
        );
        for (extra, key) in [
            (relay_http, "peers[1].via"),
            (chained, "peers[2].via"),
            (format!("[[peers]]\nagent = \"b\"\nfingerprint = \"{}\"\ntransport = \"ws\"\n", fp(1)), "peers[0].url"),
            (format!("[[peers]]\nagent = \"b\"\nfingerprint = \"{}\"\ntransport = \"ws\"\nurl = \"http://x\"\n", fp(1)), "peers[0].url"),
            (format!("[[peers]]\nagent = \"b\"\nfingerprint = \"{}\"\ntransport = \"ws\"\nurl = \"ws://x/\"\naddr = \"127.0.0.1:1\"\n", fp(1)), "peers[0].addr"),
        ] {
            let e = load(&extra).expect_err(key);
            assert!(e.contains(key), "{key}: {e}");
        }
    }

    #[test]
    fn http_section_and_http_peers() {
        let p = Path::new("config.toml");
        let dir = Path::new("/tmp");
        let fp = "0".repeat(64);
        let load = |extra: &str| {
            NodeConfig::parse(
                &format!("agent = \"a\"\nlisten = \"127.0.0.1:7400\"\n{extra}"),
                p,
            )
            .and_then(|c| c.resolve(dir))
        };
        let c = load("").expect("no http");
        assert!(c.http.is_none());
        assert_eq!(c.card_endpoints().0, "quic://127.0.0.1:7400");
        let c = load(&format!(
            "[http]\nlisten = \"127.0.0.1:7443\"\n[[peers]]\nagent = \"b\"\nfingerprint = \"{fp}\"\ntransport = \"http\"\nurl = \"https://127.0.0.1:9/\"\n"
        ))
        .expect("http peer");
        assert_eq!(
            c.card_endpoints(),
            (
                "https://127.0.0.1:7443/abhyasa/custody_ack".to_string(),
                "https://127.0.0.1:7443/abhyasa/obligations".to_string()
            )
        );
        assert_eq!(c.peers[0].http_url.as_deref(), Some("https://127.0.0.1:9"));
        // Each mistake names its key.
        for (extra, key) in [
            (format!("[[peers]]\nagent = \"b\"\nfingerprint = \"{fp}\"\ntransport = \"http\"\nurl = \"https://x\"\n"), "peers[0].transport"),
            (format!("[http]\nlisten = \"127.0.0.1:1\"\n[[peers]]\nagent = \"b\"\nfingerprint = \"{fp}\"\ntransport = \"http\"\n"), "peers[0].url"),
            (format!("[[peers]]\nagent = \"b\"\nfingerprint = \"{fp}\"\ntransport = \"smtp\"\n"), "peers[0].transport"),
            (format!("[[peers]]\nagent = \"b\"\nfingerprint = \"{fp}\"\nurl = \"https://x\"\n"), "peers[0].url"),
            ("[http]\nlisten = \"0.0.0.0:1\"\nplain_http_loopback = true\n".to_string(), "http.plain_http_loopback"),
            ("[http]\nlisten = \"127.0.0.1:1\"\npublic_url = \"http://x\"\n".to_string(), "http.public_url"),
            ("[http]\nlisten = \"nowhere\"\n".to_string(), "http.listen"),
            (format!("[http]\nlisten = \"127.0.0.1:1\"\nbearer_only = [\"b\"]\n[[peers]]\nagent = \"b\"\nfingerprint = \"{fp}\"\ntransport = \"http\"\nurl = \"https://x\"\n"), "http.bearer_only[0]"),
            ("[http]\nlisten = \"127.0.0.1:1\"\nhandshake_timeout_ms = 0\n".to_string(), "http.handshake_timeout_ms"),
            ("[mcp]\nkinds = [\"\"]\n".to_string(), "mcp.kinds"),
            ("[mcp]\nkeys = [\"\"]\n".to_string(), "mcp.keys"),
        ] {
            let e = load(&extra).expect_err(&extra);
            assert!(e.contains(&format!("`{key}`")), "{extra}: {e}");
        }
    }

    // C-PA-1: the [limits] section and [http] bearer_only, with their
    // defaults when absent.
    #[test]
    fn limits_section_and_bearer_only() {
        let p = Path::new("config.toml");
        let dir = Path::new("/tmp");
        let fp = "0".repeat(64);
        let load = |extra: &str| {
            NodeConfig::parse(
                &format!("agent = \"a\"\nlisten = \"127.0.0.1:7400\"\n{extra}"),
                p,
            )
            .and_then(|c| c.resolve(dir))
        };
        let c = load("").expect("defaults");
        assert_eq!(c.limits.descriptor_reserve, 64);
        assert_eq!(c.limits.max_handshakes, 64);
        assert_eq!(c.limits.max_handshakes_per_source, 8);
        assert!(!c.limits.allow_plaintext_ws);
        let c = load(&format!(
            "[http]\nlisten = \"127.0.0.1:7443\"\nbearer_only = [\"b\"]\nhandshake_timeout_ms = 700\n\n[limits]\ndescriptor_reserve = 32\nmax_handshakes_per_source = 2\nallow_plaintext_ws = true\n\n[[peers]]\nagent = \"b\"\nfingerprint = \"{fp}\"\ntransport = \"http\"\nurl = \"https://127.0.0.1:9/\"\ntoken = \"t\"\n"
        ))
        .expect("limits");
        assert_eq!(c.limits.descriptor_reserve, 32);
        assert_eq!(c.limits.max_handshakes_per_source, 2);
        assert!(c.limits.allow_plaintext_ws);
        let h = c.http.expect("http");
        assert_eq!(h.bearer_only, vec![AgentId::new("b").expect("id")]);
        assert_eq!(h.handshake_timeout, Duration::from_millis(700));
        assert_eq!(h.header_read_timeout, Duration::from_millis(5000));
    }

    // store = "postgres": the URL and lease are read and checked,
    // the standby flag selects waiting, and the URL never shows in Debug.
    #[test]
    fn postgres_store_keys() {
        let p = Path::new("config.toml");
        let dir = Path::new("/nonexistent");
        let text = "agent = \"a\"\nstore = \"postgres\"\n\
                    postgres_url = \"postgres://u:secret@127.0.0.1:5432/db\"\n\
                    postgres_lease_ms = 2000\npostgres_standby = true\n\
                    postgres_holder = \"host-b\"\n";
        let r = NodeConfig::parse(text, p).unwrap().resolve(dir).unwrap();
        let pg = r.postgres.as_ref().expect("postgres settings");
        assert_eq!(pg.url, "postgres://u:secret@127.0.0.1:5432/db");
        assert_eq!(pg.options.lease, Duration::from_millis(2000));
        assert_eq!(pg.options.holder, "host-b");
        assert!(matches!(
            pg.options.takeover,
            abhyasa_pg::Takeover::Wait { .. }
        ));
        assert!(!format!("{r:?}").contains("secret"), "URL printed");

        let short = text.replace("2000", "10");
        let e = NodeConfig::parse(&short, p)
            .unwrap()
            .resolve(dir)
            .expect_err("short lease");
        assert!(e.contains("`postgres_lease_ms`"), "{e}");

        let embedded = NodeConfig::parse("agent = \"a\"\n", p)
            .unwrap()
            .resolve(dir)
            .unwrap();
        assert!(embedded.postgres.is_none());
        if std::env::var(abhyasa_pg::URL_ENV).is_err() {
            let e = NodeConfig::parse("agent = \"a\"\nstore = \"postgres\"\n", p)
                .unwrap()
                .resolve(dir)
                .expect_err("no url");
            assert!(
                e.contains("`postgres_url`") && e.contains("ABHYASA_PG_URL"),
                "{e}"
            );
        }
    }
}
