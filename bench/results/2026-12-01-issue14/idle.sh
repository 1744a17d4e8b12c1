#!/usr/bin/env bash
# idle.sh BROKER_BIN LOAD_BIN [--subscribe]: one fresh broker, 10,000 idle MQTT connections, RSS/conn
set -u
B=$1; L=$2; shift 2
d=$(mktemp -d /tmp/rosetta-idle.XXXXXX)
fp() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
m=$(fp); s=$(fp); a=$(fp)
cat > $d/r.toml <<CONF
data_dir = "$d/data"
[listeners]
mqtt = "127.0.0.1:$m"
stomp = "127.0.0.1:$s"
amqp = "127.0.0.1:$a"
websocket = ""
mqtts = ""
stomps = ""
amqps = ""
wss = ""
[store]
sync = "every-commit"
[broker]
connections_max = 100000
CONF
ulimit -n $(ulimit -Hn)
$B --config $d/r.toml > $d/log 2>&1 & pid=$!
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$m) 2>/dev/null && break; sleep 0.1; done
$L --port $m --broker-pid $pid --broker-name x mqtt-idle --connections 10000 "$@" 2>&1 | grep -E "^x |RSS"
kill $pid; wait $pid 2>/dev/null; rm -rf $d
