#!/usr/bin/env bash
# sqlite-from-npm.sh <npm sqlite3 version> <SQLite version number> <output directory>
#
# Builds libsqlite3.so.0 (and the libsqlite3.so link) of an older SQLite from the amalgamation that
# the npm package sqlite3@<version> ships (deps/sqlite-autoconf-<number>.tar.gz), for the hosts and
# the system-SQLite run that CI cannot get from the distribution: sqlite3@5.0.1 is SQLite 3.32.3,
# @5.0.2 is 3.34.0, @5.1.7 is 3.44.2. Compiled with what Debian's Python _sqlite3 module calls for
# (deserialize, FTS5, JSON1, ...). Does nothing when the output is there already.
set -euo pipefail
npm_version="$1" number="$2" out="$3"
[ -f "$out/libsqlite3.so.0" ] && exit 0
command -v npm >/dev/null || { echo "npm not found" >&2; exit 1; }
command -v gcc >/dev/null || { echo "gcc not found" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
timeout 120 npm pack --silent "sqlite3@$npm_version" >/dev/null
tar xzf "sqlite3-$npm_version.tgz" "package/deps/sqlite-autoconf-$number.tar.gz"
tar xzf "package/deps/sqlite-autoconf-$number.tar.gz" "sqlite-autoconf-$number/sqlite3.c" \
    "sqlite-autoconf-$number/sqlite3.h"
gcc -O1 -g0 -fPIC -shared -Wl,-soname,libsqlite3.so.0 -DSQLITE_THREADSAFE=1 \
    -DSQLITE_ENABLE_DESERIALIZE -DSQLITE_ENABLE_FTS3 -DSQLITE_ENABLE_FTS5 \
    -DSQLITE_ENABLE_JSON1 -DSQLITE_ENABLE_RTREE -DSQLITE_ENABLE_COLUMN_METADATA \
    -o libsqlite3.so.0 "sqlite-autoconf-$number/sqlite3.c" -lpthread -ldl -lm
mkdir -p "$out"
cp "sqlite-autoconf-$number/sqlite3.h" "$out/"
mv libsqlite3.so.0 "$out/"
ln -sf libsqlite3.so.0 "$out/libsqlite3.so"
