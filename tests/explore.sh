#!/usr/bin/env bash
# The deterministic scheduler of connections (tests/explore): its tests, then every scenario over a
# range of seeds, one VFS call at a time in the order each seed gives, with the invariants checked
# after every schedule. Prints `<scenario>: explored N schedules ...` per scenario and
# `explored N schedules in all; violations V`; fails when V > 0, printing each failing schedule's
# seed, replay command and steps. Then:
#   - the enumeration: every schedule within a preemption bound of each scenario (`--dfs`);
#   - the bug rediscoveries: the stale-WAL gate's old order (judged first, EXCLUSIVE after), put
#     back by a fault switch, is found over the CI's seeds (its seeds' tests:
#     tests/explore/tests/it/stale_wal_order.rs); recovery's old rules (a fault switch too) over
#     newer-checkpointed's first 500 seeds (tests/explore/tests/it/newer_generation.rs); add-only
#     in place of the changes rule over newer-changes' first 500
#     (tests/explore/tests/it/newer_changes.rs); the old overwrite judgement
#     (`--fault judgement-unconfirmed`) over churn's first 500 seeds
#     (tests/explore/tests/it/churn.rs); the WAL-reset race on SQLite 3.50.2 (the explorer built
#     without `bundled`, run on the libsqlite3.so.0 of tests/unusual-sqlite-builds.sh) is found
#     without the guard's rule and not with it (tests/explore/tests/it/wal_reset.rs).
#
#   bash tests/explore.sh                                   # the CI run (EXPLORE_SCHEDULES per scenario)
#   bash tests/explore.sh --scenario peer-loss --seed 17    # replays one schedule, step by step
#   bash tests/explore.sh --scenario peer-loss --schedules 20000 --first 1000000   # a longer search
#   bash tests/explore.sh --scenario lone-loss --dfs 2      # every schedule within 2 preemptions
#   EXPLORE_SQLITE=3.50.2 HERMES_GUARD_WAL_RESET_GUARD=off bash tests/explore.sh --scenario wal-reset --seed 0 --deviations '18:1,51:0'
#                                                           # a replay on SQLite 3.50.2
#
# Built in the debug profile (it reuses the root `cargo test` build of the dependencies). The
# schedules' directories go to /dev/shm when there is one (tmpfs: no fsync waits, about 6x faster;
# user extended attributes, which the stale-WAL record needs, since Linux 6.6 — without them the
# test that restore-openers sets a WAL aside fails, it does not pass silently); EXPLORE_TMPDIR
# chooses another. Each run of 500 seeds is its own process (the guard's process-wide state
# grows with every database it has seen, and slows a long run down); the CI run's processes run
# EXPLORE_JOBS at once (default: the number of CPUs).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

if [ -n "${EXPLORE_TMPDIR:-}" ]; then
    export TMPDIR="$EXPLORE_TMPDIR"
elif [ -d /dev/shm ] && [ -w /dev/shm ]; then
    export TMPDIR=/dev/shm
fi
target_dir="${CARGO_TARGET_DIR:-$root/target}"

