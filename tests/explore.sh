#!/usr/bin/env bash
# The deterministic scheduler of connections (tests/explore, issue 38): its tests, then every
# scenario over a range of seeds, one VFS call at a time in the order each seed gives, with the
# invariants checked after every schedule. Prints `<scenario>: explored N schedules ...` per
# scenario and `explored N schedules in all; violations V`; fails when V > 0, printing each
# failing schedule's seed, replay command and steps.
#
#   bash tests/explore.sh                                   # the CI run (EXPLORE_SCHEDULES per scenario)
#   bash tests/explore.sh --scenario peer-loss --seed 17    # replays one schedule, step by step
#   bash tests/explore.sh --scenario peer-loss --schedules 20000 --first 1000000   # a longer search
#
# Built in the debug profile (it reuses the root `cargo test` build of the dependencies). The
# schedules' directories go to /dev/shm when there is one (tmpfs: no fsync waits, about 6x faster;
# user extended attributes, which the stale-WAL record needs, since Linux 6.6 — without them the
# test that restore-openers sets a WAL aside fails, it does not pass silently); EXPLORE_TMPDIR
# chooses another. Each run of 500 seeds is its own process (the guard's process-wide state
# grows with every database it has seen, and slows a long run down).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

if [ -n "${EXPLORE_TMPDIR:-}" ]; then
    export TMPDIR="$EXPLORE_TMPDIR"
elif [ -d /dev/shm ] && [ -w /dev/shm ]; then
    export TMPDIR=/dev/shm
fi
cargo build -q -p hermes-guard-explore
explore="${CARGO_TARGET_DIR:-$root/target}/debug/explore"
if [ "$#" -gt 0 ]; then
    exec "$explore" "$@"
fi
cargo test -q -p hermes-guard-explore -- --test-threads=2

per="${EXPLORE_SCHEDULES:-4000}"
chunk=500
total=0
violations=0
scenarios="$("$explore" --list)"
for scenario in $scenarios; do
    start=$SECONDS
    runs=0 failing=0 known=0
    for ((first = 0; first < per; first += chunk)); do
        n=$((per - first < chunk ? per - first : chunk))
        out="$("$explore" --scenario "$scenario" --first "$first" --schedules "$n")" || true
        # The failing schedules' replays, as they come.
        grep -v -e ': explored ' -e '^explored ' -e 'showed a known guard bug' <<<"$out" || true
        runs=$((runs + n))
        failing=$((failing + $(awk '/ in all; violations / { print $NF }' <<<"$out")))
        known=$((known + $(awk '/showed a known guard bug/ { print $1 }' <<<"$out" | head -1 | grep . || echo 0)))
    done
    echo "$scenario: explored $runs schedules (seeds 0..$per), $failing failing, $known showing a known guard bug only ($((SECONDS - start))s)"
    total=$((total + runs))
    violations=$((violations + failing))
done
echo "explored $total schedules in all; violations $violations"
[ "$violations" -eq 0 ]
