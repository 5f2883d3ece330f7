#!/usr/bin/env bash
# The framework recipes (docs/hosts.md, the README's hosts in full) are the tested code: each code block that follows a
# `<!-- recipe: FILE -->` line must appear, line for line (shifted right as a whole at most), in FILE, whose
# test runs it (tests/frameworks.sh). A second or less; ext/build-and-test.sh runs it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python3 - <<'PY'
import re, sys
readme = open("docs/hosts.md", encoding="utf-8").read()
found = re.findall(r"<!-- recipe: (\S+) -->\n```[^\n]*\n(.*?)\n```", readme, re.S)
if not found:
    sys.exit("docs/hosts.md: no recipe blocks found")
bad = 0
for path, block in found:
    try:
        source = open(path, encoding="utf-8").read()
    except OSError as e:
        print(f"docs/hosts.md: a recipe cites {path}: {e}", file=sys.stderr)
        bad += 1
        continue
    lines = block.splitlines()
    if not any("\n".join(" " * n + l if l else l for l in lines) in source for n in range(0, 25, 4)):
        print(f"docs/hosts.md: a recipe is no longer in {path}; its first line: {block.splitlines()[0]!r}",
              file=sys.stderr)
        bad += 1
print(f"   {len(found) - bad} of {len(found)} docs/hosts.md recipes are in their tests")
sys.exit(1 if bad else 0)
PY
