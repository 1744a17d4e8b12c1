#!/usr/bin/env bash
# Issue 19: what the balancer costs a client, in one run on one machine.
#
#   bench/cluster.sh
#
# Starts one etcd and three Rosetta nodes (a, b, c) on free loopback ports,
# keyed by `client_id` with `key_filter = "^([^-]+)-"` (every id with one
# prefix belongs to one node) and `proxy = true`, then measures with
# rosetta-load, each figure next to its direct baseline:
#
# 1. connection rate and connect latency (TCP connect to CONNACK 0, then
#    DISCONNECT), at concurrency 1 and $CONCURRENCY:
#    - MQTT 3.1.1 direct to the owner vs. through another node's proxy;
#    - MQTT 5 direct to the owner vs. via another node's 0x9C redirect,
#      followed (both connects counted);
# 2. throughput through the proxy vs. direct: MQTT QoS 0 and QoS 1 (1 -> 1)
#    and STOMP (persistent, receipts), with the serving node's CPU per
#    message and, when proxied, the proxying node's.
#
# Which node owns a prefix comes from the discovery route
# (GET /api/v1/balancer/target). Everything started is stopped on exit.
#
# Environment: ROSETTA_BIN and LOAD (binaries; default: build both in
# release), CONNECTS (connections per connect run, default 2000),
# CONCURRENCY (default 16), MSGS (messages per throughput run, default
# 100000), OUT (results file; default bench/results/<date>-issue19/cluster.txt).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
CONNECTS=${CONNECTS:-2000}
CONCURRENCY=${CONCURRENCY:-16}
MSGS=${MSGS:-100000}
OUT=${OUT:-$ROOT/bench/results/$(date -u +%F)-issue19/cluster.txt}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
if [ -z "${ROSETTA_BIN:-}" ] || [ -z "${LOAD:-}" ]; then
  cargo build --release --locked -p rosetta -p rosetta-load
fi
ROSETTA_BIN=${ROSETTA_BIN:-$CARGO_TARGET_DIR/release/rosetta}
LOAD=${LOAD:-$CARGO_TARGET_DIR/release/rosetta-load}
command -v etcd > /dev/null || { echo "needs etcd (Debian: etcd-server; scripts/lib/install.sh ensure_etcd)"; exit 1; }
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

source "$ROOT/bench/peers/peers.sh"
trap 'peers_stop_all; rm -rf "$BENCH_TMP"' EXIT
mkdir -p "$(dirname "$OUT")"
exec > >(tee "$OUT") 2>&1

# -- etcd --
etcd_client=$(free_port)
etcd_peer=$(free_port)
etcd --name bench --data-dir "$BENCH_TMP/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_client" \
  --advertise-client-urls "http://127.0.0.1:$etcd_client" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer" \
  --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
  --initial-cluster "bench=http://127.0.0.1:$etcd_peer" > "$BENCH_TMP/etcd.log" 2>&1 &
PEER_PIDS+=("$!")
wait_port "$etcd_client" "$!" 30 || { echo "etcd did not start"; tail -20 "$BENCH_TMP/etcd.log"; exit 1; }

# -- three nodes --
users=$BENCH_TMP/users.toml
touch "$users"
declare -A MQTT STOMP ADMIN PID
for n in a b c; do
  dir=$BENCH_TMP/$n
  mkdir -p "$dir/data"
  MQTT[$n]=$(free_port); STOMP[$n]=$(free_port); ADMIN[$n]=$(free_port)
  cat > "$dir/rosetta.toml" <<CONF
data_dir = "$dir/data"
[listeners]
mqtt = "127.0.0.1:${MQTT[$n]}"
stomp = "127.0.0.1:${STOMP[$n]}"
amqp = ""
websocket = ""
mqtts = ""
stomps = ""
amqps = ""
wss = ""
[security]
anonymous = true
users_file = "$users"
[admin]
listen = "127.0.0.1:${ADMIN[$n]}"
[cluster]
etcd = ["http://127.0.0.1:$etcd_client"]
node_name = "$n"
[cluster.balancer]
key = "client_id"
key_filter = "^([^-]+)-"
proxy = true
CONF
done
ROSETTA_PASSWORD=bench-pw "$ROSETTA_BIN" --config "$BENCH_TMP/a/rosetta.toml" user add watcher --role monitoring > /dev/null
for n in a b c; do
  "$ROSETTA_BIN" --config "$BENCH_TMP/$n/rosetta.toml" > "$BENCH_TMP/$n.log" 2>&1 &
  PID[$n]=$!
  PEER_PIDS+=("$!")
  wait_port "${MQTT[$n]}" "${PID[$n]}" 30 || { echo "node $n did not start"; tail -20 "$BENCH_TMP/$n.log"; exit 1; }
