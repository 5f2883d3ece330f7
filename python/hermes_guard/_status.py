"""What a guarded connection can tell about itself, and what an error from it means."""

from __future__ import annotations

import enum
import json
import os
import sqlite3
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from ._loader import HermesGuardError

#: `SQLITE_READONLY_DBMOVED`: the extended result code of every write the guard refuses.
READONLY_DBMOVED = 1032
#: `SQLITE_CANTOPEN_DIRTYWAL`: an open refused in the strict stale-WAL mode.
CANTOPEN_DIRTYWAL = 1294

FileId = Tuple[int, int]
"""`(st_dev, st_ino)` of a file, as the guard pinned it."""


class NotGuardedError(HermesGuardError):
    """The connection's database was not opened through the hermes-guard VFS."""


class CaptureFailedError(HermesGuardError):
    """A retired generation could not be captured (disk full, permissions). The guard keeps the
    generation's descriptors open, so a later call, close or
    :func:`retry_pending_captures` can still write it."""


class RetireReason(str, enum.Enum):
    """Why a generation was retired (`reason` in the status and the manifest)."""

    WAL_LOST = "wal-lost"
    """`<db>-wal` no longer resolves to the WAL this connection writes."""
    SHM_LOST = "shm-lost"
    """`<db>-shm` no longer resolves to the shared memory this connection maps."""
    MAIN_REPLACED = "main-replaced"
    """`<db>` no longer resolves to the main file this connection opened."""
    STALE_WAL = "stale-wal"
    """A WAL found at the open was written on another database file (a restore after a crash):
    set aside at the open, never replayed (manifests only)."""
    MAIN_OVERWRITTEN = "main-overwritten"
    """`<db>` was overwritten in place (a restore by copy) under the connection: found before a
    checkpoint wrote into it."""


class ErrorClass(enum.Enum):
    """What an error from a guarded connection means for the application."""

    WAL_LOST = "wal-lost"
    """The WAL generation was lost (WAL or `-shm` unlinked or replaced); the retired bytes are
    captured next to the database (:attr:`GuardStatus.capture`)."""
    MAIN_REPLACED = "main-replaced"
    """The main file was replaced (a snapshot restore): reopen to see the new database."""
    STALE_WAL = "stale-wal"
    """The open was refused in the strict stale-WAL mode (`SQLITE_CANTOPEN_DIRTYWAL`, 1294): the
    WAL beside the database was not written on it (:attr:`GuardStatus.stale_wal`)."""
    OTHER = "other"
    """Anything else: handle it as usual."""


# The names the issue and the Rust API use.
WalLost = ErrorClass.WAL_LOST
MainReplaced = ErrorClass.MAIN_REPLACED


@dataclass(frozen=True)
class Backfill:
    """A WAL's checkpoint progress when its loss was seen (from the retired `-shm`)."""

    frames: int
    """Valid frames in the WAL (`mxFrame`)."""
    backfilled: int
    """Frames copied into the main file (`nBackfill`)."""
    attempted: int
    """Frames a checkpoint may have begun copying (`nBackfillAttempted`)."""


def _path(display: Optional[str], hexed: Optional[str]) -> Optional[str]:
    """A path from the JSON: its exact bytes when they are not UTF-8 (`*_hex`), decoded the way
    `os` does (surrogateescape), so it opens the same file."""
    if hexed:
        return os.fsdecode(bytes.fromhex(hexed))
    return display


def _file_id(value: Any) -> Optional[FileId]:
    return None if value is None else (int(value[0]), int(value[1]))


