"""The seed scenarios (shared/seeds/test_retired_wal_generation_capture.py) on plain `sqlite3`
after `hermes_guard.enable()`: the sidecars are lost for real; the next write is refused; the
exact retired generation is captured next to the database (at the halt, or at close), located by
inode and described by its manifest; a transaction committed only in the retired WAL is
recoverable from the capture alone, also after the writer process has exited."""

import hashlib
import sqlite3
from pathlib import Path

import pytest

import hermes_guard
from helpers import (
    Child, capture_dirs, count_like, descriptor_contents, descriptor_for, identity_of, insert,
    integrity_ok, lose_sidecars, open_db, sidecar, wal_only_sentinel,
)


@pytest.mark.parametrize("rename", [False, True], ids=["unlink", "rename"])
def test_halt_captures_the_exact_retired_generation(tmp_path, rename):
    path = tmp_path / "state.db"
    conn = open_db(path)
    sentinel = wal_only_sentinel(conn)
    guard = hermes_guard.status(conn)
    assert not guard.retired and guard.wal is not None
    identity = guard.wal
    lose_sidecars(path, rename=rename)
    original = descriptor_contents(descriptor_for(identity))

    with pytest.raises(sqlite3.OperationalError) as refused:
        insert(conn, "after the loss")
    assert refused.value.sqlite_errorcode == hermes_guard.READONLY_DBMOVED
    assert hermes_guard.is_retired(refused.value)
    assert hermes_guard.classify(conn, refused.value) is hermes_guard.WalLost

    guard = hermes_guard.status(conn)
    assert guard.retired and guard.reason is hermes_guard.RetireReason.WAL_LOST
    assert guard.refusals == 1
    assert guard.capture is not None and guard.capture.parent == tmp_path
    capture = hermes_guard.Capture(guard.capture)
    assert capture.trigger == "halt" and capture.reason is hermes_guard.RetireReason.WAL_LOST
    assert capture.database == str(path)
    assert capture.wal.identity == identity
    captured = capture.wal_file.read_bytes()
    assert captured == original and captured
    assert capture.wal.sha256 == hashlib.sha256(captured).hexdigest()
    assert capture.main.mode == "copied" and capture.main.header["valid"]
    assert capture.main_file.stat().st_size == capture.main.bytes
    assert capture.files_match()
    assert [c.path for c in hermes_guard.captures(path)] == [capture.path]

    recovered = capture.open_copy(tmp_path / "recovered")
    try:
        assert count_like(recovered, sentinel) == 1
        assert integrity_ok(recovered)
    finally:
        recovered.close()

    # Reads of what the connection already sees go on working.
    assert count_like(conn, sentinel) == 1
    conn.close()
    assert capture_dirs(tmp_path) == [capture.path]  # captured once, not again at close


def test_close_captures_when_the_loss_is_first_seen_at_close(tmp_path):
    path = tmp_path / "state.db"
    conn = open_db(path)
    sentinel = wal_only_sentinel(conn)
    lose_sidecars(path)

    conn.close()  # no write in between: the close itself notices the loss and captures

    [capture] = hermes_guard.captures(path)
    assert capture.trigger == "close"
    recovered = capture.open_copy(tmp_path / "recovered")
    try:
        assert count_like(recovered, sentinel) == 1
        assert integrity_ok(recovered)
    finally:
        recovered.close()


def test_close_helper_captures_first_and_reports_where(tmp_path):
    path = tmp_path / "state.db"
    conn = open_db(path)
    wal_only_sentinel(conn)
    lose_sidecars(path)
    captured = hermes_guard.ensure_captured(conn)
    assert captured.retired and captured.capture is not None
    hermes_guard.close(conn)
    assert capture_dirs(tmp_path) == [captured.capture]
    assert hermes_guard.Capture(captured.capture).trigger == "close"


def test_capture_selects_the_recorded_inode_not_the_pathname(tmp_path):
    """A second deleted WAL under the same pathname belongs to another owner: it must be neither
    captured as ours nor touched."""
    path = tmp_path / "state.db"
    wal = sidecar(path, "-wal")
    conn = open_db(path)
    sentinel = wal_only_sentinel(conn)
    identity = hermes_guard.status(conn).wal
    lose_sidecars(path)
    original = descriptor_contents(descriptor_for(identity))

    other_path = tmp_path / "other.db"
    other = open_db(other_path, stock=True)
    try:
        insert(other, "another owner committed this")
        sidecar(other_path, "-wal").rename(wal)  # same pathname as our lost WAL
        other_identity = identity_of(wal)
        wal.unlink()
        assert other_identity != identity
        other_before = descriptor_contents(descriptor_for(other_identity))

        with pytest.raises(sqlite3.OperationalError) as refused:
            insert(conn, "after the loss")
        assert hermes_guard.is_retired(refused.value)

        capture = hermes_guard.Capture(hermes_guard.status(conn).capture)
        assert capture.wal_file.read_bytes() == original
        assert capture.wal.identity == identity
        assert descriptor_contents(descriptor_for(other_identity)) == other_before
        recovered = capture.open_copy(tmp_path / "recovered")
        try:
            assert count_like(recovered, sentinel) == 1
        finally:
            recovered.close()
        conn.close()
        assert descriptor_contents(descriptor_for(other_identity)) == other_before
    finally:
        other.close()


# ── Recoverable after the writer process has exited ─────────────────────────────────────────────
#
# The gateway writer runs in its own Python process, which calls hermes_guard.enable() and then
# only plain sqlite3.connect(). It seeds and checkpoints history, leaves 4 rows only in its WAL,
# and serves commands. This process takes its sidecars away, drives one refused write (halt +
# capture), writes and checkpoints a newer generation at the path, then has the writer close and
# exit. The retired rows must come back from the capture alone, and the newer generation stay.

