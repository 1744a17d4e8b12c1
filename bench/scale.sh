#!/usr/bin/env bash
# Issue 20: broker RSS per idle connection, per protocol and connection
# count, each run on a freshly started broker (memory freed by an earlier
# run would be reused and hide what connections cost).
#
#   bench/scale.sh BROKER_BIN LOAD_BIN [COUNTS] [PROTOCOLS]
#
# COUNTS defaults to "5000 10000 19000" (the hard descriptor limit here is
# 20,000 per process; the broker and the load tool are two processes, each
# holding one end of every connection), PROTOCOLS to "mqtt mqtt-ws stomp
# amqp". Each count runs without and with one subscription per connection.
# KEEP_ALIVE_S (default 60) is the MQTT keep-alive and the STOMP heart-beat
# asked for; a run is far shorter than 1.5 times it, so nobody pings.
# PEER=mosquitto (the default; PEER= for none) runs the MQTT counts against
# mosquitto too, in the same run (installed by bench/peers/setup.sh).
# CONNECT_RATE (default 0: unpaced, 100 handshakes at a time) opens at most
# that many connections per second, as a fleet coming online over minutes
# does (memory a parked connection's task freed is then reused by the next).
# Output: one line per run, and RESULT lines in $OUT (default
# bench/results/<date>-issue20/idle.jsonl).
set -euo pipefail

ROSETTA_BIN=${1:?broker binary}
LOAD=${2:?rosetta-load binary}
COUNTS=${3:-5000 10000 19000}
PROTOCOLS=${4:-mqtt mqtt-ws stomp amqp}
KEEP_ALIVE_S=${KEEP_ALIVE_S:-60}
PEER=${PEER-mosquitto}
CONNECT_RATE=${CONNECT_RATE:-0}
OUT=${OUT:-$(dirname "$0")/results/$(date -u +%F)-issue20/idle.jsonl}
mkdir -p "$(dirname "$OUT")"

# shellcheck source=bench/peers/peers.sh
source "$(dirname "$0")/peers/peers.sh"
trap 'peers_stop_all; rm -rf "$BENCH_TMP"' EXIT
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# run_idle NAME PID PORT PROTOCOL COUNT [--subscribe]: one run of the load
# tool against a started broker, its line printed and its RESULT kept.
run_idle() {
  local name=$1 pid=$2 port=$3 proto=$4 n=$5 sub=${6:-} out
  out=$("$LOAD" --port "$port" --broker-pid "$pid" --broker-name "$name" \
    idle --protocol "$proto" --connections "$n" --keep-alive-s "$KEEP_ALIVE_S" \
    --connect-rate "$CONNECT_RATE" $sub 2>&1) || true
  echo "$out" | grep -v '^RESULT '
  echo "$out" | grep '^RESULT ' | sed 's/^RESULT //' >> "$OUT"
}

if [ "$PEER" = mosquitto ] && [[ " $PROTOCOLS " == *" mqtt "* ]]; then
  "$(dirname "$0")/peers/setup.sh" mosquitto >/dev/null
fi

for proto in $PROTOCOLS; do
  for n in $COUNTS; do
    for sub in "" --subscribe; do
      if [ "$PEER" = mosquitto ] && [ "$proto" = mqtt ]; then
        start_mosquitto
        run_idle mosquitto "$MOSQUITTO_PID" "$MOSQUITTO_PORT" mqtt "$n" $sub
        peers_stop_all
        rm -rf "$BENCH_TMP/mosquitto"
      fi
      start_rosetta
      case $proto in
        mqtt | mqtt-ws) port=$ROSETTA_MQTT_PORT ;;
        stomp) port=$ROSETTA_STOMP_PORT ;;
        amqp) port=$ROSETTA_AMQP_PORT ;;
        *) echo "unknown protocol $proto" >&2; exit 2 ;;
      esac
      [ "$proto" = mqtt-ws ] && port=$ROSETTA_WS_PORT
      run_idle rosetta "$ROSETTA_PID" "$port" "$proto" "$n" $sub
      peers_stop_all
      rm -rf "$BENCH_TMP/rosetta"
    done
  done
done
