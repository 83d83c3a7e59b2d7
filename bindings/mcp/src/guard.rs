//! Envelope before request (C-MCP-1): a layer around any rmcp server.
//!
//! [`Guarded`] wraps a server (anything implementing rmcp's
//! `Service<RoleServer>`, so every `ServerHandler`). For each `tools/call`
//! it reads the custody envelope in the request's `_meta`, hands the
//! obligation to an Abhyasa [`Receiver`] whose ledger is durable in a
//! [`Store`], commits, and only then decides whether the call may run: a
//! tool that needs a governed key the receiver now holds withheld is
//! refused with `isError`, after the revocation is applied and acked. The
//! ack rides back in the result's `_meta`. A tool call therefore never runs
//! under authority its own envelope withdrew.
//!
//! # Who the custodian is
//!
//! The receiver's ledger is keyed on (custodian, obligation id) (AB-3), so
//! the custodian must be an authenticated identity, never a field of the
//! envelope. MCP has no peer identity of its own; the deployer binds one to
//! the connection: over stdio the client is the process that launched the
//! server, named by configuration ([`Guarded::new`] takes its agent id);
//! over streamable HTTP, [`Guarded::with_custodian_fn`] maps the
//! authenticated request (e.g. the OAuth subject the HTTP layer put in the
//! request's extensions) to an agent id. A call whose custodian cannot be
//! identified is refused when it carries an envelope.
//!
//! # Failure
//!
//! A store that fails to commit poisons the guard: every later governed
//! call is refused until the process restarts and recovers the ledger from
//! the store (fail closed; nothing is acked that is not durable).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use abhyasa_core::custody::{
    Applier, AuthorityPolicy, EffectValue, Receiver, ReceiverConfig, StandardApplier, Transmit,
};
use abhyasa_core::polarity::PolarityRegistry;
use abhyasa_core::principal::Authorization;
use abhyasa_core::store::{Store, StoreError};
use abhyasa_core::wire::Message;
use abhyasa_core::{AgentId, FieldError, GovernedKey, Obligation, ObligationId, Timestamp};
use rmcp::model::{
    CallToolResult, ClientRequest, ContentBlock, MetaObject, ProtocolVersion, ServerResult,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer, Service, ServiceRole};
use rmcp::ErrorData as McpError;
use serde_json::{json, Value};

use crate::envelope::{Envelope, EnvelopeReply, ENVELOPE_KEY};

