#!/usr/bin/env bash
# Issue 20: broker CPU per message and throughput with per-packet clients,
# Rosetta against mosquitto in the same run.
#
#   bench/permsg.sh BROKER_BIN LOAD_BIN
#
# For each client (CLIENTS, default "rumqttc wire": rumqttc sends one
# packet per write, as devices do; `wire` is the load tool's batching
# client) and each scenario (MQTT QoS 0 and QoS 1 1 -> 1, QoS 1 1 -> 100
# fan-out), one run on Rosetta and one on mosquitto, each broker freshly
# started, then a table of the broker CPU per message and the throughput,
# each as Rosetta's figure over mosquitto's from the same pair of runs.
# The issue's targets: CPU per message at most 0.25x mosquitto's, and at
# least 2x its throughput. DURATION_S (default 10) caps a run's sending.
# With PERF=1, each rumqttc scenario gets one more Rosetta run, recorded
# with `perf record -g` (not the measured run), and its top symbols printed (perf from Debian's
# linux-perf). With KERNEL=1, each run of either broker gets two more:
# its CPU per message split into user and system time (from /proc), and
# its system calls and context switches per message (under `perf stat`).
# Output: the table, and RESULT lines in $OUT (default
# bench/results/<date>-issue20/permsg.jsonl).
set -euo pipefail

ROSETTA_BIN=${1:?broker binary}
LOAD=${2:?rosetta-load binary}
CLIENTS=${CLIENTS:-rumqttc wire}
DURATION_S=${DURATION_S:-10}
OUT=${OUT:-$(dirname "$0")/results/$(date -u +%F)-issue20/permsg.jsonl}
mkdir -p "$(dirname "$OUT")"
here=$(cd "$(dirname "$0")" && pwd)

"$here/peers/setup.sh" mosquitto > /dev/null
# shellcheck source=bench/peers/peers.sh
source "$here/peers/peers.sh"
trap 'peers_stop_all; rm -rf "$BENCH_TMP"' EXIT

scenarios=("mqtt-qos0 --count 200000" "mqtt-qos1 --count 100000"
           "mqtt-fanout --subscribers 100 --count 2000")
runs=$BENCH_TMP/runs.jsonl
: > "$runs"

# one BROKER PORT PID CLIENT SCENARIO...: a warm-up, then the measured run.
one() {
  local broker=$1 port=$2 pid=$3 client=$4; shift 4
  local common=(--port "$port" --broker-pid "$pid" --broker-name "$broker" --duration-s "$DURATION_S")
  "$LOAD" --port "$port" --duration-s 2 "$@" --client "$client" > /dev/null 2>&1 || true
  local out
  out=$("$LOAD" "${common[@]}" "$@" --client "$client" 2>&1) || true
  if [ "${PERF:-0}" = 1 ] && [ "$broker" = rosetta ] && [ "$client" = rumqttc ]; then
    # A separate run under perf, so that perf's own cost is not in the
    # figures above.
    perf record -q -g -p "$pid" -o "$BENCH_TMP/perf-$1.data" > /dev/null 2>&1 &
    local perf_pid=$!
    sleep 0.5
    "$LOAD" --port "$port" --duration-s "$DURATION_S" "$@" --client "$client" > /dev/null 2>&1 || true
    kill -INT "$perf_pid"; wait "$perf_pid" || true
    echo "-- perf: rosetta, $1, rumqttc: top symbols by self time"
    perf report -q -i "$BENCH_TMP/perf-$1.data" --no-children -g none --percent-limit 1.5 \
      --sort dso,symbol 2>/dev/null | grep -v '^$' | head -25 || true
  fi
  if [ "${KERNEL:-0}" = 1 ]; then
    kernel_split "$broker" "$port" "$pid" "$client" "$@"
  fi
  echo "$out" | grep -v '^RESULT '
  echo "$out" | grep '^RESULT ' | sed "s/^RESULT //; s/}\$/, \"client\": \"$client\"}/" | tee -a "$OUT" >> "$runs"
}

