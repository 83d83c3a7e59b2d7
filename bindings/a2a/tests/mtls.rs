//! Mutual TLS on the HTTP binding (C-A2A-3): the server accepts only
//! client certificates pinned to a peer, binds every request to that
//! agent, and our HTTPS client accepts only the peer's pinned server
//! certificate. Plain HTTP only when explicitly configured on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::eventually;
// Listening ports fixed before the listener binds (a peer's config names
// them): ones the kernel hands no other socket meanwhile.
use abhyasa_testkit::loopback_port;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use abhyasa::{Node, NodeEvent, NodeOptions};
use abhyasa_a2a::card::kind_profile;
use abhyasa_a2a::client::JsonClient;
use abhyasa_a2a::{HttpConfig, HttpError, HttpPeer, HttpServer};
use abhyasa_core::custody::{
    Applier, ApplyContext, ApplyDecision, CustodyProfile, ReceiverEvent, StandardApplier,
    TerminalState,
};
use abhyasa_core::store::SimStore;
use abhyasa_core::{AgentId, Kind, Obligation, ObligationId, RetryBackoff};
use abhyasa_identity::{dangerous_pinned_client_tls, generate_identity, Fingerprint, Identity};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use serde_json::{json, Value};

type Stash = Arc<Mutex<HashMap<ObligationId, ApplyDecision>>>;
/// (custodian, obligation id) -> times applied.
type Applied = Arc<Mutex<HashMap<(String, String), u32>>>;

/// Standard applier; payload `demo: defer` defers once and stashes.
struct Demo {
    standard: StandardApplier,
    stash: Stash,
}

impl Applier for Demo {
    fn decide(&mut self, ctx: &ApplyContext<'_>, ob: &Obligation) -> ApplyDecision {
        match ob.payload().get("demo").and_then(Value::as_str) {
            Some("defer") if !ctx.previously_deferred => {
                let d = self.standard.decide(ctx, ob);
                self.stash.lock().unwrap().insert(ob.id().clone(), d);
                ApplyDecision::Defer { detail: None }
            }
            _ => self.standard.decide(ctx, ob),
        }
    }
}

