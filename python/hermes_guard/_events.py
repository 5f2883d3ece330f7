"""The guard's events in Python's `logging` (logger `hermes_guard`).

The extension writes every WARN and ERROR event to stderr itself, one line each (the environment
variable `HERMES_GUARD_LOG`, or `enable(log=...)`, chooses: `off`, `quiet`, `warn`, `verbose`,
`debug`). Once it is loaded, this bridge also hands the same events to the logger
`hermes_guard` whenever the application configured logging (the logger or one of its ancestors
has a handler): a daemon thread waits for them in the extension with the GIL released, and the
events still queued at exit are delivered by an `atexit` hook.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
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


def _deliver(event: tuple) -> None:
    level, message = event
    if LOGGER.hasHandlers():
        LOGGER.log(level, "%s", message)


def _drain(lib: ctypes.CDLL) -> None:
    while True:
        event = _next(lib, 500)
        if event is not None:
            _deliver(event)


def _flush() -> None:
    """Delivers what is still queued (at exit)."""
    lib = _lib
    if lib is None:
        return
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
        lib.hermes_guard_events_attach()
        _lib = lib
        threading.Thread(target=_drain, args=(lib,), name="hermes-guard-events", daemon=True).start()
        atexit.register(_flush)
