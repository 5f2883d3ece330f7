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
# Built in the debug profile (it reuses the root `cargo test` build of the dependencies).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

cargo build -q -p hermes-guard-explore
explore="${CARGO_TARGET_DIR:-$root/target}/debug/explore"
if [ "$#" -gt 0 ]; then
    exec "$explore" "$@"
fi
cargo test -q -p hermes-guard-explore -- --test-threads=2
exec "$explore" --schedules "${EXPLORE_SCHEDULES:-4000}"