fn agent(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

fn ident(s: &str) -> Identity {
    generate_identity(&agent(s)).unwrap()
}

fn profiles() -> Vec<abhyasa_core::KindProfile> {
    vec![kind_profile(
        Kind::new("anumati.consent").unwrap(),
        "",
        600,
        &RetryBackoff::DEFAULT,
    )
    .unwrap()]
}

fn peer(name: &str, fp: Option<Fingerprint>, token: Option<&str>) -> HttpPeer {
    HttpPeer {
        agent: agent(name),
        token: token.map(str::to_string),
        fingerprint: fp,
        custody_ack_endpoint: None,
        obligation_endpoint: None,
        outbound_token: None,
    }
}

struct Receiver {
    node: Node,
    server: HttpServer,
    stash: Stash,
    applied: Applied,
}

async fn receiver(name: &str, identity: Identity, peers: Vec<HttpPeer>) -> Receiver {
    let mut cfg = HttpConfig::mtls(name, identity, peers, profiles());
    // Peers with a credential and no pin are listed bearer-only, as an
    // operator must list them (C-PA-1).
    cfg.bearer_only = cfg
        .peers
        .iter()
        .filter(|p| p.fingerprint.is_none() && p.token.is_some())
        .map(|p| p.agent.clone())
        .collect();
    receiver_with(cfg).await
}

async fn receiver_with(cfg: HttpConfig) -> Receiver {
    let name = cfg.name.clone();
    let name = name.as_str();
    let (t, server) = abhyasa_a2a::start(agent(name), cfg).await.unwrap();
    let stash = Stash::default();
    let mut o = NodeOptions::new(agent(name));
    o.applier = Box::new(Demo {
        standard: StandardApplier::default(),
        stash: stash.clone(),
    });
    let node = Node::open(o, Box::new(SimStore::new()), t).await.unwrap();
    let applied = Applied::default();
    let (a, mut rx) = (applied.clone(), node.subscribe());
    tokio::spawn(async move {
        while let Ok(e) = rx.recv().await {
            if let NodeEvent::Receiver(ReceiverEvent::Applied {
                custodian,
                obligation_id,
                ..
            }) = e
            {
                *a.lock()
                    .unwrap()
                    .entry((custodian.to_string(), obligation_id.to_string()))
                    .or_insert(0) += 1;
            }
        }
    });
    Receiver {
        node,
        server,
        stash,
        applied,
    }
}

fn obligation(id: &str, target: &str) -> String {
    json!({
        "obligation_id": id,
        "kind": "anumati.consent",
        "target": target,
        "payload": {"decision": "revoke", "scope": format!("scope-{id}")},
        "deadline_seconds": 60,
        "max_retries": 20,
        "created_at": now(),
    })
    .to_string()
}

fn now() -> String {
    use abhyasa::clock::Clock;
    abhyasa::clock::SystemClock.now().to_rfc3339()
}

/// The pinned client config `who` uses to reach `server_name` at `fp`.
fn client_tls(who: &Identity, server_name: &str, fp: Fingerprint) -> Arc<rustls::ClientConfig> {
    Arc::new(
        dangerous_pinned_client_tls(who, &agent(server_name), fp, vec![b"http/1.1".to_vec()])
            .unwrap(),
    )
}

/// A TLS client that presents no certificate (and, being a test, trusts
/// any server): what an A2A client without mTLS looks like.
fn no_cert_tls() -> Arc<rustls::ClientConfig> {
    #[derive(Debug)]
    struct AnyServer;
    impl ServerCertVerifier for AnyServer {
        fn verify_server_cert(
            &self,
            _: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &ServerName<'_>,
            _: &[u8],
            _: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            _: &[u8],
            _: &CertificateDer<'_>,
            _: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            Ok(HandshakeSignatureValid::assertion())
        }
        fn verify_tls13_signature(
            &self,
            _: &[u8],
            _: &CertificateDer<'_>,
            _: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            Ok(HandshakeSignatureValid::assertion())
        }
        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            rustls::crypto::ring::default_provider()
                .signature_verification_algorithms
                .supported_schemes()
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let c = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer))
        .with_no_client_auth();
    Arc::new(c)
}

fn client() -> JsonClient {
    JsonClient::new(Duration::from_secs(5))
}

async fn settle() {
    tokio::time::sleep(Duration::from_millis(150)).await;
}

// C-A2A-3: with mTLS only (no bearer peers) a client certificate is
// mandatory. No certificate, a certificate with the right name but another
// key ("wrong cert"), and a real node's certificate that is not pinned are
// all refused at the handshake; nothing is accepted. The pinned one is
// accepted and bound to its agent (the ack is keyed on alice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_a2a_3_mtls_rejects_no_wrong_and_unpinned_certificates() {
    let (alice, bob) = (ident("alice"), ident("bob"));
    let bob_fp = bob.fingerprint;
    let r = receiver(
        "bob",
        bob,
        vec![peer("alice", Some(alice.fingerprint), None)],
    )
    .await;
    assert!(
        r.server.base_url.starts_with("https://"),
        "{}",
        r.server.base_url
    );
    let url = format!("{}/abhyasa/obligations", r.server.base_url);
    let c = client();

    let no_cert = c
        .post(
            &url,
            None,
            obligation("no-cert", "bob"),
            Some(&no_cert_tls()),
        )
        .await;
    assert!(
        no_cert.is_err() || no_cert.as_ref().unwrap().status == 401,
        "{no_cert:?}"
    );
    let impostor = ident("alice"); // same name, another key: not the pin
    let wrong = c
        .post(
            &url,
            None,
            obligation("wrong-cert", "bob"),
            Some(&client_tls(&impostor, "bob", bob_fp)),
        )
        .await;
    assert!(wrong.is_err(), "{wrong:?}");
    let mallory = ident("mallory");
    let unpinned = c
        .post(
            &url,
            None,
            obligation("unpinned", "bob"),
            Some(&client_tls(&mallory, "bob", bob_fp)),
        )
        .await;
    assert!(unpinned.is_err(), "{unpinned:?}");
    // The server counts a refusal in its own task, after the handshake
    // fails on its side: the client may see the failure first.
    let refused = &r.server.stats.tls_refused;
    assert!(
        eventually(|| refused.load(Ordering::Relaxed) >= 3).await,
        "tls_refused = {}",
        refused.load(Ordering::Relaxed)
    );

    let good = c
        .post(
            &url,
            None,
            obligation("pinned", "bob"),
            Some(&client_tls(&alice, "bob", bob_fp)),
        )
        .await
        .unwrap();
    assert_eq!(
        good.status,
        200,
        "{:?}",
        String::from_utf8_lossy(&good.body)
    );
    let ack: Value = serde_json::from_slice(&good.body).unwrap();
    assert_eq!(ack["status"], json!("applied"));
    settle().await;
    let applied = r.applied.lock().unwrap().clone();
    assert_eq!(
        applied,
        HashMap::from([(("alice".to_string(), "pinned".to_string()), 1)]),
        "only the pinned client's obligation, keyed on alice"
    );
    r.node.shutdown().await.unwrap();
}

