# Sourced by bench/run.sh: starts each broker as a foreground child under
# its own temp dir and ports, waits for its listeners, and exports the PID
# that owns them (for /proc). Stop everything with `peers_stop_all`.
#
# Every start_* function sets <NAME>_PID and the ports it listens on;
# on failure it prints why, returns 1, and leaves the PID empty.
#
# Persistence is on everywhere:
#   rosetta    journal, [store] sync = "every-commit" (fdatasync per commit)
#   mosquitto  persistence true (a snapshot file, written at autosave/exit;
#              mosquitto has no per-message sync)
#   activemq   KahaDB, journalDiskSyncStrategy="always"
#   rabbitmq   durable queues (STOMP /queue/x, AMQP durable termini) and
#              persistent/durable messages, publisher confirms for receipts

BENCH_TMP=${BENCH_TMP:-$(mktemp -d /tmp/rosetta-bench.XXXXXX)}
PEER_PIDS=()

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# wait_port PORT PID SECONDS: until PORT accepts TCP connections (or PID dies).
wait_port() {
  local port=$1 pid=$2 deadline=$((SECONDS + $3))
  while [ $SECONDS -lt $deadline ]; do
    kill -0 "$pid" 2>/dev/null || return 1
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
    sleep 0.3
  done
  return 1
}

# listener_pid PORT: the PID of the process listening on PORT.
listener_pid() {
  ss -Hltnp "sport = :$1" | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2
}

peers_stop_all() {
  local pid
  for pid in "${PEER_PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${PEER_PIDS[@]}"; do
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  PEER_PIDS=()
}

# test_tls DIR: a throwaway CA (DIR/ca.crt) and a server certificate and
# key for localhost and 127.0.0.1 signed by it (DIR/server.crt,
# DIR/server.key), P-256, valid two days.
test_tls() {
  local dir=$1
  mkdir -p "$dir"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj /CN=bench-ca -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=localhost \
    -keyout "$dir/server.key" -out "$dir/server.csr" 2>/dev/null
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > "$dir/ext"
  openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
    -CAcreateserial -days 2 -extfile "$dir/ext" -out "$dir/server.crt" 2>/dev/null
}

# rosetta_config DIR: picks free ports (ROSETTA_MQTT_PORT, _STOMP_PORT,
# _AMQP_PORT, _WS_PORT, _ADMIN_PORT) and writes DIR/rosetta.toml: a journal in DIR/data synced on
# every commit, plain listeners on those ports, the admin API on a free port
# too (the default 8161 may be taken by another broker on the machine),
# nothing else.
rosetta_config() {
  local dir=$1
  mkdir -p "$dir/data"
  # Six ports from one call, held open together, so no two are the same
  # (free_port called six times may hand the same port out twice).
  read -r ROSETTA_MQTT_PORT ROSETTA_STOMP_PORT ROSETTA_AMQP_PORT ROSETTA_WS_PORT \
    ROSETTA_ADMIN_PORT _ < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(6)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')
  cat > "$dir/rosetta.toml" <<CONF
data_dir = "$dir/data"
[listeners]
mqtt = "127.0.0.1:$ROSETTA_MQTT_PORT"
stomp = "127.0.0.1:$ROSETTA_STOMP_PORT"
amqp = "127.0.0.1:$ROSETTA_AMQP_PORT"
websocket = "127.0.0.1:$ROSETTA_WS_PORT"
mqtts = ""
stomps = ""
amqps = ""
wss = ""
[store]
sync = "every-commit"
[broker]
connections_max = 100000
[admin]
listen = "127.0.0.1:$ROSETTA_ADMIN_PORT"
CONF
}

# rosetta_stream_config DIR: rosetta_config, with every `bench-stream*`
# name a stream (the stream benchmarks' names).
rosetta_stream_config() {
  rosetta_config "$1"
  printf '[[streams]]\npattern = "bench-stream*"\n' >> "$1/rosetta.toml"
}

# rosetta_stream_start DIR [TIMEOUT_S]: starts ROSETTA_BIN on DIR's config
# (rosetta_stream_config), its log appended to DIR/rosetta.log, as
# ROSETTA_PID, and waits for its STOMP port (default 30 s).
rosetta_stream_start() {
  "$ROSETTA_BIN" --config "$1/rosetta.toml" >> "$1/rosetta.log" 2>&1 &
  ROSETTA_PID=$!
  PEER_PIDS+=("$ROSETTA_PID")
  wait_port "$ROSETTA_STOMP_PORT" "$ROSETTA_PID" "${2:-30}" ||
    { echo "rosetta did not start"; tail -20 "$1/rosetta.log"; return 1; }
}

