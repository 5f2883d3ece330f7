"""The guard's events in Python's `logging` (logger `hermes_guard`), or on stderr: one route
per event, never both.

The level (`enable(log=...)`/`load(log=...)`, else the environment variable `HERMES_GUARD_LOG`:
`off`, `quiet`, `warn` (the default), `verbose`, `debug`) applies to whichever route is in use;
`off` is neither. While the application has configured logging (a handler on the logger
`hermes_guard` or on one of its ancestors, the root logger included: `logging.basicConfig`), the
extension queues the events instead of printing them, and a daemon thread of this bridge waits for
them in the extension with the GIL released and hands them to the logger; while it has not, the
extension prints them on stderr itself, one line each. The route is looked at again every 0.2 s
and before each delivery (an event queued just before logging was unconfigured is printed on
stderr by this bridge). At exit an `atexit` hook gives stderr back to the extension and delivers
what is still queued: what happens after Python's own exit (the guard's last word on a generation
it could not capture) goes to stderr.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import sys
import threading
from typing import Optional

LOGGER = logging.getLogger("hermes_guard")

_LEVELS = {1: logging.ERROR, 2: logging.WARNING, 3: logging.INFO, 4: logging.DEBUG}
_CAP = 1 << 16

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None


def _next(lib: ctypes.CDLL, timeout_ms: int) -> Optional[tuple]:
    level = ctypes.c_int(0)
    buf = ctypes.create_string_buffer(_CAP)
    n = lib.hermes_guard_events_next(ctypes.byref(level), buf, _CAP, timeout_ms)
    if n <= 0:
        return None
    return _LEVELS.get(level.value, logging.WARNING), buf.value.decode("utf-8", "replace")


def _configured() -> bool:
    """Whether the application configured logging for the logger `hermes_guard`."""
    return LOGGER.hasHandlers()


def _route(lib: ctypes.CDLL) -> None:
    lib.hermes_guard_events_route(1 if _configured() else 0)


def _deliver(event: tuple) -> None:
    level, message = event
    if _configured():
        LOGGER.log(level, "%s", message)
    else:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()


def _drain(lib: ctypes.CDLL) -> None:
    while True:
        _route(lib)
        event = _next(lib, 200)
        if event is not None:
            _deliver(event)


def _flush() -> None:
    """Gives stderr back to the extension and delivers what is still queued (at exit)."""
    lib = _lib
    if lib is None:
        return
    lib.hermes_guard_events_route(0)
    while True:
        event = _next(lib, 0)
        if event is None:
            return
        _deliver(event)


def start(extension: str) -> None:
    """Attaches the bridge to the extension at `extension` (already loaded into this process's
    SQLite: the same library is found again), once."""
    global _lib
    with _lock:
        if _lib is not None:
            return
        lib = ctypes.CDLL(extension)
        lib.hermes_guard_events_next.argtypes = [
            ctypes.POINTER(ctypes.c_int),
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.c_int,
        ]
        lib.hermes_guard_events_next.restype = ctypes.c_int
        lib.hermes_guard_events_route.argtypes = [ctypes.c_int]
        lib.hermes_guard_events_route.restype = None
        lib.hermes_guard_events_attach()
        _route(lib)
        _lib = lib
        threading.Thread(target=_drain, args=(lib,), name="hermes-guard-events", daemon=True).start()
        atexit.register(_flush)
