#!/usr/bin/env bash
# Runs every cargo-fuzz target of the three protocol adapters in turn, one
# libFuzzer job at a time, SECONDS_PER_TARGET seconds each (default 240).
# Not part of scripts/test.sh or CI: it needs nightly and takes minutes.
#
#   scripts/fuzz.sh [seconds-per-target]
#
# Each target starts from its committed seeds (protocols/<p>/fuzz/corpus/
# <target>/seed-*) and adds what it finds to that directory (ignored by
# git). A crash stops the script with libFuzzer's reproducer path in
# protocols/<p>/fuzz/artifacts/<target>/; replay it with
#   cd protocols/<p> && cargo +nightly fuzz run <target> <artifact>
# Logs go to $FUZZ_LOG_DIR (default target/fuzz-logs); the last "#N" line of
# each is the execution count. Set CARGO_TARGET_DIR to share a build dir.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-240}"
case "$seconds" in
    '' | *[!0-9]*) echo "usage: $0 [seconds-per-target]" >&2; exit 2 ;;
esac
log_dir="${FUZZ_LOG_DIR:-$PWD/target/fuzz-logs}"
mkdir -p "$log_dir"

if ! rustup toolchain list | grep -q '^nightly'; then
    rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

# crate:target pairs; each protocols/<crate>/fuzz is its own workspace.
targets=(
    mqtt:decode mqtt:connection
    stomp:decoder stomp:connection
    amqp:frame_decoder amqp:connection
)

for pair in "${targets[@]}"; do
    crate="${pair%%:*}"
    target="${pair#*:}"
    log="$log_dir/$crate-$target.log"
    echo "== $crate/$target: ${seconds}s (log: $log)"
    (
        cd "protocols/$crate"
        # && because set -e does not apply inside a subshell tested by ||.
        cargo +nightly fuzz build "$target" &&
            cargo +nightly fuzz run "$target" -- \
                -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1
    ) >"$log" 2>&1 || {
        echo "!! $crate/$target failed; see $log" >&2
        tail -n 40 "$log" >&2
        exit 1
    }
    # libFuzzer's "Done N runs in S second(s)" line summarises the run.
    grep -E '^Done [0-9]+ runs' "$log" || tail -n 1 "$log"
done
echo "all fuzz targets ran ${seconds}s each without a crash"
