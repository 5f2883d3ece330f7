"""The package's helpers (`captures`, `Capture`, `verify`, `recover`) give the answers the
`hermes-guard` CLI gives for the same inputs: a path that does not exist (the CLI's exit code 2,
`BadInputError` here), rows still missing (exit 3, `Capture.missing`), a capture whose manifest
cannot be read (exit 1, `UnreadableCapturesError`, with how to open its two files). The CLI's
side alone is cli/tests/it/cli_answers.rs."""

import shutil
import sqlite3
import subprocess
import urllib.parse

import pytest

import hermes_guard
from helpers import (
    SENTINEL_PREFIX, count_like, insert, lose_sidecars, open_db, run_python, wal_only_sentinel,
)

HOW_TO_OPEN = "copy state.db and state.db-wal"

NEWER_GENERATION = """
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)   # stock: this child never enable()s
    conn.execute("PRAGMA journal_mode=WAL")
    for i in range(10):
        conn.execute("INSERT INTO messages (session, content) VALUES ('gw-1', ?)", (f"newer {i}",))
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
"""


def cli(*args):
    """The CLI the package carries: its exit code, stdout, stderr."""
    done = subprocess.run([hermes_guard.cli_path(), *map(str, args)], capture_output=True, text=True)
    return done.returncode, done.stdout, done.stderr


def lost_sentinel(tmp_path):
    """A database whose last row was committed only in a WAL that was unlinked, then a newer
    generation written by another process: the row is in the capture only. The database and
    the capture."""
    path = tmp_path / "state.db"
    conn = open_db(path)
    wal_only_sentinel(conn)
    lose_sidecars(path)
    with pytest.raises(sqlite3.OperationalError) as refused:
        insert(conn, "after the loss")
    assert hermes_guard.is_retired(refused.value)
    capture = hermes_guard.status(conn).capture
    run_python(NEWER_GENERATION, str(path))
    conn.close()
    return path, capture


def test_a_path_that_does_not_exist_raises_bad_input_where_the_cli_exits_2(tmp_path):
    path, _ = lost_sentinel(tmp_path)
    for given in (tmp_path / "stat.db", tmp_path / "no-such-dir" / "state.db"):
        calls = {
            "captures": lambda: hermes_guard.captures(given),
            "verify": lambda: hermes_guard.verify(given),
            "recover": lambda: hermes_guard.recover(given, path),
        }
        for command, call in calls.items():
            args = [command, given] + (["--into", path] if command == "recover" else [])
            code, out, err = cli(*args)
            assert (code, out) == (2, ""), (command, err)
            with pytest.raises(hermes_guard.BadInputError) as raised:
                call()
            said = err.splitlines()[0].removeprefix("hermes-guard: ")
            assert said in str(raised.value), (command, said, str(raised.value))
            assert "does not exist" in said
        with pytest.raises(hermes_guard.BadInputError, match="it does not exist"):
            hermes_guard.Capture(given)


def test_rows_still_missing_are_exit_3_in_the_cli_and_missing_in_python(tmp_path):
    path, capture = lost_sentinel(tmp_path)
    code, out, err = cli("captures", path)
    assert code == 3, out + err
    assert "1 row(s) are still missing" in out, out
    [listed] = hermes_guard.captures(path)
    assert listed.path == capture
    assert (listed.verified, listed.status, listed.missing) == (True, "verified", 1)

    assert hermes_guard.recover(capture, path, apply=True).inserted == 1
    assert cli("captures", path)[0] == 0
    [listed] = hermes_guard.captures(path)
    assert listed.missing == 0


def test_an_unreadable_capture_exits_1_in_the_cli_and_raises_in_python(tmp_path):
    path, capture = lost_sentinel(tmp_path)
    (tmp_path / capture / "manifest.json").unlink()

    code, out, err = cli("captures", path)
    assert code == 1, out + err
    assert "unreadable: " in out and HOW_TO_OPEN in out, out
    with pytest.raises(hermes_guard.UnreadableCapturesError) as raised:
        hermes_guard.captures(path)
    assert raised.value.captures == []
    [(where, why)] = raised.value.unreadable.items()
    assert where == capture and HOW_TO_OPEN in why, why
    assert HOW_TO_OPEN in str(raised.value)

    code, out, err = cli("verify", capture)
    assert code == 1 and HOW_TO_OPEN in out, out + err
    verified = hermes_guard.verify(capture)
    assert not verified.ok and HOW_TO_OPEN in verified.message, verified

    code, out, err = cli("recover", capture, "--into", path)
    assert code == 2 and HOW_TO_OPEN in err, out + err
    with pytest.raises(hermes_guard.BadInputError, match=HOW_TO_OPEN):
        hermes_guard.recover(capture, path)
    with pytest.raises(hermes_guard.CaptureFormatError, match=HOW_TO_OPEN):
        hermes_guard.Capture(capture)


def test_the_two_files_of_a_capture_without_its_manifest_hold_every_row(tmp_path):
    path, capture = lost_sentinel(tmp_path)
    (tmp_path / capture / "manifest.json").unlink()
    rows = tmp_path / "rows"
    rows.mkdir()
    for name in ("state.db", "state.db-wal"):
        shutil.copyfile(tmp_path / capture / name, rows / name)
    uri = "file:" + urllib.parse.quote(str(rows / "state.db")) + "?vfs=unix"
    copy = sqlite3.connect(uri, uri=True)
    try:
        assert count_like(copy, SENTINEL_PREFIX + "%") == 1
    finally:
        copy.close()
    live = open_db(path)
    try:
        assert count_like(live, SENTINEL_PREFIX + "%") == 0, "the row was only in the capture"
    finally:
        live.close()
