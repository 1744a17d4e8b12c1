#!/usr/bin/env bash
# Where a stream benchmark's time goes, by thread (docs/streams.md, fifth
# round): appends MIB MiB of 1 KiB messages to a stream over one STOMP
# connection and, with PHASE=history, then reads it back with one reader
# from `first`. During the phase under study, for SAMPLE_S seconds:
#
#   - each broker and load generator thread's CPU (from /proc, %);
#   - each broker thread's state, sampled every half millisecond: R
#     (running or runnable), S (sleeping) or D (waiting on the disk), with
#     the kernel function it waits in;
#   - `vmstat 1`: the machine's CPU split and the disk's blocks out.
#
#   bench/stream_threads.sh                   (PHASE=append, MIB=4096)
#   PHASE=history MIB=2048 bench/stream_threads.sh
#
# Environment: PHASE (append or history), MIB, WINDOW (receipts
# outstanding, default 1000), PREFETCH (default 1000), SAMPLE_S (default
# 3), ROSETTA_BIN and LOAD_BIN (both set: no build). The phase must last
# longer than the 2 s warm-up and SAMPLE_S (history reads about 1 GiB a
# second: PHASE=history wants MIB=4096 or more). Figures move by 20% or
# more between runs on a shared machine: alternate binaries.
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
source "$ROOT/bench/peers/peers.sh"
trap 'peers_stop_all; rm -rf "$BENCH_TMP"' EXIT
rosetta_binaries || exit 1
PHASE=${PHASE:-append}
MIB=${MIB:-4096}
COUNT=$((MIB * 1024))
SAMPLE_S=${SAMPLE_S:-3}

dir=$BENCH_TMP/rosetta
rosetta_stream_config "$dir"
rosetta_stream_start "$dir" || exit 1

load() {
  "$LOAD_BIN" --port "$ROSETTA_STOMP_PORT" --broker-pid "$ROSETTA_PID" --broker-name rosetta \
    --timeout-s 1800 stomp-stream --stream bench-stream-threads --count "$COUNT" --size 1024 "$@" |
    grep -v '^RESULT '
}

# sample: per-thread CPU and states of the broker (and the load
# generator's CPU), and vmstat, for SAMPLE_S seconds after a 2 s warm-up.
sample() {
  sleep 2
  vmstat 1 "$((SAMPLE_S + 1))" > "$BENCH_TMP/vmstat.txt" &
  local vmstat=$!
  python3 - "$SAMPLE_S" "$ROSETTA_PID" "$(pgrep -nx "$(basename "$LOAD_BIN" | cut -c1-15)")" <<'PY'
import collections, os, sys, time
dur, broker, loadgen = float(sys.argv[1]), sys.argv[2], sys.argv[3]
hz = os.sysconf("SC_CLK_TCK")

def threads(pid):
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            st = open(f"/proc/{pid}/task/{tid}/stat").read()
        except OSError:
            continue
        comm = st[st.index("(") + 1:st.rindex(")")]
        f = st[st.rindex(")") + 2:].split()
        out[tid] = (comm, f[0], int(f[11]) + int(f[12]))
    return out

pids = {"broker": broker, "load": loadgen} if loadgen else {"broker": broker}
before = {who: threads(p) for who, p in pids.items()}
states = collections.Counter()
samples = 0
end = time.time() + dur
while time.time() < end:
    samples += 1
    for tid, (comm, state, _) in threads(broker).items():
        wchan = ""
        if state != "R":
            try:
                wchan = open(f"/proc/{broker}/task/{tid}/wchan").read()
            except OSError:
                pass
        states[(tid, comm, state, wchan)] += 1
    time.sleep(0.0005)
after = {who: threads(p) for who, p in pids.items()}
print(f"CPU per thread over {dur:.0f} s (% of one CPU):")
for who in pids:
    rows = [(c, (t - before[who][tid][2]) / hz / dur * 100)
            for tid, (c, _, t) in after[who].items() if tid in before[who]]
    for comm, pct in sorted(rows, key=lambda r: -r[1]):
        if pct >= 1:
            print(f"  {who:6} {comm:18} {pct:5.1f}")
busy = {tid for (tid, _, s, _), n in states.items() if s != "S" and n * 100 >= samples}
print(f"broker thread states ({samples} samples; threads not asleep at least 1% of them):")
for (tid, comm, state, wchan), n in sorted(states.items(), key=lambda kv: (kv[0][0], -kv[1])):
    if tid in busy and n * 100 >= samples:
        print(f"  {tid:>7} {comm:18} {state} {wchan:24} {100 * n / samples:5.1f}%")
PY
  wait "$vmstat"
  echo "vmstat 1:"
  cat "$BENCH_TMP/vmstat.txt"
}

echo "# $(git -C "$ROOT" describe --always --dirty) $(nproc) cores, load average $(cut -d" " -f1-3 /proc/loadavg); PHASE=$PHASE MIB=$MIB"
if [ "$PHASE" = append ]; then
  sample &
  SAMPLER=$!
  load --window "${WINDOW:-1000}"
  wait "$SAMPLER"
else
  load --window "${WINDOW:-1000}"
  sample &
  SAMPLER=$!
  load --readers 1 --prefetch "${PREFETCH:-1000}" --from first --no-append
  wait "$SAMPLER"
fi
