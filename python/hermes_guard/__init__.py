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
        if hermes_guard.is_retired(e):
            print(hermes_guard.status(conn).capture)   # where the retired generation is

Linux only. The standard library's `sqlite3` must be able to load extensions (Debian's and
Ubuntu's `/usr/bin/python3` can; pyenv's builds by default cannot: use apsw there).
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
               CaptureFailedError, CaptureFormatError, BadInputError, UnreadableCapturesError):
    _error.__module__ = __name__
del _error

__all__ = [
    "Backfill",
    "BadInputError",
    "Capture",
    "CaptureFailedError",
    "CaptureFormatError",
    "ErrorClass",
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