done

# owner NODE KEY: the node NODE's balancer places KEY on (KEY with a
# "-": without one key_filter does not match and every node answers itself).
owner() {
  curl -sf -u watcher:bench-pw "http://127.0.0.1:${ADMIN[$1]}/api/v1/balancer/target?key=$2" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["node"])'
}
# Settled: every node places 30 probe keys alike, over all three nodes.
settled=
for _ in $(seq 1 60); do
  seen=$(for n in a b c; do for k in $(seq 0 29); do owner "$n" "probe$k-x" 2>/dev/null || echo "?"; done | tr '\n' ' '; echo; done)
  if [ "$(echo "$seen" | sort -u | wc -l)" = 1 ] && ! echo "$seen" | grep -q '?' \
     && [ "$(echo "$seen" | head -1 | tr ' ' '\n' | grep -v '^$' | sort -u | wc -l)" = 3 ]; then
    settled=1; break
  fi
  sleep 0.5
done
[ -n "$settled" ] || { echo "the three nodes did not settle"; exit 1; }
other() { for n in a b c; do [ "$n" != "$1" ] && { echo "$n"; return; }; done; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
tick_hz=$(getconf CLK_TCK)

echo "rosetta $("$ROSETTA_BIN" --version), $(nproc) cores, 3 nodes + etcd $(etcd --version | head -1 | awk '{print $3}') on loopback"
echo "connects per run $CONNECTS, concurrency 1 and $CONCURRENCY; messages per throughput run $MSGS"

# -- 1. connection rate and connect latency --
conn_owner=$(owner a conn-x)
conn_entry=$(other "$conn_owner")
echo
echo "== connect: ids conn-<n> belong to $conn_owner; the indirect runs enter at $conn_entry"
connect_run() { # LABEL NODE VERSION CONCURRENCY [--follow-redirect]
  local label=$1 node=$2 version=$3 conc=$4; shift 4
  echo "-- $label (node $node, MQTT $version, concurrency $conc)"
  "$LOAD" --port "${MQTT[$node]}" --broker-name "$label" \
    mqtt-connect --count "$CONNECTS" --concurrency "$conc" --version "$version" --id-prefix conn "$@" \
    || echo "!! $label failed"
}
for conc in 1 "$CONCURRENCY"; do
  connect_run "mqtt311-direct" "$conn_owner" 4 "$conc"
  connect_run "mqtt311-proxied" "$conn_entry" 4 "$conc"
  connect_run "mqtt5-direct" "$conn_owner" 5 "$conc"
  connect_run "mqtt5-redirected" "$conn_entry" 5 "$conc" --follow-redirect
done

# -- 2. throughput through the proxy --
through() { # LABEL ENTRY OWNER PORT_ARRAY SCENARIO ARGS...
  local label=$1 entry=$2 owner_node=$3 ports=$4; shift 4
  local -n port_of=$ports
  local proxy_before proxy_after
  proxy_before=$(cpu_ticks "${PID[$entry]}")
  echo "-- $label (enter at $entry, served by $owner_node)"
  "$LOAD" --port "${port_of[$entry]}" --broker-pid "${PID[$owner_node]}" --broker-name "$label" "$@" \
    || echo "!! $label failed"
  proxy_after=$(cpu_ticks "${PID[$entry]}")
  if [ "$entry" != "$owner_node" ]; then
    echo "   proxying node $entry CPU: $(( (proxy_after - proxy_before) * 1000 / tick_hz )) ms"
  fi
}
mqtt_owner=$(owner a bench/mqtt-x)
mqtt_entry=$(other "$mqtt_owner")
stomp_owner=$(owner a bench/stomp-x)
stomp_entry=$(other "$stomp_owner")
echo
echo "== throughput: MQTT ids bench/mqtt-... belong to $mqtt_owner, STOMP client-ids bench/stomp-... to $stomp_owner"
for qos in 0 1; do
  through "mqtt-qos$qos-direct" "$mqtt_owner" "$mqtt_owner" MQTT "mqtt-qos$qos" --count "$MSGS"
  through "mqtt-qos$qos-proxied" "$mqtt_entry" "$mqtt_owner" MQTT "mqtt-qos$qos" --count "$MSGS"
done
stomp_msgs=$((MSGS / 2))
through "stomp-direct" "$stomp_owner" "$stomp_owner" STOMP stomp --count "$stomp_msgs" --client-id-prefix bench/stomp
through "stomp-proxied" "$stomp_entry" "$stomp_owner" STOMP stomp --count "$stomp_msgs" --client-id-prefix bench/stomp
echo
echo "saved to $OUT"
