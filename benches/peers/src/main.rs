//! Load client for the broker side of the comparison.
//!
//! ```sh
//! peers-bench mqtt --port 18830 --qos 1 --count 50000 --json
//! peers-bench jetstream --port 14222 --count 50000 --json
//! ```
//!
//! Each run does what `abhyasa/examples/throughput.rs` does to a node pair,
//! with the broker in the middle:
//!
//! - **saturation**: `--count` messages of `--size` bytes, at most
//!   `--inflight` unconfirmed at any time; messages/s is `count` over the
//!   time from the first publish until the publisher holds every broker
//!   confirmation (MQTT PUBACK or PUBCOMP; JetStream PubAck) *and* the
//!   subscriber has received (and, for JetStream, acked) every message;
//! - **latency at a paced load**: `--rate` messages/s for `--seconds`;
//!   p50/p99/max from the publish call to the subscriber's receipt (one
//!   process, one monotonic clock: the send instant rides in the payload).
//!
//! It prints one JSON object per run with `--json` (`system`, `per_s`,
//! `p50_ms`, `p99_ms`, ...), a line of text otherwise. `benches/peers/run.sh`
//! starts the brokers and interleaves these runs with Abhyasa's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use clap::{Parser, Subcommand};
use futures_util::StreamExt;
use tokio::sync::{mpsc, Semaphore};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Parser)]
#[command(name = "peers-bench", about = "MQTT and JetStream load for the broker comparison")]
struct Args {
    #[command(subcommand)]
    system: System,
    /// Messages per saturation run.
    #[arg(long, default_value_t = 50_000, global = true)]
    count: usize,
    /// Payload bytes per message (at least 16: sequence and send instant).
    #[arg(long, default_value_t = 256, global = true)]
    size: usize,
    /// Unconfirmed messages allowed at once.
    #[arg(long, default_value_t = 512, global = true)]
    inflight: usize,
    /// Offered load of the latency run, messages/s.
    #[arg(long, default_value_t = 10_000, global = true)]
    rate: u64,
    /// Duration of the latency run, seconds (0 skips it).
    #[arg(long, default_value_t = 5, global = true)]
    seconds: u64,
    /// One JSON object instead of a line of text.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum System {
    /// MQTT 3.1.1 through a broker (mosquitto), QoS 1 or 2.
    Mqtt {
        /// Broker port on 127.0.0.1.
        #[arg(long, default_value_t = 1883)]
        port: u16,
        /// 1 (at least once) or 2 (exactly once).
        #[arg(long, default_value_t = 1)]
        qos: u8,
    },
    /// NATS JetStream: file-stored stream, durable pull consumer with
    /// explicit acks.
    Jetstream {
        /// Server port on 127.0.0.1.
        #[arg(long, default_value_t = 4222)]
        port: u16,
    },
}

#[derive(Debug, serde::Serialize)]
struct Figures {
    system: String,
    count: usize,
    size: usize,
    inflight: usize,
    per_s: f64,
    latency_rate: u64,
    latency_count: usize,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

/// A payload carrying its sequence number and send instant (ns since `base`).
fn payload(size: usize, seq: u64, base: Instant) -> Vec<u8> {
    let mut p = vec![0x5a; size.max(16)];
    p[..8].copy_from_slice(&seq.to_le_bytes());
    let nanos = u64::try_from(base.elapsed().as_nanos()).unwrap_or(u64::MAX);
    p[8..16].copy_from_slice(&nanos.to_le_bytes());
    p
}

/// The sequence number and one-way latency of a received payload.
fn receipt(p: &[u8], base: Instant) -> Option<(u64, Duration)> {
    let seq = u64::from_le_bytes(p.get(..8)?.try_into().ok()?);
    let sent = u64::from_le_bytes(p.get(8..16)?.try_into().ok()?);
    let now = u64::try_from(base.elapsed().as_nanos()).unwrap_or(u64::MAX);
    Some((seq, Duration::from_nanos(now.saturating_sub(sent))))
}

fn percentile(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)].as_secs_f64() * 1e3
}

/// What one phase (saturation or paced) measured.
struct Phase {
    elapsed: Duration,
    latencies: Vec<Duration>,
}

/// Publishes `count` messages, paced at `rate`/s when given, and waits for
/// every confirmation and every receipt.
trait Broker {
    async fn phase(&mut self, args: &Args, count: usize, rate: Option<u64>)
        -> Result<Phase, BoxError>;
}

