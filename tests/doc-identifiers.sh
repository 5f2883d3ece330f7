#!/usr/bin/env bash
# Every code identifier the docs cite in backticks must still exist in the source tree.
#
# Reads the inline `code spans` (not fenced blocks: those are examples, compiled or run elsewhere)
# of docs/*.md, README.md, ext/README.md, python/README.md and node/README.md, keeps the spans that look like code
# symbols, and fails listing each one whose name appears nowhere in the source tree: src/, store/, cli/,
# ext/, python/, node/, tests/ (target/ and build outputs left out) and the Cargo manifests. The
# heuristic, span by span (a trailing `(...)` call is stripped first; a span with a space, `=`,
# `-`, `/`, `.`, `<`, `"` or `'` in it is prose, a setting, a path or a command, and is skipped,
# except the file names below):
#   - `a::b::c` (also `A::{B, C}`): a path. Every segment is looked up, unless the first is a
#     crate other than ours (std, core, rusqlite, rustix, libc, serde, ...): those are the other
#     crate's names, not checked. `hermes_guard::`/`crate::`/`self::`/`super::` are ours.
#   - `snake_case` with an underscore, `CamelCase` with two capitals or more (`GuardExt`, not
#     `Manifest`), `mixedCase` (`unixOpen`, `xShmLock`) and `UPPER_CASE` with an underscore.
#   - `SQLITE_*` and `sqlite3_*` names, and mixedCase or UPPER_CASE ones the source tree lacks
#     (`unixOpen`, `RESERVED_BYTE`), are SQLite's:
#     looked up in the bundled sqlite3.c of the libsqlite3-sys in the cargo registry when it is
#     there, allowed otherwise.
#   - a file name ending in .rs, .sh or .py (`src/vfs/file.rs`, `fork.rs`): a file of that path,
#     or of that base name for a bare name, must exist in the repository.
#   - Single lowercase words (`register`, `close`) and single-capital words (`Manifest`) are not
#     checked: they are English as often as code.
# ALLOW below lists the names that are neither ours nor SQLite's (the kernel's, other tools')
# or that the docs cite on purpose as gone (a rejected alternative names what it would have used).
# Runs in about a second (one pass over the tree and sqlite3.c).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

sqlite_c="$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/libsqlite3-sys-*/sqlite3/sqlite3.c 2>/dev/null | tail -n 1 || true)"

python3 - "$sqlite_c" <<'PY'
import os, re, sys

sqlite_c = sys.argv[1]
DOCS = sorted(
    ["docs/" + f for f in os.listdir("docs") if f.endswith(".md")]
    + ["README.md", "ext/README.md", "python/README.md", "node/README.md"]
)
TREES = ["src", "store", "cli", "ext", "python", "tests", "node"]
SKIP_DIRS = {"target", ".git", "__pycache__", "build", "node_modules", ".venv", "venv"}
SRC_EXT = (".rs", ".toml", ".sh", ".py", ".c", ".h", ".txt", ".cfg", ".json", ".js", ".ts")
# Crates whose paths are not ours: their names are not checked.
FOREIGN = {"std", "core", "alloc", "rusqlite", "rustix", "libc", "serde", "serde_json", "clap",
           "log", "env_logger", "parking_lot", "tempfile", "sha2", "thiserror", "humantime",
           "criterion", "loom", "proptest", "indicatif", "libsqlite3_sys", "apsw", "sqlite3",
           "os", "subprocess", "ctypes", "setuptools_rust"}
# Not ours, not SQLite's: the kernel's, the C library's, other tools'.
ALLOW = {
    "F_OFD_SETLK", "F_GETLK", "F_UNLCK", "MADV_WIPEONFORK", "MAP_FIXED", "MAP_SHARED",
    "NAME_MAX", "CAP_SYS_ADMIN", "EPOLLIN", "EPOLLPRI", "EPOLLERR", "EAGAIN", "RUST_LOG",
    "mounts_poll", "epoll_wait", "epoll_pwait", "pthread_atfork", "map_files", "rep_stosb",
    "syscall5", "build_rust", "bdist_wheel", "after_help", "enable_load_extension",
    "load_extension", "TemporaryDirectory", "RustExtension", "NoBinding", "SETUPTOOLS_RUST_CARGO_PROFILE",
    "VmFlags", "CI", "RENAME_NOREPLACE", "sched_yield", "copy_file_range", "_copy_to_iter",
    "copy_folio_from_iter_atomic", "callgrind_annotate", "buildtime_bindgen",
    "hermes_state", "hermes_state_registry",  # the Python originals (hermes-agent) of the store
}

