"""A stale WAL set aside at open from Python: the capture holds the WAL and no main
image (`main.mode` `absent`); `Capture` says so, checks the WAL alone, refuses to open a copy it
cannot make, and `recover(..., main=<the file the WAL was written on>)` brings the dead
generation's rows back."""

import shutil

import pytest

import hermes_guard
from helpers import Child, count_like, insert, open_db, sidecar

WRITER = """
import json
import sys

import hermes_guard
from helpers import insert, open_db

hermes_guard.enable()
conn = open_db(sys.argv[1])
conn.execute("PRAGMA wal_autocheckpoint=0")
for i in range(20):
    insert(conn, f"history {i}")
conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
for i in range(30):
    insert(conn, f"dead generation {i}")
print(json.dumps({"event": "ready"}), flush=True)
sys.stdin.read()
"""


def test_a_stale_wal_capture_has_no_image_and_recovers_with_the_file_it_was_written_on(tmp_path):
    path = tmp_path / "state.db"
    seed = open_db(path)
    insert(seed, "restored 0")
    seed.close()
    backup = tmp_path / "backup.db"
    shutil.copyfile(path, backup)

    writer = Child(WRITER, str(path))
    writer.next_event("ready")
    writer.kill()  # SIGKILL: committed frames stay in the WAL
    assert sidecar(path, "-wal").stat().st_size > 0
    written_on = tmp_path / "before-the-restore.db"
    shutil.copyfile(path, written_on)
    shutil.copyfile(backup, path)  # the operator's restore, in place

    conn = open_db(path)
    assert count_like(conn, "%") == 1, "opened as restored"
    stale = hermes_guard.status(conn).stale_wal
    assert stale is not None and stale["action"] == "set-aside", stale
    capture = hermes_guard.Capture(stale["capture"])
    conn.close()

    assert not capture.has_main_image
    assert capture.files_match()
    with pytest.raises(hermes_guard.CaptureFormatError, match="no main image"):
        capture.open_copy(tmp_path / "copy")
    merged = capture.recover(path, apply=True, main=written_on)
    assert merged.exit_code == 0, merged.report
    live = open_db(path)
    try:
        assert count_like(live, "dead generation %") == 30
        assert count_like(live, "restored %") == 1
    finally:
        live.close()
