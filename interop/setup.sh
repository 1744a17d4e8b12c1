#!/usr/bin/env bash
# Installs what the interop suite needs, idempotently and quietly when it is
# already there: Debian's mosquitto-clients (and build deps when
# python-qpid-proton has no wheel for this Python), a virtualenv at
# interop/.venv with the Python clients, a Node.js >= 20 (the machine's, or
# the pinned one from the npm registry: scripts/lib/install.sh) and the Node
# clients via `npm ci`. Reaches only Debian's archive, PyPI and the npm
# registry.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
install_tag="interop/setup"
# shellcheck source=../scripts/lib/install.sh
source "$here/../scripts/lib/install.sh"

# --- apt -------------------------------------------------------------------
apt_needed=()
command -v mosquitto_pub >/dev/null 2>&1 || apt_needed+=(mosquitto-clients)
# python-qpid-proton's Cyrus SASL finds its mechanisms (ANONYMOUS, PLAIN)
# as plugins; without them every AMQP connect fails "No worthy mechs found".
dpkg -s libsasl2-modules >/dev/null 2>&1 || apt_needed+=(libsasl2-modules)
# pip and npm verify TLS against the system's CA bundle on a minimal Debian.
[ -f /etc/ssl/certs/ca-certificates.crt ] || apt_needed+=(ca-certificates)
# The venv module: Debian's python3 splits it out; a pyenv/other python has it.
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    PYTHON=/usr/bin/python3
    "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1 || apt_needed+=(python3-venv)
fi
apt_install "${apt_needed[@]}"

# --- python venv -----------------------------------------------------------
venv="$here/.venv"
stamp="$venv/.requirements-installed"
if [ ! -x "$venv/bin/python" ]; then
    install_log "creating $venv"
    "$PYTHON" -m venv "$venv"
fi
if [ ! -f "$stamp" ] || ! cmp -s "$here/requirements.txt" "$stamp"; then
    install_log "pip install -r requirements.txt"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
    # python-qpid-proton is published as a source distribution only: pip
    # builds its C extension (cffi), which needs a compiler and the OpenSSL
    # and Cyrus SASL headers.
    build_deps=()
    command -v cc >/dev/null 2>&1 || build_deps+=(build-essential)
    for pkg in pkg-config libssl-dev libsasl2-dev; do
        dpkg -s "$pkg" >/dev/null 2>&1 || build_deps+=("$pkg")
    done
    "$venv/bin/python" -c 'import sysconfig, os, sys; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)' \
        || build_deps+=(python3-dev)
    apt_install "${build_deps[@]}"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$here/requirements.txt"
    cp "$here/requirements.txt" "$stamp"
fi

# --- node --------------------------------------------------------------------
ensure_node
node_dir="$here/node"
if [ ! -d "$node_dir/node_modules" ] || ! cmp -s "$node_dir/package-lock.json" "$node_dir/node_modules/.package-lock-copy.json"; then
    install_log "npm ci"
    (cd "$node_dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
    cp "$node_dir/package-lock.json" "$node_dir/node_modules/.package-lock-copy.json"
fi
