//! The fuzz targets' seed corpora (`fuzz/corpus/<target>/`, C-SD-5).
//!
//! `seeds()` makes them: a few valid inputs per target (`ok-*`: each must
//! be accepted by the decoder its target reads it with) and edge inputs
//! (`edge-*`: limits, truncations, tampering; any answer but a panic).
//! `write_fuzz_seeds` (ignored) writes them:
//!
//! ```sh
//! cargo test -p abhyasa-cli --test fuzz_seeds -- --ignored write_fuzz_seeds
//! ```
//!
//! `ok_seeds_are_accepted` holds the committed `ok-*` seeds to it, so a
//! format change that leaves a corpus rejecting its own valid inputs (and
//! the fuzzer starting shallow) fails here first.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use abhyasa_a2a::card::{kind_profile, AbhyasaServiceRef, EXTENSION_URI};
use abhyasa_a2a::message::{RpcRequest, SendMessage};
use abhyasa_cli::fuzzing::{read_config, read_control_request};
use abhyasa_core::wire::{
    DedupKey, Envelope, FrameDecoder, FrameKey, Message, ProtocolError, Refusal, RefusalCode,
    RelayMessage, RelayReceipt, StatusReply, DEFAULT_MAX_FRAME,
};
use abhyasa_core::{
    AckStatus, AgentId, CustodyAck, DeclineReason, Kind, KindProfile, Obligation, ObligationId,
    Payload, RetryBackoff, Timestamp,
};
use abhyasa_identity::{generate_identity, Fingerprint, PeerPin};
use abhyasa_spool::{Opener, Sealer};
use abhyasa_ws::fuzzing::HelloHarness;
use bytes::BytesMut;
use serde_json::{json, Value};

const T: Timestamp = Timestamp::from_unix_seconds(1_780_000_000);

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus")
}