# kernel_split BROKER PORT PID CLIENT SCENARIO...: two more runs (not the
# measured one): one with the broker's user and system CPU read from
# /proc, and one with its system calls and context switches counted by
# `perf stat` (software tracepoints: they work where the VM has no PMU;
# they add to each system call's cost, so that run's CPU is not used).
# Each figure per message received: where a per-packet client's cost goes.
kernel_split() {
  local broker=$1 port=$2 pid=$3 client=$4; shift 4
  local stat=$BENCH_TMP/perf-stat-$broker-$1.txt u0 s0 u1 s1 plain counted
  read -r u0 s0 < <(awk '{print $14, $15}' "/proc/$pid/stat")
  plain=$("$LOAD" --port "$port" --duration-s "$DURATION_S" "$@" --client "$client" 2>&1 | sed -n 's/^RESULT //p') || true
  read -r u1 s1 < <(awk '{print $14, $15}' "/proc/$pid/stat")
  perf stat -x, -e context-switches,raw_syscalls:sys_enter -p "$pid" -o "$stat" > /dev/null 2>&1 &
  local perf_pid=$!
  sleep 0.5
  counted=$("$LOAD" --port "$port" --duration-s "$DURATION_S" "$@" --client "$client" 2>&1 | sed -n 's/^RESULT //p') || true
  kill -INT "$perf_pid"; wait "$perf_pid" || true
  python3 - "$broker" "$1" "$client" "$plain" "$counted" "$stat" $((u1 - u0)) $((s1 - s0)) "$(getconf CLK_TCK)" <<'PY'
import json, sys
broker, scenario, client, plain, counted, stat, utime, stime, tck = sys.argv[1:]
received = lambda out: max(json.loads(out).get("received") or 0, 1) if out else 1
counts = {}
for line in open(stat):
    f = line.strip().split(",")
    if len(f) > 2 and f[0].isdigit():
        counts[f[2]] = int(f[0])
n, m = received(plain), received(counted)
us = lambda ticks: int(ticks) / int(tck) * 1e6 / n
print(f"-- kernel: {broker}, {scenario}, {client}: user {us(utime):.2f} us, system {us(stime):.2f} us,"
      f" {counts.get('raw_syscalls:sys_enter', 0) / m:.3f} system calls,"
      f" {counts.get('context-switches', 0) / m:.3f} context switches per message")
PY
}

echo "# $(git -C "$here/.." describe --always --dirty), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# mosquitto $(dpkg-query -W -f='${Version}' mosquitto), DURATION_S=$DURATION_S"
for client in $CLIENTS; do
  for sc in "${scenarios[@]}"; do
    start_rosetta
    # shellcheck disable=SC2086
    one rosetta "$ROSETTA_MQTT_PORT" "$ROSETTA_PID" "$client" $sc
    peers_stop_all
    start_mosquitto
    # shellcheck disable=SC2086
    one mosquitto "$MOSQUITTO_PORT" "$MOSQUITTO_PID" "$client" $sc
    peers_stop_all
    rm -rf "$BENCH_TMP/rosetta" "$BENCH_TMP/mosquitto"
  done
done

python3 - "$runs" <<'PY'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {(r["client"], r["scenario"], r["broker"]): r for r in runs}
print(f"\n{'client':8} {'scenario':12} {'rosetta µs/msg':>15} {'mosquitto µs/msg':>17} {'CPU ratio':>9}"
      f" {'rosetta msg/s':>14} {'mosquitto msg/s':>16} {'rate ratio':>10}")
for (client, scenario, broker), r in sorted(by.items()):
    if broker != "rosetta":
        continue
    m = by.get((client, scenario, "mosquitto"))
    if not m:
        continue
    def ratio(a, b):
        return f"{a / b:.2f}x" if a and b else "-"
    rc, mc = r.get("cpu_us_per_msg"), m.get("cpu_us_per_msg")
    print(f"{client:8} {scenario:12} {rc or 0:15.2f} {mc or 0:17.2f} {ratio(rc, mc):>9}"
          f" {r['msg_per_s']:14.0f} {m['msg_per_s']:16.0f} {ratio(r['msg_per_s'], m['msg_per_s']):>10}")
PY
