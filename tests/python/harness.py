"""Shared by the tests and by the writer child process: real databases, real unlinks and renames,
descriptors found through /proc like the seed tests do. Everything goes through one Python binding
of SQLite, whose SQLite is the host the extension is loaded into:

- `HERMES_GUARD_PY_BINDING=apsw` (the default): apsw, with the method names of apsw 3.43 and later
  (`enable_load_extension`, `sqlite_lib_version`, ...) or of older releases (`enableloadextension`,
  `sqlitelibversion`, ...);
- `HERMES_GUARD_PY_BINDING=sqlite3`: the standard library's `sqlite3` (a build that can load
  extensions, such as Debian's /usr/bin/python3), on whatever libsqlite3 it links.

The tests use only what this module offers: `connect`, the error classes, `sqlite_version`."""

import hashlib
import json
import os
import platform
import shutil
import urllib.parse
from pathlib import Path

BINDING = os.environ.get("HERMES_GUARD_PY_BINDING", "apsw")

if BINDING == "apsw":
    import apsw

    Error = apsw.Error
    ReadOnlyError = apsw.ReadOnlyError  # a refused write
    SQLError = apsw.SQLError  # an error a SQL function or a PRAGMA reports
    LoadError = apsw.ExtensionLoadingError
elif BINDING == "sqlite3":
    import sqlite3

    Error = sqlite3.Error
    ReadOnlyError = sqlite3.OperationalError
    SQLError = sqlite3.OperationalError
    LoadError = sqlite3.OperationalError
else:
    raise RuntimeError(f"HERMES_GUARD_PY_BINDING must be apsw or sqlite3, not {BINDING!r}")


def _apsw(obj, name: str):
    """apsw 3.43 renamed its methods to snake case; older releases spell them without '_'."""
    found = getattr(obj, name, None)
    return found if found is not None else getattr(obj, name.replace("_", ""))


def sqlite_version() -> str:
    """The host SQLite's own version (sqlite3_libversion), not the one a binding was built with."""
    if BINDING == "apsw":
        return _apsw(apsw, "sqlite_lib_version")()
    return sqlite3.sqlite_version


def binding_description() -> str:
    if BINDING == "apsw":
        return f"apsw {_apsw(apsw, 'apsw_version')()}"
    return f"the standard library's sqlite3 of Python {platform.python_version()}"


def connect(target: str, vfs: str | None = None, uri: bool = False):
    """Opens `target` (a path, or a `file:` URI when `uri`) through `vfs` (None: the default VFS),
    read-write and created if missing, in autocommit mode."""
    if BINDING == "apsw":
        if uri:
            return apsw.Connection(target, flags=OPEN_FLAGS)
        return apsw.Connection(target, vfs=vfs) if vfs else apsw.Connection(target)
    if vfs:
        target, uri = "file:" + urllib.parse.quote(target) + "?vfs=" + vfs, True
    return sqlite3.connect(target, uri=uri, isolation_level=None, check_same_thread=False)


def extended_code(error: BaseException):
    if BINDING == "apsw":
        return getattr(error, "extendedresult", None)
    return getattr(error, "sqlite_errorcode", None)


def vfs_registered(name: str) -> bool:
    if BINDING == "apsw":
        return name in _apsw(apsw, "vfs_names")()
    # The stdlib lists no VFS: an open that names it says "no such vfs" when it is not there.
    probe = "file:/nonexistent-hermes-guard-probe/x.db?mode=ro&vfs=" + urllib.parse.quote(name)
    try:
        sqlite3.connect(probe, uri=True).close()
    except sqlite3.Error as e:
        return "no such vfs" not in str(e)
    return True


VFS_NAME = "hermes-guard"
READONLY_DBMOVED = 1032  # SQLITE_READONLY_DBMOVED, the extended code of every refusal
OPEN_FLAGS = 0x2 | 0x4 | 0x40  # SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_URI
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
    loader = connect(":memory:")
    try:
        if BINDING == "apsw":
            _apsw(loader, "enable_load_extension")(True)
            _apsw(loader, "load_extension")(extension_path(), entrypoint)
        else:
            loader.enable_load_extension(True)
            if entrypoint is None:
                loader.load_extension(extension_path())
            else:  # Python 3.11's load_extension takes no entry point; the SQL function does
                loader.execute("SELECT load_extension(?, ?)", (extension_path(), entrypoint)).fetchall()
    finally:
        loader.close()


def guarded_uri(path: Path) -> str:
    return "file:" + urllib.parse.quote(str(path)) + "?vfs=" + VFS_NAME


def prepare(conn):
    conn.execute("PRAGMA busy_timeout=10000").fetchall()
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    assert mode == "wal", mode
    conn.execute(SCHEMA)
    return conn


def open_guarded(path: Path):
    """`file:<path>?vfs=hermes-guard`, in WAL mode, with the `messages` table."""
    return prepare(connect(guarded_uri(path), uri=True))


def open_stock(path: Path):
    return prepare(connect(str(path), vfs="unix"))


def status(conn, schema: str = "main") -> dict:
    return json.loads(conn.execute("SELECT hermes_guard_status(?)", (schema,)).fetchone()[0])


def is_guarded(conn, schema: str = "main") -> bool:
    """Whether `schema` is opened through the guard: only then does its file answer the pragma."""
    return bool(conn.execute(f'PRAGMA "{schema}".hermes_guard_status').fetchall())


def insert(conn, content: str) -> None:
    conn.execute("INSERT INTO messages (session, content) VALUES ('gw-0', ?)", (content,))


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


def recover(artifact: Path, name: str, workdir: Path):
    """Opens the captured image + WAL as a fresh database, nothing else from the original path."""
    workdir.mkdir()
    shutil.copyfile(artifact / name, workdir / name)
    shutil.copyfile(artifact / (name + "-wal"), workdir / (name + "-wal"))
    return connect(str(workdir / name), vfs="unix")


def count_like(conn, pattern: str) -> int:
    return conn.execute("SELECT COUNT(*) FROM messages WHERE content LIKE ?", (pattern,)).fetchone()[0]


def integrity_ok(conn) -> bool:
    return conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


def is_refusal(error: BaseException) -> bool:
    return isinstance(error, Error) and extended_code(error) == READONLY_DBMOVED
