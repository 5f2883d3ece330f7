"""The stale-WAL rule through the loadable extension: a writer process (the extension loaded) is
killed with committed frames in its WAL, an older copy of the database is restored over the file,
and the next open through the guard gives exactly the restored rows, with the stale WAL set aside in
a capture of reason `stale-wal`; the strict mode (HERMES_GUARD_STALE_WAL=refuse) refuses the open
and moves nothing; a crash without a restore replays as always."""

import shutil
from pathlib import Path

import pytest

import harness
from harness import artifacts, insert, integrity_ok, open_guarded, sidecar, status
from test_retired_wal_generation_capture import GatewayWriter

RESTORED = 5
WAL_ROWS = 300


def count(conn) -> int:
    return conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]


def seed(tmp_path: Path):
    path = tmp_path / "state.db"
    conn = open_guarded(path)
    for i in range(RESTORED):
        insert(conn, f"restored {i}")
    conn.close()
    assert not sidecar(path, "-wal").exists()
    backup = tmp_path / "backup.db"
    shutil.copyfile(path, backup)
    return path, backup


def killed_writer(path: Path) -> int:
    writer = GatewayWriter(path, WAL_ROWS)
    writer.next_event("ready")
    writer.proc.kill()
    writer.proc.wait()
    writer.proc.stdin.close()
    writer.proc.stdout.close()
    writer.proc.stderr.close()
    return RESTORED + 20 + WAL_ROWS


def test_a_restore_over_a_crashed_writers_database_is_opened_as_restored(tmp_path):
    path, backup = seed(tmp_path)
    killed_writer(path)
    wal = sidecar(path, "-wal").read_bytes()
    shutil.copyfile(backup, path)  # the operator's restore, in place

    conn = open_guarded(path)
    assert count(conn) == RESTORED
    assert integrity_ok(conn)
    stale = status(conn)["stale_wal"]
    assert stale["action"] == "set-aside"
    capture = Path(stale["capture"])
    conn.close()
    assert artifacts(tmp_path) == [capture]
    assert (capture / "state.db-wal").read_bytes() == wal
    found = harness.manifest(capture)
    assert found["reason"] == "stale-wal" and found["trigger"] == "open"
    assert found["main"]["mode"] == "absent"


def test_the_strict_mode_refuses_the_open_and_moves_nothing(tmp_path, monkeypatch):
    path, backup = seed(tmp_path)
    killed_writer(path)
    wal = sidecar(path, "-wal").read_bytes()
    shutil.copyfile(backup, path)
    monkeypatch.setenv("HERMES_GUARD_STALE_WAL", "refuse")

    conn = harness.connect(harness.guarded_uri(path), uri=True)
    with pytest.raises(harness.Error) as refused:
        conn.execute("SELECT COUNT(*) FROM messages").fetchall()
    assert harness.extended_code(refused.value) == 1294, refused.value  # SQLITE_CANTOPEN_DIRTYWAL
    conn.close()
    assert sidecar(path, "-wal").read_bytes() == wal
    assert artifacts(tmp_path) == []


def test_a_crash_without_a_restore_replays_as_always(tmp_path):
    path, _ = seed(tmp_path)
    rows = killed_writer(path)
    conn = open_guarded(path)
    assert count(conn) == rows
    assert integrity_ok(conn)
    assert status(conn).get("stale_wal") is None
    conn.close()
    assert artifacts(tmp_path) == []
