#!/usr/bin/env bash
# unusual-sqlite-builds.sh <integration-test binary linked to the system libsqlite3>
# unusual-sqlite-builds.sh --build      # only the builds (tests/system-sqlite.sh starts it early)
#
# The guard on SQLite builds a distribution does not ship, each compiled here from the bundled
# amalgamation (the libsqlite3-sys of Cargo.lock) as a libsqlite3.so.0 that the test binary of
# tests/system-sqlite.sh loads instead of the system one (LD_LIBRARY_PATH):
#   - SQLITE_SHM_DIRECTORY: the shared memory lives in that directory, not at <db>-shm
#     (cli/tests/it/shm_directory.rs);
#   - SQLITE_THREADSAFE=0: no mutex at all (cli/tests/it/single_threaded_sqlite.rs);
#   - SQLite 3.50.2, a version with the WAL-reset race, from the amalgamation bundled by
#     libsqlite3-sys 0.35.0 (pinned by tests/sqlite-3-50/, a manifest of its own that is never
#     built), plain and with SQLITE_ENABLE_SETLK_TIMEOUT and SQLITE_DEBUG (blocking locks, and
#     the unix VFS's lock-order assertions): cli/tests/it/wal_reset*.rs, which without the rule
#     lose the forced race's update there.
# (The defines are passed to gcc as they are: a C file among them is compiled in too.)
# Their tests are `#[ignore]`d in an ordinary run and run here with --ignored; the run fails
# unless each ran and passed. Builds are kept under target/ while the amalgamation is the same;
# the four compile at once (gcc is one process a file).
#
# Environment: CARGO_TARGET_DIR (default target).
set -euo pipefail

binary="$1"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
command -v gcc >/dev/null || { echo "gcc not found" >&2; exit 1; }