/// Sleeps until message `i` of a paced run is due.
async fn pace(start: Instant, i: usize, rate: Option<u64>) {
    if let Some(r) = rate {
        let due = start + Duration::from_secs_f64(i as f64 / r as f64);
        tokio::time::sleep_until(due.into()).await;
    }
}

struct Mqtt {
    port: u16,
    qos: rumqttc::QoS,
    run: u32,
}

impl Broker for Mqtt {
    async fn phase(
        &mut self,
        args: &Args,
        count: usize,
        rate: Option<u64>,
    ) -> Result<Phase, BoxError> {
        use rumqttc::{AsyncClient, Event, MqttOptions, Packet};
        self.run += 1;
        let topic = format!("abhyasa/bench/{}/{}", std::process::id(), self.run);
        let base = Instant::now();
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Duration>();

        // Subscriber: a persistent session (clean_session false), so the
        // broker keeps QoS 1/2 messages for it as it would for a consumer.
        let mut so = MqttOptions::new(format!("sub-{}-{}", std::process::id(), self.run), "127.0.0.1", self.port);
        so.set_clean_session(false);
        so.set_keep_alive(Duration::from_secs(30));
        so.set_inflight(args.inflight.min(u16::MAX as usize) as u16);
        so.set_max_packet_size(1 << 20, 1 << 20);
        let (sub, mut sub_loop) = AsyncClient::new(so, args.inflight.max(16));
        sub.subscribe(&topic, self.qos).await?;
        let (sub_ready_tx, sub_ready_rx) = tokio::sync::oneshot::channel();
        let sub_task = tokio::spawn(async move {
            let mut ready = Some(sub_ready_tx);
            let mut got = 0usize;
            while got < count {
                match sub_loop.poll().await {
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        if let Some(r) = ready.take() {
                            let _ = r.send(());
                        }
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        if let Some((_, lat)) = receipt(&p.payload, base) {
                            got += 1;
                            let _ = done_tx.send(lat);
                        }
                    }
                    Ok(_) => {}
                    Err(e) => return Err::<(), BoxError>(format!("subscriber: {e}").into()),
                }
            }
            // Let the last acks reach the broker.
            let deadline = Instant::now() + Duration::from_millis(50);
            while Instant::now() < deadline {
                if tokio::time::timeout(Duration::from_millis(10), sub_loop.poll()).await.is_err() {
                    break;
                }
            }
            Ok(())
        });
        sub_ready_rx.await.map_err(|_| "subscriber never got its SUBACK")?;

        let mut po = MqttOptions::new(format!("pub-{}-{}", std::process::id(), self.run), "127.0.0.1", self.port);
        po.set_keep_alive(Duration::from_secs(30));
        po.set_inflight(args.inflight.min(u16::MAX as usize) as u16);
        po.set_max_packet_size(1 << 20, 1 << 20);
        let (publ, mut pub_loop) = AsyncClient::new(po, args.inflight.max(16));
        let qos = self.qos;
        let confirm_task = tokio::spawn(async move {
            let mut confirmed = 0usize;
            while confirmed < count {
                match pub_loop.poll().await {
                    Ok(Event::Incoming(Packet::PubAck(_))) if qos == rumqttc::QoS::AtLeastOnce => {
                        confirmed += 1
                    }
                    Ok(Event::Incoming(Packet::PubComp(_))) if qos == rumqttc::QoS::ExactlyOnce => {
                        confirmed += 1
                    }
                    Ok(_) => {}
                    Err(e) => return Err::<(), BoxError>(format!("publisher: {e}").into()),
                }
            }
            Ok(())
        });

        let start = Instant::now();
        let size = args.size;
        for i in 0..count {
            pace(start, i, rate).await;
            // `publish` waits when the client's request channel is full; the
            // event loop holds at most `inflight` unconfirmed messages.
            publ.publish(topic.as_str(), qos, false, payload(size, i as u64, base)).await?;
        }
        let mut latencies = Vec::with_capacity(count);
        while latencies.len() < count {
            match done_rx.recv().await {
                Some(l) => latencies.push(l),
                None => break,
            }
        }
        confirm_task.await??;
        let elapsed = start.elapsed();
        sub_task.await??;
        let _ = publ.disconnect().await;
        let _ = sub.disconnect().await;
        if latencies.len() < count {
            return Err(format!("subscriber received {} of {count}", latencies.len()).into());
        }
        Ok(Phase { elapsed, latencies })
    }
}

struct JetStream {
    port: u16,
    run: u32,
}