fn agent(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

fn obligation(id: &str, target: &str, payload: Value) -> Obligation {
    Obligation::builder()
        .id(id)
        .kind("anumati.consent")
        .target(target)
        .payload(payload)
        .deadline_seconds(3600)
        .max_retries(64)
        .created_at(T)
        .build()
        .unwrap()
}

fn ob() -> Obligation {
    obligation(
        "ob-0001",
        "bob",
        json!({"decision": "revoke", "scope": "email.read"}),
    )
}

fn acks() -> Vec<CustodyAck> {
    let o = ob();
    let id = o.id().clone();
    let mut deferred = CustodyAck::new(
        id.clone(),
        agent("bob"),
        AckStatus::Deferred,
        T,
        Some(o.digest()),
    );
    deferred.detail = Some("waiting for the principal".into());
    deferred.receiver_instance = Some("bob-1".into());
    vec![
        CustodyAck::new(
            id.clone(),
            agent("bob"),
            AckStatus::Applied,
            T,
            Some(o.digest()),
        ),
        CustodyAck::declined(
            id,
            agent("bob"),
            T,
            Some(o.digest()),
            DeclineReason::Conflict,
            Some("obligation id already used with another digest".into()),
        ),
        deferred,
    ]
}

fn profile() -> KindProfile {
    kind_profile(
        Kind::new("anumati.consent").unwrap(),
        "https://bob.example/abhyasa/obligations",
        300,
        &RetryBackoff::DEFAULT,
    )
    .unwrap()
}

/// Envelopes of every message type but relay ones.
fn envelopes() -> Vec<(&'static str, Envelope)> {
    let o = ob();
    let alice = agent("alice");
    vec![
        (
            "obligation",
            Envelope::new(alice.clone(), Message::Obligation(o.clone())),
        ),
        ("acks", Envelope::new(agent("bob"), Message::Acks(acks()))),
        (
            "status-query",
            Envelope::new(
                alice.clone(),
                Message::StatusQuery(vec![o.id().clone(), ObligationId::new("ob-0002").unwrap()]),
            ),
        ),
        (
            "status-reply",
            Envelope::new(
                agent("bob"),
                Message::StatusReply(StatusReply {
                    target: agent("bob"),
                    known: acks()[..1].to_vec(),
                    unknown: vec![ObligationId::new("ob-0002").unwrap()],
                }),
            ),
        ),
        (
            "error",
            Envelope::new(
                agent("bob"),
                Message::Error(ProtocolError {
                    code: abhyasa_core::wire::ErrorCode::Overloaded,
                    obligation_id: Some(o.id().clone()),
                    digest: Some(o.digest()),
                    message: "try later".into(),
                }),
            ),
        ),
    ]
}

/// Relay envelopes: a sealed frame (signed with a fresh identity), a
/// receipt, pull, pull-done and delivered.
fn relay_envelopes() -> Vec<(&'static str, Envelope)> {
    let alice = agent("alice");
    let identity = generate_identity(&alice).unwrap();
    let sealer = Sealer::new(alice.clone(), identity, DEFAULT_MAX_FRAME);
    let inner = Envelope::new(alice.clone(), Message::Obligation(ob()));
    let sealed = sealer.seal(&agent("bob"), &inner, T).unwrap();
    let key = sealed.key();
    let other = FrameKey::of(
        &alice,
        &agent("carol"),
        &DedupKey::new("k", b"status-query").unwrap(),
    );
    let relay = agent("relay-1");
    vec![
        (
            "sealed",
            Envelope::new(
                alice.clone(),
                Message::Relay(RelayMessage::Sealed(Box::new(sealed))),
            ),
        ),
        (
            "receipt",
            Envelope::new(
                relay.clone(),
                Message::Relay(RelayMessage::Receipt(RelayReceipt {
                    accepted: vec![key],
                    refused: vec![Refusal {
                        key: other,
                        code: RefusalCode::DestinationQuota,
                        retry_after_seconds: 30,
                    }],
                })),
            ),
        ),
        (
            "pull",
            Envelope::new(
                agent("bob"),
                Message::Relay(RelayMessage::Pull {
                    max_frames: 64,
                    max_bytes: 1 << 20,
                }),
            ),
        ),
        (
            "pull-done",
            Envelope::new(
                relay,
                Message::Relay(RelayMessage::PullDone { remaining: 3 }),
            ),
        ),
        (
            "delivered",
            Envelope::new(
                agent("bob"),
                Message::Relay(RelayMessage::Delivered(vec![key, other])),
            ),
        ),
    ]
}

fn framed(envs: &[&Envelope]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in envs {
        e.encode_frame(&mut out);
    }
    out
}

fn config_sample() -> String {
    let fp = "3f".repeat(32);
    format!(
        r#"agent = "alice"
listen = "0.0.0.0:7400"
store = "log"
retention_seconds = 604800
backoff_base_ms = 1000
backoff_cap_ms = 64000
backoff_jitter = 0.1
decline_policy = "apply_safe"
card_deadline_seconds = 300

[kind_decline_policy]
"anumati.consent" = "surface"

[http]
listen = "127.0.0.1:7443"
public_url = "https://alice.example:7443"

[[peers]]
agent = "bob"
fingerprint = "{fp}"
addr = "192.0.2.7:7400"
via = "relay-1"

[[peers]]
agent = "carol"
fingerprint = "{}"
transport = "http"
url = "https://192.0.2.8:7443"
token = "secret-token"

[[peers]]
agent = "relay-1"
fingerprint = "{}"
transport = "ws"
url = "ws://192.0.2.9:7501/"
"#,
        "9a".repeat(32),
        "5c".repeat(32)
    )
}

/// A log store's log (generation 0, grown commit by commit) holding
/// `n` commits of rows shaped like the engine's.
fn store_log(n: usize) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let options = abhyasa_store::LogOptions {
        preallocate_bytes: 0,
        ..abhyasa_store::LogOptions::default()
    };
    let mut s = abhyasa_store::LogStore::open_with(dir.path(), options).unwrap();
    for i in 0..n {
        let id = format!("ob-{i:04}");
        let value = format!("{{\"obligation\":\"{id}\",\"scope\":\"email.read\"}}");
        s.plant_raw("custody_pending", id.as_bytes(), Some(value.as_bytes()))
            .unwrap();
    }
    s.plant_raw("custody_pending", b"ob-0000", None).unwrap();
    drop(s);
    std::fs::read(dir.path().join("log-0")).unwrap()
}

