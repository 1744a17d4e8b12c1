#!/usr/bin/env bash
# Issue 13, item 12: what a burst of password logins does to a QoS 1
# stream already running (rosetta-load's mqtt-login-storm scenario).
#
#   bench/login_storm.sh [RUNS]        (default: 3 runs)
#
# Starts Rosetta on a free port with a temp data dir and a users file
# written by `rosetta user add` (argon2id, as in production), then runs
# `rosetta-load mqtt-login-storm` RUNS times: a 1,000 msg/s QoS 1 stream
# between two anonymous clients, and LOGINS connections (default 500)
# sending a CONNECT with the user's password at once. Prints each run's
# line and RESULT json; the stream's p99 during the storm is `p99_us`.
#
# Environment: ROSETTA_BIN and LOAD (binaries; default: build both in
# release), LOGINS, RATE (stream msg/s), SECURITY_EXTRA (lines appended to
# the [security] section, e.g. "password_check_queue_max = 64").
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
RUNS=${1:-3}
LOGINS=${LOGINS:-500}
RATE=${RATE:-1000}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
if [ -z "${ROSETTA_BIN:-}" ] || [ -z "${LOAD:-}" ]; then
  cargo build --release --locked -p rosetta -p rosetta-load
fi
ROSETTA_BIN=${ROSETTA_BIN:-$CARGO_TARGET_DIR/release/rosetta}
LOAD=${LOAD:-$CARGO_TARGET_DIR/release/rosetta-load}

# Each storm login is a socket in the tool and in the broker.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

source "$ROOT/bench/peers/peers.sh"
trap 'peers_stop_all; rm -rf "$BENCH_TMP"' EXIT

dir=$BENCH_TMP/rosetta
mkdir -p "$dir/data"
port=$(free_port)
cat > "$dir/rosetta.toml" <<CONF
data_dir = "$dir/data"
[listeners]
mqtt = "127.0.0.1:$port"
stomp = ""
amqp = ""
websocket = ""
mqtts = ""
stomps = ""
amqps = ""
wss = ""
[security]
anonymous = true
users_file = "$dir/users.toml"
${SECURITY_EXTRA:-}
CONF
ROSETTA_PASSWORD=storm-secret "$ROSETTA_BIN" --config "$dir/rosetta.toml" user add storm > /dev/null
"$ROSETTA_BIN" --config "$dir/rosetta.toml" > "$dir/rosetta.log" 2>&1 &
pid=$!
PEER_PIDS+=("$pid")
if ! wait_port "$port" "$pid" 30; then
  echo "rosetta did not start; log:"; tail -20 "$dir/rosetta.log"; exit 1
fi
echo "rosetta $("$ROSETTA_BIN" --version) pid $pid, $(nproc) cores, $LOGINS logins, $RATE msg/s"
for i in $(seq 1 "$RUNS"); do
  echo "-- run $i: rosetta-load --port $port --broker-pid $pid mqtt-login-storm --logins $LOGINS --rate $RATE --login-user storm --login-password ..."
  "$LOAD" --port "$port" --broker-pid "$pid" --broker-name rosetta \
    mqtt-login-storm --logins "$LOGINS" --rate "$RATE" \
    --login-user storm --login-password storm-secret || echo "!! run $i failed"
done
