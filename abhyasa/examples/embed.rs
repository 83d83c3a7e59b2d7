//! An agent embedding an Abhyasa node with its own asynchronous applier.
//!
//! The agent ("assistant") decides what an obligation means for it on its
//! own time: here it consults a (simulated, slow) policy service before
//! answering, declines to drop its audit scope, and applies the rest. The
//! node asks it without blocking its loop and records each decision with
//! its effect in one commit (AB-3). A principal's node ("alice") sends
//! three revocations over the in-memory transport and prints how each
//! ended. Runs in about a second and exits by itself:
//!
//! ```sh
//! cargo run -p abhyasa --example embed
//! ```
//!
//! A real agent opens the node the same way on QUIC and a durable store
//! (`abhyasa_quic`, `abhyasa_store::RedbStore`).

use std::time::Duration;

use abhyasa::{AsyncApplier, AsyncApplierHandle, Node, NodeOptions};
use abhyasa_core::custody::{ApplyDecision, ApplyRequest, StandardApplier, TerminalState};
use abhyasa_core::store::SimStore;
use abhyasa_core::{AgentId, DeclineReason, Obligation};
use abhyasa_transport::mem::MemNetwork;
use abhyasa_transport::LinkConfig;
use serde_json::json;

/// The assistant's applier: asks its policy service, then decides.
struct Assistant {
    /// Scopes the assistant's operator requires it to keep.
    protected: Vec<&'static str>,
}

impl AsyncApplier for Assistant {
    async fn decide(&self, req: ApplyRequest) -> ApplyDecision {
        // Stands for a network call, a model or a human: the node's loop,
        // its timers and its other obligations go on meanwhile.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let scope = req
            .obligation
            .payload()
            .get("scope")
            .and_then(|v| v.as_str())
            .unwrap_or_default();
        if self.protected.contains(&scope) {
            return ApplyDecision::Decline {
                reason: DeclineReason::Policy,
                detail: Some(format!("{scope} is required by the operator")),
            };
        }
        // Receiver-owned state the standard way (withhold the scope).
        req.answer_with(&mut StandardApplier::default())
    }
}

fn revoke(alice: &Node, id: &str, scope: &str) -> Result<Obligation, Box<dyn std::error::Error>> {
    Ok(Obligation::builder()
        .id(id)
        .kind("anumati.consent")
        .target("assistant")
        .payload(json!({"decision": "revoke", "scope": scope}))
        .deadline_seconds(60)
        .max_retries(100)
        .created_at(alice.now())
        .build()?)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let net = MemNetwork::new(1);
    let open = |name: &str, options: NodeOptions| {
        let net = net.clone();
        let agent = AgentId::new(name);
        async move {
            let transport = net.join(agent?, LinkConfig::default()).await?;
            let node = Node::open(options, Box::new(SimStore::new()), transport).await?;
            Ok::<_, Box<dyn std::error::Error>>(node)
        }
    };

    let mut options = NodeOptions::new(AgentId::new("assistant")?);
    options.async_applier = Some(
        AsyncApplierHandle::new(Assistant {
            protected: vec!["audit.log"],
        })
        .with_concurrency(8),
    );
    let assistant = open("assistant", options).await?;
    let alice = open("alice", NodeOptions::new(AgentId::new("alice")?)).await?;

    let obligations = [
        revoke(&alice, "consent-1", "email.read")?,
        revoke(&alice, "consent-2", "calendar.write")?,
        revoke(&alice, "consent-3", "audit.log")?,
    ];
    for ob in &obligations {
        alice.offer(ob.clone()).await?;
    }
    let mut applied = 0;
    for ob in &obligations {
        let out = tokio::time::timeout(Duration::from_secs(10), alice.outcome(ob.id())).await??;
        println!(
            "{}: {:?}{}",
            ob.id(),
            out.state,
            out.reason.map(|r| format!(" ({r:?})")).unwrap_or_default()
        );
        applied += usize::from(out.state == TerminalState::Applied);
    }
    let m = assistant.metrics().await?;
    println!(
        "assistant applied {} (alice saw {applied} applied)",
        m.receiver_applied
    );
    alice.shutdown().await?;
    assistant.shutdown().await?;
    Ok(())
}
