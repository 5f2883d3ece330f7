#!/usr/bin/env bash
# The loom models: ConnectionState's lock-free protocol (src/vfs/loom_protocol.rs): every interleaving
# of a retirement with a write lock, a full check and a transaction's end, up to
# LOOM_MAX_PREEMPTIONS preemptions (default 3). Its own workspace (tests/loom) and target
# directory, so neither loom nor `--cfg loom` touches the main build. About a minute from
# scratch on two cores, seconds once built.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}/loom"
RUSTFLAGS="--cfg loom" cargo test --release --manifest-path "$root/tests/loom/Cargo.toml" \
    --test loom_protocol --test loom_wal_index
