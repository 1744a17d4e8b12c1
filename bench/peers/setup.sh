#!/usr/bin/env bash
# Installs the peer brokers the benchmarks compare Rosetta with (Debian
# packages): mosquitto, ActiveMQ (+ libmqtt-client-java, which its MQTT
# transport loads), RabbitMQ, or those named as arguments. Idempotent: installed packages are skipped.
#
# The run scripts never use the system services: each peer is started in
# the foreground under a temp dir so its PID (for /proc) is known. While
# installing we therefore tell invoke-rc.d not to start the services
# (policy-rc.d exit 101), so nothing else competes for the two cores.
set -euo pipefail

# Arguments, when given, name the packages to install (bench/churn.sh needs
# only mosquitto).
pkgs=(mosquitto activemq libmqtt-client-java rabbitmq-server)
[ $# -eq 0 ] || pkgs=("$@")
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "peers: all installed (${pkgs[*]})"
  exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

policy=/usr/sbin/policy-rc.d
added_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
  $SUDO chmod +x "$policy"
  added_policy=1
fi
cleanup() { [ "$added_policy" -eq 1 ] && $SUDO rm -f "$policy"; true; }
trap cleanup EXIT

$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "peers: installed ${missing[*]}"