impl Broker for JetStream {
    async fn phase(
        &mut self,
        args: &Args,
        count: usize,
        rate: Option<u64>,
    ) -> Result<Phase, BoxError> {
        use jetstream::consumer::{pull, AckPolicy};
        self.run += 1;
        let name = format!("BENCH_{}_{}", std::process::id(), self.run);
        let subject = format!("bench.{}.{}", std::process::id(), self.run);
        let client = async_nats::connect(format!("127.0.0.1:{}", self.port)).await?;
        let js = jetstream::new(client);
        let stream = js
            .create_stream(jetstream::stream::Config {
                name: name.clone(),
                subjects: vec![subject.clone()],
                storage: jetstream::stream::StorageType::File,
                ..Default::default()
            })
            .await?;
        let consumer = stream
            .create_consumer(pull::Config {
                durable_name: Some(format!("{name}_C")),
                ack_policy: AckPolicy::Explicit,
                max_ack_pending: i64::try_from(args.inflight.max(1) * 4).unwrap_or(i64::MAX),
                ..Default::default()
            })
            .await?;
        let base = Instant::now();
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Duration>();
        let sub_task = tokio::spawn(async move {
            let mut messages = consumer.messages().await?;
            let mut got = 0usize;
            while got < count {
                let Some(m) = messages.next().await else {
                    return Err::<(), BoxError>("consumer stream ended".into());
                };
                let m = m?;
                if let Some((_, lat)) = receipt(&m.payload, base) {
                    m.ack().await?;
                    got += 1;
                    let _ = done_tx.send(lat);
                }
            }
            Ok(())
        });

        let permits = Arc::new(Semaphore::new(args.inflight.max(1)));
        let mut acks = Vec::with_capacity(count);
        let start = Instant::now();
        for i in 0..count {
            pace(start, i, rate).await;
            let permit = permits.clone().acquire_owned().await?;
            let fut = js
                .publish(subject.clone(), payload(args.size, i as u64, base).into())
                .await?;
            acks.push(tokio::spawn(async move {
                let r = fut.await;
                drop(permit);
                r.map(|_| ()).map_err(|e| BoxError::from(format!("publish ack: {e}")))
            }));
        }
        for a in acks {
            a.await??;
        }
        let mut latencies = Vec::with_capacity(count);
        while latencies.len() < count {
            match done_rx.recv().await {
                Some(l) => latencies.push(l),
                None => break,
            }
        }
        let elapsed = start.elapsed();
        sub_task.await??;
        let _ = js.delete_stream(&name).await;
        if latencies.len() < count {
            return Err(format!("consumer received {} of {count}", latencies.len()).into());
        }
        Ok(Phase { elapsed, latencies })
    }
}

async fn measure<B: Broker>(b: &mut B, args: &Args, system: String) -> Result<Figures, BoxError> {
    let sat = b.phase(args, args.count, None).await?;
    let paced_count = usize::try_from(args.rate.saturating_mul(args.seconds)).unwrap_or(usize::MAX);
    let mut lat = if paced_count > 0 {
        b.phase(args, paced_count, Some(args.rate)).await?.latencies
    } else {
        Vec::new()
    };
    lat.sort_unstable();
    Ok(Figures {
        system,
        count: args.count,
        size: args.size,
        inflight: args.inflight,
        per_s: args.count as f64 / sat.elapsed.as_secs_f64(),
        latency_rate: args.rate,
        latency_count: lat.len(),
        p50_ms: percentile(&lat, 0.50),
        p99_ms: percentile(&lat, 0.99),
        max_ms: lat.last().map_or(f64::NAN, |d| d.as_secs_f64() * 1e3),
    })
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    if args.size < 16 {
        return Err("--size must be at least 16 (sequence and send instant)".into());
    }
    let f = match args.system {
        System::Mqtt { port, qos } => {
            let q = match qos {
                1 => rumqttc::QoS::AtLeastOnce,
                2 => rumqttc::QoS::ExactlyOnce,
                other => return Err(format!("--qos {other}: use 1 or 2").into()),
            };
            measure(&mut Mqtt { port, qos: q, run: 0 }, &args, format!("mqtt-qos{qos}")).await?
        }
        System::Jetstream { port } => {
            measure(&mut JetStream { port, run: 0 }, &args, "jetstream".into()).await?
        }
    };
    if args.json {
        println!("{}", serde_json::to_string(&f)?);
    } else {
        println!(
            "{}: {:.0}/s ({} x {} B, {} in flight); at {}/s: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            f.system, f.per_s, f.count, f.size, f.inflight, f.latency_rate, f.p50_ms, f.p99_ms, f.max_ms
        );
    }
    Ok(())
}
