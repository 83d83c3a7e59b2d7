//! An Abhyasa node that serves A2A peers over the HTTP binding on
//! 127.0.0.1, for the official-client tests and the README.
//!
//! ```text
//! cargo run -p abhyasa-a2a --example a2a_receiver -- \
//!     [--port 0] [--agent bob] [--peer alice] [--token alice-secret] \
//!     [--ack-endpoint http://127.0.0.1:PORT/abhyasa/custody_ack] [--sync-wait-ms 2000]
//! ```
//!
//! It prints `listening <base url>` once serving, then one line per
//! receiver event (`applied <custodian> <id>`, `declined ...`,
//! `deferred ...`) so a test can count applications.
//!
//! Demo decisions (the applier a real agent plugs in decides otherwise):
//! an obligation whose payload has `"demo": "decline"` is declined
//! (`policy`), `"demo": "defer"` is deferred and completed 300 ms later
//! with the standard effect (its final ack is then POSTed to the
//! custodian's `--ack-endpoint`); everything else goes to the standard
//! applier. The store is redb in a temporary directory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use abhyasa::{Node, NodeEvent, NodeOptions};
use abhyasa_a2a::card::kind_profile;
use abhyasa_a2a::{HttpConfig, HttpPeer};
use abhyasa_core::custody::{Applier, ApplyContext, ApplyDecision, ReceiverEvent, StandardApplier};
use abhyasa_core::{AgentId, DeclineReason, Kind, Obligation, ObligationId, RetryBackoff};
use abhyasa_store::{StoreKind, StoreOptions};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Stash = Arc<Mutex<HashMap<(AgentId, ObligationId), ApplyDecision>>>;

/// The standard applier plus the demo's decline/defer switches.
struct DemoApplier {
    standard: StandardApplier,
    deferred: Stash,
}

impl Applier for DemoApplier {
    fn decide(&mut self, ctx: &ApplyContext<'_>, ob: &Obligation) -> ApplyDecision {
        match ob.payload().get("demo").and_then(|v| v.as_str()) {
            Some("decline") => ApplyDecision::Decline {
                reason: DeclineReason::Policy,
                detail: Some("demo: declined by policy".into()),
            },
            Some("defer") if !ctx.previously_deferred => {
                // Decide now (the context is only valid now), apply later.
                let d = self.standard.decide(ctx, ob);
                self.deferred
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert((ctx.custodian.clone(), ob.id().clone()), d);
                ApplyDecision::Defer {
                    detail: Some("demo: deferred, final ack follows".into()),
                }
            }
            _ => self.standard.decide(ctx, ob),
        }
    }
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let port: u16 = arg(&args, "--port").unwrap_or_else(|| "0".into()).parse()?;
    let agent = AgentId::new(arg(&args, "--agent").unwrap_or_else(|| "bob".into()))?;
    let peer = AgentId::new(arg(&args, "--peer").unwrap_or_else(|| "alice".into()))?;
    let token = arg(&args, "--token").unwrap_or_else(|| "alice-secret".into());
    let sync_wait: u64 = arg(&args, "--sync-wait-ms")
        .unwrap_or_else(|| "2000".into())
        .parse()?;

    let backoff = RetryBackoff::DEFAULT;
    let profiles = ["anumati.consent", "phala.belief_update", "oauth.token"]
        .iter()
        .map(|k| kind_profile(Kind::new(k)?, "", 3600, &backoff).map_err(BoxError::from))
        .collect::<Result<Vec<_>, _>>()?;
    let mut cfg = HttpConfig::loopback(
        agent.to_string(),
        vec![HttpPeer {
            agent: peer,
            token: Some(token),
            fingerprint: None,
            custody_ack_endpoint: arg(&args, "--ack-endpoint"),
            obligation_endpoint: None,
            outbound_token: None,
        }],
        profiles,
    );
    cfg.listen = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    cfg.sync_wait = Duration::from_millis(sync_wait);
    let (transport, server) = abhyasa_a2a::start(agent.clone(), cfg).await?;

    let dir = tempfile::tempdir()?;
    let store = StoreKind::Redb.open(dir.path().join("bob.redb"), &StoreOptions::default())?;
    let stash: Stash = Arc::default();
    let mut options = NodeOptions::new(agent);
    options.applier = Box::new(DemoApplier {
        standard: StandardApplier::default(),
        deferred: stash.clone(),
    });
    let node = Node::open(options, store, transport).await?;
    let mut events = node.subscribe();
    println!("listening {}", server.base_url);

    let n = node.clone();
    tokio::spawn(async move {
        while let Ok(e) = events.recv().await {
            let NodeEvent::Receiver(e) = e else { continue };
            match e {
                ReceiverEvent::Applied {
                    custodian,
                    obligation_id,
                    ..
                } => println!("applied {custodian} {obligation_id}"),
                ReceiverEvent::Declined {
                    custodian,
                    obligation_id,
                    reason,
                } => println!("declined {custodian} {obligation_id} {reason}"),
                ReceiverEvent::Deferred {
                    custodian,
                    obligation_id,
                } => {
                    println!("deferred {custodian} {obligation_id}");
                    let key = (custodian, obligation_id);
                    let decision = stash.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
                    if let Some(d) = decision {
                        let n = n.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_millis(300)).await;
                            if let Err(e) = n.complete_deferred(key.0, key.1, d).await {
                                eprintln!("complete_deferred: {e}");
                            }
                        });
                    }
                }
                _ => {}
            }
        }
    });

    tokio::signal::ctrl_c().await?;
    node.shutdown().await?;
    Ok(())
}
