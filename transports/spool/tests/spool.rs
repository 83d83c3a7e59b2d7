//! C-TR-3 at the spool: frames are durable before the receipt and survive a
//! restart; retries collapse to one copy; a frame is held until
//! min(deadline, max_hold) and never handed out later; handing out removes
//! nothing; quotas refuse with typed codes; only the origin may spool.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::time::Duration;

use abhyasa_core::wire::{Envelope, FrameKey, Message, RefusalCode, Sealed};
use abhyasa_core::{AgentId, Obligation, ObligationId, Timestamp};
use abhyasa_identity::generate_identity;
use abhyasa_spool::{Sealer, Spool, SpoolLimits};
use serde_json::json;

const T: Timestamp = Timestamp::from_unix_seconds(1_780_000_000);

fn agent(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

fn sealer(name: &str) -> Sealer {
    let id = agent(name);
    Sealer::new(id.clone(), generate_identity(&id).unwrap(), 1 << 20)
}

fn revoke(id: &str, target: &str, deadline: i64) -> Obligation {
    Obligation::builder()
        .id(id)
        .kind("anumati.consent")
        .target(target)
        .payload(json!({"decision": "revoke", "scope": "email.read"}))
        .deadline_seconds(deadline)
        .max_retries(64)
        .created_at(T)
        .build()
        .unwrap()
}

fn frame(s: &Sealer, id: &str, to: &str, deadline: i64) -> Sealed {
    let ob = revoke(id, to, deadline);
    let inner = Envelope::new(s.local().clone(), Message::Obligation(ob.clone()));
    s.seal(&agent(to), &inner, ob.deadline_at()).unwrap()
}

fn all(_: &AgentId) -> bool {
    true
}

fn limits() -> SpoolLimits {
    let mut l = SpoolLimits::default();
    l.max_hold = Duration::from_secs(3600);
    l
}

fn pending(spool: &Spool, now: Timestamp, to: &str) -> Vec<ObligationId> {
    let (frames, _) = spool
        .pending_for(now, &agent(to), 1000, u64::MAX, &HashSet::new())
        .unwrap();
    frames
        .iter()
        .map(|s| match Envelope::decode(&s.inner).unwrap().message {
            Message::Obligation(o) => o.id().clone(),
            other => panic!("{other:?}"),
        })
        .collect()
}

// C-TR-3: what was receipted survives the relay's restart, in order.
#[test]
fn c_tr_3_receipted_frames_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spool.redb");
    let alice = sealer("alice");
    let frames: Vec<Sealed> = (0..5)
        .map(|i| frame(&alice, &format!("ob-{i}"), "edge", 600))
        .collect();
    let keys: Vec<FrameKey> = frames.iter().map(Sealed::key).collect();
    {
        let mut spool = Spool::open(&path, limits()).unwrap();
        let r = spool.offer(T, &agent("alice"), frames, all).unwrap();
        assert_eq!(r.accepted, keys);
        assert!(r.refused.is_empty());
    } // dropped without any shutdown step
    let spool = Spool::open(&path, limits()).unwrap();
    assert_eq!(spool.depth(&agent("edge")), 5);
    for k in &keys {
        assert!(spool.contains(k));
    }
    let ids: Vec<String> = pending(&spool, T, "edge")
        .iter()
        .map(|i| i.to_string())
        .collect();
    assert_eq!(ids, ["ob-0", "ob-1", "ob-2", "ob-3", "ob-4"]);
}

// C-TR-3: retransmissions while the edge is dark collapse to one copy, in
// one batch and across batches; a different content is a separate frame.
#[test]
fn c_tr_3_retries_collapse_to_one_copy() {
    let dir = tempfile::tempdir().unwrap();
    let mut spool = Spool::open(&dir.path().join("s"), limits()).unwrap();
    let alice = sealer("alice");
    let a1 = frame(&alice, "ob-1", "edge", 600);
    let a2 = frame(&alice, "ob-1", "edge", 600); // a retry: new signature
    assert_ne!(a1.signature, a2.signature);
    assert_eq!(a1.key(), a2.key());
    let r = spool
        .offer(T, &agent("alice"), vec![a1.clone(), a2], all)
        .unwrap();
    assert_eq!(r.accepted, vec![a1.key(), a1.key()]);
    let a3 = frame(&alice, "ob-1", "edge", 600);
    spool.offer(T, &agent("alice"), vec![a3], all).unwrap();
    assert_eq!(spool.depth(&agent("edge")), 1);
    // The copy held is the first: a retransmission costs no write.
    let (held, _) = spool
        .pending_for(T, &agent("edge"), 10, u64::MAX, &HashSet::new())
        .unwrap();
    assert_eq!(held[0].signature, a1.signature);
    // Another origin's obligation with the same id is its own frame.
    let bob = sealer("bob");
    spool
        .offer(
            T,
            &agent("bob"),
            vec![frame(&bob, "ob-1", "edge", 600)],
            all,
        )
        .unwrap();
    assert_eq!(spool.depth(&agent("edge")), 2);
}

