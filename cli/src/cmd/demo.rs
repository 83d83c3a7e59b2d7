//! `abhyasa demo`: two real nodes on loopback QUIC, durable on the default
//! embedded store, a mix of obligations, a partition mid-run, and every
//! obligation shown reaching applied, declined or escalated.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use abhyasa::{Node, NodeEvent, NodeOptions, Outcome};
use abhyasa_core::custody::{
    Applier, ApplyContext, ApplyDecision, CustodianEvent, CustodyProfile, DeclineDisposition,
    StandardApplier, TerminalState,
};
use abhyasa_core::{AgentId, DeclineReason, Obligation, RetryBackoff, SafeEffect};
use abhyasa_identity::generate_identity;
use abhyasa_quic::QuicConfig;
use abhyasa_store::{StoreKind, StoreOptions};
use serde_json::{json, Value};
use tokio::net::UdpSocket;

/// Options of `abhyasa demo`.
#[derive(Debug, clap::Args)]
pub(crate) struct DemoArgs {
    /// Print one JSON summary instead of the live view.
    #[arg(long)]
    json: bool,
    /// Store backend for both nodes: log, fjall, redb or sled (default:
    /// the node's default store, log).
    #[arg(long)]
    store: Option<String>,
    /// Keep the temporary directory (stores, identities) and print its path.
    #[arg(long)]
    keep: bool,
}

type DemoError = Box<dyn std::error::Error + Send + Sync>;

/// Runs the demo on a fresh tokio runtime.
pub(crate) fn run(args: DemoArgs) -> Result<(), DemoError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(demo(args))
}

/// A loopback UDP relay between the custodian and the receiver that drops
/// every datagram while partitioned: a real partition under QUIC.
async fn relay(to: SocketAddr, partitioned: Arc<AtomicBool>) -> Result<SocketAddr, DemoError> {
    let front = Arc::new(UdpSocket::bind("127.0.0.1:0").await?);
    let back = Arc::new(UdpSocket::bind("127.0.0.1:0").await?);
    let addr = front.local_addr()?;
    let client = Arc::new(tokio::sync::Mutex::new(None::<SocketAddr>));
    let (f, b, c, p) = (
        front.clone(),
        back.clone(),
        client.clone(),
        partitioned.clone(),
    );
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_536];
        while let Ok((n, from)) = f.recv_from(&mut buf).await {
            *c.lock().await = Some(from);
            if !p.load(Ordering::Relaxed) {
                let _ = b.send_to(&buf[..n], to).await;
            }
        }
    });
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_536];
        while let Ok((n, _)) = back.recv_from(&mut buf).await {
            let dest = *client.lock().await;
            if let (Some(d), false) = (dest, partitioned.load(Ordering::Relaxed)) {
                let _ = front.send_to(&buf[..n], d).await;
            }
        }
    });
    Ok(addr)
}

/// The receiving agent's policy: the standard effects, but it refuses to
/// revoke a token under legal hold (an accountable decline).
struct DemoApplier(StandardApplier);

impl Applier for DemoApplier {
    fn decide(&mut self, ctx: &ApplyContext<'_>, ob: &Obligation) -> ApplyDecision {
        if ob.payload().get("token_id").and_then(Value::as_str) == Some("tok-legal-hold") {
            return ApplyDecision::Decline {
                reason: DeclineReason::Policy,
                detail: Some("token is under legal hold".into()),
            };
        }
        self.0.decide(ctx, ob)
    }
}

fn options(agent: &AgentId, applier: Box<dyn Applier + Send>) -> NodeOptions {
    let mut o = NodeOptions::new(agent.clone());
    o.custodian.default_profile = CustodyProfile {
        backoff: RetryBackoff {
            base: Duration::from_millis(200),
            cap: Duration::from_millis(1000),
            jitter: 0.1,
        },
        ..CustodyProfile::default()
    };
    o.receiver.skew_margin = Duration::from_millis(200);
    o.applier = applier;
    o
}

struct Planned {
    id: &'static str,
    kind: &'static str,
    what: &'static str,
    payload: Value,
    deadline: i64,
}