/// Why a policy or guard could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GuardError {
    /// The selector does not describe a governed key of that kind.
    #[error("tool {tool}: {kind} with {selector} names no governed key: {detail}")]
    NoKey {
        /// The tool.
        tool: String,
        /// The kind.
        kind: String,
        /// The payload selector given.
        selector: Value,
        /// Why.
        detail: String,
    },
    /// An identifier is invalid.
    #[error("{0}")]
    Field(#[from] FieldError),
    /// The store failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

/// Which governed key each tool needs. The key is computed by the kind's
/// polarity rule (AC-1) from a payload selector, exactly as the receiver
/// computes it from an obligation, so the two always agree.
#[derive(Debug, Clone)]
pub struct ToolPolicy {
    agent: AgentId,
    registry: PolarityRegistry,
    needs: HashMap<String, GovernedKey>,
}

impl ToolPolicy {
    /// An empty policy for the server's own agent id (the `target` of the
    /// obligations it receives).
    pub fn new(agent: AgentId, registry: PolarityRegistry) -> Self {
        Self {
            agent,
            registry,
            needs: HashMap::new(),
        }
    }

    /// Declares that `tool` needs the key an obligation of `kind` with
    /// payload `selector` governs, e.g. `read_email` needs
    /// (`anumati.consent`, `{"scope": "email.read"}`).
    pub fn require(mut self, tool: &str, kind: &str, selector: Value) -> Result<Self, GuardError> {
        let key = self
            .key_of(kind, selector.clone())
            .map_err(|detail| GuardError::NoKey {
                tool: tool.into(),
                kind: kind.into(),
                selector,
                detail,
            })?;
        self.needs.insert(tool.to_string(), key);
        Ok(self)
    }

    fn key_of(&self, kind: &str, selector: Value) -> Result<GovernedKey, String> {
        // A probe obligation: only kind, target and payload matter to the
        // rule's key; the rest is any valid value.
        let probe = Obligation::builder()
            .id("policy-probe")
            .kind(kind)
            .target(self.agent.as_str())
            .payload(selector)
            .deadline_seconds(1)
            .max_retries(0)
            .created_at(Timestamp::from_unix_seconds(0))
            .build()
            .map_err(|e| e.to_string())?;
        if !self.registry.knows(probe.kind()) {
            return Err(format!("no polarity rule for kind {kind}"));
        }
        let c = self.registry.classify(&probe).map_err(|e| e.to_string())?;
        c.key.ok_or_else(|| "the rule names no key".to_string())
    }

    /// The key `tool` needs, if any.
    pub fn key_for(&self, tool: &str) -> Option<&GovernedKey> {
        self.needs.get(tool)
    }

    /// The server's agent id.
    pub fn agent(&self) -> &AgentId {
        &self.agent
    }
}

/// The time source of the guard (wall clock by default; tests pass a fixed
/// one).
pub type ClockFn = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// The wall clock as a [`Timestamp`].
pub fn system_now() -> Timestamp {
    let us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    Timestamp::from_unix_micros(us)
}

/// The receiver behind the guard: the core [`Receiver`] over a durable
/// [`Store`], with an applier (the standard one by default). Write-ahead:
/// the records of each obligation are committed before its ack is read.
pub struct GuardReceiver {
    receiver: Receiver,
    store: Box<dyn Store>,
    applier: Box<dyn Applier + Send>,
    poisoned: Option<String>,
}

impl std::fmt::Debug for GuardReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardReceiver")
            .field("agent", &self.receiver.config().agent)
            .field("store", &self.store.backend())
            .field("ledger", &self.receiver.ledger_len())
            .field("poisoned", &self.poisoned)
            .finish()
    }
}

impl GuardReceiver {
    /// Opens the receiver for `agent`, recovering its ledger and effects
    /// from `store`.
    pub fn open(
        agent: AgentId,
        registry: PolarityRegistry,
        mut store: Box<dyn Store>,
        now: Timestamp,
    ) -> Result<Self, GuardError> {
        let state = store.load()?;
        let mut receiver =
            Receiver::restore(ReceiverConfig::new(agent), registry, &state.receiver, now);
        // Restore may emit records (in-doubt intents); make them durable
        // before anything else.
        while let Some(b) = receiver.poll_records() {
            let _durable = store.commit(now, &[&b.records])?;
            receiver.handle_committed(b.token());
        }
        while receiver.poll_transmit().is_some() {}
        while receiver.poll_event().is_some() {}
        Ok(Self {
            receiver,
            store,
            applier: Box::new(StandardApplier::default()),
            poisoned: None,
        })
    }

    /// Sets what each custodian may govern here (C-AZ-1): the receiver's
    /// per-peer policy. The default lets each custodian govern only keys
    /// held under its own identity.
    pub fn with_authority(mut self, policy: AuthorityPolicy) -> Self {
        self.receiver.set_authority(policy);
        self
    }

    /// Replaces the applier (what applying an obligation means here).
    pub fn with_applier(mut self, applier: impl Applier + Send + 'static) -> Self {
        self.applier = Box::new(applier);
        self
    }

