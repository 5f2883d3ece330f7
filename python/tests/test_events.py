"""Every event reaches a Python user, once: with only `enable()`, a loss
prints on stderr where the rows are and the command that brings them back; with logging
configured, the same events reach the logger `hermes_guard` instead of stderr; `log=` sets the
level of whichever route is in use, `"off"` being neither."""

from helpers import run_python

LOSS = """
import logging, sys
import hermes_guard
from helpers import insert, lose_sidecars, open_db, wal_only_sentinel
if sys.argv[2] == "logging":
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
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
    # In a Python process the package's own call comes first.
    assert f'hermes_guard.recover("{capture}", "{db}", apply=True)' in captured[0], captured[0]


def test_with_logging_configured_the_events_reach_the_hermes_guard_logger(tmp_path):
    db = tmp_path / "state.db"
    done = run_python(LOSS, str(db), "logging", "default")
    capture = _capture_of(done.stdout)
    logged = [line for line in done.stderr.splitlines() if line.startswith("PYLOG hermes_guard ")]
    assert any("ERROR" in line and "is retired" in line for line in logged), done.stderr
    assert any("WARNING" in line and capture in line for line in logged), done.stderr


def _lines_with(text: str, stderr: str) -> list:
    return [line for line in stderr.splitlines() if text in line]


def test_with_logging_configured_each_refusal_and_capture_line_appears_exactly_once(tmp_path):
    db = tmp_path / "state.db"
    done = run_python(LOSS, str(db), "logging", "default")
    for text in ("is retired for this connection", "captured the retired generation"):
        lines = _lines_with(text, done.stderr)
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith("PYLOG hermes_guard "), lines[0]


def test_quiet_keeps_warnings_off_stderr_and_errors_on_it(tmp_path):
    db = tmp_path / "state.db"
    done = run_python(LOSS, str(db), "plain", "quiet")
    assert "captured the retired generation" not in done.stderr, done.stderr
    assert "is retired for this connection" in done.stderr, done.stderr


def test_quiet_sets_the_level_of_the_logging_route_too(tmp_path):
    db = tmp_path / "state.db"
    done = run_python(LOSS, str(db), "logging", "quiet")
    assert not _lines_with("captured the retired generation", done.stderr), done.stderr
    [refusal] = _lines_with("is retired for this connection", done.stderr)
    assert refusal.startswith("PYLOG hermes_guard ERROR "), refusal


def test_off_says_nothing_on_either_route(tmp_path):
    for mode in ("plain", "logging"):
        db = tmp_path / mode / "state.db"
        db.parent.mkdir()
        done = run_python(LOSS, str(db), mode, "off")
        assert "hermes-guard:" not in done.stderr, done.stderr
