"""The guard's last word at a Python process's exit: each retired generation the
process still holds uncaptured gets one last capture attempt after Python's own exit, and each
that fails its own ERROR line — none dropped because another was captured or failed first, no
panic; a forked child that exits says and does nothing about the generations its parent holds.

The capture is made to fail as a full disk would, without one: the process writes its databases
as root, then drops its effective uid to `nobody`, which can write neither beside them (the
test's root-only directory) nor in a fallback directory (`HOME=/nonexistent`); it "frees the
space" by taking its root uid back. The loss is seen (`status`) while the process is still root;
as `nobody` the close can neither capture nor heal the generation into the live file (its staging
file beside the database cannot be written), so the generation is held.
"""

import os
import re

import pytest

from helpers import capture_dirs, run_python

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="dropping to the user nobody needs root")

NOBODY = 65534

# argv: directory, "space" (root again before the exit) or "full", the database names.
COMMON = """
import os, sys
from pathlib import Path
import hermes_guard
from helpers import lose_sidecars, open_db, wal_only_sentinel

hermes_guard.enable()
directory = Path(sys.argv[1])
conns = []
for name in sys.argv[3:]:
    path = directory / name
    conn = open_db(path)
    wal_only_sentinel(conn)
    lose_sidecars(path)
    assert hermes_guard.status(conn).retired
    conns.append(conn)
os.seteuid(%d)
for conn in conns:
    conn.close()
""" % NOBODY

TWO_HELD = COMMON + """
assert hermes_guard.retry_pending_captures() == len(conns)
if sys.argv[2] == "space":
    os.seteuid(0)
print("EXITING", file=sys.stderr, flush=True)
sys.exit(0)
"""

FORKED = COMMON + """
if sys.argv[2] == "space":
    os.seteuid(0)
pid = os.fork()
if pid == 0:
    print("CHILD EXITING", file=sys.stderr, flush=True)
    sys.exit(0)
_, status = os.waitpid(pid, 0)
print("CHILD GONE", status, file=sys.stderr, flush=True)
os.seteuid(0)
print("CAPTURES BEFORE", len([p for p in directory.iterdir() if ".retired-wal-" in p.name]))
print("LEFT", hermes_guard.retry_pending_captures())
"""

# No fallback capture directory: the per-user default is under $HOME (and no $XDG_STATE_HOME, no
# orphan directory: see _env_without_state_dirs).
ENV = {"HOME": "/nonexistent"}

LOST = "is exiting with the retired generation of"


def _run(code: str, tmp_path, mode: str, *names: str):
    directory = tmp_path / "data"
    directory.mkdir(mode=0o700)
    done = run_python(code, str(directory), mode, *names, env=ENV, check=False)
    return directory, done


def _env_without_state_dirs(monkeypatch):
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.delenv("HERMES_GUARD_ORPHAN_CAPTURE_DIR", raising=False)


def test_two_held_generations_are_both_captured_at_exit_once_there_is_space(tmp_path, monkeypatch):
    _env_without_state_dirs(monkeypatch)
    directory, done = _run(TWO_HELD, tmp_path, "space", "a.db", "b.db")
    assert done.returncode == 0 and "EXITING" in done.stderr, done.stderr
    assert "panicked" not in done.stderr, done.stderr
    assert LOST not in done.stderr, done.stderr
    captured = [p.name.split(".retired-wal-")[0] for p in capture_dirs(directory)]
    assert sorted(captured) == ["a.db", "b.db"], (captured, done.stderr)


def test_two_held_generations_that_cannot_be_captured_each_get_their_own_error_at_exit(
        tmp_path, monkeypatch):
    _env_without_state_dirs(monkeypatch)
    directory, done = _run(TWO_HELD, tmp_path, "full", "a.db", "b.db")
    assert done.returncode == 0 and "EXITING" in done.stderr, done.stderr
    assert "panicked" not in done.stderr, done.stderr
    after = done.stderr.split("EXITING", 1)[1]
    for name in ("a.db", "b.db"):
        word = f"{LOST} {directory / name} "
        assert len([line for line in after.splitlines() if word in line]) == 1, done.stderr
    assert capture_dirs(directory) == []


def _child_said(stderr: str) -> list:
    between = re.search(r"CHILD EXITING\n(.*?)CHILD GONE", stderr, re.S)
    assert between, stderr
    return [line for line in between.group(1).splitlines() if "hermes-guard" in line]


def test_a_forked_childs_exit_says_nothing_about_its_parents_held_generation(tmp_path, monkeypatch):
    _env_without_state_dirs(monkeypatch)
    directory, done = _run(FORKED, tmp_path, "full", "state.db")
    assert done.returncode == 0, done.stderr
    assert _child_said(done.stderr) == [], done.stderr
    assert "CHILD GONE 0" in done.stderr, done.stderr
    assert "LEFT 0" in done.stdout, done.stdout + done.stderr
    assert len(capture_dirs(directory)) == 1


def test_a_forked_childs_exit_never_captures_its_parents_held_generation(tmp_path, monkeypatch):
    _env_without_state_dirs(monkeypatch)
    directory, done = _run(FORKED, tmp_path, "space", "state.db")
    assert done.returncode == 0, done.stderr
    assert _child_said(done.stderr) == [], done.stderr
    assert "CAPTURES BEFORE 0" in done.stdout, done.stdout + done.stderr
    assert len(capture_dirs(directory)) == 1