// C-A2A-3, client side: our HTTPS client accepts only the server
// certificate pinned for the peer; a server holding another key gets
// nothing (the obligation is never sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_a2a_3_client_refuses_an_unpinned_server() {
    let (alice, bob) = (ident("alice"), ident("bob"));
    let r = receiver(
        "bob",
        bob,
        vec![peer("alice", Some(alice.fingerprint), None)],
    )
    .await;
    let url = format!("{}/abhyasa/obligations", r.server.base_url);
    let other = ident("bob").fingerprint; // what alice wrongly pinned for bob
    let e = client()
        .post(
            &url,
            None,
            obligation("x", "bob"),
            Some(&client_tls(&alice, "bob", other)),
        )
        .await
        .expect_err("an unpinned server certificate is refused");
    assert!(e.contains("TLS"), "{e}");
    // An https URL without a pin is refused before anything is sent.
    let e = client()
        .post(&url, None, obligation("y", "bob"), None)
        .await
        .expect_err("no pin");
    assert!(e.contains("pinned"), "{e}");
    settle().await;
    assert!(r.applied.lock().unwrap().is_empty());
    r.node.shutdown().await.unwrap();
}

// C-A2A-3 with bearer peers next to mTLS ones: a client without a
// certificate must present a declared bearer credential (else 401 and
// nothing accepted); a certificate and a credential naming two different
// agents are refused 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_a2a_3_bearer_beside_mtls_and_mixed_identities_refused() {
    let (alice, bob) = (ident("alice"), ident("bob"));
    let bob_fp = bob.fingerprint;
    let r = receiver(
        "bob",
        bob,
        vec![
            peer("alice", Some(alice.fingerprint), None),
            peer("carol", None, Some("carol-secret")),
        ],
    )
    .await;
    let url = format!("{}/abhyasa/obligations", r.server.base_url);
    let c = client();
    let anon = c
        .post(&url, None, obligation("anon", "bob"), Some(&no_cert_tls()))
        .await
        .unwrap();
    assert_eq!(anon.status, 401);
    let carol = c
        .post(
            &url,
            Some("carol-secret"),
            obligation("by-carol", "bob"),
            Some(&no_cert_tls()),
        )
        .await
        .unwrap();
    assert_eq!(
        carol.status,
        200,
        "{:?}",
        String::from_utf8_lossy(&carol.body)
    );
    let mixed = c
        .post(
            &url,
            Some("carol-secret"),
            obligation("mixed", "bob"),
            Some(&client_tls(&alice, "bob", bob_fp)),
        )
        .await
        .unwrap();
    assert_eq!(mixed.status, 401);
    // Still refused at the handshake: an unpinned certificate.
    let mallory = ident("mallory");
    let m = c
        .post(
            &url,
            Some("carol-secret"),
            obligation("mallory", "bob"),
            Some(&client_tls(&mallory, "bob", bob_fp)),
        )
        .await;
    assert!(m.is_err(), "{m:?}");
    settle().await;
    let applied = r.applied.lock().unwrap().clone();
    assert_eq!(
        applied,
        HashMap::from([(("carol".to_string(), "by-carol".to_string()), 1)])
    );
    r.node.shutdown().await.unwrap();
}

