"""Loading the extension (`libhermes_guard.so`, carried in this package) into a host SQLite."""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
import urllib.parse
from pathlib import Path
from typing import Any, Optional, Union

if not sys.platform.startswith("linux"):
    raise ImportError(
        f"hermes-guard runs on Linux only (the guard relies on inotify, /proc and open-file-"
        f"description locks); this Python runs on {sys.platform}"
    )

#: The VFS the extension registers.
VFS_NAME = "hermes-guard"

ENTRY_POINT = "sqlite3_hermesguard_init"
DEFAULT_ENTRY_POINT = "sqlite3_hermesguard_default_init"

_PACKAGE_DIR = Path(__file__).resolve().parent
_EXTENSION_FILE = "libhermes_guard.so"


class HermesGuardError(Exception):
    """The base of every error this package raises itself."""


class ExtensionLoadingUnavailable(HermesGuardError):
    """This Python's `sqlite3` module cannot load SQLite extensions, and the SQLite library it
    runs on cannot be reached to load the guard from outside either (SQLite compiled into the
    module without its routines exported)."""


class LoadError(HermesGuardError):
    """The host SQLite refused the extension (too old, built without a routine the guard needs,
    or already serving the guard from another SQLite library in this process)."""


def extension_path() -> str:
    """The absolute path of the packaged loadable extension, for hosts this package does not
    drive itself (`.load` in the sqlite3 shell, another binding's `load_extension`)."""
    path = _PACKAGE_DIR / _EXTENSION_FILE
    if not path.is_file():
        raise HermesGuardError(
            f"the package has no {_EXTENSION_FILE} beside {__file__}: it was not built "
            f"(install it with `pip install ./python` from the hermes-guard repository)"
        )
    return str(path)


# Which SQLite library the extension went into, once it has. Its Rust side keeps one table of the
# host's SQLite routines per process: a second, different library (the stdlib's libsqlite3 and an
# apsw wheel's own copy) would replace the first's table under it.
_lock = threading.Lock()
_host: Optional[str] = None
_default = False


def _host_of(conn: Any) -> str:
    if isinstance(conn, sqlite3.Connection):
        return "sqlite3"
    module = type(conn).__module__.split(".")[0]
    if module == "apsw":
        return "apsw"
    raise TypeError(
        f"hermes_guard.load() takes a sqlite3.Connection or an apsw.Connection, not "
        f"{type(conn).__module__}.{type(conn).__qualname__}"
    )


def _check_host(host: str) -> None:
    if _host is not None and _host != host:
        raise LoadError(
            f"hermes-guard is already loaded into {_host}'s SQLite in this process; it cannot "
            f"also be loaded into {host}'s, which is another copy of the SQLite library. Use one "
            f"of them for the guarded databases of this process."
        )


def _loaded_into(host: str) -> None:
    global _host
    _host = host


def _interpreter() -> str:
    real = os.path.realpath(sys.executable)
    return sys.executable if real == sys.executable else f"{sys.executable} ({real})"


def _no_loading_error(why: str) -> ExtensionLoadingUnavailable:
    return ExtensionLoadingUnavailable(
        f"this Python's sqlite3 module cannot load SQLite extensions, so hermes-guard cannot be "
        f"loaded into it: {_interpreter()} (Python {sys.version.split()[0]}, SQLite "
        f"{sqlite3.sqlite_version}) was built without --enable-loadable-sqlite-extensions, "
        f"which leaves out sqlite3.Connection.enable_load_extension (CPython's configure does "
        f"by default: pyenv's builds, for one), and {why}. Use instead: the distribution's own "
        f"Python (/usr/bin/python3 on Debian or Ubuntu); a Python built with "
        f"--enable-loadable-sqlite-extensions (pyenv: "
        f'PYTHON_CONFIGURE_OPTS="--enable-loadable-sqlite-extensions" pyenv install <version>); '
        f"or apsw (pip install apsw), whose connections hermes_guard.load() accepts."
    )


