#!/usr/bin/env bash
# The whole test suite: formatting and lints first (they fail fast), then the
# Rust unit and integration tests (real clients over real sockets), then the
# cross-language interop suite and the browser test when present.
# This is the README's test command and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { echo "== $*" >&2; }

# A C compiler and make for the crates that build C (jemalloc, ring).
source scripts/lib/install.sh
install_tag=test ensure_build_tools

step "cargo fmt --all --check"
cargo fmt --all --check

step "cargo clippy --workspace --all-targets --locked -- -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

# The cluster tests need etcd; here they fail without it instead of
# skipping (rosetta_cluster::testing).
install_tag=test ensure_etcd
export ROSETTA_REQUIRE_ETCD=1

step "cargo test --workspace --locked"
cargo test --workspace --locked

if [ -x interop/run.sh ]; then
    step "interop/run.sh"
    interop/run.sh
fi

if [ -x interop/browser/run.sh ]; then
    step "interop/browser/run.sh"
    interop/browser/run.sh
fi