/// Every seed: (target, file name, bytes).
fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut s: Vec<(&'static str, String, Vec<u8>)> = Vec::new();
    let mut add = |t: &'static str, name: &str, b: Vec<u8>| s.push((t, name.to_string(), b));
    let envs = envelopes();
    let relays = relay_envelopes();

    // frame_decoder: two bytes (frame limit, chunk size), then a stream.
    let all: Vec<&Envelope> = envs.iter().chain(&relays).map(|(_, e)| e).collect();
    let stream = framed(&all);
    add(
        "frame_decoder",
        "ok-stream",
        [&[0xff, 0x40][..], &stream].concat(),
    );
    add(
        "frame_decoder",
        "edge-small-limit",
        [&[0x10, 0x01][..], &stream[..200]].concat(),
    );
    add(
        "frame_decoder",
        "edge-truncated",
        [&[0xff, 0x07][..], &stream[..stream.len() - 3]].concat(),
    );
    add(
        "frame_decoder",
        "edge-huge-length",
        vec![0xff, 0x10, 0xff, 0xff, 0xff, 0xff, 0x0f],
    );
    // envelope_decode and relay_frames: one envelope, no length prefix.
    for (name, e) in &envs {
        add("envelope_decode", &format!("ok-{name}"), e.encode());
    }
    for (name, e) in &relays {
        add("relay_frames", &format!("ok-{name}"), e.encode());
    }
    let sealed = relays[0].1.encode();
    let mut tampered = sealed.clone();
    let n = tampered.len();
    tampered[n - 1] ^= 1;
    add("relay_frames", "edge-sealed-bad-signature", tampered);
    add(
        "relay_frames",
        "edge-sealed-truncated",
        sealed[..n / 2].to_vec(),
    );
    // JSON decoders.
    for (i, o) in [
        ob(),
        obligation(
            "ob-0002",
            "carol",
            json!({"nested": {"list": [1, 2.5, -3, "x", null, true]}}),
        ),
    ]
    .iter()
    .enumerate()
    {
        add(
            "obligation_json",
            &format!("ok-{i}"),
            o.to_json().into_bytes(),
        );
    }
    add(
        "obligation_json",
        "edge-v1-without-digest",
        br#"{"obligation_id":"ob-9","kind":"anumati.consent","target":"bob","payload":{},"deadline_seconds":1,"max_retries":0,"created_at":"2026-06-09T12:00:00.123456789+05:30","sequence":18446744073709551615}"#.to_vec(),
    );
    for (i, a) in acks().iter().enumerate() {
        add(
            "custody_ack_json",
            &format!("ok-{i}"),
            a.to_json().into_bytes(),
        );
    }
    add(
        "kind_profile_json",
        "ok-consent",
        profile().to_json_value().to_string().into_bytes(),
    );
    add(
        "kind_profile_json",
        "edge-huge-numbers",
        br#"{"kind":"anumati.consent","obligation_endpoint":"https://x","custody_deadline_seconds":1e308,"max_retries":18446744073709551616,"backoff":{"base_ms":0,"cap_ms":-1,"jitter":2}}"#.to_vec(),
    );
    add(
        "payload_json",
        "ok-object",
        br#"{"decision":"revoke","scope":"email.read","n":[0,-0.0,1e-7,1.5e300,"\u00e9\ud83d\ude00"]}"#.to_vec(),
    );
    add(
        "payload_json",
        "edge-deep",
        [b"[".repeat(200), b"]".repeat(200)].concat(),
    );
    // ws_hello: the honest challenge, hello and welcome of one exchange.
    // Only the challenge carries no signature: the hello and welcome are
    // signed for that exchange's keys and nonces, and another run's
    // harness reads them as the fakes they then are.
    let h = HelloHarness::new().unwrap();
    for (name, m) in ["ok-challenge", "edge-hello", "edge-welcome"]
        .iter()
        .zip(h.valid_messages())
    {
        add("ws_hello", name, m.to_vec());
    }
    // a2a_bodies.
    let meta = json!({ EXTENSION_URI: ob().to_json_value() });
    let message = json!({
        "messageId": "m-1", "contextId": "c-1", "role": "ROLE_USER",
        "parts": [{"text": "obligation"}],
        "extensions": [EXTENSION_URI], "metadata": meta,
    });
    add(
        "a2a_bodies",
        "ok-jsonrpc-1.0",
        json!({"jsonrpc": "2.0", "id": 7, "method": "SendMessage", "params": {"message": message}})
            .to_string()
            .into_bytes(),
    );
    add(
        "a2a_bodies",
        "ok-jsonrpc-0.3",
        json!({"jsonrpc": "2.0", "id": "r-1", "method": "message/send",
               "params": {"message": {"messageId": "m-2", "kind": "message", "role": "user",
                                      "parts": [{"kind": "text", "text": "x"}],
                                      "extensions": [EXTENSION_URI], "metadata": meta}}})
        .to_string()
        .into_bytes(),
    );
    add(
        "a2a_bodies",
        "ok-rest",
        json!({ "message": message }).to_string().into_bytes(),
    );
    add("a2a_bodies", "ok-obligation", ob().to_json().into_bytes());
    let card =
        AbhyasaServiceRef::new("https://bob.example/abhyasa/custody_ack", vec![profile()]).unwrap();
    add(
        "a2a_bodies",
        "ok-card-params",
        card.to_json_value().to_string().into_bytes(),
    );
    add(
        "a2a_bodies",
        "edge-header",
        format!("1.0, {EXTENSION_URI} ,, 0.3.1").into_bytes(),
    );
    // control_request: one line per op.
    let ob_v = ob().to_json_value();
    for (name, req) in [
        (
            "offer",
            json!({"op": "offer", "obligation": ob_v, "wait": true}),
        ),
        ("status", json!({"op": "status", "id": "ob-0001"})),
        (
            "list",
            json!({"op": "list", "state": "pending", "limit": 10, "after": "ob-0001"}),
        ),
        ("inbox", json!({"op": "inbox"})),
        (
            "escalations",
            json!({"op": "escalations", "limit": 5, "after": 12, "decisions_after": "ob-1"}),
        ),
        (
            "decide",
            json!({"op": "decide", "key": "anumati.consent/alice/email.read", "decision": "withheld", "sequence": 3}),
        ),
        (
            "resolve",
            json!({"op": "resolve", "obligation_id": "ob-0001", "resolution": "apply_safe"}),
        ),
        ("metrics", json!({"op": "metrics"})),
        ("authorizations", json!({"op": "authorizations"})),
        ("leases", json!({"op": "leases"})),
    ] {
        add(
            "control_request",
            &format!("ok-{name}"),
            format!("{req}\n").into_bytes(),
        );
    }
    add(
        "control_request",
        "edge-unknown-field",
        br#"{"op":"status","id":"ob-1","extra":1}"#.to_vec(),
    );
    // config_toml.
    // log_store_decode: a log as a node writes it, and the faults of the
    // damage table over it.
    let log = store_log(6);
    add("log_store_decode", "ok-log", log.clone());
    add("log_store_decode", "ok-log-one-commit", store_log(1));
    let mut flipped = log.clone();
    flipped[log.len() / 2] ^= 0x10;
    add("log_store_decode", "edge-bit-flip", flipped);
    add(
        "log_store_decode",
        "edge-torn",
        log[..log.len() - 7].to_vec(),
    );
    let mut zeroed = log.clone();
    let mid = log.len() / 2;
    zeroed[mid..(mid + 64).min(log.len())].fill(0);
    add("log_store_decode", "edge-zeroed", zeroed);
    add("log_store_decode", "edge-header-only", log[..64].to_vec());
    add("config_toml", "ok-minimal", b"agent = \"alice\"\n".to_vec());
    add("config_toml", "ok-full", config_sample().into_bytes());
    add(
        "config_toml",
        "ok-postgres",
        b"agent = \"alice\"\nstore = \"postgres\"\npostgres_url = \"postgres://u:p@127.0.0.1/db\"\npostgres_lease_ms = 300\npostgres_standby = true\npostgres_holder = \"host-a\"\n".to_vec(),
    );
    add(
        "config_toml",
        "edge-bad-key",
        "agent = \"alice\"\nbackoff_jitter = 1.5\n[[peers]]\nagent = \"é\"\nfingerprint = \"zz\"\n"
            .as_bytes()
            .to_vec(),
    );
    s
}

