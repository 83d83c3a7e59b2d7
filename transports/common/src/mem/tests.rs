use std::time::Duration;

use abhyasa_core::wire::{Envelope, Message};
use abhyasa_core::{AgentId, ObligationId};

use super::*;
use crate::{Incoming, SendError, Transport};

fn id(s: &str) -> AgentId {
    AgentId::new(s).expect("valid agent id")
}

fn query(sender: &AgentId, n: usize) -> Envelope {
    let oid = ObligationId::new(format!("o-{n}")).expect("valid id");
    Envelope::new(sender.clone(), Message::StatusQuery(vec![oid]))
}

/// The numbers carried by the status queries in `items`.
fn numbers(items: &[Incoming]) -> Vec<usize> {
    items
        .iter()
        .filter_map(|i| match i {
            Incoming::Frame {
                envelope:
                    Envelope {
                        message: Message::StatusQuery(ids),
                        ..
                    },
                ..
            } => ids[0].as_str().strip_prefix("o-")?.parse().ok(),
            _ => None,
        })
        .collect()
}

async fn next(t: &mut Transport) -> Incoming {
    tokio::time::timeout(Duration::from_secs(5), t.incoming.recv())
        .await
        .expect("an item within 5 s")
        .expect("channel open")
}

fn drain(t: &mut Transport) -> Vec<Incoming> {
    let mut v = Vec::new();
    while let Ok(i) = t.incoming.try_recv() {
        v.push(i);
    }
    v
}

async fn pair(seed: u64) -> (MemNetwork, Transport, Transport) {
    let net = MemNetwork::new(seed);
    let mut a = net
        .join(id("a"), LinkConfig::default())
        .await
        .expect("join a");
    let mut b = net
        .join(id("b"), LinkConfig::default())
        .await
        .expect("join b");
    assert_eq!(next(&mut a).await, Incoming::Connected(id("b")));
    assert_eq!(next(&mut b).await, Incoming::Connected(id("a")));
    (net, a, b)
}

#[tokio::test]
async fn frames_round_trip_both_ways() {
    let (_net, mut a, mut b) = pair(1).await;
    a.handle
        .send(&id("b"), &query(&id("a"), 1))
        .expect("queued");
    b.handle
        .send(&id("a"), &query(&id("b"), 2))
        .expect("queued");
    assert_eq!(
        next(&mut b).await,
        Incoming::Frame {
            peer: id("a"),
            envelope: query(&id("a"), 1)
        }
    );
    assert_eq!(numbers(&[next(&mut a).await]), vec![2]);
}

#[tokio::test]
async fn send_errors_are_typed() {
    let (_net, a, _b) = pair(1).await;
    let h = &a.handle;
    assert_eq!(
        h.send(&id("zed"), &query(&id("a"), 1)),
        Err(SendError::UnknownPeer(id("zed")))
    );
    assert!(matches!(
        h.send(&id("b"), &query(&id("b"), 1)),
        Err(SendError::ForeignSender { .. })
    ));
    let big = Envelope::new(
        id("a"),
        Message::StatusQuery(
            (0..70_000)
                .map(|i| ObligationId::new(format!("obligation-{i}")).expect("id"))
                .collect(),
        ),
    );
    assert!(matches!(
        h.send(&id("b"), &big),
        Err(SendError::FrameTooLarge { max, .. }) if max == abhyasa_core::wire::DEFAULT_MAX_FRAME
    ));
}

#[tokio::test]
async fn a_full_queue_is_reported_not_blocked_on() {
    let net = MemNetwork::new(3);
    let config = LinkConfig {
        send_queue: 4,
        ..LinkConfig::default()
    };
    let a = net.join(id("a"), config.clone()).await.expect("join");
    let _b = net.join(id("b"), config).await.expect("join");
    // The pair task may drain some frames while we fill; a full queue must
    // show up long before 10 000 frames.
    let full = (0..10_000).any(|n| {
        matches!(
            a.handle.send(&id("b"), &query(&id("a"), n)),
            Err(SendError::QueueFull(_))
        )
    });
    assert!(full, "bounded queue never reported full");
}

#[tokio::test]
async fn malformed_and_unknown_version_frames_are_reported_and_the_link_survives() {
    let (net, a, mut b) = pair(1).await;
    // Garbage that is a complete frame: length 3, three bytes of junk.
    net.inject(&id("a"), &id("b"), vec![3u8, 0xff, 0xff, 0xff])
        .expect("inject");
    // A well-formed envelope claiming protocol version 2.
    let mut frame = Vec::new();
    query(&id("a"), 0).encode_frame(&mut frame);
    assert_eq!(&frame[1..3], &[0x08, 0x01], "version is the first field");
    frame[2] = 0x02;
    net.inject(&id("a"), &id("b"), frame).expect("inject");
    a.handle
        .send(&id("b"), &query(&id("a"), 7))
        .expect("queued");

    assert!(matches!(
        next(&mut b).await,
        Incoming::Malformed { peer, error: abhyasa_core::PeerError::Malformed { .. } } if peer == id("a")
    ));
    assert!(matches!(
        next(&mut b).await,
        Incoming::Malformed {
            error: abhyasa_core::PeerError::UnsupportedVersion { found: 2, .. },
            ..
        }
    ));
    assert_eq!(numbers(&[next(&mut b).await]), vec![7]);
    let stats = b.handle.stats();
    assert_eq!(
        (stats.connections, stats.malformed, stats.frames_received),
        (1, 2, 1)
    );
    assert_eq!(
        a.handle.stats().frames_sent,
        3,
        "injected frames count as sent"
    );
}

