#!/usr/bin/env bash
# Runs the cargo-fuzz targets in turn, one libFuzzer job at a time, each for
# a time or an execution count. Not part of scripts/test.sh or CI: it needs
# nightly and takes minutes to hours.
#
#   scripts/fuzz.sh [SECONDS]                 # every target, SECONDS each (default 240)
#   scripts/fuzz.sh --seconds S [TARGET...]   # the same, for some targets
#   scripts/fuzz.sh --runs N [TARGET...]      # N executions each (libFuzzer -runs=N)
#   scripts/fuzz.sh --depth [TARGET...]       # the recorded depth: 10M executions
#                                             # for decoders, 3M for state machines
#   scripts/fuzz.sh --sanitizer none ...      # cargo fuzz's -s (default address):
#                                             # `none` for a safe-Rust parser whose
#                                             # depth ASan would take hours to reach
#
# TARGET is crate:target (mqtt:decode, config:parse, root:websocket, ...);
# `--list` prints them. With both --runs and --seconds a target stops at
# whichever comes first. Each target starts from its committed seeds
# (<dir>/fuzz/corpus/<target>/seed-*, and the dictionary
# <dir>/fuzz/<target>.dict when there is one) and adds what it finds to
# that directory (ignored by git). A crash stops the script with
# libFuzzer's reproducer path in
# <dir>/fuzz/artifacts/<target>/; replay it with
#   cd <dir> && cargo +nightly fuzz run <target> <artifact>
# where <dir> is protocols/<crate>, src/config for `config`, src/cluster
# for `cluster`, or the repository root for `root`.
# Logs go to $FUZZ_LOG_DIR (default target/fuzz-logs). All targets build in
# one directory, $CARGO_TARGET_DIR (default target/fuzz), to share crates.
set -euo pipefail
cd "$(dirname "$0")/.."

# crate:target:depth, depth in executions for --depth: decoders and
# parsers 10M, whole connection state machines 3M (they are 3-10x slower
# per input).
targets=(
    mqtt:decode:10000000 mqtt:connection:3000000
    stomp:decoder:10000000 stomp:connection:3000000 stomp:swar:10000000
    amqp:frame_decoder:10000000 amqp:connection:3000000
    config:parse:10000000 root:websocket:3000000 root:websocket_frames:10000000
    root:admin_api:3000000
    cluster:proxy_header:10000000 cluster:etcd_http:10000000
)
# libFuzzer's memory limit: a single allocation over it is a finding too.
rss_limit_mb=2048

usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2
    exit 2
}

is_count() { [[ "$1" =~ ^[0-9]+$ ]]; }

seconds=""
runs=""
depth=""
sanitizer=address
selected=()
while [ "$#" -gt 0 ]; do
    case "$1" in
        --seconds) is_count "${2:-}" || usage; seconds="$2"; shift 2 ;;
        --runs) is_count "${2:-}" || usage; runs="$2"; shift 2 ;;
        --depth) depth=1; shift ;;
        --sanitizer) [[ "${2:-}" =~ ^(address|leak|memory|thread|none)$ ]] || usage; sanitizer="$2"; shift 2 ;;
        --list) printf '%s\n' "${targets[@]%:*}"; exit 0 ;;
        -h | --help) usage ;;
        *:*) selected+=("$1"); shift ;;
        *) is_count "$1" || usage; seconds="$1"; shift ;;
    esac
done
if [ -z "$seconds$runs$depth" ]; then
    seconds=240
fi

chosen=()
for entry in "${targets[@]}"; do
    name="${entry%:*}"
    if [ "${#selected[@]}" -eq 0 ] || printf '%s\n' "${selected[@]}" | grep -qx "$name"; then
        chosen+=("$entry")
    fi
done
for name in "${selected[@]}"; do
    printf '%s\n' "${targets[@]%:*}" | grep -qx "$name" || { echo "unknown target $name (see --list)" >&2; exit 2; }
done

log_dir="${FUZZ_LOG_DIR:-$PWD/target/fuzz-logs}"
mkdir -p "$log_dir"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target/fuzz}"

# A fresh machine has neither: install them once (later runs find them).
if ! rustup toolchain list | grep -q '^nightly'; then
    echo "== installing the nightly toolchain (cargo fuzz needs it)" >&2
    rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "== cargo-fuzz is not installed: cargo +nightly install cargo-fuzz --locked" >&2
    # Built in cargo's own temporary directory, not among the fuzz builds.
    env -u CARGO_TARGET_DIR cargo +nightly install cargo-fuzz --locked || {
        echo "!! could not install cargo-fuzz; install it by hand with" >&2
        echo "!!   cargo +nightly install cargo-fuzz --locked" >&2
        echo "!! (it needs crates.io) and run this script again" >&2
        exit 1
    }
fi

for entry in "${chosen[@]}"; do
    IFS=: read -r crate target target_depth <<<"$entry"
    # cargo fuzz runs from the crate's directory, the one holding fuzz/.
    case "$crate" in
        root) crate_dir=. ;;
        config) crate_dir=src/config ;;
        cluster) crate_dir=src/cluster ;;
        *) crate_dir="protocols/$crate" ;;
    esac
    limits=()
    budget=""
    if [ -n "$depth" ]; then
        limits+=("-runs=$target_depth"); budget="$target_depth runs"
    elif [ -n "$runs" ]; then
        limits+=("-runs=$runs"); budget="$runs runs"
    fi
    if [ -n "$seconds" ]; then
        limits+=("-max_total_time=$seconds"); budget="${budget:+$budget or }${seconds}s"
    fi
    dict=()
    [ -f "$crate_dir/fuzz/$target.dict" ] && dict=("-dict=fuzz/$target.dict")
    log="$log_dir/$crate-$target.log"
    echo "== $crate/$target: $budget, sanitizer $sanitizer (log: $log)"
    (
        cd "$crate_dir"
        # && because set -e does not apply inside a subshell tested by ||.
        cargo +nightly fuzz build -s "$sanitizer" "$target" &&
            cargo +nightly fuzz run -s "$sanitizer" "$target" -- \
                "${limits[@]}" "${dict[@]}" -rss_limit_mb="$rss_limit_mb" -print_final_stats=1
    ) >"$log" 2>&1 || {
        echo "!! $crate/$target failed; see $log" >&2
        tail -n 40 "$log" >&2
        exit 1
    }
    # libFuzzer's "Done N runs in S second(s)" line summarises the run.
    grep -E '^Done [0-9]+ runs' "$log" || tail -n 1 "$log"
done
echo "all ${#chosen[@]} fuzz targets ran their budgets without a crash"
