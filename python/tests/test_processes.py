"""Several processes on one database, each guarded by `hermes_guard.enable()` and plain
`sqlite3.connect()`: a writer, a reader and forked workers; and the stray close of the lock-shield
tests (cli/tests/it/lock_shield.rs), where another process's close must not delete the WAL a
guarded writer still uses."""

import json
import os
import sqlite3

import pytest

import hermes_guard
from helpers import (
    Child, capture_dirs, count_like, insert, integrity_ok, lose_sidecars, open_db, run_python,
    sidecar,
)

# A writer or a reader in its own process: `write <n>`, `count`, `close`.
PEER = """
    import json, sqlite3, sys
    import hermes_guard
    from helpers import count_like, insert, open_db

    def emit(event, **fields):
        print(json.dumps({"event": event, **fields}), flush=True)

    hermes_guard.enable()
    name = sys.argv[2]
    conn = open_db(sys.argv[1])
    emit("ready", guarded=not hermes_guard.status(conn).retired)
    for line in sys.stdin:
        command, *args = line.split()
        if command == "write":
            done, refused, kinds = 0, 0, set()
            for i in range(int(args[0])):
                try:
                    insert(conn, f"{name} {args[1]} {i}", session=name)
                    done += 1
                except sqlite3.OperationalError as e:
                    refused += hermes_guard.is_retired(e)
                    kinds.add(hermes_guard.classify(conn, e).value)
            guard = hermes_guard.status(conn)
            emit("write", done=done, refused=refused, kinds=sorted(kinds),
                 capture=str(guard.capture) if guard.capture else None)
        elif command == "count":
            emit("count", rows=conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0],
                 retired=hermes_guard.status(conn).retired)
        elif command == "close":
            hermes_guard.close(conn)
            emit("closed")
"""


def fork_worker(path, tag: str, rows: int) -> dict:
    """A worker forked from this (guarded) process opens its own connection, writes `rows` rows
    and exits; its report comes back through a pipe."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running the parent's pytest machinery
        code = 1
        try:
            os.close(read_end)
            conn = open_db(path)
            for i in range(rows):
                insert(conn, f"{tag} {i}", session=tag)
            guard = hermes_guard.status(conn)
            report = {"guarded": guard.wal is not None, "retired": guard.retired,
                      "shield": guard.shield_active}
            hermes_guard.close(conn)
            os.write(write_end, json.dumps(report).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"forked worker failed: {status}"
    return json.loads(data)


def test_a_writer_a_reader_and_forked_workers_share_one_database(tmp_path):
    # This process holds no connection to the database while it forks: a child must not inherit
    # the unix VFS's per-inode state of an open database (SQLite's own rule for fork).
    path = tmp_path / "state.db"
    writer = Child(PEER, str(path), "writer")
    reader = None
    try:
        # The writer creates the database in WAL mode first: two processes switching a fresh file
        # to WAL at once can time out on each other's SHARED lock, with or without the guard.
        assert writer.next_event("ready")["guarded"]
        reader = Child(PEER, str(path), "reader")
        assert reader.next_event("ready")["guarded"]
        assert writer.ask("write 30 before", "write")["done"] == 30
        assert fork_worker(path, "worker-1", 10) == {"guarded": True, "retired": False, "shield": True}
        assert reader.ask("count", "count") == {"event": "count", "rows": 40, "retired": False}

        # A cleanup script takes the sidecars away under all of them.
        lose_sidecars(path)
        refused = writer.ask("write 3 after", "write")
        assert refused["done"] == 0 and refused["refused"] == 3 and refused["kinds"] == ["wal-lost"]
        assert refused["capture"] is not None
        # The reader still reads what it saw; its generation is retired too.
        assert reader.ask("count", "count") == {"event": "count", "rows": 40, "retired": True}
        assert reader.ask("write 1 late", "write")["kinds"] == ["wal-lost"]

        # A worker forked after the loss opens the database anew: a new generation, accepted.
        assert fork_worker(path, "worker-2", 5) == {"guarded": True, "retired": False, "shield": True}

        for child in (writer, reader):
            child.ask("close", "closed")
            assert child.finish() == 0
    finally:
        writer.kill()
        if reader is not None:
            reader.kill()

    # Every process that retired the generation shares one capture of it.
    [capture_dir] = capture_dirs(tmp_path)
    assert str(capture_dir) == refused["capture"]
    capture = hermes_guard.Capture(capture_dir)
    assert hermes_guard.verify(capture.path).ok
    copy = capture.open_copy(tmp_path / "copy")
    try:
        assert count_like(copy, "%") == 40
    finally:
        copy.close()

    live = open_db(path)
    try:
        assert count_like(live, "worker-2 %") == 5
        assert count_like(live, "writer %") == 0  # the retired generation's rows are not live
        assert integrity_ok(live)
    finally:
        live.close()
    merged = capture.recover(path, apply=True)
    assert merged.inserted == 40
    live = open_db(path)
    try:
        assert count_like(live, "%") == 45 and integrity_ok(live)
    finally:
        live.close()


# ── The stray close (the lock shield's sequence, cli/tests/it/lock_shield.rs) ───────────────────
#
# Writer A (this process) has five rows only in its WAL. Something else in A's process opens and
# closes the database file, which drops every POSIX lock A's process holds on it. Peer B (another
# process, stock sqlite3, no hermes_guard) writes a row and closes: believing it is the last
# connection, it checkpoints and deletes the WAL — unless the guard's lock shield keeps A visible.

STOCK_PEER = """
    import sqlite3, sys
    db, n, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    c = sqlite3.connect(db, isolation_level=None, timeout=10)
    for i in range(n):
        c.execute("INSERT INTO messages (session, content) VALUES (?, ?)", (tag, f"{tag} {i}"))
    c.close()
