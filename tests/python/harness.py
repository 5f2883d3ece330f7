"""Shared by the tests and by the writer child process: real databases, real unlinks and renames,
descriptors found through /proc like the seed tests do. Everything goes through apsw, whose SQLite
is the host the extension is loaded into."""

import hashlib
import json
import os
import shutil
import urllib.parse
from pathlib import Path

import apsw

VFS_NAME = "hermes-guard"
READONLY_DBMOVED = 1032  # SQLITE_READONLY_DBMOVED, the extended code of every refusal
OPEN_FLAGS = apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE | apsw.SQLITE_OPEN_URI
SENTINEL_PREFIX = "committed only in the retired WAL "
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS messages ("
    "id INTEGER PRIMARY KEY, session TEXT NOT NULL, content TEXT NOT NULL)"
)
FD_DIRECTORY = "/proc/self/fd"


def extension_path() -> str:
    path = os.environ.get("HERMES_GUARD_EXT")
    if not path:
        raise RuntimeError(
            "HERMES_GUARD_EXT is not set: run the suite through ext/build-and-test.sh, or set it to "
            "the built libhermes_guard.so"
        )
    return path


def load_extension(entrypoint=None) -> None:
    """Loads the extension through a connection that is closed right away: the VFS must outlive it."""
    loader = apsw.Connection(":memory:")
    try:
        loader.enable_load_extension(True)
        loader.load_extension(extension_path(), entrypoint)
    finally:
        loader.close()


def guarded_uri(path: Path) -> str:
    return "file:" + urllib.parse.quote(str(path)) + "?vfs=" + VFS_NAME


def prepare(conn: apsw.Connection) -> apsw.Connection:
    conn.set_busy_timeout(10_000)
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    assert mode == "wal", mode
    conn.execute(SCHEMA)
    return conn


def open_guarded(path: Path) -> apsw.Connection:
    """`file:<path>?vfs=hermes-guard`, in WAL mode, with the `messages` table."""
    return prepare(apsw.Connection(guarded_uri(path), flags=OPEN_FLAGS))


def open_stock(path: Path) -> apsw.Connection:
    return prepare(apsw.Connection(str(path), vfs="unix"))


def status(conn: apsw.Connection, schema: str = "main") -> dict:
    return json.loads(conn.execute("SELECT hermes_guard_status(?)", (schema,)).fetchone()[0])


def is_guarded(conn: apsw.Connection, schema: str = "main") -> bool:
    """Whether `schema` is opened through the guard: only then does its file answer the pragma."""
    return bool(conn.execute(f'PRAGMA "{schema}".hermes_guard_status').fetchall())


def insert(conn: apsw.Connection, content: str) -> None:
    conn.execute("INSERT INTO messages (session, content) VALUES ('gw-0', ?)", (content,))


def wal_only_sentinel(conn: apsw.Connection) -> str:
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


def lose_sidecars(path: Path, rename: bool) -> None:
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
    for name in os.listdir(FD_DIRECTORY):
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


def manifest(artifact: Path) -> dict:
    return json.loads((artifact / "manifest.json").read_text(encoding="utf-8"))


def artifacts(directory: Path) -> list:
    return sorted(p for p in directory.iterdir() if ".retired-wal-" in p.name)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def recover(artifact: Path, name: str, workdir: Path) -> apsw.Connection:
    """Opens the captured image + WAL as a fresh database, nothing else from the original path."""
    workdir.mkdir()
    shutil.copyfile(artifact / name, workdir / name)
    shutil.copyfile(artifact / (name + "-wal"), workdir / (name + "-wal"))
    return apsw.Connection(str(workdir / name), vfs="unix")


def count_like(conn: apsw.Connection, pattern: str) -> int:
    return conn.execute("SELECT COUNT(*) FROM messages WHERE content LIKE ?", (pattern,)).fetchone()[0]


def integrity_ok(conn: apsw.Connection) -> bool:
    return conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


def is_refusal(error: BaseException) -> bool:
    return isinstance(error, apsw.Error) and getattr(error, "extendedresult", None) == READONLY_DBMOVED
