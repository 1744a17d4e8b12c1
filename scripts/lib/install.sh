# Shared install helpers for the test scripts (sourced, not run):
# `apt_install PKG...`, `ensure_build_tools`, `ensure_etcd` and `ensure_node`. Everything they fetch comes from
# Debian's archive or the npm registry, so a fresh Debian 12 with only the
# package registries reachable can run the whole suite.
#
#   source "$root/scripts/lib/install.sh"
#   ensure_node            # a Node.js >= node_major_min first on PATH, and npm
#   ensure_etcd            # Debian's etcd (etcd-server) on PATH

# The callers set -euo pipefail; this file only defines things.
install_lib_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
install_root="$(cd "$install_lib_dir/../.." && pwd)"

install_log() { echo "${install_tag:-setup}: $*" >&2; }

# apt-get install, once per process with a fresh package list. Fails with
# the apt log when not root or when a package cannot be had.
apt_updated=""
apt_install() {
    [ "$#" -eq 0 ] && return 0
    install_log "apt-get install $*"
    if [ "$(id -u)" -ne 0 ]; then
        install_log "not root: cannot install $* (install them and rerun)"
        return 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    local apt_log="${TMPDIR:-/tmp}/rosetta-apt.log"
    if [ -z "$apt_updated" ]; then
        apt-get update -qq >"$apt_log" 2>&1 || { cat "$apt_log" >&2; return 1; }
        apt_updated=1
    fi
    apt-get install -y -qq --no-install-recommends "$@" >"$apt_log" 2>&1 \
        || { cat "$apt_log" >&2; return 1; }
}

# --- build tools ---------------------------------------------------------------
# Crates that build C: jemalloc (the broker's allocator, built with make),
# ring. The Rust toolchain itself comes from rustup, not from here.
ensure_build_tools() {
    local missing=()
    command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
    command -v make >/dev/null 2>&1 || missing+=(make)
    apt_install "${missing[@]}"
}

# --- etcd ----------------------------------------------------------------------
# The cluster tests (issue 19) start their own etcd on free loopback ports
# (rosetta_cluster::testing); Debian's etcd-server package ships the binary.
# Its service, where systemd runs it, listens on 2379 and is not used.
ensure_etcd() {
    command -v etcd >/dev/null 2>&1 && return 0
    apt_install etcd-server
}

# --- Node.js -----------------------------------------------------------------
# playwright-core (the browser test) needs Node >= 20, and Debian 12 ships
# Node 18. When the node on PATH is older (or missing), the pinned Node is
# installed from the npm registry's platform package `node-linux-<arch>` (the
# upstream Linux binary published as an npm package) with Debian's npm, under
# interop/.node (ignored by git), and put first on PATH for this process and
# its children (pytest starts `node` by name).
node_major_min=20
node_pinned_version=20.20.2
node_install_dir="${ROSETTA_NODE_DIR:-$install_root/interop/.node}"

node_major() { # prints the major version of the node at $1, or nothing
    local v
    v="$("$1" --version 2>/dev/null)" || return 0
    v="${v#v}"
    echo "${v%%.*}"
}

node_arch() {
    case "$(uname -m)" in
        x86_64 | amd64) echo x64 ;;
        aarch64 | arm64) echo arm64 ;;
        armv7l) echo armv7l ;;
        ppc64le) echo ppc64le ;;
        s390x) echo s390x ;;
        *) install_log "no node-linux package for $(uname -m)"; return 1 ;;
    esac
}

ensure_node() {
    local system_node major
    system_node="$(command -v node 2>/dev/null || true)"
    if [ -n "$system_node" ]; then
        major="$(node_major "$system_node")"
        if [ -n "$major" ] && [ "$major" -ge "$node_major_min" ]; then
            command -v npm >/dev/null 2>&1 || apt_install npm
            return 0
        fi
    fi

    local arch pkg bin_dir
    arch="$(node_arch)"
    pkg="node-linux-$arch"
    bin_dir="$node_install_dir/node_modules/$pkg/bin"
    if [ "$("$bin_dir/node" --version 2>/dev/null)" != "v$node_pinned_version" ]; then
        # Debian's npm (it brings Debian's Node 18, which is enough to run it).
        command -v npm >/dev/null 2>&1 || apt_install npm
        local found="no node on PATH"
        [ -n "$system_node" ] && found="$system_node is $("$system_node" --version 2>/dev/null || echo unusable)"
        install_log "npm install $pkg@$node_pinned_version ($found; need >= $node_major_min)"
        mkdir -p "$node_install_dir"
        [ -f "$node_install_dir/package.json" ] || echo '{ "private": true }' >"$node_install_dir/package.json"
        (cd "$node_install_dir" && npm install --no-audit --no-fund --loglevel=error \
            "$pkg@$node_pinned_version" >/dev/null)
        [ "$("$bin_dir/node" --version 2>/dev/null)" = "v$node_pinned_version" ] \
            || { install_log "$bin_dir/node is not v$node_pinned_version after npm install"; return 1; }
    fi
    export PATH="$bin_dir:$PATH"
}
