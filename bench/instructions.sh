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
#
# The stream rows (issue 17, docs/streams.md) run `stomp-stream` against a
# broker whose `[[streams]]` makes `bench-stream*` streams: `stream-append`
# is one producer of 1 KiB persistent messages (receipts, group commit);
# `stream-history` first fills a stream with COUNT messages and then reads
# it with one reader from `first`, and subtracts a broker that only filled
# it (so it is the read path alone); `stream-tail10` is 10 readers at
# `next` while COUNT / 10 messages are appended, per delivery.
set -euo pipefail

BROKER=${1:?broker binary}
LOAD=${2:?rosetta-load binary}
COUNT=${3:-20000}
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 2; }

TMP=$(mktemp -d /tmp/rosetta-ir.XXXXXX)
# KEEP=DIR keeps each run's callgrind output there (DIR/NAME.callgrind),
# for callgrind_annotate.
trap '[ -n "${KEEP:-}" ] && mkdir -p "$KEEP" && for f in "$TMP"/*/callgrind.out; do cp "$f" "$KEEP/$(basename "$(dirname "$f")").callgrind"; done; rm -rf "$TMP"' EXIT
BENCH_TMP=$TMP
# shellcheck source=bench/peers/peers.sh
source "$(dirname "$0")/peers/peers.sh"

# run_broker NAME [LOAD ARGS...]: prints the broker's total Ir. With
# PRELOAD set (rosetta-load arguments), that load runs first, in the same
# broker; stream scenarios get the `[[streams]]` rule.
run_broker() {
  local name=$1; shift
  local dir=$TMP/$name
  if [[ "$name" == stream-* ]]; then
    rosetta_stream_config "$dir"
  else
    rosetta_config "$dir"
  fi
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
      stomp-stream) port=$ROSETTA_STOMP_PORT ;;
    esac
    # MQTT over WebSocket (`--transport ws`): the `websocket` listener.
    if [[ " $* " == *" --transport ws "* ]]; then port=$ROSETTA_WS_PORT; fi
    if [ -n "${PRELOAD:-}" ]; then
      # shellcheck disable=SC2086
      "$LOAD" --port "$port" --stall-s 120 --timeout-s 1200 $PRELOAD > "$dir/preload.log" 2>&1 \
        || { echo "preload failed for $name:" >&2; tail -5 "$dir/preload.log" >&2; }
    fi
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
STREAM_FILL="stomp-stream --stream bench-stream-h --size 1024 --window 1000 --count $COUNT"
while read -r name per args; do
  [[ "$name" =~ ${ONLY:-.} ]] || continue
  base=$idle
  if [ "$name" = stream-history ]; then
    # The read path alone: a broker that filled the stream the same way
    # and was not read is the baseline.
    # shellcheck disable=SC2086
    base=$(run_broker stream-fill $STREAM_FILL)
    export PRELOAD=$STREAM_FILL
  fi
  # `per`: messages each publish counts for (deliveries, for fan-out).
  # shellcheck disable=SC2086
  total=$(run_broker "$name" $args --count $((COUNT / per)))
  unset PRELOAD
  printf '%-24s %12d\n' "$name" $(( (total - base) / (COUNT / per * per) ))
done <<'SCENARIOS'
mqtt-qos1 1 mqtt-qos1
mqtt-qos0-rumqttc 1 mqtt-qos0 --client rumqttc
mqtt-qos1-rumqttc 1 mqtt-qos1 --client rumqttc
mqtt-qos1-rumqttc-ws 1 mqtt-qos1 --client rumqttc --transport ws
mqtt-fanout10-rumqttc 10 mqtt-fanout --client rumqttc --subscribers 10
stomp-1to1 1 stomp --producers 1 --consumers 1
stomp-4to4 1 stomp --producers 4 --consumers 4
amqp-durable 1 amqp
amqp-nondurable 1 amqp --non-durable
stream-append 1 stomp-stream --stream bench-stream-a --size 1024 --window 1000
stream-history 1 stomp-stream --stream bench-stream-h --size 1024 --readers 1 --prefetch 1000 --from first --no-append
stream-tail10 10 stomp-stream --stream bench-stream-t --size 1024 --window 1000 --readers 10 --prefetch 1000 --from next
SCENARIOS
