#!/usr/bin/env bash
# The browser tests (issue 6: test_browser.py; issue 18: test_console.py): installs what it needs (setup.sh), builds the
# release broker (or uses $ROSETTA_BIN), runs test_browser.py with the
# interop venv's pytest and ends with the line "N passed, N failed".
# Extra arguments go to pytest.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"

"$here/setup.sh" || { echo "browser: setup failed"; echo "0 passed, 1 failed"; exit 1; }
# setup.sh installed a Node.js >= 20; put the same one first on PATH for
# pytest, which starts `node` by name.
source "$root/scripts/lib/install.sh"
ensure_node || { echo "browser: no Node.js >= $node_major_min"; echo "0 passed, 1 failed"; exit 1; }

if [ -z "${ROSETTA_BIN:-}" ]; then
    target_dir="${CARGO_TARGET_DIR:-$root/target}"
    (cd "$root" && cargo build --release --locked --quiet) \
        || { echo "browser: broker build failed"; echo "0 passed, 1 failed"; exit 1; }
    export ROSETTA_BIN="$target_dir/release/rosetta"
fi

report="$(mktemp)"
trap 'rm -f "$report"' EXIT
cd "$here"
"$here/../.venv/bin/python" -m pytest test_browser.py test_console.py -p no:cacheprovider -rs --junitxml="$report" "$@"
rc=$?

counts="$("$here/../.venv/bin/python" - "$report" <<'PY'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except Exception:
    print("0 0")
    raise SystemExit
suites = [root] if root.tag == "testsuite" else list(root)
t = sum(int(s.get("tests", 0)) for s in suites)
f = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
s_ = sum(int(s.get("skipped", 0)) for s in suites)
print(t - f - s_, f)
PY
)"
read -r passed failed <<<"$counts"
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
    failed=1   # no tests, interrupted or internal error: never report it as green
fi
echo "${passed} passed, ${failed} failed"
exit "$rc"