// C-PA-1: client certificates are mandatory over HTTPS unless the listener
// lists bearer-only peers. Unlisted, a pinned peer's credential on a
// connection without a certificate fails at the handshake; listed, only
// the listed peer's credential is taken there (another peer's is 401); a
// credential-only peer that is not listed cannot start the binding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_pa_1_client_certificates_mandatory_unless_bearer_only_listed() {
    let (alice, bob) = (ident("alice"), ident("bob"));
    let bob_fp = bob.fingerprint;
    let dave = ident("dave");
    let peers = vec![
        peer("alice", Some(alice.fingerprint), Some("alice-secret")),
        peer("dave", Some(dave.fingerprint), Some("dave-secret")),
    ];
    let r = receiver_with(HttpConfig::mtls("bob", bob, peers.clone(), profiles())).await;
    let url = format!("{}/abhyasa/obligations", r.server.base_url);
    let c = client();
    let anon = c
        .post(
            &url,
            Some("alice-secret"),
            obligation("no-cert", "bob"),
            Some(&no_cert_tls()),
        )
        .await;
    assert!(
        anon.is_err(),
        "a connection without a certificate was served: {anon:?}"
    );
    let ok = c
        .post(
            &url,
            None,
            obligation("with-cert", "bob"),
            Some(&client_tls(&alice, "bob", bob_fp)),
        )
        .await
        .unwrap();
    assert_eq!(ok.status, 200);
    r.node.shutdown().await.unwrap();

    let bob = ident("bob");
    let bob_fp = bob.fingerprint;
    let mut cfg = HttpConfig::mtls("bob", bob, peers, profiles());
    cfg.bearer_only = vec![agent("dave")];
    let r = receiver_with(cfg).await;
    let url = format!("{}/abhyasa/obligations", r.server.base_url);
    let not_listed = c
        .post(
            &url,
            Some("alice-secret"),
            obligation("alice-token", "bob"),
            Some(&no_cert_tls()),
        )
        .await
        .unwrap();
    assert_eq!(
        not_listed.status, 401,
        "an unlisted peer's credential was taken without its certificate"
    );
    let listed = c
        .post(
            &url,
            Some("dave-secret"),
            obligation("dave-token", "bob"),
            Some(&no_cert_tls()),
        )
        .await
        .unwrap();
    assert_eq!(
        listed.status,
        200,
        "{:?}",
        String::from_utf8_lossy(&listed.body)
    );
    let _ = bob_fp;
    settle().await;
    let applied = r.applied.lock().unwrap().clone();
    assert_eq!(
        applied,
        HashMap::from([(("dave".to_string(), "dave-token".to_string()), 1)])
    );
    r.node.shutdown().await.unwrap();

    // A credential-only peer must be listed; a listed peer must have one.
    let start = |cfg: HttpConfig| abhyasa_a2a::start(agent("bob"), cfg);
    let c = HttpConfig::mtls(
        "bob",
        ident("bob"),
        vec![peer("carol", None, Some("t"))],
        profiles(),
    );
    assert!(matches!(
        start(c).await.err(),
        Some(HttpError::NoAuthentication(_))
    ));
    let mut c = HttpConfig::mtls(
        "bob",
        ident("bob"),
        vec![peer("alice", Some(ident("alice").fingerprint), None)],
        profiles(),
    );
    c.bearer_only = vec![agent("alice")];
    assert!(matches!(
        start(c).await.err(),
        Some(HttpError::BearerOnly(_))
    ));
}

