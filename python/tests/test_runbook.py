"""The runbook's samples are real output: the lines an application logs when its WAL
is taken away, and the plan `hermes-guard recover` prints, are produced here by that very
scenario and compared with the runbook (`hermes-guard help recovery`: the docs/recovery.md the
installed command carries), paths, times and pids set to the runbook's."""

import re
import subprocess
import sys

from hermes_guard._capture import cli_path
from helpers import run_python

# The runbook's scenario: 20 messages checkpointed, 4 more committed only in the WAL, the -wal
# and -shm unlinked (a cleanup script), the next write refused; another process then writes on
# (stock SQLite), so the retired connection's close cannot heal and the capture stays.
SCENARIO = """
    import os, sqlite3, subprocess, sys
    import hermes_guard
    db = os.path.join(sys.argv[1], "state.db")
    hermes_guard.enable()
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, content TEXT NOT NULL)")
    for i in range(20):
        conn.execute("INSERT INTO messages (content) VALUES (?)", (f"message {i}",))
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    for i in range(4):
        conn.execute("INSERT INTO messages (content) VALUES (?)", (f"lost {i}",))
    os.remove(db + "-wal")
    os.remove(db + "-shm")
    try:
        conn.execute("INSERT INTO messages (content) VALUES ('refused')")
    except sqlite3.OperationalError:
        pass
    else:
        raise SystemExit("the write was not refused")
    newer = "import sqlite3, sys; c = sqlite3.connect('file:' + sys.argv[1] + '?vfs=unix', uri=True); c.execute(\\"INSERT INTO messages (content) VALUES ('newer')\\"); c.commit()"
    subprocess.run([sys.executable, "-c", newer, db], check=True)
    capture = hermes_guard.status(conn).capture
    conn.close()
    print(capture)
"""


def runbook_block(runbook: str, after: str) -> list:
    """The lines of the first code block after the text `after`."""
    rest = runbook[runbook.index(after):]
    block = rest.split("```\n", 1)[1].split("```", 1)[0]
    return block.rstrip("\n").split("\n")


def as_in_the_runbook(text: str, database: str) -> list:
    # The runbook shows the line a program outside Python logs (the command alone); in Python the
    # package's call comes first, as the runbook says under the block.
    text = re.sub(r'`hermes_guard\.recover\("[^"]*", "[^"]*", apply=True\)` \(or the command: (`[^`]*`)\)',
                  r"\1", text)
    text = text.replace(database, "/srv/state.db")
    text = re.sub(r"retired-wal-\d{8}-\d{6}-\d+", "retired-wal-20261129-031502-4242", text)
    text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", "2026-11-29T03:15:02Z", text)
    return text.rstrip("\n").split("\n")


def test_the_runbooks_logged_lines_and_plan_are_what_the_guard_and_the_command_print(tmp_path):
    runbook = subprocess.run([cli_path(), "help", "recovery"], capture_output=True, text=True,
                             check=True).stdout
    done = run_python(SCENARIO, str(tmp_path), env={"HERMES_GUARD_LOG": "warn"})
    database = str(tmp_path / "state.db")
    logged = [line for line in as_in_the_runbook(done.stderr, database)
              if line.startswith("hermes-guard: ")]
    assert logged == runbook_block(runbook, "You are here because an application logged"), \
        done.stderr

    capture = done.stdout.strip()
    plan = subprocess.run([cli_path(), "recover", capture, "--into", database],
                          capture_output=True, text=True)
    assert plan.returncode == 0, plan.stderr
    assert as_in_the_runbook(plan.stdout, database) == runbook_block(
        runbook, "prints the plan, changes nothing, and exits 0:"), plan.stdout
