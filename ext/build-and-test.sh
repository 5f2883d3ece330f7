#!/usr/bin/env bash
# First checks that every identifier the docs cite in backticks exists (tests/doc-identifiers.sh).
# Builds the loadable extension (libhermes_guard.so) on its own — its rusqlite feature
# `loadable_extension` must never share a build with the root package's `bundled` — runs its Rust
# unit tests, then the Python suite in tests/python against it, once per host SQLite:
#   1. apsw of tests/python/requirements.txt (SQLite 3.54.1, the newest);
#   2. the oldest apsw wheel there is (apsw $OLDEST_APSW, SQLite 3.39.2; no wheel carries 3.34);
#   3. the standard library's sqlite3 of the distribution's Python ($DISTRO_PYTHON, Debian 12:
#      SQLite 3.40.1, the system libsqlite3);
#   4. the same Python on SQLite 3.34.0, the oldest supported host, built from the amalgamation
#      that the npm package sqlite3@5.0.2 ships (LD_LIBRARY_PATH);
# every run also proves the clear load-time error of a host below the minimum (SQLite 3.32.3, from
# sqlite3@5.0.1, in the distribution's Python). Then the distribution's sqlite3 shell loads the
# extension and guards a database, and Node's better-sqlite3 (from npm, compiled here) loads it
# and runs the loss scenario (tests/node.sh). Then python/run-tests.sh builds the Python package
# (`pip install ./python`, `pip wheel ./python`) in fresh virtual environments and runs its pytest
# suite (python/tests). Then tests/loom.sh checks the loom model of the guard's lock-free protocol
# (src/vfs/loom_protocol.rs), tests/crash-points.sh the crash points and tests/explore.sh the
# seeded schedules of connections (tests/explore). Then tests/system-sqlite.sh runs the
# library's integration tests again without `bundled`, on the system libsqlite3, and last
# tests/rusqlite-range.sh runs them on the oldest rusqlite the library accepts (0.29; Cargo.lock's,
# the newest, is the one `cargo test` runs), in a copy of the tree, and tests/frameworks.sh the
# loss scenario through r2d2_sqlite, deadpool-sqlite, tokio-rusqlite, sqlx and diesel, each in its
# pool's hooks, in a project of its own, and tests/package.sh packages the three crates and builds
# each packaged .crate on its own (`cargo publish --dry-run`) (the README's test command is
# `cargo test && bash ext/build-and-test.sh`: this script carries every host beyond the bundled one).
# Everything it needs is set up from scratch under target/, and reused while the pins below and
# tests/python/requirements.txt stay the same. A host that cannot be had (no npm, no network, no
# distribution Python that can load extensions) is skipped with the reason printed; with CI=true
# only the npm-built SQLite may be skipped.
#
# Environment: HERMES_GUARD_VENV (default target/python-venv), PYTHON (default python3, for the
# venv), HERMES_GUARD_DISTRO_PYTHON (default /usr/bin/python3), SQLITE3_SHELL (default
# /usr/bin/sqlite3), CARGO_TARGET_DIR (default target).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# The wall-clock time of each stage, printed before the last line (`cargo test`, before this
# script, is not among them).
stage_names=() stage_secs=() stage_name="checks and rustdoc" stage_start=$SECONDS
stage() { # stage <name>: the previous stage ends here
    stage_names+=("$stage_name")
    stage_secs+=($((SECONDS - stage_start)))
    stage_name="$1" stage_start=$SECONDS
}

# The docs cite only identifiers that exist (about a second).
bash tests/doc-identifiers.sh
# The framework recipes (docs/hosts.md) are the code tests/frameworks runs.
bash tests/readme-recipes.sh
# The README's Rust quick start and operator's block run as pasted (a fresh cargo project; the
# command `cargo test` built), and its main job as written (`cargo run --release -- demo`: the
# release build, about 2 minutes the first time; the project reuses the workspace's debug build).
echo "== the README's blocks, as pasted"
bash tests/readme-blocks.sh

# A build of the extension beside the bundled SQLite (what `cargo build --workspace` is) would
# unify rusqlite's loadable_extension into the CLI, which would then panic at its first SQLite
# call: the library stops such a build with a compile error saying what to run (the
# `loadable-extension` feature, Cargo.toml). A few seconds: the check reuses `cargo test`'s build.
echo "== a build of the extension beside the bundled SQLite stops, saying what to run"
if unified="$(cargo check -q -p hermes-guard --features loadable-extension 2>&1)"; then
    echo "cargo check -p hermes-guard --features loadable-extension succeeded: nothing stops" \
        "cargo build --workspace from making a CLI that panics" >&2
    exit 1
