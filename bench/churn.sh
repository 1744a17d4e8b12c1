#!/usr/bin/env bash
# Issue 20: connection churn. MQTT 3.1.1 connect/CONNACK/DISCONNECT cycles
# for DURATION_S seconds with CONCURRENCY cycles in flight, against Rosetta
# and mosquitto in the same run, in plain TCP and over TLS (every TLS
# cycle a full handshake: the load tool never resumes a session), with the
# broker's RSS before, at its peak and SETTLE_MS after.
#
#   bench/churn.sh [ROSETTA_BIN LOAD_BIN]
#
# Without arguments it builds both (release). Environment: DURATION_S
# (default 60), CONCURRENCY (default 64), SETTLE_MS (default 3000),
# BROKERS (default "rosetta mosquitto"), MODES (default "tcp tls").
# Output: a table, and RESULT lines in $OUT (default
# bench/results/<date>-issue20/churn.jsonl).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

if [ $# -ge 2 ]; then
  ROSETTA_BIN=$1; LOAD=$2
else
  cargo build --release --locked -p rosetta -p rosetta-load
  ROSETTA_BIN=$ROOT/target/release/rosetta; LOAD=$ROOT/target/release/rosetta-load
fi
DURATION_S=${DURATION_S:-60}
CONCURRENCY=${CONCURRENCY:-64}
SETTLE_MS=${SETTLE_MS:-3000}
BROKERS=${BROKERS:-rosetta mosquitto}
MODES=${MODES:-tcp tls}
OUT=${OUT:-$ROOT/bench/results/$(date -u +%F)-issue20/churn.jsonl}
mkdir -p "$(dirname "$OUT")"

# shellcheck source=bench/peers/peers.sh
source "$ROOT/bench/peers/peers.sh"
trap 'peers_stop_all; rm -rf "$BENCH_TMP"' EXIT
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
case " $BROKERS " in *" mosquitto "*) "$ROOT/bench/peers/setup.sh" mosquitto >/dev/null ;; esac

# A CA and a server certificate, both brokers' TLS listeners.
tls_dir=$BENCH_TMP/tls
test_tls "$tls_dir"

# start_broker NAME: sets PLAIN_PORT, TLS_PORT and PID of a fresh broker.
start_broker() {
  case $1 in
    rosetta)
      local dir=$BENCH_TMP/rosetta
      rosetta_config "$dir"
      TLS_PORT=$(free_port)
      # The generated file has one [listeners] table; give it a TLS port.
      sed -i "s|^mqtts = \"\"|mqtts = \"127.0.0.1:$TLS_PORT\"|" "$dir/rosetta.toml"
      printf '[tls]\ncert_file = "%s"\nkey_file = "%s"\n' \
        "$tls_dir/server.crt" "$tls_dir/server.key" >> "$dir/rosetta.toml"
      "$ROSETTA_BIN" --config "$dir/rosetta.toml" > "$dir/rosetta.log" 2>&1 &
      PID=$!; PEER_PIDS+=("$PID")
      wait_port "$TLS_PORT" "$PID" 30 || { tail -20 "$dir/rosetta.log"; return 1; }
      PLAIN_PORT=$ROSETTA_MQTT_PORT ;;
    mosquitto)
      local dir=$BENCH_TMP/mosquitto
      mkdir -p "$dir"
      PLAIN_PORT=$(free_port); TLS_PORT=$(free_port)
      cat > "$dir/mosquitto.conf" <<CONF
per_listener_settings false
allow_anonymous true
user root
log_dest file $dir/mosquitto.log
listener $PLAIN_PORT 127.0.0.1
listener $TLS_PORT 127.0.0.1
certfile $tls_dir/server.crt
keyfile $tls_dir/server.key
CONF
      mosquitto -c "$dir/mosquitto.conf" > "$dir/stdout.log" 2>&1 &
      PID=$!; PEER_PIDS+=("$PID")
      wait_port "$TLS_PORT" "$PID" 15 || { tail -20 "$dir/mosquitto.log"; return 1; } ;;
    *) echo "unknown broker $1" >&2; return 2 ;;
  esac
}

echo "churn: $DURATION_S s per run, $CONCURRENCY cycles in flight, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-10s %-4s %10s %10s %9s %9s %9s %9s %9s %s\n' broker mode cycles conn/s slowest/s p50_us p99_us rss0_MB peak_MB after_MB
for broker in $BROKERS; do
  for mode in $MODES; do
    # A fresh broker per run: memory freed by an earlier run would be
    # reused and hide what churn leaves behind.
    start_broker "$broker" || { echo "$broker did not start"; exit 1; }
    args=(--port "$PLAIN_PORT")
    [ "$mode" = tls ] && args=(--port "$TLS_PORT")
    tls_args=()
    [ "$mode" = tls ] && tls_args=(--tls-ca "$tls_dir/ca.crt" --tls-server-name localhost)
    line=$("$LOAD" "${args[@]}" --broker-pid "$PID" --broker-name "$broker" \
      --duration-s "$DURATION_S" --timeout-s $((DURATION_S + 60)) \
      mqtt-connect --count 0 --concurrency "$CONCURRENCY" --id-prefix "churn-$mode" \
      --settle-ms "$SETTLE_MS" "${tls_args[@]}" | grep '^RESULT ' || true)
    peers_stop_all
    [ -n "$line" ] || { echo "$broker $mode: no result"; continue; }
    echo "$line" >> "$OUT"
    echo "${line#RESULT }" | python3 -c '
import json, sys
r = json.load(sys.stdin)
mb = lambda v: "-" if v is None else "%.1f" % (v / 1048576)
f = lambda v: "-" if v is None else "%.0f" % v
print("%-10s %-4s %10d %10s %9s %9s %9s %9s %9s %9s %s" % (r["broker"], sys.argv[1], r["connections"],
      f(r["conn_per_s"]), f(r["slowest_second_conn"]), f(r["p50_us"]), f(r["p99_us"]),
      mb(r.get("rss_before_bytes")), mb(r.get("rss_peak_bytes")), mb(r.get("rss_after_bytes")),
      ("ERROR " + r["error"]) if r["error"] else ""))' "$mode"
  done
done
echo "RESULT lines appended to $OUT"