manifest="$(cargo metadata --format-version 1 --locked 2>/dev/null | python3 -c '
import json, sys
print(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"] == "libsqlite3-sys"))')"
amalgamation="$(dirname "$manifest")/sqlite3/sqlite3.c"
[ -f "$amalgamation" ] || { echo "no amalgamation at $amalgamation" >&2; exit 1; }

# build <name> <defines...>: $target_dir/unusual-sqlite/<name>/libsqlite3.so.0
build() {
    build_from "$amalgamation" "$@"
}

# build_from <sqlite3.c> <name> <defines...>: as build, from another amalgamation.
build_from() {
    local amalgamation="$1" name="$2"; shift 2
    local out="$target_dir/unusual-sqlite/$name"
    local stamp="$amalgamation $*"
    if [ "$(cat "$out/stamp" 2>/dev/null)" != "$stamp" ]; then
        echo "== compiling SQLite with $* ($name)"
        mkdir -p "$out"
        gcc -O1 -g0 -fPIC -shared -Wl,-soname,libsqlite3.so.0 "$@" \
            -o "$out/libsqlite3.so.0" "$amalgamation" -lpthread -ldl -lm
        printf '%s' "$stamp" > "$out/stamp"
    fi
}

shm_dir="$target_dir/unusual-sqlite/shm"
# A THREADSAFE=0 library has no sqlite3_mutex_alloc/_free/_enter/_leave/_try (macros for NULL,
# nothing and SQLITE_OK there), which rusqlite's bindings and the guard's -shm probe (it holds the
# unix VFS's mutex) link: the same no-ops as functions, in a unit of their own.
noop_mutex="$target_dir/unusual-sqlite/noop-mutex.c"
mkdir -p "$(dirname "$noop_mutex")"
cat > "$noop_mutex" <<'C'
typedef struct sqlite3_mutex sqlite3_mutex;
sqlite3_mutex *sqlite3_mutex_alloc(int id) { (void)id; return 0; }
void sqlite3_mutex_free(sqlite3_mutex *p) { (void)p; }
void sqlite3_mutex_enter(sqlite3_mutex *p) { (void)p; }
void sqlite3_mutex_leave(sqlite3_mutex *p) { (void)p; }
int sqlite3_mutex_try(sqlite3_mutex *p) { (void)p; return 0; }
C

# The WAL-reset race on a SQLite that has it (3.50.2), with the rule and without
# (cli/tests/it/wal_reset.rs: the test without the rule asserts the loss on such a version).
manifest_3_50="$(cargo metadata --format-version 1 --locked --manifest-path tests/sqlite-3-50/Cargo.toml \
    2>/dev/null | python3 -c '
import json, sys
print(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"] == "libsqlite3-sys"))')"
amalgamation_3_50="$(dirname "$manifest_3_50")/sqlite3/sqlite3.c"
grep -q '#define SQLITE_VERSION  *"3.50.2"' "$amalgamation_3_50" \
    || { echo "$amalgamation_3_50 is not SQLite 3.50.2" >&2; exit 1; }

# The four builds at once; a failed one fails the run.
pids=()
build shm-directory -DSQLITE_THREADSAFE=1 "-DSQLITE_SHM_DIRECTORY=\"$shm_dir\"" & pids+=($!)
build threadsafe-0 -DSQLITE_THREADSAFE=0 "$noop_mutex" & pids+=($!)
build_from "$amalgamation_3_50" sqlite-3.50.2 -DSQLITE_THREADSAFE=1 & pids+=($!)
build_from "$amalgamation_3_50" sqlite-3.50.2-setlk -DSQLITE_THREADSAFE=1 \
    -DSQLITE_ENABLE_SETLK_TIMEOUT=1 -DSQLITE_DEBUG & pids+=($!)
for pid in "${pids[@]}"; do wait "$pid" || { echo "compiling an unusual SQLite build failed" >&2; exit 1; }; done
[ "$binary" != --build ] || exit 0

# run_ignored <name> <filter> <expected count> [env...]: the ignored tests under <filter>, on
# that build; fails unless exactly <expected count> ran and passed.
run_ignored() {
    local name="$1" filter="$2" expected="$3"; shift 3
    local log="$target_dir/unusual-sqlite/$name/test.log"
    echo "== $filter on the $name build"
    env "$@" LD_LIBRARY_PATH="$target_dir/unusual-sqlite/$name" \
        "$binary" --ignored --test-threads=1 "$filter" 2>&1 | tee "$log"
    grep -q "test result: ok. $expected passed; 0 failed" "$log" \
        || { echo "expected $expected passing tests under $filter on the $name build" >&2; exit 1; }
}

rm -rf "$shm_dir" && mkdir -p "$shm_dir"
run_ignored shm-directory shm_directory:: 2 HERMES_GUARD_SHM_DIRECTORY="$shm_dir"

run_ignored threadsafe-0 single_threaded_sqlite:: 1

# run_tests <name> <expected count> <filters...>: as run_ignored, the ordinary tests.
run_tests() {
    local name="$1" expected="$2"; shift 2
    local log="$target_dir/unusual-sqlite/$name/test.log"
    echo "== $* on the $name build"
    LD_LIBRARY_PATH="$target_dir/unusual-sqlite/$name" \
        "$binary" --test-threads=2 --nocapture "$@" 2>&1 | tee "$log"
    grep -q "test result: ok. $expected passed; 0 failed" "$log" \
        || { echo "expected $expected passing tests under $* on the $name build" >&2; exit 1; }
}
run_tests sqlite-3.50.2 9 wal_reset:: wal_reset_soak::
grep -q "^SQLite 3.50.2: 0 of 20 rows kept" "$target_dir/unusual-sqlite/sqlite-3.50.2/test.log" \
    || { echo "the forced race without the rule did not lose the update on 3.50.2" >&2; exit 1; }
# SQLITE_DEBUG asserts `nBackfill == mxFrame` where a checkpoint finds the race's damage: the two
# tests that make that damage on purpose (the race without the rule, the tripwire's hand-made
# wal-index) are left out there.
run_tests sqlite-3.50.2-setlk 7 wal_reset:: wal_reset_soak:: \
    --skip without_the_rule --skip the_tripwire_reports