"""


def stray_close_scenario(tmp_path, guarded: bool) -> dict:
    path = tmp_path / "state.db"
    a = open_db(path, stock=not guarded)
    a.execute("PRAGMA wal_autocheckpoint=0")
    for i in range(20):
        insert(a, f"history {i}")
    a.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    a.execute("PRAGMA wal_autocheckpoint=1000")
    committed = 20
    for i in range(5):
        insert(a, f"A only in the WAL {i}")
        committed += 1
    if guarded:
        guard = hermes_guard.status(a)
        assert guard.shield_active and guard.shield_shm_active, guard

    open(path, "rb").close()  # the stray close
    run_python(STOCK_PEER, str(path), "1", "B")
    committed += 1
    wal_kept_through_b = sidecar(path, "-wal").exists()
    failures = 0
    for label in ("A after B", "C", "A after C"):
        if label == "C":
            run_python(STOCK_PEER, str(path), "20", "C")
            committed += 20
            continue
        for i in range(5):
            try:
                insert(a, f"{label} {i}")
                committed += 1
            except sqlite3.Error:
                failures += 1
    if guarded:
        hermes_guard.close(a)
    else:
        a.close()
    check = open_db(path, stock=True)
    try:
        present = check.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
        ok = integrity_ok(check)
    except sqlite3.DatabaseError:
        present, ok = None, False
    finally:
        check.close()
    return {"committed": committed, "present": present, "integrity_ok": ok,
            "wal_kept_through_b": wal_kept_through_b, "a_failures": failures,
            "captures": len(capture_dirs(tmp_path))}


def test_a_stray_close_in_the_writers_process_costs_nothing_with_the_guard(tmp_path):
    outcome = stray_close_scenario(tmp_path, guarded=True)
    assert outcome == {"committed": 56, "present": 56, "integrity_ok": True,
                       "wal_kept_through_b": True, "a_failures": 0, "captures": 0}


def test_the_same_stray_close_loses_rows_without_the_guard(tmp_path):
    """The control: through the stock unix VFS the same sequence loses rows (or the database), so
    the test above cannot pass without testing anything."""
    outcome = stray_close_scenario(tmp_path, guarded=False)
    assert not outcome["wal_kept_through_b"], (
        f"SQLite {sqlite3.sqlite_version}'s peer did not delete the WAL: the scenario no longer "
        f"reproduces the loss here"
    )
    assert outcome["present"] != outcome["committed"] or not outcome["integrity_ok"], outcome
