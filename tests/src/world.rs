//! A world: two nodes on one cell, restarts, what the scenarios ask of
//! them, and the closing invariant check.

use std::sync::Arc;
use std::time::Duration;

use abhyasa::{Node, Outcome};
use abhyasa_check as check;
use abhyasa_core::custody::{LedgerOutcome, TerminalState};
use abhyasa_core::{DeclineReason, Obligation, ObligationId};
use abhyasa_identity::generate_identity;
use abhyasa_quic::QuicConfig;
use abhyasa_spool::{RelayConfig, SpoolLimits};
use abhyasa_transport::mem::MemNetwork;
// The HTTP cells fix both nodes' ports up front (each node's configuration
// names the other's endpoint, and a restart must come back on the same
// one): ports the kernel never hands to another socket in the meantime.
use abhyasa_testkit::loopback_port;

use crate::applier::Applies;
use crate::common::{lock, BoxError};
use crate::env::{unique_prefix, Env};
use crate::matrix::{Backend, Net};
use crate::peers::{agent, Schedule, ALICE, BOB, RELAY};
use crate::plug::Plug;
use crate::probe::{Probe, SharedSim};

/// Two nodes, alice (custodian) and bob (receiver), on one backend.
pub struct World {
    /// The cell this world runs on.
    pub backend: Backend,
    env: Env,
    /// The custodian.
    pub alice: Node,
    bob: Option<Node>,
    /// Faults on what alice receives (acks).
    pub alice_plug: Plug,
    /// Faults on what bob receives (obligations).
    pub bob_plug: Plug,
}

impl World {
    /// Starts both nodes on `backend` and waits until alice is connected
    /// to bob.
    pub async fn new(backend: Backend, schedule: Schedule) -> Result<World, BoxError> {
        let (alice_plug, bob_plug) = (Plug::new(11), Plug::new(13));
        let dir = tempfile::tempdir()?;
        let alice_id = generate_identity(&agent(ALICE))?;
        let bob_id = generate_identity(&agent(BOB))?;
        let relay_id = generate_identity(&agent(RELAY))?;
        let relay = match backend.net {
            Net::Relayed => {
                let quic = QuicConfig::new(agent(RELAY), relay_id.clone(), "127.0.0.1:0".parse()?)
                    .with_peer(alice_id.pin(agent(ALICE)), None)
                    .with_peer(bob_id.pin(agent(BOB)), None);
                Some(
                    abhyasa_spool::start(RelayConfig {
                        quic: Some(quic),
                        ws: None,
                        spool_path: dir.path().join("spool.redb"),
                        limits: SpoolLimits::default(),
                        status_path: None,
                    })
                    .await?,
                )
            }
            _ => None,
        };
        let http_ports = match backend.net {
            Net::Http => [loopback_port(), loopback_port()],
            _ => [0, 0],
        };
        let mut env = Env {
            backend,
            schedule,
            dir,
            mem: MemNetwork::new(7),
            alice_id,
            bob_id,
            bob_addr: None,
            sims: [SharedSim::default(), SharedSim::default()],
            alice_plug: alice_plug.clone(),
            bob_plug: bob_plug.clone(),
            relay,
            relay_id,
            http_ports,
            pg_prefix: unique_prefix(),
            applies: Applies::default(),
            probe: Probe::default(),
            alice_generation: 0,
            made: Arc::default(),
        };
        let bob = env.open_node(BOB).await?;
        let alice = env.open_node(ALICE).await?;
        let w = World {
            backend,
            env,
            alice,
            bob: Some(bob),
            alice_plug,
            bob_plug,
        };
        w.wait_connected().await?;
        Ok(w)
    }

    /// What alice's store has made durable (C-AB1-2, C-AB2-2).
    pub fn alice_probe(&self) -> &Probe {
        &self.env.probe
    }

    /// The receiver (panics when it is stopped: a scenario bug).
    pub fn bob(&self) -> &Node {
        self.bob
            .as_ref()
            .unwrap_or_else(|| panic!("bob is stopped"))
    }