@dataclass(frozen=True)
class GuardStatus:
    """One connection's guard, as `PRAGMA hermes_guard_status` reports it."""

    database: str
    """The database's pathname, as SQLite opened it."""
    retired: bool
    """Whether the connection's generation is retired (sticky): its writes are refused."""
    reason: Optional[RetireReason]
    """What retired it."""
    main: Optional[FileId]
    """Pinned identity of the main file."""
    wal: Optional[FileId]
    """Pinned identity of the WAL, while one is open or held for capture."""
    shm: Optional[FileId]
    """Pinned identity of the `-shm` mapping."""
    capture: Optional[Path]
    """The capture's directory, once written."""
    capture_error: Optional[str]
    """The last capture failure, while no capture exists."""
    refusals: int
    """Writes refused so far."""
    backfill_at_loss: Optional[Backfill]
    """How far the retired WAL had been checkpointed when the loss was seen."""
    main_torn: bool
    """The loss left the live main file torn (`hermes-guard help recovery`, `recover --rebuild`)."""
    shield_active: bool
    """The lock shield holds its read lock on the main file's SHARED range."""
    shield_shm_active: bool
    """The lock shield holds its read lock on the `-shm` dead-man-switch byte."""
    shield_off_reason: Optional[str]
    """Why the lock shield is off for this connection, if it is."""
    capture_attempts: int = 0
    """Failed attempts to capture this retired generation so far (retried with a back-off)."""
    let_go: Optional[str] = None
    """The deleted directory whose removal let this generation go uncaptured, if it was."""
    held_generations: int = 0
    """Process-wide: retired generations held uncaptured after their connections closed."""
    held_descriptors: int = 0
    """Process-wide: the descriptors held for them."""
    generations_let_go: int = 0
    """Process-wide: generations let go because their directory was deleted."""
    log_lines_suppressed: int = 0
    """Process-wide: capture-failure and let-go log lines left out by the rate limits."""
    raw: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The JSON document itself, with any key this version does not know."""
    wal_reset_guard: bool = False
    """Whether the guard keeps SQLite's WAL resets and checkpoints apart on this connection (the
    WAL-reset race of SQLite 3.7.0–3.51.2: on by default where the host SQLite has it)."""
    wal_resets_deferred: int = 0
    """WAL resets of this connection deferred because a checkpoint was running."""
    wal_index_alarms: int = 0
    """Checkpoints that ended with the wal-index's nBackfill past its mxFrame (the race's damage,
    from any cause)."""
    retired_connections_here: int = 0
    """Connections of this process still open on this database whose generation is retired (this
    one included, when retired). A new connection to it in this process is refused (`shm-lost`)
    until they are all closed — a pool must be disposed of — and then works."""
    stale_wal: Optional[Dict[str, Any]] = None
    """A WAL found at the open that was not written on this database: `action` (`set-aside` or
    `refused`), `capture` (where the WAL and `-shm` went), `wal`, `detail`. None: nothing of the
    kind."""

    @classmethod
    def from_json(cls, document: str) -> "GuardStatus":
        """Parses the JSON of `PRAGMA hermes_guard_status` (or `hermes_guard_status()`)."""
        j = json.loads(document)
        capture = _path(j.get("capture"), j.get("capture_hex"))
        backfill = j.get("backfill_at_loss")
        return cls(
            database=_path(j["database"], j.get("database_hex")) or "",
            retired=bool(j["retired"]),
            reason=RetireReason(j["reason"]) if j.get("reason") else None,
            main=_file_id(j.get("main")),
            wal=_file_id(j.get("wal")),
            shm=_file_id(j.get("shm")),
            capture=Path(capture) if capture is not None else None,
            capture_error=j.get("capture_error"),
            refusals=int(j.get("refusals", 0)),
            backfill_at_loss=Backfill(**backfill) if backfill else None,
            main_torn=bool(j.get("main_torn", False)),
            shield_active=bool(j.get("shield_active", False)),
            shield_shm_active=bool(j.get("shield_shm_active", False)),
            shield_off_reason=j.get("shield_off_reason"),
            capture_attempts=int(j.get("capture_attempts", 0)),
            let_go=_path(j.get("let_go"), j.get("let_go_hex")),
            held_generations=int(j.get("held_generations", 0)),
            held_descriptors=int(j.get("held_descriptors", 0)),
            generations_let_go=int(j.get("generations_let_go", 0)),
            log_lines_suppressed=int(j.get("log_lines_suppressed", 0)),
            raw=j,
            wal_reset_guard=j.get("wal_reset_guard") == "on",
            wal_resets_deferred=int(j.get("wal_resets_deferred", 0)),
            wal_index_alarms=int(j.get("wal_index_alarms", 0)),
            retired_connections_here=int(j.get("retired_connections_here", 0)),
            stale_wal=j.get("stale_wal"),
        )


def _quoted(schema: str) -> str:
    return '"' + schema.replace('"', '""') + '"'


def _database_file(conn: Any, schema: str) -> str:
    for row in conn.execute("PRAGMA database_list").fetchall():
        if row[1] == schema:
            return row[2] or "in memory or temporary"
    return "?"


def _pragma(conn: Any, schema: str, pragma: str) -> GuardStatus:
    try:
        rows = conn.execute(f"PRAGMA {_quoted(schema)}.{pragma}").fetchall()
    except Exception as e:  # sqlite3.Error or apsw.Error: the guard's capture failure
        if pragma == "hermes_guard_capture" and _is_sqlite_error(e) and _extended_code(e) in (1, None):
            raise CaptureFailedError(str(e)) from e
        raise
    if not rows:
        raise NotGuardedError(
            f"schema {schema!r} ({_database_file(conn, schema)}) is not opened through the "
            f"hermes-guard VFS: open it after hermes_guard.enable(), with hermes_guard.connect(), "
            f"or as file:<path>?vfs=hermes-guard"
        )
    return GuardStatus.from_json(rows[0][0])


def status(conn: Any, schema: str = "main") -> GuardStatus:
    """The guard's status of `schema` on `conn` (a `sqlite3` or `apsw` connection). Runs the
    retirement check now. Raises :class:`NotGuardedError` for a database not opened through the
    guard."""
    return _pragma(conn, schema, "hermes_guard_status")


def ensure_captured(conn: Any, schema: str = "main") -> GuardStatus:
    """Makes sure that, if `schema`'s generation is retired, it is captured; returns the status.
    Raises :class:`CaptureFailedError` when the capture cannot be written (the connection keeps
    the generation's descriptors, so a retry can still succeed)."""
    return _pragma(conn, schema, "hermes_guard_capture")


def close(conn: Any) -> None:
    """Closes `conn`, but only once a retired generation of its main database is captured. On a
    capture failure raises :class:`CaptureFailedError` and leaves `conn` open, to retry. A
    connection not opened through the guard is simply closed."""
    try:
        ensure_captured(conn)
    except NotGuardedError:
        pass
    conn.close()


def retry_pending_captures() -> int:
    """Retries the captures of retired generations whose connections were closed while their
    capture could not be written; returns how many are still uncaptured. Needs the extension
    loaded into the standard library's sqlite3 (:func:`enable`, :func:`connect` or
    :func:`load`)."""
    probe = sqlite3.connect(":memory:")
    try:
        return int(probe.execute("SELECT hermes_guard_retry_pending()").fetchone()[0])
    except sqlite3.OperationalError as e:
        if "no such function" in str(e):
            raise HermesGuardError(
                "hermes-guard is not loaded into this process's sqlite3: call "
                "hermes_guard.enable() first"
            ) from e
        raise
    finally:
        probe.close()


def _is_sqlite_error(error: BaseException) -> bool:
    if isinstance(error, sqlite3.Error):
        return True
    return type(error).__module__.split(".")[0] == "apsw" and hasattr(error, "extendedresult")


def _extended_code(error: BaseException) -> Optional[int]:
    """The extended result code: `sqlite_errorcode` (the stdlib, Python 3.11+) or apsw's
    `extendedresult`."""
    for attribute in ("sqlite_errorcode", "extendedresult"):
        code = getattr(error, attribute, None)
        if isinstance(code, int):
            return code
    return None


# Primary result codes that a retired connection may also meet below the guard (a second
# connection attaching to the unlinked `-shm`'s mapping gets SQLITE_IOERR_SHORT_READ, ...).
_FILE_LEVEL = {
    8,  # SQLITE_READONLY
    10,  # SQLITE_IOERR
    11,  # SQLITE_CORRUPT
    14,  # SQLITE_CANTOPEN
    15,  # SQLITE_PROTOCOL
    26,  # SQLITE_NOTADB
}


# What SQLite says for every SQLITE_READONLY error, whatever its extended code (sqlite3ErrStr keeps
# the primary code only): the guard's refusal (1032), a file without write permission, a
# read-only open, a WAL it cannot recover.
_READONLY_MESSAGE = "attempt to write a readonly database"


class ExtendedCodeUnavailable(HermesGuardError):
    """:func:`is_retired` was given a standard-library `sqlite3` error, on Python 3.9 or 3.10,
    that may be the guard's refusal, and the error alone cannot tell: before 3.11 it carries no
    extended result code, and its message is the one SQLite gives every read-only error. Use
    :func:`classify` with the connection that raised it."""


def is_retired(error: BaseException) -> bool:
    """Whether `error` is the guard's refusal of a write into a retired generation
    (`SQLITE_READONLY_DBMOVED`, 1032), read from its extended result code: the standard
    library's `sqlite3.Error.sqlite_errorcode` (Python 3.11+) or apsw's `extendedresult`.

    On Python 3.9 and 3.10 a `sqlite3` error has no extended code, and the refusal's message,
    "attempt to write a readonly database", is the one SQLite gives every read-only error (a
    file without write permission too). There `is_retired` answers False for an error that
    cannot be a refusal (another class or message) and raises :class:`ExtendedCodeUnavailable`
    for one that may be; use ``classify(conn, e)`` instead, which asks the connection:
    :data:`WalLost` or :data:`MainReplaced` means the write was refused because the database's
    files were removed or replaced, and ``status(conn).capture`` says where its rows are."""
    if not _is_sqlite_error(error):
        return False
    code = _extended_code(error)
    if code is not None:
        return code == READONLY_DBMOVED
    # No extended code: on 3.11+ the error was not raised by SQLite. Before 3.11, SQLite's
    # SQLITE_READONLY errors are OperationalErrors with SQLite's message for them.
    if (
        sys.version_info < (3, 11)
        and isinstance(error, sqlite3.OperationalError)
        and str(error) == _READONLY_MESSAGE
    ):
        raise ExtendedCodeUnavailable(
            f"hermes_guard.is_retired() cannot tell on Python {sys.version.split()[0]} whether "
            f"this error is the guard's refusal: before Python 3.11 a sqlite3 error carries no "
            f"extended result code, and SQLite says {_READONLY_MESSAGE!r} for every read-only "
            f"error (a file without write permission too). Use hermes_guard.classify(conn, e) "
            f"with the connection that raised it: hermes_guard.WalLost or "
            f"hermes_guard.MainReplaced means the write was refused because the database's "
            f"files were removed or replaced, and hermes_guard.status(conn).capture says where "
            f"its committed rows are."
        ) from error
    return False


def classify(conn: Any, error: BaseException) -> ErrorClass:
    """What `error`, raised by `conn`, means: :data:`WalLost`, :data:`MainReplaced` or
    `ErrorClass.OTHER` — the rules of the Rust library's `ErrorClass::from_parts`.

    A refusal (1032) is classified by the connection's retirement reason. A retired connection
    can also fail below the guard (an I/O, corruption, protocol, cannot-open or read-only error),
    and those are classified by its reason too. SQLite's own 1032 on a connection the guard did
    not retire means the main file was moved. On a Python older than 3.11 (no extended code),
    a file-level error of a retired connection is classified by the reason alone: there, where
    :func:`is_retired` cannot tell a refusal from another read-only error, this is the call to
    make.
    """
    if not _is_sqlite_error(error):
        return ErrorClass.OTHER
    try:
        reason = status(conn).reason
    except Exception:  # not guarded, or closed: no reason to go by
        reason = None
    code = _extended_code(error)
    if code == CANTOPEN_DIRTYWAL:
        return ErrorClass.STALE_WAL
    refused = code == READONLY_DBMOVED
    if code is None:  # Python < 3.11: the exception class stands in for the code
        file_level = not isinstance(error, (sqlite3.IntegrityError, sqlite3.ProgrammingError))
    else:
        file_level = (code & 0xFF) in _FILE_LEVEL
    if reason in (RetireReason.WAL_LOST, RetireReason.SHM_LOST) and (refused or file_level):
        return ErrorClass.WAL_LOST
    if reason is RetireReason.MAIN_REPLACED and (refused or file_level):
        return ErrorClass.MAIN_REPLACED
    if reason is None and refused:
        return ErrorClass.MAIN_REPLACED
    return ErrorClass.OTHER
