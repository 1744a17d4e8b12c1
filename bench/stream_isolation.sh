#!/usr/bin/env bash
# What one reader of a stream's history costs the other clients
# (docs/streams.md, seventh round): the latency of an MQTT QoS 1 stream
# at 1,000 msg/s (rumqttc, one in flight, 256 B) while one STOMP reader
# reads MIB MiB of 1 KiB messages from `first`, in three settings:
#
#   quiet  no history reader (the baseline);
#   warm   the stream's files in the page cache;
#   cold   the page cache dropped first (`/proc/sys/vm/drop_caches`:
#          needs root; skipped without it), so the reader waits for the
#          device.
#
# Beside each history setting, how many samples of the broker's threads
# (every half millisecond) found each kind waiting on the disk: a read of
# the device on an async worker (`tokio-rt-worker`) holds up every
# connection that worker runs.
#
# The stream is filled once; each broker binary given then runs every
# setting on the same files, ROUNDS times, alternated (these machines'
# figures move between runs: compare binaries within one run).
#
#   bench/stream_isolation.sh                              (this checkout)
#   BINS="/tmp/before /tmp/after" bench/stream_isolation.sh
#
# Environment: MIB (default 2048), ROUNDS (default 2), BINS (broker
# binaries, default this checkout's), LOAD_BIN. Results in
# bench/results/<date>-issue17/stream-isolation.txt.
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
source "$ROOT/bench/peers/peers.sh"
trap 'peers_stop_all; rm -rf "$BENCH_TMP"' EXIT
if [ -n "${BINS:-}" ]; then
  LOAD_BIN=${LOAD_BIN:-$CARGO_TARGET_DIR/release/rosetta-load}
  ROSETTA_BIN=${BINS%% *}
fi
rosetta_binaries || exit 1
BINS=${BINS:-$ROSETTA_BIN}
MIB=${MIB:-2048}
ROUNDS=${ROUNDS:-2}
COUNT=$((MIB * 1024))
DIR=$BENCH_TMP/rosetta
OUT_DIR=$ROOT/bench/results/$(date -u +%F)-issue17
mkdir -p "$OUT_DIR"
OUT=$OUT_DIR/stream-isolation.txt

can_drop() { [ -w /proc/sys/vm/drop_caches ]; }

# waits BROKER_PID READER_PID: while the reader runs, samples the state of
# every broker thread each half millisecond and prints, per kind of
# thread, how many samples found it waiting on the disk (state D): the
# async workers (`tokio-rt-worker`) must not be.
waits() {
  python3 - "$1" "$2" <<'PY'
import collections, os, sys, time
pid, reader = sys.argv[1], int(sys.argv[2])
waiting, seen = collections.Counter(), collections.Counter()
while True:
    try:
        os.kill(reader, 0)
    except OSError:
        break
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = open(f"/proc/{pid}/task/{t}/stat").read()
        except OSError:
            continue
        kind = stat[stat.index("(") + 1:stat.rindex(")")].rstrip("0123456789-")
        seen[kind] += 1
        waiting[kind] += stat[stat.rindex(")") + 2] == "D"
    time.sleep(0.0005)
print("    samples waiting on the disk: " + ", ".join(
    f"{k} {waiting[k]}/{seen[k]}" for k in sorted(seen) if waiting[k] or k == "tokio-rt-worker"))
PY
}

# run BIN SETTING: one latency run beside a history reader (or none).
run() {
  local bin=$1 setting=$2 reader="" lat history=""
  case $setting in
    cold) sync; echo 3 > /proc/sys/vm/drop_caches ;;
    warm) cat "$DIR"/data/streams/*/* > /dev/null ;;
  esac
  ROSETTA_BIN=$bin rosetta_stream_start "$DIR" 60 || exit 1
  if [ "$setting" != quiet ]; then
    "$LOAD_BIN" --port "$ROSETTA_STOMP_PORT" --timeout-s 1800 stomp-stream --stream bench-stream-h \
      --count "$COUNT" --size 1024 --readers 1 --prefetch 1000 --from first --no-append \
      > "$BENCH_TMP/history.out" 2>&1 &
    reader=$!
    sleep 0.3 # the reader under way before the stream is timed
    waits "$ROSETTA_PID" "$reader" > "$BENCH_TMP/waits.out" &
  fi
  lat=$("$LOAD_BIN" --port "$ROSETTA_MQTT_PORT" mqtt-qos1 --client rumqttc --inflight 1 --rate 1000 \
    --count 4000 --size 256 2>&1 | sed -n 's/^RESULT //p')
  if [ -n "$reader" ]; then
    wait "$reader"
    history=$(sed -n 's/^RESULT //p' "$BENCH_TMP/history.out")
    sleep 0.1 # the sampler sees the reader gone
  fi
  python3 - "$bin" "$setting" "$lat" "$history" <<'PY'
import json, sys
bin, setting, lat, history = sys.argv[1:]
r = json.loads(lat) if lat else {}
ms = lambda k: "-" if r.get(k) is None else f"{r[k] / 1000:.2f}"
h = f"history {json.loads(history)['payload_bytes_per_s'] / 1e6:.0f} MB/s" if history else ""
print(f"{bin:<40} {setting:<5}  QoS 1 p50 {ms('p50_us')} ms  p99 {ms('p99_us')} ms  p99.9 {ms('p999_us')} ms  {h}")
PY
  [ -n "$reader" ] && cat "$BENCH_TMP/waits.out"
  rosetta_stop
}

{
  echo "# rosetta stream isolation benchmark, issue 17 ($(date -u +%FT%TZ))"
  echo "# $(git -C "$ROOT" describe --always --dirty) $(nproc) cores, $(uname -r), load average $(cut -d" " -f1-3 /proc/loadavg)"
  echo "# MIB=$MIB ROUNDS=$ROUNDS"
  rosetta_stream_config "$DIR"
  ROSETTA_BIN=${BINS%% *} rosetta_stream_start "$DIR" || exit 1
  echo "-- filling bench-stream-h with $COUNT messages of 1 KiB"
  "$LOAD_BIN" --port "$ROSETTA_STOMP_PORT" --timeout-s 1800 stomp-stream --stream bench-stream-h \
    --count "$COUNT" --size 1024 --window 1000 | grep -v '^RESULT '
  rosetta_stop
  settings="quiet warm cold"
  can_drop || { settings="quiet warm"; echo "# not root: the cold setting is skipped"; }
  for _ in $(seq "$ROUNDS"); do
    for bin in $BINS; do
      for setting in $settings; do
        run "$bin" "$setting"
      done
    done
  done
} 2>&1 | tee "$OUT"
