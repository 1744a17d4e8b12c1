#!/usr/bin/env bash
# A/B of two broker builds on one machine at one time (issue 17):
#   BEFORE_BIN=... BEFORE_LOAD=... AFTER_BIN=... AFTER_LOAD=... R=5 N=524288 ab-history.sh
# Both brokers run side by side; runs alternate; each line is one run:
# msg/s, and broker and load generator CPU per message (10 ms ticks).
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE/../../.."
BENCH_TMP=$(mktemp -d /tmp/s17-hist.XXXXXX)
source bench/peers/peers.sh
trap 'kill $PA $PB 2>/dev/null; wait 2>/dev/null; rm -rf "$BENCH_TMP"' EXIT
start() { # dir bin -> sets PORT PID
  rosetta_config "$1"; printf '[[streams]]\npattern = "bench-stream*"\n' >> "$1/rosetta.toml"
  "$2" --config "$1/rosetta.toml" > "$1/log" 2>&1 & PID=$!; PORT=$ROSETTA_STOMP_PORT
  wait_port "$PORT" "$PID" 30 || { echo "no start"; exit 1; }
}
start $BENCH_TMP/a $BEFORE_BIN; PA=$PID; PORTA=$PORT
start $BENCH_TMP/b $AFTER_BIN; PB=$PID; PORTB=$PORT
N=${N:-524288}
for x in "a $PORTA $PA $BEFORE_LOAD" "b $PORTB $PB $AFTER_LOAD"; do
  set -- $x
  "$4" --port $2 --broker-pid $3 --broker-name r --timeout-s 600 stomp-stream --stream bench-stream-h --count $N --size 1024 --window 1000 >/dev/null 2>&1
done
for i in $(seq 1 ${R:-4}); do
  for x in "before $PORTA $PA $BEFORE_LOAD" "after $PORTB $PB $AFTER_LOAD"; do
    set -- $x
    out=$("$4" --port $2 --broker-pid $3 --broker-name r --timeout-s 600 stomp-stream --stream bench-stream-h --count $N --size 1024 --readers 1 --prefetch 1000 --from first --no-append 2>&1 | grep '^RESULT ' | sed 's/^RESULT //')
    echo "$out" | python3 "$HERE/ab-fmt.py" "$1" 2>&1 || echo "$out" | head -c 400
  done
done
