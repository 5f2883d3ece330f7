#!/usr/bin/env bash
# The crates package: `cargo publish --dry-run` of the library (hermes-guard), the store
# (hermes-guard-store) and the CLI (hermes-guard-cli, the `hermes-guard` binary) — cargo packages
# each (the files `cargo package --list` names: the library's src/, docs/, README and LICENSE), then
# builds each packaged .crate on its own in target/package, the store and the CLI against the
# just-packaged library through a local registry, every other dependency from crates.io as a user's
# build gets it — and stops before the upload. The tree as it is, committed or not
# (`--allow-dirty`). Needs the network (crates.io). About a minute the first time.
#
# Environment: CARGO_TARGET_DIR (default target).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

crates=(-p hermes-guard -p hermes-guard-store -p hermes-guard-cli)
log="${CARGO_TARGET_DIR:-target}/package.log"
mkdir -p "$(dirname "$log")"
if ! cargo publish --dry-run --allow-dirty "${crates[@]}" >"$log" 2>&1; then
    cat "$log" >&2
    echo "cargo publish --dry-run failed (the output above, kept in $log)" >&2
    exit 1
fi
# Cargo's own lines give each crate's size ("Packaged N files, ... (... compressed)"): the
# dry run leaves its .crate files in target/package/tmp-crate, not where `cargo package` would.
grep -E '^ *(Packaged|Verifying)' "$log" | sed 's/^ */   /'