# rosetta_stop: stops the broker rosetta_stream_start started (SIGTERM,
# waits for it) and drops it from PEER_PIDS, so that a script that starts
# brokers one after another does not signal gone PIDs at exit.
rosetta_stop() {
  kill -TERM "$ROSETTA_PID" 2>/dev/null || true
  wait "$ROSETTA_PID" 2>/dev/null || true
  local kept=() pid
  for pid in "${PEER_PIDS[@]}"; do
    [ "$pid" = "$ROSETTA_PID" ] || kept+=("$pid")
  done
  PEER_PIDS=("${kept[@]}")
}

# rosetta_binaries: keeps ROSETTA_BIN and LOAD_BIN when both are set (a
# binary from another commit, no build); otherwise builds both from this
# checkout into CARGO_TARGET_DIR and points them there.
rosetta_binaries() {
  if [ -n "${ROSETTA_BIN:-}" ] && [ -n "${LOAD_BIN:-}" ]; then
    return 0
  fi
  cargo build --release --locked -p rosetta -p rosetta-load || return 1
  ROSETTA_BIN=$CARGO_TARGET_DIR/release/rosetta
  LOAD_BIN=$CARGO_TARGET_DIR/release/rosetta-load
}

start_rosetta() {
  local dir=$BENCH_TMP/rosetta attempt
  # A port found free can be taken before the broker binds it (after a run
  # of 19,000 connections the ephemeral range is busy closing): then again
  # with new ports, twice at most.
  for attempt in 1 2 3; do
    rm -rf "$dir/data"
    rosetta_config "$dir"
    "$ROSETTA_BIN" --config "$dir/rosetta.toml" > "$dir/rosetta.log" 2>&1 &
    ROSETTA_PID=$!
    PEER_PIDS+=("$ROSETTA_PID")
    if wait_port "$ROSETTA_AMQP_PORT" "$ROSETTA_PID" 30; then
      return 0
    fi
    if [ "$attempt" -lt 3 ] && grep -q "Address already in use" "$dir/rosetta.log"; then
      echo "rosetta: a port was taken before it bound it; again with new ports" >&2
      kill -KILL "$ROSETTA_PID" 2>/dev/null || true
      continue
    fi
    break
  done
  echo "rosetta did not start; log:"; tail -20 "$dir/rosetta.log"; ROSETTA_PID=""; return 1
}

start_mosquitto() {
  local dir=$BENCH_TMP/mosquitto
  mkdir -p "$dir/data"
  MOSQUITTO_PORT=$(free_port)
  cat > "$dir/mosquitto.conf" <<CONF
listener $MOSQUITTO_PORT 127.0.0.1
allow_anonymous true
persistence true
persistence_location $dir/data/
user root
log_dest file $dir/mosquitto.log
max_queued_messages 100000
CONF
  mosquitto -c "$dir/mosquitto.conf" > "$dir/stdout.log" 2>&1 &
  MOSQUITTO_PID=$!
  PEER_PIDS+=("$MOSQUITTO_PID")
  if ! wait_port "$MOSQUITTO_PORT" "$MOSQUITTO_PID" 15; then
    echo "mosquitto did not start; log:"; tail -20 "$dir/mosquitto.log" "$dir/stdout.log"; MOSQUITTO_PID=""; return 1
  fi
}