#[test]
#[ignore = "writes fuzz/corpus; run by hand after a format change"]
fn write_fuzz_seeds() {
    for (target, name, bytes) in seeds() {
        let dir = corpus_dir().join(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

/// Whether `bytes` is accepted by the decoder fuzz target `target` reads
/// it with first.
fn accepted(target: &str, bytes: &[u8]) -> Result<(), String> {
    let s = || std::str::from_utf8(bytes).map_err(|e| e.to_string());
    match target {
        "frame_decoder" => {
            let mut dec = FrameDecoder::new(DEFAULT_MAX_FRAME);
            let mut buf = BytesMut::from(&bytes[2..]);
            let mut n = 0;
            while let Some(r) = dec.decode(&mut buf) {
                r.map_err(|e| e.to_string())?;
                n += 1;
            }
            if n == 0 || !buf.is_empty() {
                return Err(format!("{n} frames, {} bytes left", buf.len()));
            }
            Ok(())
        }
        "envelope_decode" => Envelope::decode(bytes)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        "relay_frames" => {
            let env = Envelope::decode(bytes).map_err(|e| e.to_string())?;
            match env.message {
                Message::Relay(RelayMessage::Sealed(s)) => {
                    let pin = PeerPin {
                        agent: s.origin.clone(),
                        fingerprint: Fingerprint::of(&s.origin_cert),
                    };
                    Opener::new(s.destination.clone(), [&pin])
                        .open(&s)
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                }
                Message::Relay(_) => Ok(()),
                other => Err(format!("not a relay message: {other:?}")),
            }
        }
        "obligation_json" => Obligation::from_json(bytes)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        "custody_ack_json" => CustodyAck::from_json(bytes)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        "kind_profile_json" => {
            let m = abhyasa_core::json::parse_object(bytes).map_err(|e| e.to_string())?;
            KindProfile::from_json_map(&m)
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
        "payload_json" => Payload::from_json_bytes(bytes)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        "ws_hello" => HelloHarness::new()
            .and_then(|h| h.client_reads_challenge(bytes))
            .map_err(|e| e.to_string()),
        "a2a_bodies" => {
            if let Ok(req) = RpcRequest::parse(bytes) {
                return SendMessage::from_params(&req.params, false)
                    .map(|_| ())
                    .map_err(|e| e.to_string());
            }
            if Obligation::from_json(bytes).is_ok() || AbhyasaServiceRef::from_json(bytes).is_ok() {
                return Ok(());
            }
            let m: serde_json::Map<String, Value> =
                serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
            SendMessage::from_params(&m, false)
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
        "control_request" => match read_control_request(bytes) {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err("a blank line".into()),
            Err(e) => Err(format!("{e:?}")),
        },
        "config_toml" => read_config(s()?).map(|_| ()),
        "log_store_decode" => {
            abhyasa_store::fuzzing::log_store_decode(bytes)?;
            match abhyasa_store::fuzzing::log_store_commits(bytes)? {
                0 => Err("no commit".into()),
                _ => Ok(()),
            }
        }
        other => Err(format!("no decoder known for target {other}")),
    }
}

// C-SD-5: the seed corpora start each fuzz target on inputs its decoder
// accepts.
#[test]
fn ok_seeds_are_accepted() {
    let mut per_target: BTreeMap<String, usize> = BTreeMap::new();
    for entry in std::fs::read_dir(corpus_dir()).unwrap() {
        let dir = entry.unwrap().path();
        let target = dir.file_name().unwrap().to_string_lossy().into_owned();
        let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for path in names {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if !name.starts_with("ok-") {
                continue;
            }
            let bytes = std::fs::read(&path).unwrap();
            if let Err(e) = accepted(&target, &bytes) {
                panic!("seed {target}/{name} is not accepted: {e}");
            }
            *per_target.entry(target.clone()).or_default() += 1;
        }
    }
    // Every target this file writes seeds for has valid ones committed.
    for (target, name, _) in seeds() {
        if name.starts_with("ok-") {
            assert!(
                per_target.contains_key(target),
                "no ok- seed committed for {target} (run write_fuzz_seeds)"
            );
        }
    }
}
