#!/usr/bin/env bash
# The rusqlite range. The workspace asks for `rusqlite = ">=LOW, <HIGH"` (Cargo.toml), not one
# version, so that an application whose pool or async wrapper pins an older rusqlite resolves beside
# hermes-guard. Cargo.lock holds the newest of the range, which `cargo test` (the README's test
# command) tests; this script tests the oldest:
#
#   1. copies the source tree (the files git knows, untracked ones included) with its Cargo.lock
#      to $CARGO_TARGET_DIR/rusqlite-range/src, and there runs
#      `cargo update -p rusqlite --precise LOW` (the repository's Cargo.lock is never touched);
#   2. in a target directory of its own ($CARGO_TARGET_DIR/rusqlite-range/target), runs the
#      library's unit and doc tests (`cargo test -p hermes-guard --features r2d2`) and the
#      integration tests (`cargo test -p hermes-guard-cli --test it`: every loss scenario, the
#      store's and the pool's included, on the oldest rusqlite's bundled SQLite, which is
#      checked). The loadable extension (ext/) is not in the range: a cdylib of its own, no
#      other SQLite crate shares its graph, and it pins rusqlite 0.43 (its host API table needs
#      libsqlite3-sys 0.39+'s extension bindings); the copy leaves it out of the workspace;
#   3. checks that each pool, async wrapper and ORM the range is for resolves beside the library
#      in a new project (`cargo generate-lockfile`, nothing built) and prints the rusqlite each
#      one gets.
#
# Needs the network (crates.io) for the older crates. ext/build-and-test.sh calls it, so the
# README's test command runs it. 3 to 5 minutes on 2 cores from scratch, 2 to 3 of them the
# integration tests' run.
#
# Environment: CARGO_TARGET_DIR (default target).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
case "$target_dir" in /*) ;; *) target_dir="$root/$target_dir" ;; esac
work="$target_dir/rusqlite-range"

# The range, as the workspace states it: `rusqlite = ">=0.29, <0.44"`.
range="$(sed -n 's/^rusqlite = "\(.*\)"$/\1/p' Cargo.toml)"
low="$(sed -n 's/^>=\([0-9.]*\), *<\([0-9.]*\)$/\1/p' <<<"$range")"
high="$(sed -n 's/^>=\([0-9.]*\), *<\([0-9.]*\)$/\2/p' <<<"$range")"
if [ -z "$low" ] || [ -z "$high" ]; then
    echo "Cargo.toml's [workspace.dependencies] rusqlite is \"$range\", not \">=LOW, <HIGH\"" >&2
    exit 1
fi
case "$low" in *.*.*) ;; *) low="$low.0" ;; esac
# rusqlite_in <Cargo.lock>: the rusqlite version it holds.
rusqlite_in() { grep -A1 '^name = "rusqlite"$' "$1" | sed -n 's/^version = "\(.*\)"$/\1/p'; }
locked="$(rusqlite_in Cargo.lock)"
echo "   the range: rusqlite $range; Cargo.lock (tested by \`cargo test\`): $locked; here: $low"

# 1. The copy, rebuilt from scratch each run (file times kept, so the build is incremental).
rm -rf "$work/src"
mkdir -p "$work/src"
git ls-files -z --cached --others --exclude-standard \
    | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
    | tar --null -T - -cf - | tar -xf - -C "$work/src"
cd "$work/src"
sed -i 's/^members = \[\(.*\)"ext", \(.*\)$/members = [\1\2/' Cargo.toml
grep -q '"ext"' Cargo.toml && { echo "could not leave ext/ out of the copy's workspace" >&2; exit 1; }
cargo update -q -p rusqlite --precise "$low"
[ "$(rusqlite_in Cargo.lock)" = "$low" ] || { echo "the copy's Cargo.lock is not at $low" >&2; exit 1; }
sqlite="$(grep -A1 '^name = "libsqlite3-sys"$' Cargo.lock | sed -n 's/^version = "\(.*\)"$/\1/p')"
export CARGO_TARGET_DIR="$work/target"

# 2. The tests at the oldest rusqlite.
echo "== rusqlite $low (libsqlite3-sys $sqlite): cargo test -p hermes-guard --features r2d2 (the library's unit and doc tests)"
cargo test -q -p hermes-guard --features r2d2
echo "== rusqlite $low: cargo test -p hermes-guard-cli --test it (the integration tests)"
it=(cargo test -q -p hermes-guard-cli --test it)
# (The registry has that libsqlite3-sys's sources once the builds above fetched it.)
bundled_h="$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"libsqlite3-sys-$sqlite/sqlite3/sqlite3.h" 2>/dev/null | head -1 || true)"
if [ -n "$bundled_h" ]; then
    # The bundled SQLite of that libsqlite3-sys, not another: the run says which it is on.
    expect="$(sed -n 's/^#define SQLITE_VERSION *"\(.*\)"$/\1/p' "$bundled_h")"
    HERMES_GUARD_EXPECT_SQLITE="$expect" "${it[@]}" -- --exact \
        plain_rusqlite::runs_on_the_expected_sqlite --nocapture | grep '^SQLite ' \
        | sed 's/^/   the integration tests run on /'
fi
"${it[@]}"

# 3. Each project the range is for: a new project with it and the library resolves.
echo "== resolving beside the pools, async wrappers and ORMs (cargo generate-lockfile)"
project="$work/resolve"
failed=0
while IFS= read -r dep; do
    [ -n "$dep" ] || continue
    rm -rf "$project"
    mkdir -p "$project/src"
    echo 'fn main() {}' >"$project/src/main.rs"
    printf '[package]\nname = "resolve"\nversion = "0.1.0"\nedition = "2021"\npublish = false\n\n# Its own workspace: the project may lie inside the target directory of this repository.\n[workspace]\n\n[dependencies]\nhermes-guard = { path = "%s" }\n%s\n' \
        "$root" "$dep" >"$project/Cargo.toml"
    if out="$(cd "$project" && cargo generate-lockfile 2>&1)"; then
        echo "   resolves: $dep -> rusqlite $(rusqlite_in "$project/Cargo.lock")"
    else
        echo "   DOES NOT RESOLVE: $dep" >&2
        grep -v '^ *Updating\|^ *Locking\|^ *Adding' <<<"$out" | head -5 | sed 's/^/     /' >&2
        failed=1
    fi
done <<'EOF'
r2d2_sqlite = "0.35"
deadpool-sqlite = "0.14"
tokio-rusqlite = "0.8"
async-sqlite = "0.7"
sqlx = { version = "~0.8", default-features = false, features = ["sqlite"] }
diesel = { version = "~2.3", default-features = false, features = ["sqlite"] }
diesel = { version = "~2.2", default-features = false, features = ["sqlite"] }
EOF
rm -rf "$project"
[ "$failed" = 0 ] || { echo "the range no longer reaches every project above" >&2; exit 1; }
echo "   rusqlite $low and $locked pass; the range reaches every project above"