# SQLite 3.50.2 as tests/unusual-sqlite-builds.sh compiles it (the same directory and stamp:
# whichever script runs first compiles it), from the amalgamation libsqlite3-sys 0.35.0 bundles
# (tests/sqlite-3-50/). Sets sqlite_3_50 to its directory.
build_sqlite_3_50() {
    local manifest amalgamation stamp
    manifest="$(cargo metadata --format-version 1 --locked --manifest-path tests/sqlite-3-50/Cargo.toml \
        2>/dev/null | python3 -c '
import json, sys
print(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"] == "libsqlite3-sys"))')"
    amalgamation="$(dirname "$manifest")/sqlite3/sqlite3.c"
    grep -q '#define SQLITE_VERSION  *"3.50.2"' "$amalgamation" \
        || { echo "$amalgamation is not SQLite 3.50.2" >&2; exit 1; }
    sqlite_3_50="$target_dir/unusual-sqlite/sqlite-3.50.2"
    stamp="$amalgamation -DSQLITE_THREADSAFE=1"
    if [ "$(cat "$sqlite_3_50/stamp" 2>/dev/null)" != "$stamp" ]; then
        echo "== compiling SQLite 3.50.2 ($sqlite_3_50)"
        mkdir -p "$sqlite_3_50"
        gcc -O1 -g0 -fPIC -shared -Wl,-soname,libsqlite3.so.0 -DSQLITE_THREADSAFE=1 \
            -o "$sqlite_3_50/libsqlite3.so.0" "$amalgamation" -lpthread -ldl -lm
        printf '%s' "$stamp" > "$sqlite_3_50/stamp"
    fi
}

# The explorer (and its test of the WAL-reset race) without `bundled`, linked to the system
# libsqlite3 and run on 3.50.2: `$explore_3_50` and `$wal_reset_3_50`. The same target directory
# as the bundled build (only the explorer is relinked); the binary is copied aside.
build_explorer_3_50() {
    local log="$target_dir/explore-system-sqlite.log"
    cargo build -q -p hermes-guard-explore --no-default-features 2>&1 | grep -v "^warning: libsqlite3-sys" >&2 || true
    explore_3_50="$target_dir/debug/explore-system-sqlite"
    cp "$target_dir/debug/explore" "$explore_3_50"
    cargo test -p hermes-guard-explore --no-default-features --test it --no-run >"$log" 2>&1 \
        || { cat "$log" >&2; exit 1; }
    wal_reset_3_50="$(grep -o "(\(target\|$target_dir\)/debug/deps/it-[0-9a-f]*)" "$log" | tr -d '()' | tail -1)"
    [ -n "$wal_reset_3_50" ] || { echo "no wal_reset test binary (see $log)" >&2; exit 1; }
}

if [ -n "${EXPLORE_SQLITE:-}" ]; then
    [ "$EXPLORE_SQLITE" = 3.50.2 ] || { echo "EXPLORE_SQLITE: only 3.50.2 is built here" >&2; exit 2; }
    build_sqlite_3_50
    build_explorer_3_50
    cargo build -q -p hermes-guard-explore   # the bundled build back at target/debug/explore
    LD_LIBRARY_PATH="$sqlite_3_50" exec "$explore_3_50" "$@"
fi
cargo build -q -p hermes-guard-explore
explore="$target_dir/debug/explore"
if [ "$#" -gt 0 ]; then
    exec "$explore" "$@"
fi
cargo test -q -p hermes-guard-explore -- --test-threads=2

per="${EXPLORE_SCHEDULES:-4000}"
chunk=500
jobs="${EXPLORE_JOBS:-$(nproc)}"
runs_dir="$(mktemp -d)"
trap 'rm -rf "$runs_dir"' EXIT
started=$SECONDS

# Every run below is a process of its own whose schedules each have a temporary directory of their
# own: they go through one queue, $jobs at a time (EXPLORE_JOBS, default the number of CPUs), each
# into a file named for it, and are read back in a fixed order, so the output does not depend on
# which finished first.
queue() { # queue <name> <explorer arguments...>
    local name="$1"
    shift
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    "$explore" "$@" >"$runs_dir/$name" 2>"$runs_dir/$name.err" &
}
# result <name>: the run's output, its stderr after it; fails when the run printed no summary (it
# crashed: its output and stderr are shown).
result() {
    cat "$runs_dir/$1" "$runs_dir/$1.err"
    grep -q ' in all; violations ' "$runs_dir/$1" && return
    cat "$runs_dir/$1" "$runs_dir/$1.err" >&2
    echo "the explorer run $1 ended without its summary (its output is above)" >&2
    exit 1
}
scenarios="$("$explore" --list)"
# The longest runs first: churn's enumeration, then the seeds of every scenario (500 a process:
# the guard's process-wide state grows with every database it has seen and slows a long run), then
# the other enumerations and the fault rediscoveries.
dfs_specs=(churn:1:2 lone-loss:2 wal-reset:1 restore-openers:1 peer-loss:1 killed-peer:1 restore-running:1
    restore-checkpointed:1 newer-checkpointed:1:21 in-flight:1:24)
queue_dfs() { # queue_dfs <scenario:bound[:variant seeds]>
    local scenario bound variant_seeds
    IFS=: read -r scenario bound variant_seeds <<<"$1"
    queue "dfs-$scenario" --scenario "$scenario" --dfs "$bound" --variant-seeds "${variant_seeds:-8}"
}
queue_dfs "${dfs_specs[0]}"
for scenario in $scenarios; do
    for ((first = 0; first < per; first += chunk)); do
        queue "seeds-$scenario-$first" --scenario "$scenario" --first "$first" \
            --schedules "$((per - first < chunk ? per - first : chunk))"
    done
done
for spec in "${dfs_specs[@]:1}"; do queue_dfs "$spec"; done
for ((first = 0; first < per; first += chunk)); do
    queue "fault-order-$first" --fault judged-before-exclusive --scenario restore-openers --first "$first" \
        --schedules "$((per - first < chunk ? per - first : chunk))"
done
queue fault-base --fault capture-base-ignored --scenario newer-checkpointed --first 0 --schedules 500
queue fault-judgement --fault judgement-unconfirmed --scenario churn --first 0 --schedules 500
queue fault-changes --fault changes-ignored --scenario newer-changes --first 0 --schedules 500
wait

# The seeds of each scenario: the failing schedules' replays, then a line per scenario.
total=0
violations=0
for scenario in $scenarios; do
    runs=0 failing=0 known=0
    for ((first = 0; first < per; first += chunk)); do
        out="$(result "seeds-$scenario-$first")"
        grep -v -e ': explored ' -e '^explored ' -e 'showed a known guard bug' <<<"$out" || true
        runs=$((runs + $(awk '/^explored .* in all; violations / { print $2 }' <<<"$out")))
        failing=$((failing + $(awk '/ in all; violations / { print $NF }' <<<"$out")))
        known=$((known + $(awk '/showed a known guard bug/ { print $1 }' <<<"$out" | head -1 | grep . || echo 0)))
    done
    echo "$scenario: explored $runs schedules (seeds 0..$per), $failing failing, $known showing a known guard bug only"
    total=$((total + runs))
    violations=$((violations + failing))
done
echo "explored $total schedules in all; violations $violations"

# Every schedule within the bound of each scenario (the smallest with 2 preemptions, the others
# with 1), each variant the seeds 0..K choose (K 8, or the spec's third field: newer-checkpointed's
# 12 variants come from seeds 0..21, in-flight's 8 from seeds 0..24; churn's first 2 of its 4, a
# guarded and a stock RESTART writer: 2,946 schedules, about 50 s alone); a process per scenario.
dfs_total=0
for spec in "${dfs_specs[@]}"; do
    out="$(result "dfs-${spec%%:*}")"
    grep -v '^enumerated ' <<<"$out" | grep -Ev '^ +[0-9]+ +[A-Za-z0-9]+ ' || true
    dfs_total=$((dfs_total + $(awk '/^enumerated .* in all; violations / { print $2 }' <<<"$out")))
    violations=$((violations + $(awk '/^enumerated .* in all; violations / { print $NF }' <<<"$out")))
done
echo "enumerated $dfs_total schedules in all; violations $violations"

# Rediscovery 1: the gate's old order, judged first and EXCLUSIVE after
# (`--fault judged-before-exclusive`): the CI's seeds of restore-openers find a guarded opener's
# restore undone by a stock opener.
found=""
for ((first = 0; first < per; first += chunk)); do
    found+="$( (grep -o 'failing seed [0-9]*' "$runs_dir/fault-order-$first" || true) | awk '{ printf " %s", $3 }')"
done
if [ -z "$found" ]; then
    echo "with the stale-WAL gate's old order, restore-openers seeds 0..$per found nothing" >&2
    exit 1
fi
echo "the old stale-WAL gate order (--fault judged-before-exclusive): restore-openers fails at seeds$found of 0..$per (today's order: 0)"

# Rediscovery 3: recovery's old rules (`--fault capture-base-ignored`: a capture's delta replayed
# whatever its base): newer-checkpointed's first 500 seeds find the newer generation's rows deleted
# by the retired writer's recovery (its seeds' tests: tests/explore/tests/it/newer_generation.rs).
out="$(cat "$runs_dir/fault-base")"
found="$(grep -c '^  failing seed ' <<<"$out" || true)"
newer="$(grep -c 'VIOLATION: after recover --apply, row n[0-9]* is live 0 times' <<<"$out" || true)"
if [ "$newer" -eq 0 ]; then
    cat "$runs_dir/fault-base" "$runs_dir/fault-base.err" >&2
    echo "with the capture's base ignored, newer-checkpointed seeds 0..500 lost no newer row" >&2
    exit 1
fi
echo "recovery ignoring the capture's base (--fault capture-base-ignored): newer-checkpointed fails at $found of seeds 0..500, the newer generation's rows lost (today's rules: none, the runs above)"

# Rediscovery 3b: recovery reading a capture as image + WAL where it holds its base pages
# (`--fault changes-ignored`: `add-only` instead of the `changes` rule): newer-changes' first
# 500 seeds find rows the newer generation deleted live again, or an old version of a row it
# updated (its seeds' tests: tests/explore/tests/it/newer_changes.rs).
out="$(cat "$runs_dir/fault-changes")"
found="$(grep -c '^  failing seed ' <<<"$out" || true)"
undone="$(grep -c -e 'a deleted row brought back' -e 'an old version brought back' <<<"$out" || true)"
if [ "$undone" -eq 0 ]; then
    cat "$runs_dir/fault-changes" "$runs_dir/fault-changes.err" >&2
    echo "with the changes rule off, newer-changes seeds 0..500 undid none of the newer generation's changes" >&2
    exit 1
fi
echo "recovery without the changes rule (--fault changes-ignored): newer-changes fails at $found of seeds 0..500, the newer generation's deletes or updates undone (today's rules: none, the runs above)"

# Rediscovery 4: the old overwrite judgement (`--fault judgement-unconfirmed`: the close judges
# without READ(0), no confirmation with the wal-index's salts): churn's first 500 seeds find a
# healthy reader retired and captured with nothing taken away (its seeds' tests:
# tests/explore/tests/it/churn.rs).
out="$(cat "$runs_dir/fault-judgement")"
found="$(grep -c '^  failing seed ' <<<"$out" || true)"
if ! grep -q 'was overwritten in place under this connection' <<<"$out"; then
    cat "$runs_dir/fault-judgement" "$runs_dir/fault-judgement.err" >&2
    echo "with the unconfirmed overwrite judgement, churn seeds 0..500 retired no reader" >&2
    exit 1
fi
echo "the overwrite judgement unconfirmed (--fault judgement-unconfirmed): churn fails at $found of seeds 0..500, a healthy reader retired (today's judgement: none, the runs above)"
echo "the runs above: $((SECONDS - started))s, $jobs at once"

# Rediscovery 2: the WAL-reset race on SQLite 3.50.2, with the rule off and on.
build_sqlite_3_50
build_explorer_3_50
cargo build -q -p hermes-guard-explore   # the bundled build back at target/debug/explore
log="$target_dir/explore-wal-reset-3.50.2.log"
LD_LIBRARY_PATH="$sqlite_3_50" EXPLORE_EXPECT_SQLITE=3.50.2 TMPDIR="$TMPDIR" \
    "$wal_reset_3_50" wal_reset:: --nocapture --test-threads=1 >"$log" 2>&1 || true
grep -Ev '^ +[0-9]+ +[A-Za-z0-9]+ ' "$log" | grep -v '^$' | sed 's/^/   | /'
grep -q "test result: ok. 1 passed; 0 failed" "$log" \
    || { echo "the WAL-reset race test failed on SQLite 3.50.2 (see $log)" >&2; exit 1; }
echo "violations $violations"
[ "$violations" -eq 0 ]
