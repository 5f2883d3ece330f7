#!/usr/bin/env bash
# docs/hosts.md's "With your framework" recipes, run: tests/frameworks is a project of its own, as a
# user's would be — hermes-guard (by path, feature `r2d2`) beside r2d2_sqlite 0.35,
# deadpool-sqlite 0.14, tokio-rusqlite 0.8, sqlx 0.9 and diesel 2.4, one rusqlite (0.40) and one
# libsqlite3-sys in its Cargo.lock — and each test runs the loss scenario through its framework: a
# pool of 8, 4 writers, the -wal and -shm unlinked mid-stream, every refused write retried once
# lands, all 8 connections healthy afterwards, every acknowledged row live once after recovery
# (tests/frameworks/src/lib.rs). Then tests/frameworks-older, the older ends the library's range
# reaches, sqlx 0.8 and diesel 2.3 (rusqlite 0.32, libsqlite3-sys 0.30), the same harness and sqlx
# test, and diesel 2.3 asking the guard through SQL (it has no raw handle).
#
# Needs the network (crates.io) the first time. About 2 minutes on 2 cores from scratch, a second
# after. ext/build-and-test.sh calls it, so the README's test command runs it.
#
# Environment: CARGO_TARGET_DIR (default target; the project builds in its frameworks/ folder).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
case "$target_dir" in /*) ;; *) target_dir="$root/$target_dir" ;; esac
run_project() { # <folder under tests/> <what>
    local dir="$root/tests/$1"
    export CARGO_TARGET_DIR="$target_dir/$1"
    mkdir -p "$CARGO_TARGET_DIR"
    local log="$CARGO_TARGET_DIR/$1.log" rusqlite
    rusqlite="$(grep -A1 '^name = "rusqlite"$' "$dir/Cargo.lock" | sed -n 's/^version = "\(.*\)"$/\1/p')"
    echo "   one graph: hermes-guard with $2 (rusqlite $rusqlite)"
    if ! (cd "$dir" && cargo test --locked -q -- --nocapture >"$log" 2>&1); then
        cat "$log" >&2
        echo "a framework's loss scenario failed (the output above, kept in $log)" >&2
        exit 1
    fi
    # Each framework's line: rows acknowledged, refusals retried, captures.
    # (`cargo test -q` prints its progress dots on the same line, before the first one.)
    grep -E ': [0-9]+ rows acknowledged' "$log" | sed 's/^\.*//; s/^/     /'
}
run_project frameworks "r2d2_sqlite 0.35, deadpool-sqlite 0.14, tokio-rusqlite 0.8, sqlx 0.9, diesel 2.4"
run_project frameworks-older "sqlx 0.8, diesel 2.3"
