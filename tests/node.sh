#!/usr/bin/env bash
# tests/node.sh <extension> <hermes-guard command>: hermes-guard in Node. Installs better-sqlite3
# (tests/node/package-lock.json: from npm, compiled on this machine by node-gyp, about 2 minutes the
# first time) into <target>/node-host, once per lock file, and runs tests/node/*.test.js with
# `node --test`: the extension loaded with the entry point that makes the guard the default VFS, and
# the loss scenario (refused with SQLITE_READONLY_DBMOVED, captured, recovered with the command);
# then packs the npm package (node/pack.sh), installs the tarball into a fresh project and runs the
# same tests through it, and node/README.md's example as written.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ext="$1" cli="$2"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
host="$target_dir/node-host"
# node-gyp compiles against Node's headers: the distribution's (/usr/include/node) when there,
# not a download from nodejs.org (which a machine without that address, or a user without
# root's ~/.npmrc, would otherwise need).
if [ -z "${npm_config_nodedir:-}" ] && [ -f /usr/include/node/common.gypi ]; then
    export npm_config_nodedir=/usr
fi
stamp="$(sha256sum "$root/tests/node/package-lock.json" | cut -d' ' -f1) $(node --version)"
if [ "$(cat "$host/.stamp" 2>/dev/null)" != "$stamp" ]; then
    echo "   installing better-sqlite3 into $host (npm ci: compiles SQLite and the addon)"
    rm -rf "$host"
    mkdir -p "$host"
    cp "$root/tests/node/package.json" "$root/tests/node/package-lock.json" "$host/"
    log="$host/npm-ci.log"
    (cd "$host" && timeout 900 npm ci --no-audit --no-fund >"$log" 2>&1) \
        || { cat "$log" >&2; echo "npm ci of better-sqlite3 failed (see $log)" >&2; exit 1; }
    test -f "$host/node_modules/better-sqlite3/build/Release/better_sqlite3.node" \
        || { cat "$log" >&2; echo "better-sqlite3 was not compiled (see $log)" >&2; exit 1; }
    printf '%s' "$stamp" >"$host/.stamp"
fi
echo "   by hand: the extension loaded through a throwaway connection (docs/hosts.md's recipe)"
HERMES_GUARD_EXT="$ext" HERMES_GUARD_CLI="$cli" NODE_PATH="$host/node_modules" \
    node --test "$root"/tests/node/*.test.js

# The npm package (node/): packed with these builds of the extension and the command, installed
# from its tarball into a fresh project (no registry: it has no dependencies, better-sqlite3 is an
# optional peer, here the one above), and the same tests through it.
npm_dir="$target_dir/npm"
tarball="$(bash "$root/node/pack.sh" "$ext" "$cli" "$npm_dir")"
# `npm pack` in a copy of node/ as the repository has it (no native files): it must stop, saying
# how to make a whole package, and leave no tarball.
bare="$npm_dir/bare"
rm -rf "$bare"
mkdir -p "$bare/out"
cp "$root"/node/package.json "$root"/node/index.js "$root"/node/index.d.ts "$root"/node/check-native.js "$bare/"
if refused="$(cd "$bare" && npm pack --silent --pack-destination out 2>&1)"; then
    echo "npm pack without the native files made a package: $refused" >&2
    exit 1
fi
grep -q 'not packing: native/libhermes_guard.so and native/hermes-guard missing' <<<"$refused" \
    || { echo "$refused" >&2; echo "npm pack failed, but not with the words that say what to run" >&2; exit 1; }
[ -z "$(ls "$bare/out")" ] || { echo "npm pack left a tarball: $(ls "$bare/out")" >&2; exit 1; }
echo "   npm pack without the native files stops and says what to run"
project="$npm_dir/project"
rm -rf "$project"
mkdir -p "$project"
printf '{ "name": "a-user-project", "private": true }\n' >"$project/package.json"
(cd "$project" && npm install --no-audit --no-fund --silent "$tarball")
installed="$project/node_modules/hermes-guard"
test -x "$project/node_modules/.bin/hermes-guard" \
    || { echo "the npm package did not install its hermes-guard command" >&2; exit 1; }
echo "   the npm package: $(basename "$tarball") ($(du -k "$tarball" | cut -f1) KiB), installed into a fresh project"
HERMES_GUARD_NPM="$installed" NODE_PATH="$host/node_modules" \
    node --test "$root"/tests/node/*.test.js

# node/README.md's example as it is written, in the fresh project (a directory of its own for its
# state.db): it must print its refusal and the capture.
awk '/^```js$/ { on = 1; next } /^```$/ { if (on) exit } on' "$root/node/README.md" >"$project/readme.js"
mkdir -p "$project/readme-run"
out="$(cd "$project/readme-run" && HERMES_GUARD_LOG=off NODE_PATH="$host/node_modules" node ../readme.js)"
grep -q '^refused; every committed row is in .*/state\.db\.retired-wal-' <<<"$out" \
    || { echo "node/README.md's example printed: $out" >&2; exit 1; }
echo "   node/README.md's example, run as written: $out"
# Its stderr (the guard's lines, on by default) names the command the package installs, not the
# Python package's call.
said="$(cd "$project/readme-run" && rm -rf state.db* && NODE_PATH="$host/node_modules" node ../readme.js 2>&1 >/dev/null)"
grep -q 'run `hermes-guard recover .*/state\.db\.retired-wal-[^ ]* --into .*state\.db --apply`' <<<"$said" \
    || { echo "$said" >&2; echo "the capture's line does not name hermes-guard recover" >&2; exit 1; }
if grep -q 'hermes_guard\.' <<<"$said"; then
    echo "$said" >&2; echo "a line in Node names the Python package's calls" >&2; exit 1
fi
echo "   in Node the guard's lines name the hermes-guard command"

