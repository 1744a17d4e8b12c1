#!/usr/bin/env bash
# Broker RSS per idle MQTT connection, on a freshly started broker (memory
# freed by earlier traffic would be reused and hide what connections cost).
#
#   bench/idle.sh BROKER_BIN LOAD_BIN [CONNECTIONS] [--subscribe]
#
# CONNECTIONS defaults to 10000; --subscribe gives each one subscription.
# RSS barely moves with the machine's load, so two builds can be compared
# run against run (how issue 14's before/after was taken).
set -euo pipefail

ROSETTA_BIN=${1:?broker binary}
LOAD=${2:?rosetta-load binary}
CONNECTIONS=${3:-10000}
shift $(( $# < 3 ? $# : 3 ))

# shellcheck source=bench/peers/peers.sh
source "$(dirname "$0")/peers/peers.sh"
trap 'peers_stop_all; rm -rf "$BENCH_TMP"' EXIT
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

start_rosetta
"$LOAD" --port "$ROSETTA_MQTT_PORT" --broker-pid "$ROSETTA_PID" --broker-name rosetta \
  mqtt-idle --connections "$CONNECTIONS" "$@"