fi
grep -q "Build them apart: \`cargo build --release\`" <<<"$unified" || {
    echo "$unified" >&2
    echo "the build failed, but not with the message that says what to run" >&2
    exit 1
}

# rustdoc with warnings denied, every package: a broken or private intra-doc link fails here. The
# extension is documented on its own (its rusqlite features differ).
echo "== rustdoc, warnings denied (cargo doc --no-deps)"
RUSTDOCFLAGS=-Dwarnings cargo doc --no-deps -q
RUSTDOCFLAGS=-Dwarnings cargo doc --no-deps -q -p hermes-guard-ext

OLDEST_APSW=3.39.2.1   # the oldest apsw wheel for this Python: SQLite 3.39.2
MINIMUM_NPM=5.0.2      # npm sqlite3@5.0.2 ships SQLite 3.34.0: MIN_SQLITE_VERSION_NUMBER (ext/src/version.rs)
TOO_OLD_NPM=5.0.1      # npm sqlite3@5.0.1 ships SQLite 3.32.3: below it

target_dir="${CARGO_TARGET_DIR:-$root/target}"
venv="${HERMES_GUARD_VENV:-$target_dir/python-venv}"
python="${PYTHON:-python3}"
distro_python="${HERMES_GUARD_DISTRO_PYTHON:-/usr/bin/python3}"
shell="${SQLITE3_SHELL:-/usr/bin/sqlite3}"
in_ci="${CI:-}"

skipped=()
# The sub-scripts that can skip (tests/fs-matrix.sh, tests/crash-points.sh, python/run-tests.sh)
# append "what: why" lines here; the last line of this run names them with the hosts below.
export HERMES_GUARD_SKIPS="$target_dir/skipped.txt"
mkdir -p "$target_dir"
: >"$HERMES_GUARD_SKIPS"

# What this run installs, mounts and needs, said before anything starts.
missing_tools=()
for tool in mkfs.xfs mkfs.btrfs; do command -v "$tool" >/dev/null || missing_tools+=("$tool"); done
echo "== ext/build-and-test.sh: what it installs, mounts and needs"
echo "   into $target_dir only: a Python venv (pip: tests/python/requirements.txt, apsw $OLDEST_APSW),"
echo "     SQLite 3.34.0 and 3.32.3 compiled from npm sqlite3@$MINIMUM_NPM/@$TOO_OLD_NPM, better-sqlite3 from npm"
echo "     (compiled by node-gyp), the Python package in fresh venvs, SQLite 3.50.2 and unusual builds (gcc),"
echo "     the oldest rusqlite's build (crates.io); network for pip, npm and crates.io"
if [ "$(id -u)" = 0 ]; then
    if [ "${#missing_tools[@]}" -gt 0 ]; then
        echo "   system packages: apt-get install xfsprogs btrfs-progs (${missing_tools[*]} missing now)"
    else
        echo "   system packages: none (mkfs.xfs and mkfs.btrfs are there)"
    fi
    echo "   mounts, as root: ext4, xfs and btrfs loop images, tmpfs and overlayfs (tests/fs-matrix.sh),"
    echo "     the power-loss filesystem over FUSE (tests/crash-points.sh); unshare (pid namespaces) and setpriv (nobody)"
else
    echo "   not root ($(id -un 2>/dev/null || id -u)): no apt-get, no mounts; the filesystem matrix is skipped, and the crash"
    echo "     points unless fusermount3 is there; the last line names what did not run"
fi

skip() { # skip <what> <why>: a host that cannot be had here
    echo "!! SKIPPED: $1: $2" >&2
    skipped+=("$1: $2")
}
required_skip() { # as skip, but an error in CI
    skip "$1" "$2"
    if [ "$in_ci" = true ]; then echo "CI=true: $1 is required" >&2; exit 1; fi
}

stage "extension build and unit tests, the test venv"
echo "== building the extension (cargo build -p hermes-guard-ext)"
cargo build -p hermes-guard-ext
ext="$target_dir/debug/libhermes_guard.so"
test -f "$ext" || { echo "build produced no $ext" >&2; exit 1; }

echo "== extension unit tests (cargo test -p hermes-guard-ext)"
cargo test -p hermes-guard-ext

