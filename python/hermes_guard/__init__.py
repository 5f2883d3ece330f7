"""hermes-guard for Python: SQLite's lost-WAL guard on every `sqlite3` connection.

A WAL database whose `-wal`, `-shm` or main file is unlinked or replaced under a connection
silently loses committed transactions. Through the guard, that connection's writes are refused
(`sqlite3.OperationalError`, extended code `SQLITE_READONLY_DBMOVED`, 1032), the retired
generation is captured next to the database, and it is never checkpointed over the newer one.

Quick start::

    import hermes_guard, sqlite3
    hermes_guard.enable()          # every sqlite3.connect() from now on is guarded

Then, when a write fails::

    except sqlite3.OperationalError as e:
        if hermes_guard.classify(conn, e) in (hermes_guard.WalLost, hermes_guard.MainReplaced):
            print(hermes_guard.status(conn).capture)   # where the retired generation is

`is_retired(e)` answers without the connection on Python 3.11+ (and with apsw); on 3.9 and 3.10
a `sqlite3` error carries no extended result code, and it raises `ExtendedCodeUnavailable` for a
read-only error it cannot tell from the guard's refusal: `classify(conn, e)` works on every
version.

Linux only. `enable()` and `connect()` work on a Python whose `sqlite3` module cannot load
extensions (pyenv's builds by default), through the SQLite library its `_sqlite3` links.
"""

from ._capture import (
    BadInputError,
    Capture,
    CaptureFormatError,
    MainEntry,
    RecoverResult,
    UnreadableCapturesError,
    VerifyResult,
    WalEntry,
    captures,
    cli_path,
    recover,
    verify,
)
from ._loader import (
    LOG_ENV,
    VFS_NAME,
    ExtensionLoadingUnavailable,
    HermesGuardError,
    LoadError,
    connect,
    enable,
    extension_path,
    guarded_uri,
    load,
)
from ._status import (
    READONLY_DBMOVED,
    Backfill,
    CaptureFailedError,
    ErrorClass,
    ExtendedCodeUnavailable,
    FileId,
    GuardStatus,
    MainReplaced,
    NotGuardedError,
    RetireReason,
    WalLost,
    classify,
    close,
    ensure_captured,
    is_retired,
    retry_pending_captures,
    status,
)

__version__ = "0.1.0"

# Tracebacks name the errors where users import them from.
for _error in (HermesGuardError, ExtensionLoadingUnavailable, LoadError, NotGuardedError,
               CaptureFailedError, ExtendedCodeUnavailable, CaptureFormatError, BadInputError,
               UnreadableCapturesError):
    _error.__module__ = __name__
del _error

__all__ = [
    "Backfill",
    "BadInputError",
    "Capture",
    "CaptureFailedError",
    "CaptureFormatError",
    "ErrorClass",
    "ExtendedCodeUnavailable",
    "ExtensionLoadingUnavailable",
    "FileId",
    "GuardStatus",
    "HermesGuardError",
    "LOG_ENV",
    "LoadError",
    "MainEntry",
    "MainReplaced",
    "NotGuardedError",
    "READONLY_DBMOVED",
    "RecoverResult",
    "RetireReason",
    "UnreadableCapturesError",
    "VFS_NAME",
    "VerifyResult",
    "WalEntry",
    "WalLost",
    "captures",
    "classify",
    "cli_path",
    "close",
    "connect",
    "enable",
    "ensure_captured",
    "extension_path",
    "guarded_uri",
    "is_retired",
    "load",
    "recover",
    "retry_pending_captures",
    "status",
    "verify",
]
