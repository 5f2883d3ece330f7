"""Shared by the tests and their child processes: real databases, real unlinks and renames,
descriptors found through /proc as the seed tests find them. Every connection is a plain
`sqlite3.connect()`; the test process (and each child that calls `hermes_guard.enable()`) opens
them through the guard because it is the default VFS."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
SENTINEL_PREFIX = "committed only in the retired WAL "
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS messages ("
    "id INTEGER PRIMARY KEY, session TEXT NOT NULL, content TEXT NOT NULL)"
)


def open_db(path, stock: bool = False):
    """A plain `sqlite3.connect()` (guarded once `enable()` ran; `stock`: through the unix VFS,
    named in a URI), autocommit, WAL, with the `messages` table."""
    import sqlite3
    import urllib.parse

    if stock:
        uri = "file:" + urllib.parse.quote(str(path)) + "?vfs=unix"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None)
    else:
        conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute("PRAGMA busy_timeout=10000")
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    assert mode == "wal", mode
    conn.execute(SCHEMA)
    return conn


def insert(conn, content: str, session: str = "gw-0") -> None:
    conn.execute("INSERT INTO messages (session, content) VALUES (?, ?)", (session, content))


def count_like(conn, pattern: str) -> int:
    return conn.execute("SELECT COUNT(*) FROM messages WHERE content LIKE ?", (pattern,)).fetchone()[0]


def integrity_ok(conn) -> bool:
    return conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


def wal_only_sentinel(conn) -> str:
    """Seeds and checkpoints history, then commits one row that lives only in the WAL."""
    conn.execute("PRAGMA wal_autocheckpoint=0")
    for i in range(20):
        insert(conn, f"history {i}")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    sentinel = SENTINEL_PREFIX + "x" * 3000
    insert(conn, sentinel)
    return sentinel


def sidecar(path: Path, suffix: str) -> Path:
    return Path(str(path) + suffix)


def lose_sidecars(path: Path, rename: bool = False) -> None:
    """Takes the sidecars away as a cleanup script (unlink) or a restore (rename) would."""
    for suffix in ("-wal", "-shm"):
        side = sidecar(path, suffix)
        if rename:
            side.rename(sidecar(path, suffix + ".moved-away"))
        else:
            side.unlink()


def identity_of(path: Path) -> tuple:
    st = path.stat()
    return (st.st_dev, st.st_ino)


def descriptor_for(identity: tuple) -> int:
    for name in os.listdir("/proc/self/fd"):
        try:
            fd = int(name)
            st = os.fstat(fd)
        except (ValueError, OSError):
            continue
        if (st.st_dev, st.st_ino) == tuple(identity):
            return fd
    raise AssertionError(f"no descriptor of this process holds the inode {identity}")


def descriptor_contents(fd: int) -> bytes:
    return os.pread(fd, os.fstat(fd).st_size, 0)


def capture_dirs(directory: Path) -> list:
    return sorted(p for p in directory.iterdir() if ".retired-wal-" in p.name)


def run_python(code: str, *args: str, python: str = sys.executable, env: dict | None = None,
               check: bool = True) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh Python process whose working directory is this one (so
    `import helpers` works); a crash shows as its exit status."""
    child_env = dict(os.environ)
    child_env.update(env or {})
    done = subprocess.run(
        [python, "-c", textwrap.dedent(code), *args],
        cwd=HERE, env=child_env, capture_output=True, text=True, timeout=120,
    )
    if check:
        assert done.returncode == 0, f"child exited with {done.returncode}: {done.stderr}"
    return done


def last_json(done: subprocess.CompletedProcess) -> dict:
    lines = done.stdout.strip().splitlines()
    assert lines, f"the child printed nothing: {done.stderr}"
    return json.loads(lines[-1])


class Child:
    """A long-lived child Python process driven line by line: it runs `code`, which reads
    commands from stdin and answers each with one JSON line."""

    def __init__(self, code: str, *args: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), *args],
            cwd=HERE, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )

    def next_event(self, expected: str) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.kill()
            raise AssertionError(f"the child exited before {expected!r}: {self.proc.stderr.read()}")
        event = json.loads(line)
        assert event["event"] == expected, event
        return event

    def ask(self, command: str, expected: str) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.next_event(expected)

    def finish(self) -> int:
        self.proc.stdin.close()
        code = self.proc.wait(timeout=60)
        self.proc.stdout.close()
        self.proc.stderr.close()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def skip_unless_ci(reason: str):
    """Outside CI a missing prerequisite skips, saying why; with CI=true it fails."""
    import pytest

    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: {reason}")
    pytest.skip(reason)
