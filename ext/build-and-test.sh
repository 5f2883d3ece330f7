#!/usr/bin/env bash
# Builds the loadable extension (libhermes_guard.so) on its own — its rusqlite feature
# `loadable_extension` must never share a build with the root package's `bundled` — runs its Rust
# unit tests, then the Python (apsw) suite in tests/python against it:
#   1. on the SQLite of tests/python/requirements.txt (3.54.1, what the library bundles),
#      with a too-old host (apsw $TOO_OLD_APSW) proving the clear load-time error;
#   2. again, whole, on the oldest SQLite the extension supports (apsw $MINIMUM_APSW).
# Everything it needs is set up from scratch in a virtual environment under target/, reused while
# tests/python/requirements.txt and the host pins below stay the same.
#
# Environment: HERMES_GUARD_VENV (default target/python-venv), PYTHON (default python3),
# CARGO_TARGET_DIR (default target).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

MINIMUM_APSW=3.45.3.0   # SQLite 3.45.3: MIN_SQLITE_VERSION_NUMBER in ext/src/version.rs
TOO_OLD_APSW=3.44.2.0   # SQLite 3.44.2: below it

target_dir="${CARGO_TARGET_DIR:-$root/target}"
venv="${HERMES_GUARD_VENV:-$target_dir/python-venv}"
python="${PYTHON:-python3}"

echo "== building the extension (cargo build -p hermes-guard-ext)"
cargo build -p hermes-guard-ext
ext="$target_dir/debug/libhermes_guard.so"
test -f "$ext" || { echo "build produced no $ext" >&2; exit 1; }

echo "== extension unit tests (cargo test -p hermes-guard-ext)"
cargo test -p hermes-guard-ext

stamp="$(cat tests/python/requirements.txt; echo "$MINIMUM_APSW $TOO_OLD_APSW")"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.hermes-guard-stamp" 2>/dev/null)" != "$stamp" ]; then
    echo "== setting up $venv"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r tests/python/requirements.txt
    for version in "$MINIMUM_APSW" "$TOO_OLD_APSW"; do
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
            --only-binary :all: --target "$venv/hosts/apsw-$version" "apsw==$version"
    done
    printf '%s' "$stamp" > "$venv/.hermes-guard-stamp"
fi

export HERMES_GUARD_EXT="$ext"
export HERMES_GUARD_APSW_TOO_OLD="$venv/hosts/apsw-$TOO_OLD_APSW"
export PYTHONDONTWRITEBYTECODE=1
unset HERMES_GUARD_DEFAULT
pytest=("$venv/bin/python" -m pytest -p no:cacheprovider -q tests/python)

echo "== Python suite on the pinned SQLite (requirements.txt)"
HERMES_GUARD_EXPECT_SQLITE=3.54.1 "${pytest[@]}"

echo "== Python suite on the oldest supported SQLite (apsw $MINIMUM_APSW)"
PYTHONPATH="$venv/hosts/apsw-$MINIMUM_APSW" HERMES_GUARD_EXPECT_SQLITE=3.45.3 "${pytest[@]}"
