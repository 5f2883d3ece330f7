"""SQLite's WAL-reset race (3.7.0-3.51.2), kept clear of by the guard in whatever host SQLite the
extension is loaded into: the rule is on by default exactly where the host has the race, and a
checkpoint lock held elsewhere (another process's checkpoint) defers a WAL reset, the commit
appending instead. The forced race itself is in cli/tests/it/wal_reset.rs (a pausing VFS), run on
the system SQLite and on SQLite 3.50.2 by tests/system-sqlite.sh."""

import fcntl
import os
import struct

import harness
from harness import open_guarded, status


def version_number(version: str) -> int:
    major, minor, patch = (int(p) for p in version.split(".")[:3])
    return major * 1_000_000 + minor * 1_000 + patch


def has_the_race(v: int) -> bool:
    fixed_backport = 3_050_007 <= v < 3_051_000 or 3_044_006 <= v < 3_045_000
    return 3_007_000 <= v < 3_051_003 and not fixed_backport


def ofd_lock(fd: int, byte: int, kind: int) -> None:
    """fcntl(F_OFD_SETLK) of one byte: conflicts with SQLite's own locks even in this process,
    as another process's lock would. struct flock: l_type, l_whence, l_start, l_len, l_pid."""
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqixxxx", kind, os.SEEK_SET, byte, 1, 0))


def test_the_rule_is_on_by_default_exactly_where_the_host_has_the_race(tmp_path):
    conn = open_guarded(tmp_path / "state.db")
    try:
        expected = "on" if has_the_race(version_number(harness.sqlite_version())) else "off"
        assert status(conn)["wal_reset_guard"] == expected
    finally:
        conn.close()


def test_a_checkpoint_lock_held_elsewhere_defers_the_wal_reset(tmp_path):
    conn = open_guarded(tmp_path / "state.db")
    try:
        assert conn.execute("PRAGMA hermes_guard_wal_reset_guard=on").fetchone()[0] == "on"
        conn.execute("PRAGMA wal_autocheckpoint=0").fetchall()
        harness.insert(conn, "before the checkpoint")
        busy, log, done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        assert (busy, log) == (0, done)
        shm = os.open(tmp_path / "state.db-shm", os.O_RDWR)
        try:
            ofd_lock(shm, 121, fcntl.F_WRLCK)  # the checkpoint lock's byte of the -shm
            harness.insert(conn, "while a checkpoint runs elsewhere")
            after = status(conn)
            assert (after["wal_resets_deferred"], after["wal_resets_guarded"]) == (1, 0)
            ofd_lock(shm, 121, fcntl.F_UNLCK)
        finally:
            os.close(shm)
        busy, log, done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        assert (busy, log) == (0, done)
        harness.insert(conn, "after it")
        assert status(conn)["wal_resets_guarded"] == 1
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 3
    finally:
        conn.close()
