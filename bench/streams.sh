#!/usr/bin/env bash
# Streams benchmark (issue 17), every figure set against the disk measured
# in the same run, in the same directory:
#
#   1. the disk: sequential write (dd, 1 MiB blocks, fdatasync at the end;
#      through the page cache, and with oflag=direct, the device's own),
#      sequential read from the device (dd iflag=direct: the page cache
#      bypassed; or, where O_DIRECT is refused, after dropping the file
#      from the cache), sequential read once cached (dd twice, the second
#      counted), and fdatasync/s of 4 KiB appends;
#   2. append: one STOMP producer of 1 KiB persistent messages with up to
#      WINDOW receipts outstanding (group commit syncs them together) into
#      one stream, under [store] sync = "every-commit"; payload and on-disk
#      bytes/s as a ratio of the disk's sequential write rate;
#   3. history: one reader (prefetch-count PREFETCH) reads the whole stream
#      from `first`; bytes/s as a ratio of the device's sequential read
#      rate and of the cached one (docs/streams.md says which the target
#      means), and the broker's RSS growth against the reader's credit;
#   4. tail: 1, 10 and 100 readers at `next` of a new stream while the
#      producer appends TAIL_COUNT messages; deliveries/s and broker RSS as
#      readers are added, and the growth per reader against its credit.
#
# Every run also prints the load generator's own CPU per message next to
# the broker's: both share the machine's cores, so a load generator that
# costs as much as the broker would cap what is measured.
#
#   bench/streams.sh   (results in bench/results/<date>-issue17/streams-<STREAM_MIB>mib.txt)
#
# Environment: STREAM_MIB (stream size for append and history, default
# 1024; the issue's 10 GB is STREAM_MIB=10240), TAIL_COUNT (default 20000),
# WINDOW (default 1000), PREFETCH (default 1000), ROSETTA_BIN and LOAD_BIN
# (both set: no build).
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
source "$ROOT/bench/peers/peers.sh"
trap 'peers_stop_all; rm -rf "$BENCH_TMP"' EXIT
rosetta_binaries || exit 1
STREAM_MIB=${STREAM_MIB:-1024}
TAIL_COUNT=${TAIL_COUNT:-20000}
WINDOW=${WINDOW:-1000}
PREFETCH=${PREFETCH:-1000}
SIZE=1024
COUNT=$((STREAM_MIB * 1024 * 1024 / SIZE))

OUT_DIR=$ROOT/bench/results/$(date -u +%F)-issue17
mkdir -p "$OUT_DIR"
OUT=$OUT_DIR/streams-${STREAM_MIB}mib.txt
RESULTS=$BENCH_TMP/results.jsonl

# dd_rate DD-ARGS...: bytes/s dd reports (its last stderr line).
dd_rate() {
  dd "$@" 2>&1 | tail -1 | awk '{ for (i = 1; i <= NF; i++) if ($i == "copied,") { printf "%.0f\n", $1 / $(i + 1); exit } }'
}

disk() {
  local probe=$BENCH_TMP/dd-probe
  # At most 4 GiB: enough for a steady rate, and the issue's 10 GB run
  # need not hold the probe and the stream on the disk at once.
  local probe_mib=$((STREAM_MIB < 4096 ? STREAM_MIB : 4096))
  # The device's own write rate, the page cache bypassed: on a virtual
  # machine that returns freed memory to its host, the buffered rate below
  # moves by up to five times between runs with how much of the page
  # cache's memory is new to the guest (docs/streams.md, sixth round), and
  # this one much less.
  DISK_WRITE_DIRECT=$(dd_rate if=/dev/zero of="$probe" bs=1M count="$probe_mib" oflag=direct conv=fdatasync)
  rm -f "$probe"
  DISK_WRITE=$(dd_rate if=/dev/zero of="$probe" bs=1M count="$probe_mib" conv=fdatasync)
  # Where O_DIRECT is refused, the buffered rate stands in.
  [ -n "$DISK_WRITE_DIRECT" ] || DISK_WRITE_DIRECT=$DISK_WRITE
  # From the device: O_DIRECT bypasses the page cache; where the file
  # system refuses it, drop the file's pages first (fdatasync'ed above, so
  # they are clean and nocache can drop them).
  DISK_READ_DEVICE=$(dd_rate if="$probe" of=/dev/null bs=1M iflag=direct)
  if [ -z "$DISK_READ_DEVICE" ]; then
    dd if="$probe" iflag=nocache count=0 2>/dev/null
    DISK_READ_DEVICE=$(dd_rate if="$probe" of=/dev/null bs=1M iflag=nocache)
    DEVICE_HOW="page cache dropped first"
  else
    DEVICE_HOW="iflag=direct"
  fi
  dd_rate if="$probe" of=/dev/null bs=1M > /dev/null
  DISK_READ=$(dd_rate if="$probe" of=/dev/null bs=1M)
  rm -f "$probe"
  echo "disk: sequential write $((DISK_WRITE / 1000000)) MB/s (dd ${probe_mib} MiB, fdatasync;" \
    "$((DISK_WRITE_DIRECT / 1000000)) MB/s with oflag=direct)," \
    "sequential read from the device $((DISK_READ_DEVICE / 1000000)) MB/s ($DEVICE_HOW)," \
    "cached sequential read $((DISK_READ / 1000000)) MB/s"
  python3 - "$BENCH_TMP" <<'PY'
import os, sys, time
path = os.path.join(sys.argv[1], "fsync-probe")
fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
buf, n, t0 = b"x" * 4096, 0, time.monotonic()
while time.monotonic() - t0 < 2:
    os.write(fd, buf); os.fdatasync(fd); n += 1
os.close(fd); os.unlink(path)
print(f"disk: {n / (time.monotonic() - t0):.0f} fdatasync/s (4 KiB appends)")
PY
}

