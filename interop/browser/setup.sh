#!/usr/bin/env bash
# Installs what the browser test needs, idempotently: Debian's chromium
# (apt-get update only when it is missing), the interop suite's Python venv
# (interop/setup.sh: paho-mqtt, python-qpid-proton, pytest) and the npm
# packages of this directory (playwright-core and the mqtt and
# @stomp/stompjs browser bundles) via `npm ci`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
log() { echo "interop/browser/setup: $*" >&2; }

if [ ! -x "${CHROMIUM:-/usr/bin/chromium}" ]; then
    if [ "$(id -u)" -ne 0 ]; then
        log "chromium is missing and this is not root: apt-get install chromium, then rerun"
        exit 1
    fi
    log "apt-get install chromium"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends chromium >/tmp/browser-apt.log 2>&1 \
        || { cat /tmp/browser-apt.log >&2; exit 1; }
fi

# The Python clients come from the interop suite's own setup.
"$here/../setup.sh"

# npm ci only when the lock file changed since the last install.
stamp="$here/node_modules/.package-lock.installed"
if [ ! -f "$stamp" ] || ! cmp -s "$here/package-lock.json" "$stamp"; then
    log "npm ci"
    (cd "$here" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
    cp "$here/package-lock.json" "$stamp"
fi