fn plan_before() -> Vec<Planned> {
    vec![
        Planned {
            id: "ob-01",
            kind: "anumati.consent",
            what: "revoke email.read",
            payload: json!({"decision": "revoke", "scope": "email.read"}),
            deadline: 20,
        },
        Planned {
            id: "ob-02",
            kind: "anumati.consent",
            what: "grant calendar.read",
            payload: json!({"decision": "grant", "scope": "calendar.read"}),
            deadline: 20,
        },
        Planned {
            id: "ob-03",
            kind: "phala.belief_update",
            what: "corrective -0.4",
            payload: json!({"weight_delta": -0.4, "weight_key": "routing.receiver.preference"}),
            deadline: 20,
        },
        Planned {
            id: "ob-04",
            kind: "phala.belief_update",
            what: "reinforcing +0.2",
            payload: json!({"weight_delta": 0.2, "weight_key": "routing.receiver.preference"}),
            deadline: 20,
        },
        Planned {
            id: "ob-05",
            kind: "oauth.token",
            what: "revoke tok-7731",
            payload: json!({"action": "revoke", "token_id": "tok-7731"}),
            deadline: 20,
        },
        Planned {
            id: "ob-06",
            kind: "oauth.token",
            what: "revoke tok-legal-hold",
            payload: json!({"action": "revoke", "token_id": "tok-legal-hold"}),
            deadline: 20,
        },
        Planned {
            id: "ob-07",
            kind: "oauth.token",
            what: "issue tok-8000",
            payload: json!({"action": "issue", "token_id": "tok-8000"}),
            deadline: 20,
        },
    ]
}

fn plan_during() -> Vec<Planned> {
    vec![
        Planned {
            id: "ob-08",
            kind: "anumati.consent",
            what: "revoke files.write (deadline 3 s)",
            payload: json!({"decision": "revoke", "scope": "files.write"}),
            deadline: 3,
        },
        Planned {
            id: "ob-09",
            kind: "phala.belief_update",
            what: "corrective -0.3 (deadline 3 s)",
            payload: json!({"weight_delta": -0.3, "weight_key": "routing.receiver.summaries"}),
            deadline: 3,
        },
        Planned {
            id: "ob-10",
            kind: "oauth.token",
            what: "revoke tok-9001 (deadline 25 s)",
            payload: json!({"action": "revoke", "token_id": "tok-9001"}),
            deadline: 25,
        },
        Planned {
            id: "ob-11",
            kind: "anumati.consent",
            what: "restrict contacts (deadline 25 s)",
            payload: json!({"decision": "restrict", "scope": "contacts"}),
            deadline: 25,
        },
    ]
}