GATEWAY_WRITER = """
    import json, sqlite3, sys
    import hermes_guard
    from helpers import insert, open_db

    def emit(event, **fields):
        print(json.dumps({"event": event, **fields}), flush=True)

    hermes_guard.enable()
    conn = open_db(sys.argv[1])
    conn.execute("PRAGMA wal_autocheckpoint=0")
    for i in range(20):
        insert(conn, f"history {i}")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    for i in range(4):
        insert(conn, f"uncheckpointed {i}")
    emit("ready", wal=hermes_guard.status(conn).wal)
    for line in sys.stdin:
        command = line.strip()
        if command == "write":
            try:
                insert(conn, "after the loss")
                emit("write", refused=False, capture=None)
            except sqlite3.OperationalError as e:
                capture = hermes_guard.status(conn).capture
                emit("write", refused=hermes_guard.is_retired(e),
                     kind=hermes_guard.classify(conn, e).value, capture=str(capture))
        elif command == "close":
            hermes_guard.close(conn)
            emit("closed")
"""


def write_second_generation(path: Path, n_rows: int) -> int:
    """This process writes and checkpoints a newer generation at the path (through the guard:
    it is a new connection, on the new files)."""
    conn = open_db(path)
    try:
        conn.execute("BEGIN")
        for i in range(n_rows):
            insert(conn, f"second generation {i}")
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        assert not hermes_guard.status(conn).retired
        return conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
    finally:
        conn.close()


@pytest.mark.parametrize("rename", [False, True], ids=["unlink", "rename"])
def test_retired_rows_recoverable_after_the_writer_process_exits(tmp_path, rename):
    path = tmp_path / "state.db"
    writer = Child(GATEWAY_WRITER, str(path))
    try:
        writer.next_event("ready")
        lose_sidecars(path, rename=rename)
        refused = writer.ask("write", "write")
        assert refused["refused"] is True and refused["kind"] == "wal-lost", refused
        capture = hermes_guard.Capture(refused["capture"])
        assert capture.trigger == "halt"

        expected = write_second_generation(path, n_rows=400)

        writer.ask("close", "closed")
        assert writer.finish() == 0
    finally:
        writer.kill()

    # The writer is gone, and its unlinked WAL inode with it: only the capture holds the rows.
    recovered = capture.open_copy(tmp_path / "recovered")
    try:
        assert count_like(recovered, "uncheckpointed %") == 4, "retired WAL-only rows lost across exit"
        assert integrity_ok(recovered), "captured image + WAL do not form a consistent database"
    finally:
        recovered.close()
    assert hermes_guard.verify(capture.path).ok

    # The writer's close neither checkpointed its stale frames over the newer generation nor
    # deleted the newer generation's files.
    live = open_db(path)
    try:
        assert integrity_ok(live)
        assert live.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == expected
        assert count_like(live, "second generation %") == 400
        assert count_like(live, "uncheckpointed %") == 0
    finally:
        live.close()

    # The operator's step, from Python: the plan, then the merge, then nothing left to do.
    plan = hermes_guard.recover(capture.path, path)
    assert plan.exit_code == 0 and plan.missing == 4 and not plan.applied
    merged = capture.recover(path, apply=True)
    assert merged.exit_code == 0 and merged.inserted == 4 and merged.applied
    assert hermes_guard.recover(capture.path, path).exit_code == 0
    live = open_db(path)
    try:
        assert count_like(live, "uncheckpointed %") == 4
        assert integrity_ok(live)
    finally:
        live.close()


# ── A capture that cannot be written ────────────────────────────────────────────────────────────
#
# The seed's "close refuses to settle without a capture", with a real failure: the child lowers
# its file-size limit to 1 KiB (as a full disk would), so the capture cannot be written.

CAPTURE_FAILS = """
    import json, resource, signal, sqlite3, sys
    from pathlib import Path
    import hermes_guard
    from helpers import lose_sidecars, open_db, wal_only_sentinel

    path = Path(sys.argv[1]) / "state.db"
    hermes_guard.enable()
    conn = open_db(path)
    sentinel = wal_only_sentinel(conn)
    lose_sidecars(path)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, hard))
    try:
        hermes_guard.close(conn)
        refused = None
    except hermes_guard.CaptureFailedError as e:
        refused = str(e)
    still_open = conn.execute("SELECT count(*) FROM messages").fetchone()[0]
    after_failure = hermes_guard.status(conn)
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    hermes_guard.close(conn)
    print(json.dumps({"sentinel": sentinel, "refused": refused, "still_open": still_open,
                      "capture_error": after_failure.capture_error,
                      "captured_then": after_failure.capture is not None}))
"""


def test_close_refuses_to_settle_without_a_capture(tmp_path):
    from helpers import last_json, run_python

    probe = last_json(run_python(CAPTURE_FAILS, str(tmp_path)))
    assert probe["refused"] is not None and "File too large" in probe["refused"], probe
    assert probe["still_open"] == 21, "the connection stays open after the refused close"
    assert "File too large" in probe["capture_error"] and not probe["captured_then"]
    [capture] = hermes_guard.captures(tmp_path / "state.db")
    assert capture.trigger == "close" and capture.files_match()
    recovered = capture.open_copy(tmp_path / "recovered")
    try:
        assert count_like(recovered, probe["sentinel"]) == 1
    finally:
        recovered.close()