    /// Takes one obligation from `custodian`: applies it at most once
    /// (AB-3), commits, and returns what to answer in the result's `_meta`.
    pub fn handle(
        &mut self,
        now: Timestamp,
        custodian: &AgentId,
        ob: Obligation,
    ) -> Result<EnvelopeReply, String> {
        if let Some(p) = &self.poisoned {
            return Err(p.clone());
        }
        let id = ob.id().clone();
        let _ = self
            .receiver
            .handle_obligation(now, custodian, ob, self.applier.as_mut());
        while let Some(b) = self.receiver.poll_records() {
            if let Err(e) = self.store.commit(now, &[&b.records]) {
                let msg = format!("the receiver's store failed ({e}); refusing until restart");
                self.poisoned = Some(msg.clone());
                return Err(msg);
            }
            self.receiver.handle_committed(b.token());
        }
        let mut reply = None;
        while let Some(Transmit { to, message }) = self.receiver.poll_transmit() {
            if &to != custodian {
                continue;
            }
            match message {
                Message::Acks(acks) => {
                    if let Some(a) = acks.into_iter().find(|a| a.obligation_id == id) {
                        reply = Some(EnvelopeReply::Ack(a));
                    }
                }
                Message::Error(e) => {
                    reply = Some(EnvelopeReply::Error {
                        code: serde_json::to_value(e.code)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_string))
                            .unwrap_or_else(|| "error".into()),
                        message: e.message,
                    });
                }
                _ => {}
            }
        }
        while self.receiver.poll_event().is_some() {}
        reply.ok_or_else(|| format!("the receiver produced no answer for obligation {id}"))
    }

    /// The authorization the receiver holds on `key` (committed). Each
    /// custodian governs the key under its own identity (C-AZ-2): given the
    /// issuer-less key, `Withheld` if any custodian withholds it, else
    /// `Granted` if any grants it; given a key held under one issuer, that
    /// issuer's.
    pub fn authorization(&self, key: &GovernedKey) -> Option<Authorization> {
        let one = |k: &str| match self.receiver.effects().get(k) {
            Some(EffectValue::Authorization(a)) => Some(*a),
            _ => None,
        };
        if key.issuer().is_some() {
            return one(key.as_str());
        }
        let mut held = None;
        for (k, v) in self.receiver.effects() {
            let EffectValue::Authorization(a) = v else {
                continue;
            };
            let Ok(gk) = GovernedKey::new(k) else {
                continue;
            };
            if gk.issuer().is_some() && gk.unqualified() == key.as_str() {
                if *a == Authorization::Withheld {
                    return Some(Authorization::Withheld);
                }
                held = Some(*a);
            }
        }
        held
    }

    /// Receiver-owned effect state.
    pub fn effects(&self) -> &BTreeMap<String, EffectValue> {
        self.receiver.effects()
    }

    /// Applications performed since open.
    pub fn applications(&self) -> u64 {
        self.receiver.applications()
    }

    /// True when the ledger holds (custodian, id).
    pub fn knows(&self, custodian: &AgentId, id: &ObligationId) -> bool {
        self.receiver.ledger_outcome(custodian, id).is_some()
    }
}

/// How the guard names the custodian of a request.
pub type CustodianFn = Arc<dyn Fn(&RequestContext<RoleServer>) -> Option<AgentId> + Send + Sync>;

/// A server wrapped so that envelopes are processed before requests
/// (C-MCP-1). Serve it like the inner server: `Guarded::new(..).serve(t)`.
pub struct Guarded<S> {
    inner: S,
    policy: Arc<ToolPolicy>,
    receiver: Arc<Mutex<GuardReceiver>>,
    custodian: CustodianFn,
    clock: ClockFn,
}