async fn demo(args: DemoArgs) -> Result<(), DemoError> {
    let kind: StoreKind = match &args.store {
        Some(s) => s.parse()?,
        None => StoreKind::default(),
    };
    let dir = tempfile::tempdir()?;
    let (c_id, r_id) = (AgentId::new("custodian")?, AgentId::new("receiver")?);
    let (c_ident, r_ident) = (generate_identity(&c_id)?, generate_identity(&r_id)?);
    let open = |name: &str| {
        let path = dir.path().join(format!("{name}.{}", kind.as_str()));
        kind.open(path, &StoreOptions::default())
    };

    // Receiver first (its port is the relay's destination).
    let r_cfg = QuicConfig::new(r_id.clone(), r_ident.clone(), "127.0.0.1:0".parse()?)
        .with_peer(c_ident.pin(c_id.clone()), None);
    let r_transport = abhyasa_quic::start(r_cfg).await?;
    let r_addr = r_transport
        .handle
        .local_addr()
        .ok_or("receiver has no address")?;
    let partitioned = Arc::new(AtomicBool::new(false));
    let via = relay(r_addr, partitioned.clone()).await?;
    let receiver = Node::builder(r_id.clone())
        .options(options(
            &r_id,
            Box::new(DemoApplier(StandardApplier::default())),
        ))
        .boxed_store(open("receiver")?)
        .transport(r_transport)
        .open()
        .await?;
    let c_cfg = QuicConfig::new(c_id.clone(), c_ident.clone(), "127.0.0.1:0".parse()?)
        .with_peer(r_ident.pin(r_id.clone()), Some(via));
    let custodian = Node::builder(c_id.clone())
        .options(options(&c_id, Box::new(StandardApplier::default())))
        .boxed_store(open("custodian")?)
        .transport(abhyasa_quic::start(c_cfg).await?)
        .open()
        .await?;

    let start = Instant::now();
    let live = !args.json;
    if live {
        println!(
            "Abhyasa demo: custodian -> receiver over loopback QUIC (mutual TLS, pinned keys),"
        );
        println!("both durable on {} in {}", kind, dir.path().display());
        println!();
    }
    // Wait for the QUIC link (mutual TLS with pinned keys).
    let up = tokio::time::timeout(Duration::from_secs(10), async {
        while !custodian.is_connected(&r_id) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    if up.is_err() {
        return Err("the QUIC link did not come up within 10 s".into());
    }
    let printer = tokio::spawn(print_events(custodian.subscribe(), start, live));
    let stamp = move || format!("t+{:>5.2}s", start.elapsed().as_secs_f64());

    let mut offered = Vec::new();
    let mut waiters = Vec::new();
    for p in plan_before() {
        let o = offer(&custodian, &p, live, &stamp).await?;
        waiters.push(wait(&custodian, o.0.clone()));
        offered.push(o);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    partitioned.store(true, Ordering::Relaxed);
    if live {
        println!(
            "{}  ── partition: every datagram between the two nodes is dropped ──",
            stamp()
        );
    }
    for p in plan_during() {
        let o = offer(&custodian, &p, live, &stamp).await?;
        waiters.push(wait(&custodian, o.0.clone()));
        offered.push(o);
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    partitioned.store(false, Ordering::Relaxed);
    if live {
        println!("{}  ── partition healed ──", stamp());
    }

    let mut outcomes: BTreeMap<String, Outcome> = BTreeMap::new();
    for w in waiters {
        let o = tokio::time::timeout(Duration::from_secs(40), w).await???;
        outcomes.insert(o.obligation_id.to_string(), o);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    printer.abort();
    let inbox = custodian.inbox().await?;
    let metrics = custodian.metrics().await?;
    let receiver_metrics = receiver.metrics().await?;
    let elapsed = start.elapsed().as_secs_f64();

    let count = |s: TerminalState| outcomes.values().filter(|o| o.state == s).count();
    let summary = json!({
        "store": kind.as_str(),
        "transport": "quic",
        "obligations": offered.len(),
        "applied": count(TerminalState::Applied),
        "declined": count(TerminalState::Declined),
        "escalated": count(TerminalState::Escalated),
        "best_effort": count(TerminalState::BestEffort),
        "silent_losses": offered.len() - outcomes.len(),
        "receiver_applications": receiver_metrics.receiver_applied,
        "attempts_sent": metrics.attempts_sent,
        "commits": metrics.commits,
        "inbox": inbox,
        "elapsed_s": elapsed,
        "outcomes": offered.iter().map(|(id, kind, what, admissible)| {
            let o = &outcomes[id.as_str()];
            json!({
                "obligation_id": id.as_str(),
                "kind": kind,
                "what": what,
                "admissible": admissible,
                "outcome": o.state,
                "attempts": o.attempts,
                "reason": o.reason,
                "fail_safe": o.escalation.as_ref().map(|e| json!({"key": e.safe_action.key, "effect": e.safe_action.effect, "guard": e.guard})),
            })
        }).collect::<Vec<_>>(),
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        println!();
        println!(
            "{:<6} {:<20} {:<36} {:<10} {:>8}",
            "id", "kind", "what", "outcome", "attempts"
        );
        for (id, kind, what, _) in &offered {
            let o = &outcomes[id.as_str()];
            let state = serde_json::to_value(o.state)?
                .as_str()
                .unwrap_or("?")
                .to_string();
            let attempts = o.attempts.map_or("-".to_string(), |a| a.to_string());
            println!(
                "{:<6} {:<20} {:<36} {:<10} {:>8}",
                id.as_str(),
                kind,
                what,
                state,
                attempts
            );
        }
        println!();
        println!(
            "{} obligations: {} applied, {} declined, {} escalated (fail-safe applied), {} best-effort; silent losses: {}.",
            offered.len(),
            summary["applied"],
            summary["declined"],
            summary["escalated"],
            summary["best_effort"],
            summary["silent_losses"]
        );
        println!(
            "Receiver applied {} obligations (best-effort ones included), each once. Custodian: {} attempts, {} group commits. Inbox: {} pending, {} escalated.",
            receiver_metrics.receiver_applied, metrics.attempts_sent, metrics.commits, inbox.pending, inbox.escalated
        );
        println!("Done in {elapsed:.1} s.");
    }
    custodian.shutdown().await?;
    receiver.shutdown().await?;
    if args.keep {
        let kept = dir.keep();
        eprintln!("kept {}", kept.display());
    }
    Ok(())
}

/// Registers for the outcome of the obligation just offered, before it can
/// end, so the outcome carries its attempts and escalation.
fn wait(
    node: &Node,
    id: abhyasa_core::ObligationId,
) -> tokio::task::JoinHandle<Result<Outcome, abhyasa::NodeError>> {
    let node = node.clone();
    tokio::spawn(async move { node.outcome(&id).await })
}

async fn offer(
    node: &Node,
    p: &Planned,
    live: bool,
    stamp: &impl Fn() -> String,
) -> Result<(abhyasa_core::ObligationId, &'static str, &'static str, bool), DemoError> {
    let ob = Obligation::builder()
        .id(p.id)
        .kind(p.kind)
        .target("receiver")
        .payload(p.payload.clone())
        .deadline_seconds(p.deadline)
        // AB-2 sizing rule for the demo backoff (200 ms doubling to 1 s).
        .max_retries(abhyasa_core::min_retries_to_span(p.deadline as u64, 0.2, 1.0) as i64 + 4)
        .created_at(node.now())
        .build()?;
    let id = ob.id().clone();
    let offered = node.offer(ob).await?;
    let admissible = matches!(offered, abhyasa_core::custody::Offered::Custody { .. });
    if live {
        let mode = if admissible { "custody" } else { "best-effort" };
        println!(
            "{}  offer      {} {:<20} {:<36} {}",
            stamp(),
            p.id,
            p.kind,
            p.what,
            mode
        );
    }
    Ok((id, p.kind, p.what, admissible))
}

async fn print_events(mut rx: abhyasa::Subscription, start: Instant, live: bool) {
    while let Ok(e) = rx.recv().await {
        if !live {
            continue;
        }
        let t = format!("t+{:>5.2}s", start.elapsed().as_secs_f64());
        match e {
            NodeEvent::Custodian(CustodianEvent::Applied {
                obligation_id,
                attempts,
                ..
            }) => {
                println!("{t}  APPLIED    {obligation_id} (attempt {attempts})");
            }
            NodeEvent::Custodian(CustodianEvent::Retrying {
                obligation_id,
                attempt,
            }) => {
                println!("{t}  retry      {obligation_id} attempt {attempt}");
            }
            NodeEvent::Custodian(CustodianEvent::Declined {
                obligation_id,
                reason,
                disposition,
                ..
            }) => {
                let what = match disposition {
                    DeclineDisposition::SafeApplied { guard } => {
                        format!("fail-safe applied ({guard:?})")
                    }
                    DeclineDisposition::Surfaced => "surfaced for a principal decision".into(),
                };
                let reason = reason.map_or("unspecified".to_string(), |r| r.to_string());
                println!("{t}  DECLINED   {obligation_id} ({reason}); {what}");
            }
            NodeEvent::Custodian(CustodianEvent::Escalated(e)) => {
                let effect = match e.safe_action.effect {
                    SafeEffect::FailClosed => format!("withhold {}", e.safe_action.key),
                    SafeEffect::DownWeight { magnitude } => {
                        format!("down-weight {} by {magnitude}", e.safe_action.key)
                    }
                };
                println!(
                    "{t}  ESCALATED  {} after {} attempts: {}; fail-safe: {effect} ({:?})",
                    e.obligation_id, e.attempts, e.cause, e.guard
                );
            }
            NodeEvent::Custodian(CustodianEvent::BestEffortSent { obligation_id, .. }) => {
                println!(
                    "{t}  sent once  {obligation_id} (best-effort: no custody, loss is benign)"
                );
            }
            NodeEvent::PeerDown(p) => println!("{t}  link to {p} down"),
            NodeEvent::PeerUp(p) => println!("{t}  link to {p} up"),
            _ => {}
        }
    }
}