// C-TR-3: held until min(deadline, max_hold); never handed out after; the
// expiry is counted per destination.
#[test]
fn c_tr_3_frames_drop_at_min_of_deadline_and_max_hold() {
    let dir = tempfile::tempdir().unwrap();
    let mut spool = Spool::open(&dir.path().join("s"), limits()).unwrap();
    let alice = sealer("alice");
    let short = frame(&alice, "short", "edge", 60); // deadline T+60
    let long = frame(&alice, "long", "edge", 86_400); // max_hold T+3600
    spool
        .offer(T, &agent("alice"), vec![short.clone(), long.clone()], all)
        .unwrap();
    let at = |s: i64| Timestamp::from_unix_seconds(1_780_000_000 + s);
    assert_eq!(pending(&spool, at(59), "edge").len(), 2);
    // Past the deadline it is not handed out even before expire() runs.
    assert_eq!(pending(&spool, at(60), "edge").len(), 1);
    assert_eq!(spool.expire(at(60)).unwrap(), vec![short.key()]);
    assert_eq!(spool.next_expiry(), Some(at(3600)));
    assert_eq!(spool.expire(at(3600)).unwrap(), vec![long.key()]);
    assert!(spool.is_empty());
    let st = spool.status(at(3600));
    assert_eq!(st.destinations[0].expired, 2);
    // Arriving already expired is refused, not stored.
    let r = spool
        .offer(
            at(61),
            &agent("alice"),
            vec![frame(&alice, "late", "edge", 60)],
            all,
        )
        .unwrap();
    assert_eq!(r.refused[0].code, RefusalCode::Expired);
    assert!(spool.is_empty());
}

// C-TR-3: handing frames out removes nothing (a crash after a push loses
// nothing); only remove() (Delivered / a matching ack) does. The pull
// budget bounds frames and bytes, in order.
#[test]
fn c_tr_3_frames_leave_only_on_evidence_within_the_pull_budget() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let alice = sealer("alice");
    let frames: Vec<Sealed> = (0..4)
        .map(|i| frame(&alice, &format!("ob-{i}"), "edge", 600))
        .collect();
    let mut spool = Spool::open(&path, limits()).unwrap();
    spool
        .offer(T, &agent("alice"), frames.clone(), all)
        .unwrap();
    let edge = agent("edge");
    let (two, rest) = spool
        .pending_for(T, &edge, 2, u64::MAX, &HashSet::new())
        .unwrap();
    assert_eq!((two.len(), rest), (2, 2));
    assert_eq!(two[0].key(), frames[0].key());
    // A byte budget below one frame still lets the first one through.
    let (one, rest) = spool.pending_for(T, &edge, 10, 1, &HashSet::new()).unwrap();
    assert_eq!((one.len(), rest), (1, 3));
    // What was pushed on this connection is skipped.
    let skip: HashSet<FrameKey> = two.iter().map(Sealed::key).collect();
    let (next, rest) = spool.pending_for(T, &edge, 10, u64::MAX, &skip).unwrap();
    assert_eq!((next.len(), rest), (2, 0));
    assert_eq!(spool.depth(&edge), 4, "handing out removed nothing");
    assert_eq!(
        spool.remove(&[frames[0].key(), frames[1].key()]).unwrap(),
        2
    );
    drop(spool);
    let spool = Spool::open(&path, limits()).unwrap();
    assert_eq!(spool.depth(&edge), 2, "removal is durable");
}