    /// Waits until alice has an authenticated connection to bob.
    pub async fn wait_connected(&self) -> Result<(), BoxError> {
        tokio::time::timeout(Duration::from_secs(15), async {
            while !self.alice.is_connected(&agent(BOB)) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .map_err(|_| format!("{:?}: alice never connected to bob", self.backend))?;
        Ok(())
    }

    /// Stops bob (his store keeps everything he committed).
    pub async fn stop_bob(&mut self) -> Result<(), BoxError> {
        if let Some(b) = self.bob.take() {
            b.shutdown().await?;
        }
        Ok(())
    }

    /// Reopens bob on his store (and, for QUIC and WebSocket, his port).
    pub async fn start_bob(&mut self) -> Result<(), BoxError> {
        self.stop_bob().await?;
        let b = self.env.open_node(BOB).await?;
        self.bob = Some(b);
        Ok(())
    }

    /// Stops alice and reopens her on her store: every pending transfer
    /// must resume from its durable record.
    pub async fn restart_alice(&mut self) -> Result<(), BoxError> {
        self.restart_alice_after(Duration::ZERO).await
    }

    /// Stops alice, leaves her down for `down`, and reopens her on her
    /// store (a custodian that was away across deadlines).
    pub async fn restart_alice_after(&mut self, down: Duration) -> Result<(), BoxError> {
        self.alice.shutdown().await?;
        tokio::time::sleep(down).await;
        let a = self.env.open_node(ALICE).await?;
        let old = std::mem::replace(&mut self.alice, a);
        drop(old);
        Ok(())
    }

    /// Stops alice and reopens her on a FRESH, empty store (a new
    /// SimStore, a new file, a new PostgreSQL partition): a custodian that
    /// lost its disk and kept its identity and address. Everything her old
    /// store held is gone, from her and from [`World::trace`] (which reads
    /// her store): an obligation whose custody lived only there is no
    /// longer an offer of hers, while bob's ledger and applier still show
    /// what he did with it. The honest way, through the node, to reuse an
    /// obligation id with other content (C-AB3-4).
    pub async fn reopen_alice_on_fresh_store(&mut self) -> Result<(), BoxError> {
        self.alice.shutdown().await?;
        self.env.alice_generation += 1;
        self.env.sims[0] = SharedSim::default();
        self.env.probe.clear();
        let a = self.env.open_node(ALICE).await?;
        let old = std::mem::replace(&mut self.alice, a);
        drop(old);
        Ok(())
    }

    /// A custodian with alice's configuration (schedule, profiles, seed)
    /// and no history: what the node must follow, computed apart from it
    /// (C-AB2-2 compares its [`Custodian::interval`](abhyasa_core::custody::Custodian::interval)
    /// with the node's durable schedule).
    pub fn reference_custodian(&self) -> abhyasa_core::custody::Custodian {
        abhyasa_core::custody::Custodian::new(
            self.env.options(ALICE).custodian,
            abhyasa_core::polarity::PolarityRegistry::standard(),
        )
    }

    /// How many times bob's applier decided to apply `id` from alice,
    /// across his restarts.
    pub fn applied_by_bob(&self, id: &ObligationId) -> usize {
        lock(&self.env.applies)
            .iter()
            .filter(|a| a.id == *id && a.custodian == agent(ALICE))
            .count()
    }

    /// An Anumati revocation of `scope` from alice to bob: admissible,
    /// custody mode, deadline `deadline_s` seconds, retries enough to span it.
    pub fn revoke(
        &self,
        id: &str,
        scope: &str,
        deadline_s: i64,
        sequence: Option<u64>,
    ) -> Obligation {
        let mut b = Obligation::builder()
            .id(id)
            .kind("anumati.consent")
            .target(BOB)
            .payload(serde_json::json!({"decision": "revoke", "scope": scope}))
            .deadline_seconds(deadline_s)
            .max_retries(abhyasa_core::min_retries_to_span(deadline_s as u64, 0.05, 0.2) as i64 + 2)
            .created_at(self.alice.now());
        if let Some(s) = sequence {
            b = b.sequence(s);
        }
        let ob = b.build().unwrap_or_else(|e| panic!("obligation {id}: {e}"));
        lock(&self.env.made).push(ob.clone());
        ob
    }

    /// An obligation of `kind` with `payload` from alice to bob, custody
    /// sized like [`World::revoke`] (admissible or not: the registry
    /// decides).
    pub fn obligation(
        &self,
        id: &str,
        kind: &str,
        payload: serde_json::Value,
        deadline_s: i64,
    ) -> Obligation {
        let ob = Obligation::builder()
            .id(id)
            .kind(kind)
            .target(BOB)
            .payload(payload)
            .deadline_seconds(deadline_s)
            .max_retries(abhyasa_core::min_retries_to_span(deadline_s as u64, 0.05, 0.2) as i64 + 2)
            .created_at(self.alice.now())
            .build()
            .unwrap_or_else(|e| panic!("obligation {id}: {e}"));
        lock(&self.env.made).push(ob.clone());
        ob
    }

    /// Alice's terminal outcome for `id`, waiting at most `within`.
    pub async fn outcome(&self, id: &ObligationId, within: Duration) -> Outcome {
        match tokio::time::timeout(within, self.alice.outcome(id)).await {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => panic!("{:?}: outcome of {id}: {e}", self.backend),
            Err(_) => panic!("{:?}: {id} not terminal within {within:?}", self.backend),
        }
    }

    /// Bob's durable ledger: obligation id → outcome, read from his store
    /// (not from events), so "applied once" is what survives.
    pub async fn bob_ledger(&self) -> Vec<(ObligationId, LedgerOutcome)> {
        let st = self
            .bob()
            .durable_state()
            .await
            .unwrap_or_else(|e| panic!("bob's durable state: {e}"));
        let mut v: Vec<_> = st
            .receiver
            .ledger
            .values()
            .map(|r| (r.obligation_id.clone(), r.outcome))
            .collect();
        v.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
        v
    }

    /// Bob's durable ledger entry for `id`: outcome and decline reason.
    pub async fn bob_entry(
        &self,
        id: &ObligationId,
    ) -> Option<(LedgerOutcome, Option<DeclineReason>)> {
        let st = self
            .bob()
            .durable_state()
            .await
            .unwrap_or_else(|e| panic!("bob's durable state: {e}"));
        st.receiver
            .ledger
            .values()
            .find(|r| r.obligation_id == *id)
            .map(|r| (r.outcome, r.reason))
    }

    /// What the world saw happen, as the one invariant checker's trace
    /// (`abhyasa_check`, the same checker the abstract sweep and the
    /// full-stack simulator use): the obligations alice was offered (held
    /// or closed in her store), every decision of bob's applier to apply,
    /// bob's durable ledger, and how custody ended at alice (her stored
    /// terminal summaries with the attempts and escalation of each
    /// outcome). Only alice's current store is read: after
    /// [`World::reopen_alice_on_fresh_store`] the custody her lost store
    /// held is not in the trace (its obligation is no offer of hers any
    /// more), while bob's ledger and applier still show his side of it;
    /// an id she reused is checked as the custody she holds now, against
    /// everything bob did under that id. Custody still pending when the
    /// trace is taken goes into `pending_at_end`, which the checker
    /// reports as AB-1: every scenario waits for the outcome of everything
    /// it offered before it closes.
    pub async fn trace(&self) -> check::Trace {
        let a = self
            .alice
            .durable_state()
            .await
            .unwrap_or_else(|e| panic!("{:?}: alice's durable state: {e}", self.backend));
        let registry = abhyasa_core::polarity::PolarityRegistry::standard();
        let alice = agent(ALICE);
        let made = lock(&self.env.made).clone();
        let made_count = made.len();
        let mut trace = check::Trace::default();
        for ob in made {
            let id = ob.id();
            // Alice holds this very obligation (same digest): an id reused
            // after a store loss names another one, whose records went
            // with the lost store.
            // An obligation offered without a sequence was sent with the
            // next one on its key (C-OR-1): same content but for that.
            let as_sent = |d: abhyasa_core::Digest, seq: Option<abhyasa_core::Sequence>| {
                d == ob.digest() || (ob.sequence().is_none() && d == ob.with_sequence(seq).digest())
            };
            let pending = a
                .custodian
                .pending
                .get(id)
                .is_some_and(|p| as_sent(p.obligation.digest(), p.obligation.sequence()));
            let closed = a.custodian.terminal.get(id).is_some_and(|t| {
                (1..=made_count as u64 + 1)
                    .any(|s| as_sent(t.digest, Some(abhyasa_core::Sequence(s))))
            });
            if !pending && !closed {
                continue;
            }
            let admissible = registry.classify(&ob).is_ok_and(|c| c.is_admissible());
            trace.offers.push(check::Offer {
                custodian: alice.clone(),
                id: id.clone(),
                admissible,
                deadline_at: ob.deadline_at(),
                max_retries: u64::from(ob.max_retries()),
                sequence: ob.sequence(),
            });
            if pending {
                trace.pending_at_end.push((alice.clone(), id.clone()));
            }
        }
        for (id, t) in &a.custodian.terminal {
            let o = self.outcome(id, Duration::from_secs(1)).await;
            let outcome = match t.state {
                TerminalState::Applied => check::Outcome::Applied,
                TerminalState::Declined => check::Outcome::Declined(o.reason),
                TerminalState::Escalated => check::Outcome::Escalated,
                TerminalState::BestEffort => check::Outcome::BestEffort,
            };
            trace.terminals.push(check::Terminal {
                custodian: alice.clone(),
                id: id.clone(),
                outcome,
                attempts: u64::from(o.attempts.unwrap_or(1)),
                escalation: o.escalation.as_ref().map(|e| e.guard),
                principal_writes: None,
            });
        }
        let b = self
            .bob()
            .durable_state()
            .await
            .unwrap_or_else(|e| panic!("{:?}: bob's durable state: {e}", self.backend));
        trace.ledger = Some(
            b.receiver
                .ledger
                .iter()
                .map(|((c, id), l)| ((c.clone(), id.clone()), l.outcome))
                .collect(),
        );
        trace.applier_applies = lock(&self.env.applies).clone();
        trace
    }

    /// Runs the invariant checker over [`World::trace`] and fails the
    /// scenario, naming its cell, on any violation. Every scenario ends
    /// with it (through [`World::close`]).
    pub async fn verify(&self) {
        let trace = self.trace().await;
        let violations = check::check(&trace);
        assert!(
            violations.is_empty(),
            "{:?}: the invariant checker found {} violation(s):\n{}",
            self.backend,
            violations.len(),
            violations
                .iter()
                .map(|v| format!("  {v}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    /// Checks the invariants ([`World::verify`]), then shuts both nodes
    /// down (and the relay, if any).
    pub async fn close(mut self) -> Result<(), BoxError> {
        if self.bob.is_some() {
            self.verify().await;
        }
        self.stop_bob().await?;
        self.alice.shutdown().await?;
        if let Some(r) = self.env.relay.take() {
            r.shutdown().await;
        }
        Ok(())
    }
}