start_activemq() {
  local dir=$BENCH_TMP/activemq
  mkdir -p "$dir/conf" "$dir/data" "$dir/tmp" "$dir/lib"
  # ActiveMQ's MQTT transport needs the fusesource MQTT codec and
  # hawtdispatch, which Debian ships outside ActiveMQ's lib dir.
  local jar
  for jar in mqtt-client hawtdispatch hawtdispatch-transport; do
    [ -e "/usr/share/java/$jar.jar" ] && ln -sf "/usr/share/java/$jar.jar" "$dir/lib/$jar.jar"
  done
  ACTIVEMQ_MQTT_PORT=$(free_port); ACTIVEMQ_STOMP_PORT=$(free_port)
  cat > "$dir/conf/activemq.xml" <<CONF
<beans xmlns="http://www.springframework.org/schema/beans"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
  xsi:schemaLocation="http://www.springframework.org/schema/beans http://www.springframework.org/schema/beans/spring-beans-2.0.xsd
  http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">
  <broker xmlns="http://activemq.apache.org/schema/core" useJmx="false" brokerName="bench"
          dataDirectory="$dir/data" schedulePeriodForDestinationPurge="0">
    <persistenceAdapter>
      <kahaDB directory="$dir/data/kahadb" journalDiskSyncStrategy="always"/>
    </persistenceAdapter>
    <systemUsage>
      <systemUsage>
        <memoryUsage><memoryUsage limit="256 mb"/></memoryUsage>
        <storeUsage><storeUsage limit="10 gb"/></storeUsage>
        <tempUsage><tempUsage limit="1 gb"/></tempUsage>
      </systemUsage>
    </systemUsage>
    <transportConnectors>
      <transportConnector name="mqtt" uri="mqtt+nio://127.0.0.1:$ACTIVEMQ_MQTT_PORT?maximumConnections=20000&amp;transport.tcpNoDelay=true"/>
      <transportConnector name="stomp" uri="stomp+nio://127.0.0.1:$ACTIVEMQ_STOMP_PORT?maximumConnections=1000&amp;transport.tcpNoDelay=true"/>
    </transportConnectors>
  </broker>
</beans>
CONF
  cp /etc/activemq/instances-available/main/log4j2.properties "$dir/conf/" 2>/dev/null || true
  java -Xms512M -Xmx512M \
    --add-reads=java.xml=java.logging \
    --add-opens java.base/java.security=ALL-UNNAMED \
    --add-opens java.base/java.net=ALL-UNNAMED \
    --add-opens java.base/java.lang=ALL-UNNAMED \
    --add-opens java.base/java.util=ALL-UNNAMED \
    --add-opens java.naming/javax.naming.spi=ALL-UNNAMED \
    --add-opens java.base/java.util.concurrent=ALL-UNNAMED \
    --add-opens java.base/java.util.concurrent.atomic=ALL-UNNAMED \
    -Dactivemq.classpath="$dir/lib" \
    -Dactivemq.home=/usr/share/activemq \
    -Dactivemq.base="$dir" -Dactivemq.conf="$dir/conf" -Dactivemq.data="$dir/data" \
    -Djava.io.tmpdir="$dir/tmp" \
    -jar /usr/share/activemq/bin/activemq.jar start "xbean:file:$dir/conf/activemq.xml" \
    > "$dir/activemq.log" 2>&1 &
  ACTIVEMQ_PID=$!
  PEER_PIDS+=("$ACTIVEMQ_PID")
  if ! wait_port "$ACTIVEMQ_STOMP_PORT" "$ACTIVEMQ_PID" 90 || ! wait_port "$ACTIVEMQ_MQTT_PORT" "$ACTIVEMQ_PID" 10; then
    echo "activemq did not start; log:"; tail -30 "$dir/activemq.log"; ACTIVEMQ_PID=""; return 1
  fi
}

start_rabbitmq() {
  local dir=$BENCH_TMP/rabbitmq
  mkdir -p "$dir/mnesia" "$dir/log" "$dir/home"
  RABBITMQ_AMQP_PORT=$(free_port); RABBITMQ_STOMP_PORT=$(free_port)
  local dist_port epmd_port
  dist_port=$(free_port); epmd_port=$(free_port)
  cat > "$dir/rabbitmq.conf" <<CONF
listeners.tcp.1 = 127.0.0.1:$RABBITMQ_AMQP_PORT
stomp.listeners.tcp.1 = 127.0.0.1:$RABBITMQ_STOMP_PORT
tcp_listen_options.nodelay = true
stomp.tcp_listen_options.nodelay = true
loopback_users = none
CONF
  echo "[rabbitmq_stomp,rabbitmq_amqp1_0]." > "$dir/enabled_plugins"
  # The Debian wrapper (/usr/sbin/rabbitmq-server) switches to the rabbitmq
  # user and system paths; the real script runs in the foreground here.
  HOME="$dir/home" \
  RABBITMQ_NODENAME="bench@localhost" \
  RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf" \
  RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
  RABBITMQ_MNESIA_BASE="$dir/mnesia" \
  RABBITMQ_LOG_BASE="$dir/log" \
  RABBITMQ_PID_FILE="$dir/rabbitmq.pid" \
  RABBITMQ_DIST_PORT="$dist_port" \
  ERL_EPMD_PORT="$epmd_port" \
    /usr/lib/rabbitmq/bin/rabbitmq-server > "$dir/stdout.log" 2>&1 &
  local wrapper=$!
  PEER_PIDS+=("$wrapper")
  if ! wait_port "$RABBITMQ_STOMP_PORT" "$wrapper" 120; then
    echo "rabbitmq did not start; log:"; tail -30 "$dir/stdout.log"; RABBITMQ_PID=""; return 1
  fi
  # The script execs erl; the listener belongs to beam.smp.
  RABBITMQ_PID=$(listener_pid "$RABBITMQ_STOMP_PORT")
  RABBITMQ_EPMD_PORT=$epmd_port
  [ -n "$RABBITMQ_PID" ] && [ "$RABBITMQ_PID" != "$wrapper" ] && PEER_PIDS+=("$RABBITMQ_PID")
}