pytest_pins=(pytest iniconfig packaging pluggy pygments)
stamp="$(cat tests/python/requirements.txt; echo "$OLDEST_APSW pure-pytest")"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.hermes-guard-stamp" 2>/dev/null)" != "$stamp" ]; then
    echo "== setting up $venv"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
    "${pip[@]}" -r tests/python/requirements.txt
    "${pip[@]}" --no-deps --only-binary :all: --target "$venv/hosts/apsw-$OLDEST_APSW" "apsw==$OLDEST_APSW"
    # pytest and its dependencies (pure Python) for the distribution's Python, which has no pip
    # of its own on a fresh machine: the versions of requirements.txt.
    pins=()
    for name in "${pytest_pins[@]}"; do
        pins+=("$(grep -i "^$name==" tests/python/requirements.txt)")
    done
    "${pip[@]}" --no-deps --only-binary :all: --target "$venv/hosts/pytest" "${pins[@]}"
    printf '%s' "$stamp" > "$venv/.hermes-guard-stamp"
fi

# build_sqlite <npm version> <SQLite version number>: libsqlite3.so.0 of that SQLite in
# $target_dir/old-sqlite/<number>/ (tests/sqlite-from-npm.sh); prints the directory, or why not.
build_sqlite() {
    local out="$target_dir/old-sqlite/$2" log
    if log="$(bash tests/sqlite-from-npm.sh "$1" "$2" "$out" 2>&1)"; then
        echo "$out"
    else
        echo "building SQLite $2 from npm sqlite3@$1 failed: $(tail -3 <<<"$log" | tr '\n' ' ')"
        return 1
    fi
}

stage "SQLite 3.34 and 3.32 from npm, Python suites (four hosts), sqlite3 shell"
distro_ok=false
if [ -x "$distro_python" ] && "$distro_python" -c \
    'import sqlite3; sqlite3.connect(":memory:").enable_load_extension(True)' 2>/dev/null; then
    distro_ok=true
else
    required_skip "the distribution's Python ($distro_python)" \
        "missing, or its sqlite3 module cannot load extensions"
fi

minimum_lib=""
if $distro_ok; then
    echo "== building SQLite 3.34.0 (npm sqlite3@$MINIMUM_NPM) and 3.32.3 (npm sqlite3@$TOO_OLD_NPM)"
    if out="$(build_sqlite "$MINIMUM_NPM" 3340000)"; then
        minimum_lib="$out"
    else
        skip "the run on SQLite 3.34.0" "$out"
    fi
    if out="$(build_sqlite "$TOO_OLD_NPM" 3320300)"; then
        export HERMES_GUARD_TOO_OLD_LIB="$out"
    else
        export HERMES_GUARD_TOO_OLD_SKIPPED="$out"
        skip "the too-old host (SQLite 3.32.3)" "$out"
    fi
else
    export HERMES_GUARD_TOO_OLD_SKIPPED="no distribution Python that can load extensions"
fi

export HERMES_GUARD_EXT="$ext"
export HERMES_GUARD_DISTRO_PYTHON="$distro_python"
export PYTHONDONTWRITEBYTECODE=1
unset HERMES_GUARD_DEFAULT HERMES_GUARD_PY_BINDING
pytest_args=(-m pytest -p no:cacheprovider -q -rs tests/python)

echo "== Python suite: apsw, SQLite 3.54.1 (requirements.txt)"
HERMES_GUARD_EXPECT_SQLITE=3.54.1 "$venv/bin/python" "${pytest_args[@]}"

echo "== Python suite: apsw $OLDEST_APSW, SQLite 3.39.2"
PYTHONPATH="$venv/hosts/apsw-$OLDEST_APSW" HERMES_GUARD_EXPECT_SQLITE=3.39.2 \
    "$venv/bin/python" "${pytest_args[@]}"

if $distro_ok; then
    echo "== Python suite: $distro_python, standard library sqlite3, the system SQLite"
    HERMES_GUARD_PY_BINDING=sqlite3 PYTHONPATH="$venv/hosts/pytest" \
        "$distro_python" "${pytest_args[@]}"

    if [ -n "$minimum_lib" ]; then
        echo "== Python suite: $distro_python, standard library sqlite3, SQLite 3.34.0 ($minimum_lib)"
        HERMES_GUARD_PY_BINDING=sqlite3 PYTHONPATH="$venv/hosts/pytest" \
            LD_LIBRARY_PATH="$minimum_lib" HERMES_GUARD_EXPECT_SQLITE=3.34.0 \
            "$distro_python" "${pytest_args[@]}"
    fi
fi

