#!/usr/bin/env bash
# The power-loss filesystem (tests/lazyfs): its own rules (tests/lazyfs/tests/it/rules.rs), then
# every crash-point test (tests/lazyfs/tests/it/crash_point_*.rs: one test binary), which mount it
# over FUSE and cut the power before each durable step of a workload, with the reordered states of
# each cut, a failing fsync or write, and a cut during the recovery after a first cut. Prints each
# test's "N crash points" and "N crash states (<dimension>)" and their sums. Needs /dev/fuse and
# root (the mount is a direct mount(2); without root, fusermount3 from Debian's fuse3 package).
# Without FUSE it fails with the reason (it never skips silently); outside CI (CI unset) it is
# skipped with the reason printed.
# Built in the debug profile (it reuses the root `cargo test` build); a few minutes once built.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

no_fuse() {
    echo "!! the power-loss filesystem cannot be mounted: $1" >&2
    if [ "${CI:-}" = true ]; then
        echo "CI=true: the crash-point tests are required (tests/crash-points.sh)" >&2
        exit 1
    fi
    echo "!! SKIPPED: the crash-point tests (tests/crash-points.sh)" >&2
    # ext/build-and-test.sh names it again in its last line.
    [ -z "${HERMES_GUARD_SKIPS:-}" ] || echo "the crash-point tests (tests/crash-points.sh): $1" >>"$HERMES_GUARD_SKIPS"
    exit 0
}

[ -e /dev/fuse ] || no_fuse "/dev/fuse is missing (load the fuse module, or run the container with --device /dev/fuse)"
if [ "$(id -u)" != 0 ] && ! command -v fusermount3 >/dev/null; then
    no_fuse "not root, and no fusermount3 (apt-get install fuse3)"
fi

out="$(mktemp)"
trap 'rm -f "$out"' EXIT
cargo test -p hermes-guard-lazyfs -- --nocapture --test-threads=2 2>&1 | tee "$out"
awk '/ crash points$/ { n += $(NF-2) }
     / crash states \(/ { d = $0; sub(/.* crash states /, "", d)
                          match($0, /[0-9]+ crash states/); s[d] += substr($0, RSTART, RLENGTH) }
     END { printf "== crash points in all: %d (each on 4 images)\n", n
           for (d in s) printf "== crash states %s in all: %d\n", d, s[d] }' "$out"
