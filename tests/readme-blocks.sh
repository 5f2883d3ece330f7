#!/usr/bin/env bash
# The README's blocks run as pasted (a reader copies them whole): the Rust quick start's
# `[dependencies]` and program, in a fresh cargo project of their own, must print what the README
# says it prints; then the operator's block ("When a write is refused"), in that project's
# directory with the `hermes-guard` command on PATH, must run each line with exit code 0 (the
# capture is there, and its rows were healed back at the program's close: nothing is missing).
# Then the main job's line of "The two commands" (the demo), as written, from the repository
# root; the other line is the test command this script runs under. The Python quick start is run
# verbatim by python/run-tests.sh and python/tests/test_api.py, node/README.md's example by
# tests/node.sh.
#
#   bash tests/readme-blocks.sh [hermes-guard command]   # default: target/debug/hermes-guard
#
# The project builds the library by path into the workspace's target directory with the
# workspace's Cargo.lock (its dependencies are reused from `cargo test`'s build).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
cli="$(realpath "${1:-$target_dir/debug/hermes-guard}")"
[ -x "$cli" ] || { echo "tests/readme-blocks.sh: no hermes-guard command at $cli" >&2; exit 2; }
project="$(mktemp -d)"
trap 'rm -rf "$project"' EXIT

python3 - "$root/README.md" "$project" "$root" <<'PY'
import pathlib, re, sys
readme, project, root = pathlib.Path(sys.argv[1]).read_text(encoding="utf-8"), pathlib.Path(sys.argv[2]), sys.argv[3]
rust_part = readme[readme.index("**Rust**"):]
toml = re.search(r"```toml\n(.*?)```", rust_part, re.S).group(1)
program = re.search(r"```rust[^\n]*\n(.*?)```", rust_part, re.S).group(1)
refused = readme[readme.index("## When a write is refused"):]
operator = re.search(r"```sh\n(.*?)```", refused, re.S).group(1)
two = readme[readme.index("## The two commands"):]
main_job = [l for l in re.search(r"```sh\n(.*?)```", two, re.S).group(1).splitlines()
            if l.startswith("cargo run")]
if len(main_job) != 1:
    sys.exit("README.md: \"The two commands\" no longer has one `cargo run` line (the main job)")
(project / "main_job.sh").write_text(main_job[0] + "\n", encoding="utf-8")
if '"../hermes-guard"' not in toml:
    sys.exit("README.md: the Rust quick start's [dependencies] no longer names ../hermes-guard")
manifest = ('[package]\nname = "readme-quick-start"\nversion = "0.1.0"\nedition = "2021"\n'
            'publish = false\n\n[workspace]\n\n' + toml.replace('"../hermes-guard"', f'"{root}"'))
(project / "Cargo.toml").write_text(manifest, encoding="utf-8")
(project / "src").mkdir()
(project / "src" / "main.rs").write_text(program, encoding="utf-8")
(project / "operator.sh").write_text(operator, encoding="utf-8")
expected = re.search(r"It prints[^\n]*\n\n```text\n(.*?)```", readme[readme.index("**Rust**"):], re.S).group(1)
(project / "expected.txt").write_text(expected, encoding="utf-8")
PY
cp "$root/Cargo.lock" "$project/"
mkdir -p "$project/run"
out="$(cd "$project/run" && HERMES_GUARD_LOG=off CARGO_TARGET_DIR="$target_dir" \
    cargo run -q --manifest-path "$project/Cargo.toml" 2>&1)" \
    || { echo "$out" >&2; echo "README.md: the Rust quick start does not build or run as pasted" >&2; exit 1; }
first="$(sed -n 1p "$project/expected.txt")"
[ "$(sed -n 1p <<<"$out")" = "$first" ] \
    || { echo "$out" >&2; echo "README.md: the Rust quick start did not print: $first" >&2; exit 1; }
grep -q "^every committed row is in Some(\"$project/run/state.db.retired-wal-[0-9-]*\")$" <<<"$out" \
    || { echo "$out" >&2; echo "README.md: the Rust quick start did not name its capture" >&2; exit 1; }
echo "   README.md's Rust quick start, built and run as pasted: $(sed -n 1p <<<"$out")"

mkdir -p "$project/bin"
ln -s "$cli" "$project/bin/hermes-guard"
while IFS= read -r line; do
    [ -n "$line" ] || continue
    if ! said="$(cd "$project/run" && PATH="$project/bin:$PATH" bash -c "$line" 2>&1)"; then
        echo "$said" >&2
        echo "README.md: the operator's line failed as pasted after the quick start: $line" >&2
        exit 1
    fi
done <"$project/operator.sh"
echo "   README.md's operator block, run as pasted after it: every line exit 0"

main_job="$(cat "$project/main_job.sh")"
if ! said="$(cd "$root" && bash -c "$main_job" 2>&1)"; then
    echo "$said" >&2
    echo "README.md: the main job failed as written: $main_job" >&2
    exit 1
fi
grep -q "rows lost" <<<"$said" || { echo "$said" >&2; echo "README.md: the demo printed no table" >&2; exit 1; }
echo "   README.md's main job, run as written: $(grep -m1 "rows lost" <<<"$said" | tr -s ' ')"
