#!/usr/bin/env bash
# The crates package: `cargo publish --dry-run` of the library (hermes-guard), the store
# (hermes-guard-store) and the CLI (hermes-guard-cli, the `hermes-guard` binary) — cargo packages
# each (the files `cargo package --list` names: the library's src/, docs/, README and LICENSE), then
# builds each packaged .crate on its own in target/package-verify, the store and the CLI against the
# just-packaged library through a local registry, every other dependency from crates.io as a user's
# build gets it — and stops before the upload. The tree as it is, committed or not
# (`--allow-dirty`). Needs the network (crates.io). About a minute the first time (its own
# target directory), under half of one after (nothing of the packaged crates is reused: see below).
#
# Environment: CARGO_TARGET_DIR (default target).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

crates=(-p hermes-guard -p hermes-guard-store -p hermes-guard-cli)
target="${CARGO_TARGET_DIR:-target}"
log="$target/package.log"
mkdir -p "$(dirname "$log")"
# Nothing of an earlier run is reused. The dry run unpacks the packaged crates of its local
# registry (<target>/package/tmp-registry) into $CARGO_HOME/registry/src/-<hash of that path>/ and
# keeps an unpacked copy of the same name and version; and it builds them as registry crates,
# whose fingerprints are their name and version, not their content: a second run after a change
# to the library verified the store and the CLI against the first run's library. So the dry run
# builds in a target directory of its own, where the packaged crates' fingerprints are removed
# first (their dependencies stay built), and their unpacked copies are removed too (a crates.io
# crate of one of these names would be unpacked again from cargo's cache).
verify_target="$target/package-verify"
rm -rf "$verify_target/package" "$verify_target"/debug/.fingerprint/hermes-guard-*
rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/hermes-guard-[0-9]* \
    "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/hermes-guard-store-[0-9]* \
    "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/hermes-guard-cli-[0-9]*
if ! CARGO_TARGET_DIR="$verify_target" \
    cargo publish --dry-run --allow-dirty "${crates[@]}" >"$log" 2>&1; then
    cat "$log" >&2
    echo "cargo publish --dry-run failed (the output above, kept in $log)" >&2
    exit 1
fi
# Cargo's own lines give each crate's size ("Packaged N files, ... (... compressed)"): the
# dry run leaves its .crate files in <target>/package-verify/package/tmp-crate, not where
# `cargo package` would.
grep -E '^ *(Packaged|Verifying)' "$log" | sed 's/^ */   /'
