#!/usr/bin/env bash
# Same-run peer benchmarks (issues 3, 4, 5): Rosetta against mosquitto and
# ActiveMQ (MQTT), ActiveMQ and RabbitMQ (STOMP), RabbitMQ (AMQP 1.0).
#
#   bench/run.sh [mqtt|stomp|amqp|all]      (default: all)
#
# Builds rosetta and rosetta-load (release), installs the peers
# (bench/peers/setup.sh), starts every broker in the foreground on free
# ports with a temp data dir, runs each scenario against each broker, prints
# a table and writes the whole output to bench/results/<date>-<proto>.txt.
# Environment: COUNT_SCALE (multiplies message counts, e.g. 0.1, default 1),
# DURATION_S (cap on a run's sending time, default 20), WARMUP (1: a 3 s
# unreported run per broker and scenario first, default 1), ROSETTA_BIN and
# LOAD_BIN (both set: measure that broker binary with that load tool, no
# build; how a before/after comparison of two commits is run).
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
which="${1:-all}"
case "$which" in mqtt|stomp|amqp|all) ;; *) echo "usage: $0 [mqtt|stomp|amqp|all]" >&2; exit 2 ;; esac

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
if [ -n "${ROSETTA_BIN:-}" ] && [ -n "${LOAD_BIN:-}" ]; then
  # A before/after comparison: another commit's broker binary, measured
  # with one load tool, so only the broker differs between the runs.
  LOAD=$LOAD_BIN
else
  cargo build --release --locked -p rosetta -p rosetta-load || exit 1
  ROSETTA_BIN=${ROSETTA_BIN:-$CARGO_TARGET_DIR/release/rosetta}
  LOAD=$CARGO_TARGET_DIR/release/rosetta-load
fi
export ROSETTA_BIN
"$ROOT/bench/peers/setup.sh" || { echo "peer install failed" >&2; exit 1; }

# 10,000 idle connections need more descriptors than the usual 1024, in the
# load tool and in every broker (they inherit this shell's limit).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt 10100 ]; then
  echo "warning: open files limit $(ulimit -n) < 10100; the idle scenario will fail" >&2
fi

source "$ROOT/bench/peers/peers.sh"
trap 'peers_stop_all; rm -rf "$BENCH_TMP"' EXIT

SCALE=${COUNT_SCALE:-1}
DURATION_S=${DURATION_S:-20}
WARMUP=${WARMUP:-1}
n() { awk -v n="$1" -v s="$SCALE" 'BEGIN { v = int(n * s); print (v < 1 ? 1 : v) }'; }
RESULTS=$BENCH_TMP/results.jsonl

# run_case BROKER PORT PID SCENARIO [ARGS...]
run_case() {
  local broker=$1 port=$2 pid=$3; shift 3
  if [ -z "$pid" ]; then
    echo "-- $broker: not running, skipped $1"; return
  fi
  local common=(--port "$port" --broker-pid "$pid" --broker-name "$broker")
  if [ "$WARMUP" = 1 ] && [ "$1" != mqtt-idle ]; then
    "$LOAD" "${common[@]}" --duration-s 3 --stall-s 10 "$@" > /dev/null 2>&1 || true
  fi
  echo "-- $broker: rosetta-load ${common[*]} --duration-s $DURATION_S $*"
  local out
  out=$("$LOAD" "${common[@]}" --duration-s "$DURATION_S" "$@" 2>&1)
  echo "$out" | grep -v '^RESULT '
  echo "$out" | grep '^RESULT ' | sed 's/^RESULT //' >> "$RESULTS"
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "!! $broker (pid $pid) died during $1"
  fi
}

fsync_rate() {
  python3 - "$BENCH_TMP" <<'PY'
import os, sys, time
path = os.path.join(sys.argv[1], "fsync-probe")
fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
buf, n, t0 = b"x" * 4096, 0, time.monotonic()
while time.monotonic() - t0 < 2:
    os.write(fd, buf); os.fdatasync(fd); n += 1
os.close(fd); os.unlink(path)
print(f"disk: {n / (time.monotonic() - t0):.0f} fdatasync/s (4 KiB appends, {sys.argv[1]})")
PY
}

