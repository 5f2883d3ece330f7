#!/usr/bin/env bash
# The library without `bundled`: the CLI and the integration tests (cli/tests/it: every loss
# scenario, the writer child processes included) built with `--no-default-features`, so rusqlite
# links the system libsqlite3 (pkg-config, libsqlite3-dev) the way an application on the system
# SQLite does, and run again. ext/build-and-test.sh calls it, so the README's test command runs it.
# The binaries' libsqlite3 (ldd) and the version the tests run on (sqlite_version()) are printed,
# and the version is checked against pkg-config's.
#
# Environment: CARGO_TARGET_DIR (default target).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
target_dir="${CARGO_TARGET_DIR:-$root/target}"

if ! system="$(pkg-config --modversion sqlite3 2>/dev/null)"; then
    echo "pkg-config finds no system SQLite: install libsqlite3-dev (and pkg-config)" >&2
    exit 1
fi
# libsqlite3-sys prints a pkg-config "requires 3.45.3" warning for an older system library and
# links it anyway (`-lsqlite3`); what the guard and rusqlite 0.43's paths it uses call exists since
# SQLite 3.32 (sqlite3_database_file_object).
build=(cargo test -p hermes-guard-cli --no-default-features --test it)
# The unusual SQLite builds (gcc, a few minutes) compile while the tests below build and run.
mkdir -p "$target_dir/unusual-sqlite"
bash tests/unusual-sqlite-builds.sh --build >"$target_dir/unusual-sqlite/build.log" 2>&1 &
unusual_builds=$!
echo "== ${build[*]}: the system SQLite $system, not the bundled one"
"${build[@]}" --no-run 2>&1 | tee "$target_dir/system-sqlite-build.log" | grep -v "^warning: libsqlite3-sys" >&2 || true
binary="$(grep -o "(target/debug/deps/it-[0-9a-f]*)\|($target_dir/debug/deps/it-[0-9a-f]*)" \
    "$target_dir/system-sqlite-build.log" | tr -d '()' | tail -1)"
[ -n "$binary" ] || { echo "the build failed (see $target_dir/system-sqlite-build.log)" >&2; exit 1; }
for exe in "$binary" "$target_dir/debug/hermes-guard"; do
    linked="$(ldd "$exe" | grep -o "libsqlite3.so[^ ]* => [^ ]*" || true)"
    echo "   $(basename "$exe"): ${linked:-no shared libsqlite3}"
    [ -n "$linked" ] || { echo "$exe has SQLite compiled in: not a system-SQLite build" >&2; exit 1; }
done
export HERMES_GUARD_EXPECT_SQLITE="$system"
"${build[@]}" -- --exact plain_rusqlite::runs_on_the_expected_sqlite --nocapture 2>/dev/null \
    | grep "^SQLite " | sed 's/^/== the tests run on /'
"${build[@]}"

# The same binary on SQLite builds the distribution does not ship (SQLITE_SHM_DIRECTORY,
# SQLITE_THREADSAFE=0, 3.50.2), compiled here.
wait "$unusual_builds" || { cat "$target_dir/unusual-sqlite/build.log" >&2; exit 1; }
cat "$target_dir/unusual-sqlite/build.log"
bash tests/unusual-sqlite-builds.sh "$binary"