start_broker() {
  rosetta_stream_config "$BENCH_TMP/rosetta"
  rosetta_stream_start "$BENCH_TMP/rosetta" || exit 1
}

# load ARGS...: one rosetta-load stomp-stream run; its RESULT line is kept.
load() {
  echo "-- rosetta-load stomp-stream $*"
  local out
  out=$("$LOAD_BIN" --port "$ROSETTA_STOMP_PORT" --broker-pid "$ROSETTA_PID" --broker-name rosetta \
    --timeout-s 1800 stomp-stream "$@" 2>&1)
  echo "$out" | grep -v '^RESULT '
  echo "$out" | grep '^RESULT ' | sed 's/^RESULT //' | tee -a "$RESULTS" > "$BENCH_TMP/last.json"
}

field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$BENCH_TMP/last.json" "$1"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
# cpu: the broker's and the load generator's CPU per message of the last run.
cpu() {
  python3 - "$BENCH_TMP/last.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
n = max(r.get("received") or 0, 1)
per = lambda us: "-" if us is None else f"{us / n:.2f}"
print(f"CPU per message: broker {per(r.get('broker_cpu_us'))} us, load generator {per(r.get('load_cpu_us'))} us")
PY
}

{
  echo "# rosetta streams benchmark, issue 17 ($(date -u +%FT%TZ))"
  echo "# $(git -C "$ROOT" describe --always --dirty) $(nproc) cores, $(uname -r), load average $(cut -d" " -f1-3 /proc/loadavg)"
  echo "# broker binary: $ROSETTA_BIN; data in $BENCH_TMP"
  echo "# STREAM_MIB=$STREAM_MIB ($COUNT messages of $SIZE B) TAIL_COUNT=$TAIL_COUNT WINDOW=$WINDOW PREFETCH=$PREFETCH"
  disk
  start_broker

  echo; echo "## append"
  load --stream bench-stream-history --count "$COUNT" --size "$SIZE" --window "$WINDOW"
  payload=$(field payload_bytes_per_s)
  elapsed=$(field elapsed_s)
  on_disk=$(du -sb "$BENCH_TMP/rosetta/data/streams" | cut -f1)
  disk_rate=$(awk -v b="$on_disk" -v s="$elapsed" 'BEGIN { printf "%.0f\n", b / s }')
  echo "append: payload $((payload / 1000000)) MB/s = $(ratio "$payload" "$DISK_WRITE") of the disk's sequential write" \
    "($(ratio "$payload" "$DISK_WRITE_DIRECT") of its direct write);" \
    "log on disk $((on_disk / 1048576)) MiB, $((disk_rate / 1000000)) MB/s = $(ratio "$disk_rate" "$DISK_WRITE")"
  cpu

  echo; echo "## history (one reader from first)"
  load --stream bench-stream-history --count "$COUNT" --size "$SIZE" --readers 1 --prefetch "$PREFETCH" --from first --no-append
  payload=$(field payload_bytes_per_s)
  grow=$(( $(field rss_peak_bytes) - $(field rss_start_bytes) ))
  credit=$((PREFETCH * SIZE))
  echo "history: $((payload / 1000000)) MB/s = $(ratio "$payload" "$DISK_READ_DEVICE") of the device's sequential read," \
    "$(ratio "$payload" "$DISK_READ") of the cached sequential read;" \
    "broker RSS grew $((grow / 1024)) KiB at its peak against a credit of $PREFETCH x $SIZE B = $((credit / 1024)) KiB"
  cpu

  echo; echo "## tail readers"
  for r in 1 10 100; do
    load --stream "bench-stream-tail-$r" --count "$TAIL_COUNT" --size "$SIZE" --window "$WINDOW" \
      --readers "$r" --prefetch "$PREFETCH" --from next
    grow=$(( $(field rss_peak_bytes) - $(field rss_start_bytes) ))
    eval "TAIL_GROW_$r=$grow"
    echo "tail $r readers: $(field msg_per_s | cut -d. -f1) deliveries/s, broker RSS start $(( $(field rss_start_bytes) / 1048576 )) MiB," \
      "peak $(( $(field rss_peak_bytes) / 1048576 )) MiB: $((grow / r / 1024)) KiB per reader against a credit of $((PREFETCH * SIZE / 1024)) KiB"
    cpu
  done
  # What one more reader costs, without the stream's own (its tail cache,
  # the writer's batches): the growth from 10 to 100 readers, per reader.
  echo "tail: $(( (TAIL_GROW_100 - TAIL_GROW_10) / 90 / 1024 )) KiB per reader from 10 to 100 readers" \
    "against a credit of $((PREFETCH * SIZE / 1024)) KiB"
  if grep -qiE 'panic|error' "$BENCH_TMP/rosetta/rosetta.log"; then
    echo; echo "## rosetta log (errors)"; grep -iE 'panic|error' "$BENCH_TMP/rosetta/rosetta.log" | head -20
  fi
} > >(tee "$OUT") 2>&1
# The block ran in this shell, so peers_stop_all sees the broker's PID.
peers_stop_all
sleep 1 # lets tee write the last lines
echo "saved $OUT"
