#!/usr/bin/env bash
# Broker instructions per message under callgrind: a before/after figure
# that the machine's load does not move (time-based figures on these shared
# 2-core machines vary by 20% between runs of the same binary).
#
#   bench/instructions.sh BROKER_BIN LOAD_BIN [COUNT]     (default 20000)
#
# For each scenario, runs the broker under `valgrind --tool=callgrind` twice:
# once with no traffic (start, then SIGTERM) and once with COUNT messages of
# the scenario from LOAD_BIN (rosetta-load), and prints
# (Ir(traffic) - Ir(idle)) / COUNT: the instructions the broker executed per
# message, all threads, the journal's writer included. Timers (the 100 ms
# housekeeping tick) and group-commit batch sizes depend on wall time, which
# valgrind stretches, so compare binaries measured by the same script on the
# same machine, not against native runs.
#
# The MQTT rows with `rumqttc` send one packet per write, as devices do
# (issue 20's CPU per message); the fan-out row divides by deliveries
# (COUNT / 10 publishes to 10 subscribers). Valgrind runs the broker far
# slower than natively, so a per-packet client's packets pile up and the
# broker reads several per read: these rows measure the user-space code
# per message, not the syscalls and wake-ups a per-packet client costs
# natively (bench/permsg.sh measures those). ONLY=REGEX runs only the
# scenarios whose name matches.
set -euo pipefail

BROKER=${1:?broker binary}
LOAD=${2:?rosetta-load binary}
COUNT=${3:-20000}
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 2; }

TMP=$(mktemp -d /tmp/rosetta-ir.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
BENCH_TMP=$TMP
# shellcheck source=bench/peers/peers.sh
source "$(dirname "$0")/peers/peers.sh"

# run_broker NAME [LOAD ARGS...]: prints the broker's total Ir.
run_broker() {
  local name=$1; shift
  local dir=$TMP/$name
  rosetta_config "$dir"
  valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.out" \
    "$BROKER" --config "$dir/rosetta.toml" > "$dir/broker.log" 2>&1 &
  local pid=$!
  wait_port "$ROSETTA_AMQP_PORT" "$pid" 120 || { echo "broker did not start" >&2; exit 1; }
  if [ $# -gt 0 ]; then
    local port
    case $1 in
      mqtt-*) port=$ROSETTA_MQTT_PORT ;;
      stomp) port=$ROSETTA_STOMP_PORT ;;
      amqp) port=$ROSETTA_AMQP_PORT ;;
    esac
    "$LOAD" --port "$port" --stall-s 120 --timeout-s 1200 "$@" > "$dir/load.log" 2>&1 \
      || { echo "load failed for $name:" >&2; tail -5 "$dir/load.log" >&2; }
  fi
  kill -TERM "$pid"
  wait "$pid" || true
  awk '/^summary:/ {print $2}' "$dir/callgrind.out"
}

idle=$(run_broker idle)
echo "broker $BROKER"
echo "idle start+stop: $idle Ir"
printf '%-24s %12s\n' scenario Ir/msg
while read -r name per args; do
  [[ "$name" =~ ${ONLY:-.} ]] || continue
  # `per`: messages each publish counts for (deliveries, for fan-out).
  # shellcheck disable=SC2086
  total=$(run_broker "$name" $args --count $((COUNT / per)))
  printf '%-24s %12d\n' "$name" $(( (total - idle) / (COUNT / per * per) ))
done <<'SCENARIOS'
mqtt-qos1 1 mqtt-qos1
mqtt-qos0-rumqttc 1 mqtt-qos0 --client rumqttc
mqtt-qos1-rumqttc 1 mqtt-qos1 --client rumqttc
mqtt-fanout10-rumqttc 10 mqtt-fanout --client rumqttc --subscribers 10
stomp-1to1 1 stomp --producers 1 --consumers 1
stomp-4to4 1 stomp --producers 4 --consumers 4
amqp-durable 1 amqp
amqp-nondurable 1 amqp --non-durable
SCENARIOS
