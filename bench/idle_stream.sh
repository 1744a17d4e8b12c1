#!/usr/bin/env bash
# Issue 20: does a QoS 1 stream between two other clients keep its rate
# and p99 while the broker holds many idle connections?
#
#   bench/idle_stream.sh BROKER_BIN LOAD_BIN [COUNT] [PROTOCOLS]
#
# For each idle PROTOCOL (default "mqtt stomp amqp mqtt-ws") and broker
# (Rosetta; mosquitto too for mqtt unless PEER=), two runs on a freshly
# started broker each:
#   base  the stream alone: rumqttc QoS 1, 1 publisher -> 1 subscriber,
#         RATE msg/s paced (default 1000), MSGS messages (default 10000);
#   idle  COUNT idle connections (default 19000, keep-alive 60 s, one
#         subscription each when SUBSCRIBE=1) opened by one load-tool
#         process and held, and the same stream from a second process
#         while they are held.
# It prints the stream's rate and p50/p99 in both runs and their ratio,
# and the broker's RSS per idle connection before and after the stream.
# RESULT lines go to $OUT (default bench/results/<date>-issue20/idle-stream.jsonl).
set -euo pipefail

ROSETTA_BIN=${1:?broker binary}
LOAD=${2:?rosetta-load binary}
COUNT=${3:-19000}
PROTOCOLS=${4:-mqtt stomp amqp mqtt-ws}
RATE=${RATE:-1000}
MSGS=${MSGS:-10000}
SUBSCRIBE=${SUBSCRIBE:-0}
PEER=${PEER-mosquitto}
OUT=${OUT:-$(dirname "$0")/results/$(date -u +%F)-issue20/idle-stream.jsonl}
mkdir -p "$(dirname "$OUT")"

# shellcheck source=bench/peers/peers.sh
source "$(dirname "$0")/peers/peers.sh"
trap 'peers_stop_all; rm -rf "$BENCH_TMP"' EXIT
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
if [ "$PEER" = mosquitto ] && [[ " $PROTOCOLS " == *" mqtt "* ]]; then
  "$(dirname "$0")/peers/setup.sh" mosquitto >/dev/null
fi

sub=()
[ "$SUBSCRIBE" = 1 ] && sub=(--subscribe)

# start NAME: a fresh broker; sets PID, MQTT_PORT and IDLE_PORTS.
start() {
  rm -rf "$BENCH_TMP/rosetta" "$BENCH_TMP/mosquitto"
  case $1 in
    rosetta)
      start_rosetta
      PID=$ROSETTA_PID MQTT_PORT=$ROSETTA_MQTT_PORT
      declare -gA IDLE_PORTS=([mqtt]=$ROSETTA_MQTT_PORT [stomp]=$ROSETTA_STOMP_PORT
        [amqp]=$ROSETTA_AMQP_PORT [mqtt-ws]=$ROSETTA_WS_PORT) ;;
    mosquitto)
      start_mosquitto
      PID=$MOSQUITTO_PID MQTT_PORT=$MOSQUITTO_PORT
      declare -gA IDLE_PORTS=([mqtt]=$MOSQUITTO_PORT) ;;
  esac
}

# stream NAME: the QoS 1 stream against the started broker; its RESULT line.
stream() {
  "$LOAD" --port "$MQTT_PORT" --broker-pid "$PID" --broker-name "$1" \
    --timeout-s $((MSGS / RATE + 60)) \
    mqtt-qos1 --client rumqttc --rate "$RATE" --count "$MSGS" | grep '^RESULT ' || true
}

# field JSON KEY: one number of a RESULT line ("-" when missing).
field() {
  python3 -c 'import json,sys
r = json.loads(sys.argv[1][len("RESULT "):]) if sys.argv[1] else {}
v = r.get(sys.argv[2])
print("-" if v is None else "%.0f" % v)' "$1" "$2"
}

echo "idle + stream: $COUNT idle connections (subscribe=$SUBSCRIBE), QoS 1 rumqttc 1 -> 1 at $RATE msg/s, $MSGS messages; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-10s %-8s %9s %9s %9s %9s %9s %9s %8s %11s %11s\n' broker idle base_msg/s idle_msg/s base_p50 idle_p50 base_p99 idle_p99 p99_x B/conn B/conn_end
for proto in $PROTOCOLS; do
  brokers=rosetta
  [ "$PEER" = mosquitto ] && [ "$proto" = mqtt ] && brokers="mosquitto rosetta"
  for broker in $brokers; do
    start "$broker" || { echo "$broker did not start"; exit 1; }
    base=$(stream "$broker")
    peers_stop_all
    [ -n "$base" ] && echo "$base" | sed 's/^RESULT //' >> "$OUT"

    start "$broker" || { echo "$broker did not start"; exit 1; }
    held=$BENCH_TMP/idle.out
    "$LOAD" --port "${IDLE_PORTS[$proto]}" --broker-pid "$PID" --broker-name "$broker" \
      --timeout-s 600 idle --protocol "$proto" --connections "$COUNT" --keep-alive-s 60 \
      --hold-s $((MSGS / RATE + 20)) "${sub[@]}" > "$held" 2>&1 &
    idle_pid=$!
    until grep -q '^HOLDING' "$held" 2>/dev/null; do
      kill -0 "$idle_pid" 2>/dev/null || { echo "idle run ended early:"; cat "$held"; exit 1; }
      sleep 1
    done
    during=$(stream "$broker")
    wait "$idle_pid" || true
    peers_stop_all
    idle_line=$(grep '^RESULT ' "$held" || true)
    [ -n "$during" ] && echo "$during" | sed 's/^RESULT /{"during_idle": '"$COUNT"', "idle_protocol": "'"$proto"'", "stream": /; s/$/}/' >> "$OUT"
    [ -n "$idle_line" ] && echo "$idle_line" | sed 's/^RESULT //' >> "$OUT"

    per_conn=$(field "$idle_line" rss_per_conn_bytes)
    end=$(python3 -c 'import json,sys
l = sys.argv[1]
if not l: print("-"); sys.exit()
r = json.loads(l[len("RESULT "):])
e, b, n = r.get("rss_after_hold_bytes"), r["rss_before_bytes"], r["received"]
print("-" if e is None or not n else "%.0f" % ((e - b) / n))' "$idle_line")
    p99b=$(field "$base" p99_us) p99i=$(field "$during" p99_us)
    ratio=$(python3 -c 'import sys
a, b = sys.argv[1:]
print("-" if "-" in (a, b) or float(a) == 0 else "%.2f" % (float(b) / float(a)))' "$p99b" "$p99i")
    printf '%-10s %-8s %9s %9s %9s %9s %9s %9s %8s %11s %11s\n' "$broker" "$proto" \
      "$(field "$base" msg_per_s)" "$(field "$during" msg_per_s)" \
      "$(field "$base" p50_us)" "$(field "$during" p50_us)" "$p99b" "$p99i" "$ratio" "$per_conn" "$end"
  done
done
echo "RESULT lines appended to $OUT"