def _sqlite_library() -> Any:
    """The SQLite library this Python's `_sqlite3` module runs on, through ctypes: the module's
    own shared object, whose symbol lookup (dlsym) covers the libraries it links — a shared
    libsqlite3, or a SQLite compiled into the module with its symbols exported. Raises
    ExtensionLoadingUnavailable when neither has SQLite's routines, or they are another copy."""
    import ctypes

    import _sqlite3  # type: ignore[import-not-found,unused-ignore]

    module_file = getattr(_sqlite3, "__file__", None)
    try:
        lib = ctypes.CDLL(module_file) if module_file else ctypes.CDLL(None)
        version = lib.sqlite3_libversion
        lib.sqlite3_enable_load_extension
    except (OSError, AttributeError):
        raise _no_loading_error(
            f"its _sqlite3 ({module_file or 'built into the interpreter'}) has SQLite compiled in "
            f"without its routines exported (or without extension loading), so the guard cannot "
            f"be registered in it from outside either"
        ) from None
    version.restype = ctypes.c_char_p
    found = version().decode()
    if found != sqlite3.sqlite_version:
        raise _no_loading_error(
            f"the SQLite its _sqlite3 exposes ({found}) is not the one it runs on "
            f"({sqlite3.sqlite_version})"
        )
    return lib


def _load_through_library(entry_point: str) -> None:
    """Loads the extension with the C API of the SQLite library `_sqlite3` runs on (a private
    in-memory connection, closed at once), for a Python whose `sqlite3` module leaves out
    `enable_load_extension`: the library itself can load extensions, and the VFS it registers
    serves every connection of this process's `sqlite3` module."""
    import ctypes

    lib = _sqlite_library()
    db = ctypes.c_void_p()
    lib.sqlite3_open_v2.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p),
                                    ctypes.c_int, ctypes.c_char_p]
    lib.sqlite3_enable_load_extension.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.sqlite3_load_extension.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                           ctypes.POINTER(ctypes.c_char_p)]
    lib.sqlite3_close.argtypes = [ctypes.c_void_p]
    lib.sqlite3_free.argtypes = [ctypes.c_void_p]
    open_readwrite_create = 0x02 | 0x04
    rc = lib.sqlite3_open_v2(b":memory:", ctypes.byref(db), open_readwrite_create, None)
    try:
        if rc != 0:
            raise LoadError(f"SQLite {sqlite3.sqlite_version} could not open an in-memory "
                            f"database to load the guard through (error code {rc})")
        lib.sqlite3_enable_load_extension(db, 1)
        message = ctypes.c_char_p()
        rc = lib.sqlite3_load_extension(db, os.fsencode(extension_path()),
                                        entry_point.encode(), ctypes.byref(message))
        if rc != 0:
            text = message.value.decode(errors="replace") if message.value else f"code {rc}"
            lib.sqlite3_free(ctypes.cast(message, ctypes.c_void_p))
            raise LoadError(f"{text} (loading {extension_path()} through the SQLite library "
                            f"of _sqlite3)")
    finally:
        lib.sqlite3_close(db)


def _load_stdlib(conn: sqlite3.Connection, entry_point: str) -> None:
    enable = getattr(conn, "enable_load_extension", None)
    if enable is None:
        raise _no_loading_error(
            "a connection of it cannot load one. hermes_guard.enable() and hermes_guard.connect() "
            "work on this Python nonetheless (they register the guard through the SQLite library "
            "itself)"
        )
    enable(True)
    try:
        # The SQL function takes an entry point on every Python (load_extension() only from
        # 3.12 on); it is usable while loading is enabled, for this call only.
        conn.execute("SELECT load_extension(?, ?)", (extension_path(), entry_point)).fetchall()
    except sqlite3.Error as e:
        raise LoadError(f"{e} (loading {extension_path()})") from e
    finally:
        enable(False)


def _load_apsw(conn: Any, entry_point: str) -> None:
    import apsw  # type: ignore[import-not-found,unused-ignore]  # only with an apsw.Connection

    def method(name: str) -> Any:  # apsw 3.43 renamed enableloadextension & co.
        found = getattr(conn, name, None)
        return found if found is not None else getattr(conn, name.replace("_", ""))

    method("enable_load_extension")(True)
    try:
        method("load_extension")(extension_path(), entry_point)
    except apsw.Error as e:
        raise LoadError(f"{e} (loading {extension_path()})") from e
    finally:
        method("enable_load_extension")(False)


#: The environment variable the extension reads at load for what reaches stderr.
LOG_ENV = "HERMES_GUARD_LOG"
_LOG_SETTINGS = ("off", "quiet", "error", "warn", "warning", "verbose", "info", "debug")


def _set_log(log: Optional[str]) -> None:
    """`log` (when given) as HERMES_GUARD_LOG for the load that follows."""
    if log is None:
        return
    if log not in _LOG_SETTINGS:
        raise ValueError(
            f"hermes_guard: log must be one of {', '.join(_LOG_SETTINGS)} (or None: "
            f"{LOG_ENV} or the default, warn), not {log!r}"
        )
    os.environ[LOG_ENV] = log