#[tokio::test]
async fn a_frame_claiming_another_sender_is_dropped_and_reported() {
    let (net, _a, mut b) = pair(1).await;
    let mut frame = Vec::new();
    query(&id("mallory"), 1).encode_frame(&mut frame);
    net.inject(&id("a"), &id("b"), frame).expect("inject");
    assert_eq!(
        next(&mut b).await,
        Incoming::Unauthorized {
            peer: id("a"),
            claimed: id("mallory")
        }
    );
}

/// Sends 0..n from a to b under `faults` and returns what b received.
async fn faulty_run(seed: u64, faults: Faults, n: usize) -> (Vec<usize>, LinkStats) {
    let (net, a, mut b) = pair(seed).await;
    net.set_faults(&id("a"), &id("b"), faults);
    for i in 0..n {
        a.handle
            .send(&id("b"), &query(&id("a"), i))
            .expect("queued");
    }
    net.settle().await;
    (numbers(&drain(&mut b)), net.stats(&id("a"), &id("b")))
}

#[tokio::test]
async fn loss_duplication_and_reordering_are_seeded_and_reproducible() {
    let faults = Faults {
        loss: 0.2,
        duplicate: 0.2,
        reorder: 0.2,
    };
    let (first, stats) = faulty_run(42, faults, 300).await;
    let (again, stats_again) = faulty_run(42, faults, 300).await;
    let (other, _) = faulty_run(43, faults, 300).await;
    assert_eq!(first, again, "same seed, same sends: same deliveries");
    assert_eq!(stats, stats_again);
    assert_ne!(first, other, "another seed draws other faults");

    // Every fault kind happened, and the counters add up.
    assert!(
        stats.lost > 20 && stats.duplicated > 20 && stats.reordered > 20,
        "{stats:?}"
    );
    assert_eq!(stats.sent, 300);
    assert_eq!(stats.delivered as usize, first.len());
    assert_eq!(stats.sent - stats.lost + stats.duplicated, stats.delivered);
    let mut distinct = first.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len() as u64, stats.sent - stats.lost);
    assert!(
        first.windows(2).any(|w| w[0] > w[1]),
        "some frame arrived out of order"
    );
    assert!(
        first.windows(2).any(|w| w[0] == w[1]),
        "some frame arrived twice"
    );
}

#[tokio::test]
async fn a_partition_drops_silently_until_healed() {
    let (net, a, mut b) = pair(5).await;
    net.partition(&id("a"), &id("b"));
    a.handle
        .send(&id("b"), &query(&id("a"), 1))
        .expect("queued: a partition is silent");
    net.settle().await;
    assert!(drain(&mut b).is_empty());
    assert_eq!(net.stats(&id("a"), &id("b")).partitioned, 1);
    net.heal(&id("a"), &id("b"));
    a.handle
        .send(&id("b"), &query(&id("a"), 2))
        .expect("queued");
    assert_eq!(numbers(&[next(&mut b).await]), vec![2]);
}

#[tokio::test]
async fn a_peer_that_leaves_is_disconnected_and_can_rejoin() {
    let (net, mut a, b) = pair(9).await;
    b.handle.shutdown().await;
    assert_eq!(next(&mut a).await, Incoming::Disconnected(id("b")));
    assert_eq!(
        a.handle.send(&id("b"), &query(&id("a"), 1)),
        Err(SendError::NotConnected(id("b")))
    );
    assert_eq!(
        b.handle.send(&id("a"), &query(&id("b"), 1)),
        Err(SendError::Closed)
    );

    let mut b = net
        .join(id("b"), LinkConfig::default())
        .await
        .expect("rejoin");
    assert_eq!(next(&mut a).await, Incoming::Connected(id("b")));
    assert_eq!(next(&mut b).await, Incoming::Connected(id("a")));
    a.handle
        .send(&id("b"), &query(&id("a"), 3))
        .expect("queued");
    assert_eq!(numbers(&[next(&mut b).await]), vec![3]);
    assert!(matches!(
        net.join(id("b"), LinkConfig::default()).await,
        Err(MemError::AlreadyJoined(_))
    ));
}

#[tokio::test]
async fn three_endpoints_are_fully_linked() {
    let net = MemNetwork::new(0);
    let mut ts = Vec::new();
    for n in ["a", "b", "c"] {
        ts.push(net.join(id(n), LinkConfig::default()).await.expect("join"));
    }
    for t in &ts {
        assert_eq!(t.handle.connected_peers().len(), 2);
    }
    ts[2]
        .handle
        .send(&id("a"), &query(&id("c"), 4))
        .expect("queued");
    net.settle().await;
    let got = drain(&mut ts[0]);
    assert!(got.contains(&Incoming::Frame {
        peer: id("c"),
        envelope: query(&id("c"), 4)
    }));
}