impl<S> std::fmt::Debug for Guarded<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guarded")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl<S> Guarded<S> {
    /// Wraps `inner`: `policy` says which key each tool needs, `receiver`
    /// holds the ledger, and every request on this connection comes from
    /// the custodian `custodian` (see the module docs).
    pub fn new(
        inner: S,
        policy: ToolPolicy,
        receiver: Arc<Mutex<GuardReceiver>>,
        custodian: AgentId,
    ) -> Self {
        Self {
            inner,
            policy: Arc::new(policy),
            receiver,
            custodian: Arc::new(move |_| Some(custodian.clone())),
            clock: Arc::new(system_now),
        }
    }

    /// Names the custodian per request (e.g. from authenticated HTTP
    /// extensions) instead of one per connection.
    pub fn with_custodian_fn(mut self, f: CustodianFn) -> Self {
        self.custodian = f;
        self
    }

    /// Replaces the wall clock.
    pub fn with_clock(mut self, clock: ClockFn) -> Self {
        self.clock = clock;
        self
    }

    /// The inner server.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The envelope step of one `tools/call`: `Ok(reply)` lets the call run
    /// (answering `reply` in `_meta`), `Err(result)` is the refusal.
    fn before_call(
        &self,
        tool: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<Option<EnvelopeReply>, CallToolResult> {
        let envelope = match Envelope::from_meta(&context.meta) {
            Ok(e) => e,
            Err(e) => {
                // Unreadable envelope: we cannot know what authority it
                // withdraws, so the call does not run (fail closed).
                let reply = EnvelopeReply::Error {
                    code: e.code().into(),
                    message: e.to_string(),
                };
                return Err(refusal(
                    format!("custody envelope refused: {e}"),
                    json!({"tool": tool}),
                    Some(&reply),
                ));
            }
        };
        let mut guard = match self.receiver.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let reply = match envelope {
            None => None,
            Some(env) => {
                let Some(custodian) = (self.custodian)(context) else {
                    let reply = EnvelopeReply::Error {
                        code: "unauthenticated".into(),
                        message: "the custodian of this request is not identified".into(),
                    };
                    return Err(refusal(
                        "custody envelope refused: the custodian of this request is not identified"
                            .into(),
                        json!({"tool": tool}),
                        Some(&reply),
                    ));
                };
                match guard.handle((self.clock)(), &custodian, env.obligation) {
                    Ok(r) => Some(r),
                    Err(msg) => {
                        return Err(refusal(msg, json!({"tool": tool}), None));
                    }
                }
            }
        };
        if let Some(p) = &guard.poisoned {
            return Err(refusal(p.clone(), json!({"tool": tool}), reply.as_ref()));
        }
        if let Some(key) = self.policy.key_for(tool) {
            if guard.authorization(key) == Some(Authorization::Withheld) {
                return Err(refusal(
                    format!("authority {key} is withdrawn: tool {tool} is refused"),
                    json!({"tool": tool, "key": key.as_str(), "authorization": "withheld"}),
                    reply.as_ref(),
                ));
            }
        }
        Ok(reply)
    }
}

/// A refused call: `isError`, the `{"ok": false, "error": ...}` text, and
/// the envelope reply (the ack) in `_meta`.
fn refusal(message: String, detail: Value, reply: Option<&EnvelopeReply>) -> CallToolResult {
    let body = json!({"ok": false, "error": message, "refused": detail});
    let mut r = CallToolResult::structured_error(body.clone());
    r.content = vec![ContentBlock::text(
        serde_json::to_string_pretty(&body).unwrap_or_else(|_| body.to_string()),
    )];
    if let Some(reply) = reply {
        attach(&mut r, reply);
    }
    r
}

/// Puts `reply` under [`ENVELOPE_KEY`] of the result's `_meta`.
pub fn attach(result: &mut CallToolResult, reply: &EnvelopeReply) {
    result
        .meta
        .get_or_insert_with(MetaObject::new)
        .insert(ENVELOPE_KEY.into(), reply.to_value());
}

impl<S: Service<RoleServer>> Service<RoleServer> for Guarded<S> {
    async fn handle_request(
        &self,
        request: <RoleServer as ServiceRole>::PeerReq,
        context: RequestContext<RoleServer>,
    ) -> Result<<RoleServer as ServiceRole>::Resp, McpError> {
        let tool = match &request {
            ClientRequest::CallToolRequest(call) => call.params.name.to_string(),
            _ => return self.inner.handle_request(request, context).await,
        };
        let reply = match self.before_call(&tool, &context) {
            Ok(reply) => reply,
            Err(refused) => return Ok(ServerResult::CallToolResult(refused)),
        };
        // The call runs only now, after the envelope is durable. If the
        // inner server answers with a protocol error the ack is not
        // carried; it is durable, and the custodian's retry is re-acked
        // without re-applying (AB-3).
        let mut result = self.inner.handle_request(request, context).await?;
        if let (Some(reply), ServerResult::CallToolResult(r)) = (&reply, &mut result) {
            attach(r, reply);
        }
        Ok(result)
    }

    async fn handle_notification(
        &self,
        notification: <RoleServer as ServiceRole>::PeerNot,
        context: NotificationContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.inner.handle_notification(notification, context).await
    }

    fn get_info(&self) -> <RoleServer as ServiceRole>::Info {
        self.inner.get_info()
    }

    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        self.inner.supported_protocol_versions()
    }
}