// C-PA-1: an accepted connection that is not authenticated within the
// handshake timeout is closed, whether it never starts TLS or finishes it
// without a certificate and sends no credential; one source holds at most
// its share of the unauthenticated slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_pa_1_unauthenticated_connections_are_capped_and_timed_out() {
    use tokio::io::AsyncReadExt as _;
    let bob = ident("bob");
    let mut cfg = HttpConfig::mtls(
        "bob",
        bob,
        vec![peer("carol", None, Some("carol-secret"))],
        profiles(),
    );
    cfg.bearer_only = vec![agent("carol")];
    cfg.handshake_timeout = Duration::from_millis(600);
    cfg.max_handshakes_per_source = 4;
    let r = receiver_with(cfg).await;
    let addr = r.server.addr;
    let mut held = Vec::new();
    for _ in 0..12 {
        held.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut open = 0;
    for s in &mut held {
        let mut b = [0u8; 16];
        if tokio::time::timeout(Duration::from_millis(20), s.read(&mut b))
            .await
            .is_err()
        {
            open += 1;
        }
    }
    assert_eq!(
        open, 4,
        "one source held {open} unauthenticated connections"
    );
    assert_eq!(
        r.server.stats.connections_refused.load(Ordering::Relaxed),
        8
    );
    // The held ones are closed by the timeout (EOF or reset).
    for s in &mut held {
        let mut b = [0u8; 16];
        let r = tokio::time::timeout(Duration::from_secs(3), s.read(&mut b)).await;
        assert!(matches!(r, Ok(Ok(0)) | Ok(Err(_))), "{r:?}");
    }
    // A TLS client without a certificate that sends no credential is
    // closed too; carol's credential is still taken.
    let connector = tokio_rustls::TlsConnector::from(no_cert_tls());
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut tls = connector
        .connect(ServerName::try_from("bob").unwrap(), tcp)
        .await
        .unwrap();
    let mut b = [0u8; 16];
    let idle = tokio::time::timeout(Duration::from_secs(3), tls.read(&mut b)).await;
    assert!(matches!(idle, Ok(Ok(0)) | Ok(Err(_))), "{idle:?}");
    let c = client();
    let url = format!("{}/abhyasa/obligations", r.server.base_url);
    let by_carol = c
        .post(
            &url,
            Some("carol-secret"),
            obligation("carol-1", "bob"),
            Some(&no_cert_tls()),
        )
        .await
        .unwrap();
    assert_eq!(by_carol.status, 200);
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(
        r.server
            .stats
            .unauthenticated_closed
            .load(Ordering::Relaxed)
            >= 4
    );
    r.node.shutdown().await.unwrap();
}

// Plain HTTP only when explicitly configured and only on loopback; http://
// peer endpoints likewise; https:// endpoints need a pin. Typed errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_refused_unless_explicit_and_loopback() {
    let start = |cfg: HttpConfig| abhyasa_a2a::start(agent("bob"), cfg);
    let bearer = vec![peer("alice", None, Some("t"))];
    let mut c = HttpConfig::loopback("bob", bearer.clone(), profiles());
    c.plain_http_loopback = false;
    assert!(matches!(
        start(c).await.err(),
        Some(HttpError::PlainHttpNotAllowed(_))
    ));
    let mut c = HttpConfig::loopback("bob", bearer.clone(), profiles());
    c.listen = SocketAddr::from(([0, 0, 0, 0], 0));
    assert!(matches!(
        start(c).await.err(),
        Some(HttpError::PlainHttpNotAllowed(_))
    ));
    // TLS on, plain off: an http:// endpoint is refused.
    let alice = ident("alice");
    let mut p = peer("alice", Some(alice.fingerprint), None);
    p.custody_ack_endpoint = Some("http://127.0.0.1:9/abhyasa/custody_ack".into());
    let c = HttpConfig::mtls("bob", ident("bob"), vec![p], profiles());
    assert!(matches!(
        start(c).await.err(),
        Some(HttpError::BadEndpoint { .. })
    ));
    // An https:// endpoint of a peer with no pin is refused.
    let mut p = peer("carol", None, Some("t"));
    p.obligation_endpoint = Some("https://127.0.0.1:9/abhyasa/obligations".into());
    let c = HttpConfig::mtls("bob", ident("bob"), vec![p], profiles());
    assert!(matches!(
        start(c).await.err(),
        Some(HttpError::BadEndpoint { .. })
    ));
    // A peer with no way to authenticate.
    let c = HttpConfig::mtls(
        "bob",
        ident("bob"),
        vec![peer("dave", None, None)],
        profiles(),
    );
    assert!(matches!(
        start(c).await.err(),
        Some(HttpError::NoAuthentication(_))
    ));
}

