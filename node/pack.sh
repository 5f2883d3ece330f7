#!/usr/bin/env bash
# node/pack.sh <extension .so> <hermes-guard command> <destination directory>: the npm package.
# Copies this folder's package files and the two native files (debug sections stripped) into a
# staging folder under the destination, runs `npm pack` there and prints the tarball's path. The
# source tree is never written to.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ext="$1" cli="$2" dest="$3"
[ -f "$ext" ] || { echo "node/pack.sh: no extension at $ext" >&2; exit 2; }
[ -x "$cli" ] || { echo "node/pack.sh: no command at $cli" >&2; exit 2; }
mkdir -p "$dest"
dest="$(cd "$dest" && pwd)"
stage="$dest/stage"
rm -rf "$stage"
mkdir -p "$stage/native"
cp "$here/package.json" "$here/index.js" "$here/index.d.ts" "$here/check-native.js" "$here/README.md" "$stage/"
cp "$here/../LICENSE" "$stage/"
strip --strip-debug -o "$stage/native/libhermes_guard.so" "$ext"
strip --strip-debug -o "$stage/native/hermes-guard" "$cli"
chmod 755 "$stage/native/hermes-guard"
rm -f "$dest"/hermes-guard-*.tgz
(cd "$stage" && npm pack --silent --pack-destination "$dest" >/dev/null)
ls "$dest"/hermes-guard-*.tgz