// Quotas per destination, per origin and in total are typed refusals with
// a retry hint; only the origin itself may spool its frames.
#[test]
fn c_tr_3_quotas_and_authorization_are_typed_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let mut lim = limits();
    lim.per_destination = 2;
    lim.per_origin = 3;
    lim.total_frames = 4;
    let mut spool = Spool::open(&dir.path().join("s"), lim).unwrap();
    let alice = sealer("alice");
    let f = |i: usize, to: &str| frame(&alice, &format!("ob-{i}"), to, 600);
    let r = spool
        .offer(
            T,
            &agent("alice"),
            vec![f(0, "e1"), f(1, "e1"), f(2, "e1")],
            all,
        )
        .unwrap();
    assert_eq!(r.accepted.len(), 2);
    assert_eq!(r.refused[0].code, RefusalCode::DestinationQuota);
    assert_eq!(r.refused[0].retry_after_seconds, 30);
    let r = spool
        .offer(T, &agent("alice"), vec![f(3, "e2"), f(4, "e2")], all)
        .unwrap();
    assert_eq!(r.accepted.len(), 1);
    assert_eq!(r.refused[0].code, RefusalCode::OriginQuota);
    let bob = sealer("bob");
    let r = spool
        .offer(
            T,
            &agent("bob"),
            vec![frame(&bob, "b0", "e3", 600), frame(&bob, "b1", "e3", 600)],
            all,
        )
        .unwrap();
    assert_eq!(r.accepted.len(), 1);
    assert_eq!(r.refused[0].code, RefusalCode::SpoolFull);
    // A frame relayed in alice's name by bob is refused.
    let r = spool
        .offer(T, &agent("bob"), vec![f(9, "e3")], all)
        .unwrap();
    assert_eq!(r.refused[0].code, RefusalCode::Unauthorized);
    assert_eq!(r.refused[0].retry_after_seconds, 0);
    let r = spool
        .offer(T, &agent("alice"), vec![f(9, "nobody")], |d| {
            d.as_str() != "nobody"
        })
        .unwrap();
    assert_eq!(r.refused[0].code, RefusalCode::UnknownDestination);
    assert_eq!(spool.len(), 4);
    let st = spool.status(T);
    let e1 = st
        .destinations
        .iter()
        .find(|d| d.destination.as_str() == "e1")
        .unwrap();
    assert_eq!(e1.depth, 2);
    assert_eq!(e1.refused.get("destination_quota"), Some(&1));
}

fn big_frame(s: &Sealer, id: &str, to: &str, bytes: usize) -> Sealed {
    let ob = Obligation::builder()
        .id(id)
        .kind("anumati.consent")
        .target(to)
        .payload(json!({"decision": "revoke", "scope": "s".repeat(bytes)}))
        .deadline_seconds(600)
        .max_retries(64)
        .created_at(T)
        .build()
        .unwrap();
    let inner = Envelope::new(s.local().clone(), Message::Obligation(ob.clone()));
    s.seal(&agent(to), &inner, ob.deadline_at()).unwrap()
}

// C-PA-2: quotas per origin are in bytes as well as frames. A tenant
// sending large frames is refused `origin_quota` once it holds its bytes,
// long before the spool is full, and another tenant's frames are still
// taken; what the first tenant had spooled stays.
#[test]
fn c_pa_2_one_tenant_cannot_fill_the_spool_with_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let mut l = limits();
    // Frames of ~51 KB (a 50 000-byte payload, sealed): four fit in
    // 230 000 bytes, a fifth does not; the spool holds 1 MiB.
    l.per_origin_bytes = 230_000;
    l.total_bytes = 1 << 20;
    let mut spool = Spool::open(&dir.path().join("spool.redb"), l).unwrap();
    let (greedy, other) = (sealer("greedy"), sealer("other"));
    let frames: Vec<Sealed> = (0..20)
        .map(|i| big_frame(&greedy, &format!("big-{i}"), "edge", 50_000))
        .collect();
    let r = spool.offer(T, &agent("greedy"), frames, all).unwrap();
    // The rest are refused by bytes (the frame quota, 100 000, is far
    // away), though the spool has room for more than twice as much.
    assert_eq!(r.accepted.len(), 4, "{r:?}");
    assert_eq!(r.refused.len(), 16);
    assert!(r
        .refused
        .iter()
        .all(|x| x.code == RefusalCode::OriginQuota && x.retry_after_seconds > 0));
    let more = big_frame(&greedy, "big-later", "edge", 50_000);
    let r = spool.offer(T, &agent("greedy"), vec![more], all).unwrap();
    assert_eq!(r.refused[0].code, RefusalCode::OriginQuota, "{r:?}");
    // The other tenant still gets its frames in.
    let small = frame(&other, "small-1", "edge", 600);
    let big = big_frame(&other, "big-other", "edge", 50_000);
    let r = spool
        .offer(T, &agent("other"), vec![small, big], all)
        .unwrap();
    assert_eq!(r.accepted.len(), 2, "{r:?}");
    assert_eq!(pending(&spool, T, "edge").len(), 6);
}

// C-PA-3: the spool file is owner-only: the frames in it are signed, not
// encrypted.
#[cfg(unix)]
#[test]
fn c_pa_3_spool_file_is_owner_only() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spool.redb");
    drop(Spool::open(&path, limits()).unwrap());
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{mode:o}");
    // An existing file that was readable by others is made owner-only.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    drop(Spool::open(&path, limits()).unwrap());
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{mode:o}");
}
