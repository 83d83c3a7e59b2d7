#!/usr/bin/env bash
# The broker comparison, in one run on one machine.
#
#   benches/peers/run.sh                       # 3 rounds, 50,000 x 256 B, 512 in flight
#   ROUNDS=5 COUNT=100000 benches/peers/run.sh
#
# Starts mosquitto (MQTT, persistence on) and nats-server (JetStream, file
# store) on loopback with temporary directories — installing the Debian
# packages when they are missing — then interleaves, round by round:
#   Abhyasa  cargo run --release -p abhyasa --example throughput -- --store "$STORE" --json (default log)
#   MQTT     QoS 1 and QoS 2 through mosquitto (benches/peers, rumqttc)
#   NATS     JetStream publish + durable pull consumer with explicit acks
# and prints one table (medians over the rounds) with Abhyasa's ratio to each.
# It is a benchmark: not part of `cargo test` or CI. Run it on a quiet machine.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
ROUNDS="${ROUNDS:-3}"
COUNT="${COUNT:-50000}"
SIZE="${SIZE:-256}"
INFLIGHT="${INFLIGHT:-512}"
RATE="${RATE:-10000}"
SECONDS_PACED="${SECONDS_PACED:-5}"
STORE="${STORE:-log}"
MQTT_PORT="${MQTT_PORT:-18830}"
NATS_PORT="${NATS_PORT:-14222}"

need() { command -v "$1" >/dev/null 2>&1; }
if ! need mosquitto || ! need nats-server; then
    echo "installing mosquitto and nats-server (Debian packages)" >&2
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q mosquitto nats-server >/dev/null
fi
export PATH="$PATH:/usr/sbin"

WORK="$(mktemp -d)"
PIDS=()
cleanup() {
    for p in "${PIDS[@]:-}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# mosquitto: persistence on (its default autosave, no fsync per message),
# limits raised so neither the inflight window nor the queue drops anything.
mkdir -p "$WORK/mosquitto"
cat > "$WORK/mosquitto.conf" <<EOF
listener $MQTT_PORT 127.0.0.1
allow_anonymous true
persistence true
persistence_location $WORK/mosquitto/
max_inflight_messages $INFLIGHT
max_queued_messages 0
max_queued_bytes 0
log_dest none
EOF
mosquitto -c "$WORK/mosquitto.conf" &
PIDS+=($!)

# nats-server: JetStream with the file store (its default sync_interval).
nats-server -a 127.0.0.1 -p "$NATS_PORT" -js -sd "$WORK/nats" >"$WORK/nats.log" 2>&1 &
PIDS+=($!)

echo "building (release): the throughput example and benches/peers" >&2
cargo build --release -q --manifest-path "$ROOT/Cargo.toml" -p abhyasa --example throughput
cargo build --release -q --manifest-path "$ROOT/benches/peers/Cargo.toml"
THROUGHPUT="$ROOT/target/release/examples/throughput"
PEERS="$ROOT/benches/peers/target/release/peers-bench"
sleep 1

COMMON=(--count "$COUNT" --rate "$RATE" --seconds "$SECONDS_PACED" --json)
PEER_ARGS=("${COMMON[@]}" --size "$SIZE" --inflight "$INFLIGHT")
RESULTS="$WORK/results.jsonl"
for r in $(seq 1 "$ROUNDS"); do
    echo "round $r/$ROUNDS" >&2
    "$THROUGHPUT" --store "$STORE" --concurrency "$INFLIGHT" "${COMMON[@]}" \
        | sed 's/^{/{"system":"abhyasa",/' >> "$RESULTS"
    "$PEERS" mqtt --port "$MQTT_PORT" --qos 1 "${PEER_ARGS[@]}" >> "$RESULTS"
    "$PEERS" mqtt --port "$MQTT_PORT" --qos 2 "${PEER_ARGS[@]}" >> "$RESULTS"
    "$PEERS" jetstream --port "$NATS_PORT" "${PEER_ARGS[@]}" >> "$RESULTS"
done

# `mosquitto -h` exits non-zero after printing its version: keep going.
MOSQ_V="$( (mosquitto -h 2>/dev/null || true) | head -1 | awk '{print $3}')"
NATS_V="$( (nats-server --version 2>/dev/null || true) | awk '{print $2}')"
python3 - "$RESULTS" "$ROUNDS" "$COUNT" "$SIZE" "$INFLIGHT" "$RATE" "$MOSQ_V" "$NATS_V" "$STORE" <<'EOF'
import json, statistics, sys
path, rounds, count, size, inflight, rate, mosq, nats, store = sys.argv[1:]
rows = [json.loads(l) for l in open(path) if l.strip()]
def med(system, field):
    v = [r[field] for r in rows if r["system"] == system]
    return statistics.median(v) if v else float("nan")
def spread(system, field):
    v = [r[field] for r in rows if r["system"] == system]
    return f"{min(v):,.0f}–{max(v):,.0f}" if v else "-"
ab_c = med("abhyasa", "custody_per_s")
ab_b = med("abhyasa", "best_effort_per_s")
print(f"\n{rounds} interleaved rounds, {int(count):,} x {size} B, {inflight} in flight; "
      f"latency at {int(rate):,}/s paced (medians; per-round range in brackets)\n")
print("| system | per second | Abhyasa custody ÷ it | p50 / p99 ms |")
print("|---|---:|---:|---|")
print(f"| Abhyasa custody ({store}, QUIC, fsync both sides) | {ab_c:,.0f} [{spread('abhyasa','custody_per_s')}] | 1.00 | "
      f"{med('abhyasa','p50_ms'):.2f} / {med('abhyasa','p99_ms'):.2f} |")
print(f"| Abhyasa best-effort | {ab_b:,.0f} [{spread('abhyasa','best_effort_per_s')}] | {ab_c/ab_b:.2f} | — |")
names = {"mqtt-qos1": f"mosquitto {mosq}, MQTT QoS 1", "mqtt-qos2": f"mosquitto {mosq}, MQTT QoS 2",
         "jetstream": f"NATS JetStream {nats}, file store, explicit acks"}
for s, label in names.items():
    m = med(s, "per_s")
    print(f"| {label} | {m:,.0f} [{spread(s,'per_s')}] | {ab_c/m:.2f} | "
          f"{med(s,'p50_ms'):.2f} / {med(s,'p99_ms'):.2f} |")
print(f"\ncustody overhead (best-effort ÷ custody): {ab_b/ab_c:.2f}")
cold = [r["custody_cold_per_s"] for r in rows
        if r["system"] == "abhyasa" and r.get("custody_cold_per_s") is not None]
if cold:
    print(f"Abhyasa custody measured after a warm-up run of the same size (the brokers run "
          f"warm from their first round); the warm-up itself, a fresh process's first run: "
          f"{statistics.median(cold):,.0f}/s [{min(cold):,.0f}–{max(cold):,.0f}]")
EOF