words = set()
files = set()
basenames = set()
for tree in TREES:
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".")]
        for f in filenames:
            p = os.path.join(dirpath, f)
            files.add(p)
            basenames.add(f)
            if f.endswith(SRC_EXT) or f in ("run",):
                with open(p, encoding="utf-8", errors="replace") as fh:
                    words.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", fh.read()))
for f in ["Cargo.toml", ".ci/run"] + [d for d in DOCS]:
    files.add(f)
for f in ["Cargo.toml"]:
    with open(f) as fh:
        words.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", fh.read()))
sqlite_words = None
if sqlite_c and os.path.exists(sqlite_c):
    with open(sqlite_c, encoding="utf-8", errors="replace") as fh:
        sqlite_words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", fh.read()))

SNAKE = re.compile(r"^_*[a-z][a-z0-9]*(_[a-z0-9]+)+$")
CAMEL = re.compile(r"^[A-Z][a-z0-9]+([A-Z][A-Za-z0-9]*)+$")
MIXED = re.compile(r"^[a-z][a-z0-9]*([A-Z][A-Za-z0-9]*)+$")
UPPER = re.compile(r"^[A-Z][A-Z0-9]*(_[A-Z0-9]+)+$")
IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*!?$")

def sqlite_name(w):
    return w.startswith(("SQLITE_", "sqlite3_", "sqlite3"))

def exists(w, mixed_ok=False):
    w = w.rstrip("!")
    if w in ALLOW or w in words:
        return True
    if sqlite_name(w) or mixed_ok or UPPER.match(w):
        return sqlite_words is None or w in sqlite_words
    return False

def code_like(w):
    return bool(SNAKE.match(w) or CAMEL.match(w) or MIXED.match(w) or UPPER.match(w))

def check_span(span):
    """None when fine or not code; else the name that is missing."""
    s = span.strip()
    s = re.sub(r"\(.*\)$", "", s)          # f(x) -> f
    if re.fullmatch(r"[\w./-]+\.(rs|sh|py)", s):
        if "/" in s:   # a path from the root, or the tail of one (`state/healing.rs`)
            return None if os.path.exists(s) or any(f.endswith("/" + s) for f in files) else s
        return None if s in basenames else s
    if "::" in s:
        if re.search(r"[ =\"'<>]", re.sub(r"\{[^}]*\}", "", s)):
            return None
        head, _, tail = s.partition("::{")
        segs = head.split("::")
        if tail:
            segs += [t.strip() for t in tail.rstrip("}").split(",") if t.strip()]
        if segs[0] in FOREIGN:
            return None
        for seg in segs:
            seg = seg.strip()
            if seg in ("hermes_guard", "crate", "self", "super", "") or not IDENT.match(seg):
                continue
            if not exists(seg, mixed_ok=bool(MIXED.match(seg))):
                return s
        return None
    if not IDENT.match(s) or not code_like(s.rstrip("!")):
        return None
    return None if exists(s, mixed_ok=bool(MIXED.match(s))) else s

missing = []
for doc in DOCS:
    fenced = False
    with open(doc, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if fenced:
                continue
            for m in re.finditer(r"(`+)(.+?)\1", line):
                bad = check_span(m.group(2))
                if bad:
                    missing.append(f"{doc}:{n}: `{bad}`")

if missing:
    print("doc-identifiers: cited in backticks but found nowhere in the source tree:")
    print("\n".join(missing))
    sys.exit(1)
print(f"doc-identifiers: every cited identifier exists ({len(DOCS)} documents)"
      + ("" if sqlite_words else "; sqlite3.c not found, SQLite names not checked"))
PY
