#!/usr/bin/env bash
# Issue 20: where an idle connection's heap bytes go. Runs the broker's
# `idle_heap` example (the system allocator, so heaptrack sees every
# allocation) under heaptrack, opens N idle connections with the load
# tool, stops the broker, and prints the peak heap per connection grouped
# by the allocating site (the deepest Rosetta or tokio frame of each
# stack).
#
#   nice -n 19 cargo build --release --locked -p rosetta --example idle_heap
#   bench/idle_heap.sh target/release/examples/idle_heap target/release/rosetta-load \
#     [CONNECTIONS] [PROTOCOL] [--subscribe]
#
# CONNECTIONS defaults to 10000, PROTOCOL (mqtt, mqtt-ws, stomp, amqp) to
# mqtt. KEEP_ALIVE_S (default 60) as in bench/scale.sh. COST=live (the
# default) counts what the broker holds once the load tool is done (the
# broker is killed then, and what it never freed is what it held; idle
# connections are parked by then, see docs/scaling.md); COST=peak the
# peak heap instead (it includes the connections' time in their tasks
# before they park). The grouped table
# goes to stdout, the raw heaptrack file is left at $HEAP_OUT (default
# /tmp/idle-heap.zst). Needs heaptrack (the Debian package).
set -euo pipefail

HEAP_BIN=${1:?idle_heap example binary}
LOAD=${2:?rosetta-load binary}
CONNECTIONS=${3:-10000}
PROTOCOL=${4:-mqtt}
shift $(( $# < 4 ? $# : 4 ))
KEEP_ALIVE_S=${KEEP_ALIVE_S:-60}
COST=${COST:-live}
HEAP_OUT=${HEAP_OUT:-/tmp/idle-heap}

# shellcheck source=bench/peers/peers.sh
source "$(dirname "$0")/peers/peers.sh"
trap 'peers_stop_all; rm -rf "$BENCH_TMP"' EXIT
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

dir=$BENCH_TMP/rosetta
rosetta_config "$dir"
rm -f "$HEAP_OUT".zst "$HEAP_OUT".gz
heaptrack -o "$HEAP_OUT" "$HEAP_BIN" "$dir/rosetta.toml" > "$dir/heap.log" 2>&1 &
PEER_PIDS+=("$!")
wait_port "$ROSETTA_AMQP_PORT" "$!" 60 || { tail -20 "$dir/heap.log"; exit 1; }
broker=$(listener_pid "$ROSETTA_AMQP_PORT")
case $PROTOCOL in
  mqtt) port=$ROSETTA_MQTT_PORT ;;
  mqtt-ws) port=$ROSETTA_WS_PORT ;;
  stomp) port=$ROSETTA_STOMP_PORT ;;
  amqp) port=$ROSETTA_AMQP_PORT ;;
  *) echo "unknown protocol $PROTOCOL" >&2; exit 2 ;;
esac
"$LOAD" --port "$port" --broker-pid "$broker" --broker-name idle_heap \
  idle --protocol "$PROTOCOL" --connections "$CONNECTIONS" --keep-alive-s "$KEEP_ALIVE_S" "$@" \
  | grep -v '^RESULT ' &
load=$!
if [ "$COST" = live ]; then
  # Killed while every connection is open and has been idle for 1 s (the
  # load tool waits 3 s before it closes them).
  while [ "$(find /proc/"$broker"/fd -lname 'socket:*' 2>/dev/null | wc -l)" -lt "$CONNECTIONS" ]; do
    sleep 0.1
  done
  sleep 1
  kill -KILL "$broker"
  wait "$load" || true
else
  wait "$load"
  kill -INT "$broker"
fi
for _ in $(seq 1 100); do kill -0 "$broker" 2>/dev/null || break; sleep 0.3; done
sleep 2 # heaptrack writes its file after the process exits
file=
for f in "$HEAP_OUT".zst "$HEAP_OUT".gz; do [ -e "$f" ] && file=$f; done
case $COST in
  live) cost_type=leaked ;;
  *) cost_type=peak ;;
esac
heaptrack_print -f "$file" --flamegraph-cost-type "$cost_type" -F "$dir/stacks.txt" > /dev/null
python3 - "$dir/stacks.txt" "$CONNECTIONS" "$COST" <<'PY'
import collections, re, sys
path, conns = sys.argv[1], int(sys.argv[2])
# The allocating site: the deepest frame of ours or tokio's (a stack is
# root;...;leaf cost). Allocator, std and alloc frames are skipped.
ours = re.compile(r'^(_?<?)?(rosetta|tokio|tungstenite|tokio_tungstenite|mio|tracing|sharded_slab)')
sites = collections.Counter()
total = 0
for line in open(path):
    stack, _, cost = line.rstrip('\n').rpartition(' ')
    if not cost.isdigit():
        continue
    cost = int(cost)
    total += cost
    site = 'other'
    for frame in reversed(stack.split(';')):
        name = frame.replace('_$LT$', '<').replace('$LT$', '<').replace('$GT$', '>') \
            .replace('$u20$', ' ').replace('$u7b$', '{').replace('$u7d$', '}').replace('..', '::')
        if ours.match(name.lstrip('<_')):
            site = name[:160]
            break
    sites[site] += cost
print(f"total {sys.argv[3]} {total/1e6:.2f} MB = {total/conns:.0f} B per connection")
for site, cost in sites.most_common(40):
    if cost / conns < 1:
        break
    print(f"{cost/conns:8.0f} B/conn  {cost/1e3:9.0f} KB  {site}")
PY