def _bridge_events() -> None:
    from . import _events

    try:
        _events.start(extension_path())
    except (OSError, AttributeError) as e:  # an extension without the bridge: stderr only
        _events.LOGGER.debug("hermes-guard: no logging bridge: %s", e)


def load(conn: Any, log: Optional[str] = None) -> None:
    """Loads hermes-guard through `conn` (a `sqlite3.Connection` or an `apsw.Connection`).

    This registers the `hermes-guard` VFS for the whole process (it stays after `conn` closes)
    and adds the SQL functions `hermes_guard_status()`, `hermes_guard_capture()` and
    `hermes_guard_retry_pending()` to `conn` and to every connection opened afterwards.

    It does not guard `conn`'s own databases, which were opened before the VFS existed: a
    database is guarded when it is opened through the VFS, with :func:`connect`, with a
    `file:<path>?vfs=hermes-guard` URI, or after :func:`enable` for every open.

    Events (a capture, a heal, a refused generation) take one route each: the logger
    `hermes_guard` while the application has configured logging (a handler on that logger or on
    the root logger, as `logging.basicConfig` adds), else stderr, one line each — never both.
    `log` sets the level for whichever route is in use: `"off"` (neither), `"quiet"` (errors
    only), `"warn"` (the default), `"verbose"` (info), `"debug"`; the environment variable
    `HERMES_GUARD_LOG` when not given. The logger's own level filters further.

    Loading is switched on for the call and off again after it. Raises
    :class:`ExtensionLoadingUnavailable` on a Python whose `sqlite3` cannot load extensions and
    :class:`LoadError` when the host SQLite refuses the extension.
    """
    host = _host_of(conn)
    with _lock:
        _check_host(host)
        _set_log(log)
        if host == "sqlite3":
            _load_stdlib(conn, ENTRY_POINT)
        else:
            _load_apsw(conn, ENTRY_POINT)
        _loaded_into(host)
    _bridge_events()


def enable(log: Optional[str] = None) -> None:
    """Makes hermes-guard the default VFS of this process's standard-library `sqlite3`: every
    `sqlite3.connect()` after this call — the application's, its libraries', its ORM's — opens
    through the guard without naming it. Idempotent; call it once at start-up.

    The extension is loaded through a private in-memory connection, closed at once: the VFS stays
    registered for the life of the process (the extension returns `SQLITE_OK_LOAD_PERMANENTLY`).
    Connections opened before the call are not guarded. Events reach Python's `logging`
    or stderr, one route each, as with :func:`load` (`log`: the level, `"off"` for neither). Raises
    :class:`ExtensionLoadingUnavailable` when neither this Python's `sqlite3` module nor the
    SQLite library it runs on can load extensions. On a Python built without
    `--enable-loadable-sqlite-extensions` (pyenv's, python.org-style builds) whose `_sqlite3`
    links a shared libsqlite3, the guard is loaded through that library's C API.
    """
    global _default
    with _lock:
        if _default:
            return
        _check_host("sqlite3")
        _set_log(log)
        _load_private(DEFAULT_ENTRY_POINT)
        _default = True
    _bridge_events()


def _load_private(entry_point: str) -> None:
    """Loads into the stdlib's SQLite through a private in-memory connection, closed at once:
    the `sqlite3` module's own, or the library's C API where the module cannot load extensions."""
    if not hasattr(sqlite3.Connection, "enable_load_extension"):
        _load_through_library(entry_point)
        _loaded_into("sqlite3")
        return
    loader = sqlite3.connect(":memory:")
    try:
        _load_stdlib(loader, entry_point)
    finally:
        loader.close()
    _loaded_into("sqlite3")


def guarded_uri(path: Union[str, "os.PathLike[str]"]) -> str:
    """`file:<path>?vfs=hermes-guard`, with the path's bytes percent-encoded (any name, UTF-8 or
    not); open it with `uri=True`."""
    return "file:" + urllib.parse.quote(os.fsencode(path)) + "?vfs=" + VFS_NAME


def connect(path: Union[str, "os.PathLike[str]"], **kwargs: Any) -> sqlite3.Connection:
    """`sqlite3.connect(path, **kwargs)` through the guard, loading it first if needed (without
    making it the default VFS). Any keyword of `sqlite3.connect` may be given; `uri` is set."""
    with _lock:
        loaded = _host == "sqlite3"
        if not loaded:
            _check_host("sqlite3")
            _load_private(ENTRY_POINT)
    if not loaded:
        _bridge_events()
    kwargs["uri"] = True
    conn: sqlite3.Connection = sqlite3.connect(guarded_uri(path), **kwargs)
    return conn
