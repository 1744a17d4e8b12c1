#!/usr/bin/env bash
# Runs the simulations (tests/journal_sim.rs, tests/core_sim.rs and
# tests/timers_sim.rs) on
# new random seeds for as long as asked, in a release build, and prints the
# seed of a failure so that it replays exactly:
#
#   scripts/simulate.sh [seconds]        # default 300, split between the three
#   SIM_SEED=<seed> cargo test --test journal_sim -- --nocapture   # replay
#
# CI runs a fixed set of seeds of each in `cargo test`; this looks further.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-300}"
third=$(( (secs + 2) / 3 ))
base="${SIM_SEED_BASE:-$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')}"
echo "simulating for ${secs}s from seed base ${base}"
status=0
for sim in journal_sim core_sim timers_sim; do
  log="$(mktemp)"
  if SIM_SECONDS="$third" SIM_SEED_BASE="$base" \
      nice -n 10 cargo test --release --locked --test "$sim" -- --nocapture >"$log" 2>&1; then
    grep -E "random seeds passed" "$log" || true
  else
    status=1
    echo "FAILED: $sim"
    grep -E -A3 "simulation seed|replay:" "$log" || tail -40 "$log"
    echo "full log: $log"
    continue
  fi
  rm -f "$log"
done
exit "$status"
