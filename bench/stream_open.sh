#!/usr/bin/env bash
# How long a broker takes to open a large stream (issue 17): a stream of
# STREAM_MIB MiB of 1 KiB messages is written, then the broker is started
# four times and the stream opened by a reader (`rosetta-load stomp-stream
# --from last`), and its "stream opened" log line read (open_ms):
#
#   1. with its sealed segments' index files (the newest segment scanned);
#   2. with the index files removed, the segments in the page cache (scan);
#   3. the same with the segment files dropped from the cache first
#      (dd iflag=nocache: only these files' pages, nothing else's);
#   4. with the index files (written again by 3), files dropped from cache.
#
#   bench/stream_open.sh        (STREAM_MIB, default 2048; ROSETTA_BIN and
#                                LOAD_BIN both set: no build)
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
source "$ROOT/bench/peers/peers.sh"
trap 'peers_stop_all; rm -rf "$BENCH_TMP"' EXIT
rosetta_binaries || exit 1
STREAM_MIB=${STREAM_MIB:-2048}

dir=$BENCH_TMP/rosetta
rosetta_stream_config "$dir"
segments=$dir/data/streams/bench-stream-open

start() { rosetta_stream_start "$dir" 120 || exit 1; }
drop_from_cache() { for f in "$segments"/*.log; do dd if="$f" iflag=nocache count=0 2>/dev/null; done; }
opened() {
  start
  "$LOAD_BIN" --port "$ROSETTA_STOMP_PORT" stomp-stream --stream bench-stream-open --count 1 --size 1024 \
    --readers 1 --prefetch 10 --from last --no-append > /dev/null 2>&1
  echo "$1: $(grep 'stream opened' "$dir/rosetta.log" | tail -1 | grep -o 'segments=[0-9]*\|from_index_files=[0-9]*\|open_ms=[0-9]*' | tr '\n' ' ')"
  rosetta_stop
}

echo "# stream open times, issue 17 ($(date -u +%FT%TZ)); $(git -C "$ROOT" describe --always --dirty), load average $(cut -d" " -f1-3 /proc/loadavg)"
start
"$LOAD_BIN" --port "$ROSETTA_STOMP_PORT" stomp-stream --stream bench-stream-open --count $((STREAM_MIB * 1024)) \
  --size 1024 --window 1000 2>&1 | grep "on broker"
rosetta_stop
echo "stream: $STREAM_MIB MiB of 1 KiB messages, $(ls "$segments"/*.log | wc -l) segments"
opened "with index files"
rm -f "$segments"/*.idx
opened "scan, in the page cache"
rm -f "$segments"/*.idx
drop_from_cache
opened "scan, dropped from the cache"
drop_from_cache
opened "with index files, dropped from the cache"
