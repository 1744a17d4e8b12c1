#!/usr/bin/env bash
# Issue 20: QoS 1 latency at a steady rate. One rumqttc publisher sends
# RATE QoS 1 messages per second (paced, 256 B) to one rumqttc subscriber
# for COUNT messages, over plain TCP, TLS and WebSocket, against Rosetta
# and mosquitto in the same run (a fresh broker per run), and prints each
# broker's p50/p90/p99/p99.9 end-to-end latency and Rosetta's p99 over mosquitto's
# for each transport.
#
#   bench/latency.sh [ROSETTA_BIN LOAD_BIN]
#
# Without arguments it builds both (release). Environment: RATE (default
# 1000), COUNT (default 20000: 20 s per run at 1,000/s), BROKERS (default
# "rosetta mosquitto"), MODES (default "tcp tls ws"), OUT (the JSON lines).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

if [ $# -ge 2 ]; then
  ROSETTA_BIN=$1; LOAD=$2
else
  cargo build --release --locked -p rosetta -p rosetta-load
  ROSETTA_BIN=$ROOT/target/release/rosetta; LOAD=$ROOT/target/release/rosetta-load
fi
RATE=${RATE:-1000}
COUNT=${COUNT:-20000}
BROKERS=${BROKERS:-rosetta mosquitto}
MODES=${MODES:-tcp tls ws}
OUT=${OUT:-$ROOT/bench/results/$(date -u +%F)-issue20/latency.jsonl}
mkdir -p "$(dirname "$OUT")"

source "$ROOT/bench/peers/peers.sh"
trap 'peers_stop_all; rm -rf "$BENCH_TMP"' EXIT
case " $BROKERS " in *" mosquitto "*) "$ROOT/bench/peers/setup.sh" mosquitto >/dev/null ;; esac

# A throwaway CA and a server certificate, both brokers' TLS listeners.
tls_dir=$BENCH_TMP/tls
test_tls "$tls_dir"

# start_broker NAME: sets PID and the TCP_PORT, TLS_PORT and WS_PORT it
# listens on.
start_broker() {
  case $1 in
    rosetta)
      local dir=$BENCH_TMP/rosetta
      rosetta_config "$dir"
      TLS_PORT=$(free_port)
      sed -i "s|^mqtts = \"\"|mqtts = \"127.0.0.1:$TLS_PORT\"|" "$dir/rosetta.toml"
      printf '[tls]\ncert_file = "%s"\nkey_file = "%s"\n' \
        "$tls_dir/server.crt" "$tls_dir/server.key" >> "$dir/rosetta.toml"
      "$ROSETTA_BIN" --config "$dir/rosetta.toml" > "$dir/rosetta.log" 2>&1 &
      PID=$!; PEER_PIDS+=("$PID")
      wait_port "$TLS_PORT" "$PID" 30 || { tail -20 "$dir/rosetta.log"; return 1; }
      TCP_PORT=$ROSETTA_MQTT_PORT; WS_PORT=$ROSETTA_WS_PORT ;;
    mosquitto)
      local dir=$BENCH_TMP/mosquitto
      mkdir -p "$dir"
      TCP_PORT=$(free_port); TLS_PORT=$(free_port); WS_PORT=$(free_port)
      cat > "$dir/mosquitto.conf" <<CONF
per_listener_settings false
allow_anonymous true
user root
log_dest file $dir/mosquitto.log
listener $TCP_PORT 127.0.0.1
listener $WS_PORT 127.0.0.1
protocol websockets
listener $TLS_PORT 127.0.0.1
certfile $tls_dir/server.crt
keyfile $tls_dir/server.key
CONF
      mosquitto -c "$dir/mosquitto.conf" > "$dir/stdout.log" 2>&1 &
      PID=$!; PEER_PIDS+=("$PID")
      wait_port "$TLS_PORT" "$PID" 15 || { tail -20 "$dir/mosquitto.log"; return 1; }
      wait_port "$WS_PORT" "$PID" 15 || { tail -20 "$dir/mosquitto.log"; return 1; } ;;
    *) echo "unknown broker $1" >&2; return 2 ;;
  esac
}

echo "latency: QoS 1, rumqttc 1 -> 1, $RATE msg/s paced, $COUNT messages per run, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-10s %-4s %9s %9s %9s %9s %9s %9s %s\n' broker mode msgs msg/s p50_us p90_us p99_us p999_us
declare -A P99
for mode in $MODES; do
  for broker in $BROKERS; do
    start_broker "$broker" || { echo "$broker did not start"; exit 1; }
    case $mode in
      tcp) args=(--port "$TCP_PORT") ;;
      tls) args=(--port "$TLS_PORT" --transport tls --tls-ca "$tls_dir/ca.crt") ;;
      ws) args=(--port "$WS_PORT" --transport ws) ;;
    esac
    line=$("$LOAD" --port "${args[1]}" --broker-pid "$PID" --broker-name "$broker" \
      --timeout-s $((COUNT / RATE + 60)) \
      mqtt-qos1 --client rumqttc --rate "$RATE" --count "$COUNT" "${args[@]:2}" \
      | grep '^RESULT ' || true)
    peers_stop_all
    [ -n "$line" ] || { echo "$broker $mode: no result"; continue; }
    echo "$line" >> "$OUT"
    row=$(echo "${line#RESULT }" | python3 -c '
import json, sys
r = json.load(sys.stdin)
f = lambda v: "-" if v is None else "%.0f" % v
print("%s %s %s %s %s %s %s" % (r["received"], f(r["msg_per_s"]), f(r["p50_us"]),
      f(r.get("p90_us")), f(r["p99_us"]), f(r.get("p999_us")),
      ("ERROR " + r["error"]) if r["error"] else ""))')
    read -r received rate p50 p90 p99 p999 err <<<"$row"
    printf '%-10s %-4s %9s %9s %9s %9s %9s %9s %s\n' "$broker" "$mode" "$received" "$rate" "$p50" "$p90" "$p99" "$p999" "${err:-}"
    P99[$broker-$mode]=$p99
  done
  r=${P99[rosetta-$mode]:-}; m=${P99[mosquitto-$mode]:-}
  if [ -n "$r" ] && [ -n "$m" ] && [ "$r" != - ] && [ "$m" != - ]; then
    echo "  $mode: rosetta p99 / mosquitto p99 = $(python3 -c "print('%.2f' % ($r / $m))")"
  fi
done
echo "RESULT lines appended to $OUT"
