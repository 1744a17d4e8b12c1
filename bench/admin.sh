#!/usr/bin/env bash
# Admin API latency with many queues (issue 18's bound: with 100,000
# queues, the overview under 50 ms and a page of 100 queues under 100 ms).
# Starts a fresh broker with an admin listener and an administrator,
# creates the queues through the API, then times /healthz (the yardstick
# measured in the same run), the overview, a plain page and a filtered
# page; prints the broker's RSS before and after the queues.
#
#   bench/admin.sh BROKER_BIN [QUEUES] [SAMPLES]
set -euo pipefail

ROSETTA_BIN=${1:?broker binary}
QUEUES=${2:-100000}
SAMPLES=${3:-50}
here=$(cd "$(dirname "$0")" && pwd)

# shellcheck source=bench/peers/peers.sh
source "$here/peers/peers.sh"
trap 'peers_stop_all; rm -rf "$BENCH_TMP"' EXIT

dir=$BENCH_TMP/rosetta
rosetta_config "$dir"
ADMIN_PORT=$ROSETTA_ADMIN_PORT
password=bench-$RANDOM$RANDOM
# The users file is users.toml beside the configuration (the default).
"$ROSETTA_BIN" --config "$dir/rosetta.toml" user add bench --password "$password" \
  --role administrator --users-file "$dir/users.toml" > /dev/null
"$ROSETTA_BIN" --config "$dir/rosetta.toml" > "$dir/rosetta.log" 2>&1 &
ROSETTA_PID=$!
PEER_PIDS+=("$ROSETTA_PID")
wait_port "$ADMIN_PORT" "$ROSETTA_PID" 30 || { tail -20 "$dir/rosetta.log"; exit 1; }
deadline=$((SECONDS + 30))
# `rosetta::READY_LOG_LINE`: the admin API answers every route.
until grep -q "ready: journal recovered, listeners bound" "$dir/rosetta.log"; do
  [ $SECONDS -lt $deadline ] || { echo "broker never ready"; tail -20 "$dir/rosetta.log"; exit 1; }
  sleep 0.2
done

rss() { awk '/^VmRSS/ {print $2 " kB"}' "/proc/$ROSETTA_PID/status"; }
echo "$("$ROSETTA_BIN" --version), $QUEUES queues, $SAMPLES samples per request"
echo "broker RSS before: $(rss)"
python3 "$here/admin/admin_api.py" "$ADMIN_PORT" bench "$password" "$QUEUES" "$SAMPLES"
echo "broker RSS after: $(rss)"
