#!/usr/bin/env bash
# Runs the cross-protocol interop suite: installs the clients (setup.sh),
# builds the broker (or reuses $ROSETTA_BIN), runs pytest, which starts and
# stops its own brokers on free loopback ports, and ends with the line
# "N passed, N failed, N skipped". Extra arguments go to pytest
# (e.g. interop/run.sh -k matrix -x).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"

"$here/setup.sh" || { echo "interop: setup failed"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
# setup.sh installed a Node.js >= 20; put the same one first on PATH for
# pytest, which starts `node` by name.
source "$root/scripts/lib/install.sh"
ensure_node || { echo "interop: no Node.js >= $node_major_min"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }

if [ -z "${ROSETTA_BIN:-}" ]; then
    target_dir="${CARGO_TARGET_DIR:-$root/target}"
    (cd "$root" && cargo build --release --locked --quiet) \
        || { echo "interop: broker build failed"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
    export ROSETTA_BIN="$target_dir/release/rosetta"
fi

report="$(mktemp)"
trap 'rm -f "$report"' EXIT
cd "$here"
"$here/.venv/bin/python" -m pytest tests -p no:cacheprovider -rs --junitxml="$report" "$@"
rc=$?

# One plain summary line from the JUnit report (pytest's own line also
# counts errors and may say "no tests ran").
counts="$("$here/.venv/bin/python" - "$report" <<'PY'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except Exception:
    print("0 0 0")
    raise SystemExit
suites = [root] if root.tag == "testsuite" else list(root)
t = sum(int(s.get("tests", 0)) for s in suites)
f = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
s_ = sum(int(s.get("skipped", 0)) for s in suites)
print(t - f - s_, f, s_)
PY
)"
read -r passed failed skipped <<<"$counts"
if [ "$rc" -eq 5 ]; then
    echo "interop: pytest collected no tests"
    failed=$((failed + 1))
    rc=1
elif [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
    failed=1   # interrupted or internal error: never report it as green
fi
echo "${passed} passed, ${failed} failed, ${skipped} skipped"
exit "$rc"