fn fast_options(name: &str) -> NodeOptions {
    let mut o = NodeOptions::new(agent(name));
    o.custodian.default_profile = CustodyProfile {
        backoff: RetryBackoff {
            base: Duration::from_millis(100),
            cap: Duration::from_millis(400),
            jitter: 0.1,
        },
        ..CustodyProfile::default()
    };
    o
}

// Node to node over HTTPS with mutual TLS, no bearer credential anywhere:
// applied synchronously, and deferred-then-final through bob's pinned
// HTTPS POST to alice's /abhyasa/custody_ack (C-TR-1 over the binding).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_to_node_over_mtls_applied_and_deferred_then_final() {
    let (alice_id, bob_id) = (ident("alice"), ident("bob"));
    let a_port = loopback_port();
    let mut to_alice = peer("alice", Some(alice_id.fingerprint), None);
    to_alice.custody_ack_endpoint = Some(format!("https://127.0.0.1:{a_port}/abhyasa/custody_ack"));
    let bob = receiver("bob", bob_id.clone(), vec![to_alice]).await;
    let mut to_bob = peer("bob", Some(bob_id.fingerprint), None);
    to_bob.obligation_endpoint = Some(format!("{}/abhyasa/obligations", bob.server.base_url));
    let mut cfg = HttpConfig::mtls("alice", alice_id, vec![to_bob], profiles());
    cfg.listen = SocketAddr::from(([127, 0, 0, 1], a_port));
    let (t, _a) = abhyasa_a2a::start(agent("alice"), cfg).await.unwrap();
    let alice = Node::open(fast_options("alice"), Box::new(SimStore::new()), t)
        .await
        .unwrap();
    let ob = |id: &str, demo: Option<&str>| {
        let mut payload = json!({"decision": "revoke", "scope": format!("s-{id}")});
        if let Some(d) = demo {
            payload["demo"] = json!(d);
        }
        Obligation::builder()
            .id(id)
            .kind("anumati.consent")
            .target("bob")
            .payload(payload)
            .deadline_seconds(20)
            .max_retries(abhyasa_core::min_retries_to_span(20, 0.1, 0.4) as i64 + 2)
            .created_at(alice.now())
            .build()
            .unwrap()
    };
    let first = ob("m-1", None);
    alice.offer(first.clone()).await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), alice.outcome(first.id()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.state, TerminalState::Applied);

    let deferred = ob("m-2", Some("defer"));
    alice.offer(deferred.clone()).await.unwrap();
    let mut d = None;
    for _ in 0..300 {
        if let Some(x) = bob.stash.lock().unwrap().remove(deferred.id()) {
            d = Some(x);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    bob.node
        .complete_deferred(agent("alice"), deferred.id().clone(), d.expect("deferred"))
        .await
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), alice.outcome(deferred.id()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.state, TerminalState::Applied);
    settle().await;
    let applied = bob.applied.lock().unwrap().clone();
    assert_eq!(applied.len(), 2, "{applied:?}");
    assert!(
        applied.iter().all(|((c, _), n)| c == "alice" && *n == 1),
        "{applied:?}"
    );
    alice.shutdown().await.unwrap();
    bob.node.shutdown().await.unwrap();
}