# The distribution's sqlite3 shell: load, open guarded, WAL, write, lose the -wal; the next write
# must be refused and the retired generation captured next to the database.
if [ -x "$shell" ]; then
    echo "== the sqlite3 shell ($shell, SQLite $("$shell" -version | cut -d' ' -f1))"
    work="$(mktemp -d)"
    db="$work/state.db"
    set +e
    out="$("$shell" :memory: 2>&1 <<EOF
.load $ext
.open file:$db?vfs=hermes-guard
PRAGMA journal_mode=WAL;
CREATE TABLE t(x);
INSERT INTO t VALUES ('committed before the loss');
.shell rm -f $db-wal
INSERT INTO t VALUES ('after the loss');
SELECT 'status', json_extract(s, '\$.retired'), json_extract(s, '\$.reason'), json_extract(s, '\$.refusals')
  FROM (SELECT hermes_guard_status() AS s);
EOF
)"
    set -e
    echo "$out" | sed 's/^/   | /'
    captures=("$db".retired-wal-*)
    if ! grep -q "attempt to write a readonly database" <<<"$out" \
        || ! grep -q "^status|1|wal-lost|1$" <<<"$out" \
        || [ ! -f "${captures[0]}/manifest.json" ]; then
        echo "the sqlite3 shell was not protected: no refusal, or no capture in $work" >&2
        exit 1
    fi
    echo "   refused, captured in $(basename "${captures[0]}")"
    rm -rf "$work"
else
    required_skip "the sqlite3 shell ($shell)" "not installed"
fi

stage "Node (better-sqlite3)"
# Node: better-sqlite3 (from npm, compiled here) loads the extension and is guarded; the loss
# scenario with the command's recovery (tests/node.sh).
if command -v node >/dev/null && command -v npm >/dev/null; then
    echo "== Node: better-sqlite3 $(node --version) (tests/node.sh)"
    cargo build -q -p hermes-guard-cli
    bash tests/node.sh "$ext" "$target_dir/debug/hermes-guard"
else
    required_skip "Node (better-sqlite3)" "node or npm not installed"
fi

# The Python package (python/): `pip install ./python` into a fresh venv of the distribution's
# Python, its wheel into a second one, and its pytest suite (python/run-tests.sh; with CI=true a
# missing prerequisite fails there too).
stage "the Python package"
echo "== the Python package (python/run-tests.sh)"
HERMES_GUARD_DISTRO_PYTHON="$distro_python" bash python/run-tests.sh

stage "loom"
echo "== the loom model of the lock-free protocol (tests/loom.sh)"
bash tests/loom.sh

stage "crash points"
echo "== power loss: the crash-point tests through the power-loss filesystem (tests/crash-points.sh)"
bash tests/crash-points.sh

stage "explorer"
echo "== every interleaving: the deterministic scheduler of connections (tests/explore.sh)"
bash tests/explore.sh

stage "filesystem matrix"
echo "== the filesystem and container matrix (tests/fs-matrix.sh: ext4, xfs, btrfs, tmpfs, overlayfs, pid namespaces)"
bash tests/fs-matrix.sh

stage "system SQLite"
echo "== the library without bundled SQLite (tests/system-sqlite.sh)"
bash tests/system-sqlite.sh

stage "oldest rusqlite"
echo "== the oldest rusqlite of the library's range (tests/rusqlite-range.sh)"
bash tests/rusqlite-range.sh

stage "crates package"
echo "== the crates package: cargo publish --dry-run of the library, the store and the CLI (tests/package.sh)"
bash tests/package.sh

stage "frameworks"
echo "== the loss scenario through each framework: r2d2_sqlite, deadpool-sqlite, tokio-rusqlite, sqlx, diesel (tests/frameworks.sh)"
bash tests/frameworks.sh

stage end
echo "== time per stage (ext/build-and-test.sh, $((SECONDS / 60)) min $((SECONDS % 60)) s in all):"
for i in "${!stage_names[@]}"; do printf '   %5d s  %s\n' "${stage_secs[$i]}" "${stage_names[$i]}"; done

while IFS= read -r line; do
    [ -n "$line" ] && skipped+=("$line")
done <"$HERMES_GUARD_SKIPS"
if [ "${#skipped[@]}" -gt 0 ]; then
    echo "== done, but these did not run (each skip's reason is above):"
    printf '   %s\n' "${skipped[@]}"
    # The last line: what did not run, on one line.
    joined="$(printf '%s; ' "${skipped[@]}")"
    echo "== NOT RUN (${#skipped[@]}): ${joined%; }"
else
    echo "== done: every host ran"
fi
