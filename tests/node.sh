#!/usr/bin/env bash
# tests/node.sh <extension> <hermes-guard command>: hermes-guard in Node (issue 45). Installs
# better-sqlite3 (tests/node/package-lock.json: from npm, compiled on this machine by node-gyp,
# about 2 minutes the first time) into <target>/node-host, once per lock file, and runs
# tests/node/*.test.js with `node --test`: the extension loaded with the entry point that makes
# the guard the default VFS, and the loss scenario (refused with SQLITE_READONLY_DBMOVED,
# captured, recovered with the command).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ext="$1" cli="$2"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
host="$target_dir/node-host"
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
HERMES_GUARD_EXT="$ext" HERMES_GUARD_CLI="$cli" NODE_PATH="$host/node_modules" \
    node --test "$root"/tests/node/*.test.js
