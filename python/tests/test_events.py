"""Every event reaches a Python user (issue 30): with only `enable()`, a loss prints on stderr
where the rows are and the command that brings them back; with logging configured, the same
events reach the logger `hermes_guard`; `log="quiet"` keeps the warnings off stderr."""

from helpers import run_python

LOSS = """
import logging, sys
import hermes_guard
from helpers import insert, lose_sidecars, open_db, wal_only_sentinel
if sys.argv[2] == "logging":
    logging.basicConfig(stream=sys.stdout, level=logging.INFO,
                        format="PYLOG %(name)s %(levelname)s %(message)s")
hermes_guard.enable(log=None if sys.argv[3] == "default" else sys.argv[3])
conn = open_db(sys.argv[1])
wal_only_sentinel(conn)
lose_sidecars(__import__("pathlib").Path(sys.argv[1]))
try:
    insert(conn, "after the loss")
except Exception as e:
    print("REFUSED", e)
[capture] = hermes_guard.captures(sys.argv[1])
print("CAPTURE", capture.path)
conn.close()
"""


def _capture_of(stdout: str) -> str:
    return next(line.split(" ", 1)[1] for line in stdout.splitlines() if line.startswith("CAPTURE "))


def test_a_loss_with_only_enable_prints_the_capture_and_the_next_command_on_stderr(tmp_path):
    db = tmp_path / "state.db"
    done = run_python(LOSS, str(db), "plain", "default")
    capture = _capture_of(done.stdout)
    assert "is retired for this connection" in done.stderr, done.stderr
    captured = [line for line in done.stderr.splitlines() if "captured the retired generation" in line]
    assert captured, done.stderr
    assert capture in captured[0], captured[0]
    assert f"hermes-guard recover {capture} --into {db} --apply" in captured[0], captured[0]


def test_with_logging_configured_the_events_reach_the_hermes_guard_logger(tmp_path):
    db = tmp_path / "state.db"
    done = run_python(LOSS, str(db), "logging", "default")
    capture = _capture_of(done.stdout)
    logged = [line for line in done.stdout.splitlines() if line.startswith("PYLOG hermes_guard ")]
    assert any("ERROR" in line and "is retired" in line for line in logged), done.stdout
    assert any("WARNING" in line and capture in line for line in logged), done.stdout


def test_quiet_keeps_warnings_off_stderr_and_errors_on_it(tmp_path):
    db = tmp_path / "state.db"
    done = run_python(LOSS, str(db), "plain", "quiet")
    assert "captured the retired generation" not in done.stderr, done.stderr
    assert "is retired for this connection" in done.stderr, done.stderr
