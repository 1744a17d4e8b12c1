#!/usr/bin/env bash
# The whole test suite: Rust unit and integration tests (real clients over
# real sockets), then the cross-language interop suite when present.
# This is the README's test command and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --workspace --locked

if [ -x interop/run.sh ]; then
    interop/run.sh
fi

if [ -x interop/browser/run.sh ]; then
    interop/browser/run.sh
fi