header() {
  echo "# rosetta peer benchmark: $1 ($(date -u +%FT%TZ))"
  echo "# $(git -C "$ROOT" describe --always --dirty) $(nproc) cores, $(uname -r), load average $(cut -d" " -f1-3 /proc/loadavg)"
  echo "# broker binary: $ROSETTA_BIN"
  echo "# mosquitto $(dpkg-query -W -f='${Version}' mosquitto), activemq $(dpkg-query -W -f='${Version}' activemq), rabbitmq-server $(dpkg-query -W -f='${Version}' rabbitmq-server)"
  echo "# COUNT_SCALE=$SCALE DURATION_S=$DURATION_S WARMUP=$WARMUP"
  fsync_rate
}

bench_mqtt() {
  local sc
  for sc in "mqtt-qos0 --count $(n 200000)" "mqtt-qos1 --count $(n 100000)" \
            "mqtt-fanout --subscribers 100 --count $(n 2000)" "mqtt-idle --connections 10000" \
            "mqtt-idle --connections 10000 --subscribe"; do
    # Idle scenarios measure RSS growth, so each gets freshly started
    # brokers: memory freed by earlier scenarios would be reused and hide
    # what the connections cost.
    if [ "${#PEER_PIDS[@]}" = 0 ] || [[ $sc == mqtt-idle* ]]; then
      peers_stop_all
      start_rosetta; start_mosquitto; start_activemq
    fi
    # shellcheck disable=SC2086
    run_case rosetta "$ROSETTA_MQTT_PORT" "$ROSETTA_PID" $sc
    run_case mosquitto "$MOSQUITTO_PORT" "$MOSQUITTO_PID" $sc
    run_case activemq "$ACTIVEMQ_MQTT_PORT" "$ACTIVEMQ_PID" $sc
  done
}

bench_stomp() {
  start_rosetta; start_activemq; start_rabbitmq
  for sc in "--producers 1 --consumers 1" "--producers 4 --consumers 4"; do
    # shellcheck disable=SC2086
    run_case rosetta "$ROSETTA_STOMP_PORT" "$ROSETTA_PID" stomp $sc --count "$(n 100000)"
    run_case activemq "$ACTIVEMQ_STOMP_PORT" "$ACTIVEMQ_PID" stomp $sc --count "$(n 100000)"
    run_case rabbitmq "$RABBITMQ_STOMP_PORT" "$RABBITMQ_PID" stomp $sc --count "$(n 100000)" \
      --login guest --passcode guest
  done
}

bench_amqp() {
  start_rosetta; start_rabbitmq
  for d in "" "--non-durable"; do
    # shellcheck disable=SC2086
    run_case rosetta "$ROSETTA_AMQP_PORT" "$ROSETTA_PID" amqp --count "$(n 100000)" $d
    run_case rabbitmq "$RABBITMQ_AMQP_PORT" "$RABBITMQ_PID" amqp --count "$(n 100000)" $d \
      --user guest --password guest --durable-terminus
  done
}

mkdir -p "$ROOT/bench/results"
protos=("$which"); [ "$which" = all ] && protos=(mqtt stomp amqp)
for proto in "${protos[@]}"; do
  out="$ROOT/bench/results/$(date -u +%F)-$proto.txt"
  : > "$RESULTS"
  {
    header "$proto"
    "bench_$proto"
    echo
    echo "## summary ($proto)"
    python3 "$ROOT/bench/peers/table.py" < "$RESULTS"
    if grep -qiE 'panic|error' "$BENCH_TMP/rosetta/rosetta.log" 2>/dev/null; then
      echo; echo "## rosetta log (errors)"; grep -iE 'panic|error' "$BENCH_TMP/rosetta/rosetta.log" | head -20
    fi
  } > >(tee "$out") 2>&1
  # The block ran in this shell, so peers_stop_all sees its PIDs. (No
  # `wait $!`: inside the block $! became the last broker started.)
  peers_stop_all
  sleep 1 # lets tee write the last lines
  rm -rf "${BENCH_TMP:?}/rosetta" "$BENCH_TMP/mosquitto" "$BENCH_TMP/activemq" "$BENCH_TMP/rabbitmq"
  echo "saved $out"
done
