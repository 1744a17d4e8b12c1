#!/usr/bin/env bash
# Installs what the browser test needs, idempotently: Debian's chromium, the
# interop suite's Python venv and Node.js >= 20 (interop/setup.sh: paho-mqtt,
# python-qpid-proton, pytest; the machine's node or the pinned one from the
# npm registry) and the npm packages of this directory (playwright-core and
# the mqtt and @stomp/stompjs browser bundles) via `npm ci`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
install_tag="interop/browser/setup"
# shellcheck source=../../scripts/lib/install.sh
source "$here/../../scripts/lib/install.sh"

if [ ! -x "${CHROMIUM:-/usr/bin/chromium}" ]; then
    apt_install chromium
fi

# The Python clients and Node come from the interop suite's own setup; this
# process needs the same node on PATH (found again, not reinstalled).
"$here/../setup.sh"
ensure_node

# npm ci only when the lock file changed since the last install.
stamp="$here/node_modules/.package-lock.installed"
if [ ! -f "$stamp" ] || ! cmp -s "$here/package-lock.json" "$stamp"; then
    install_log "npm ci"
    (cd "$here" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
    cp "$here/package-lock.json" "$stamp"
fi
