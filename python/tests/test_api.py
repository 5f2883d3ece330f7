"""The package's API on its own: enable() and load(), the typed status, the error classifier, the
CLI it carries, apsw, and the clear refusal of a Python whose sqlite3 cannot load extensions.
Whatever must start from a process without the guard runs in a child process."""

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import hermes_guard
from helpers import (
    insert, last_json, lose_sidecars, open_db, run_python, skip_unless_ci, wal_only_sentinel,
)


def test_enable_guards_every_plain_connect_and_outlives_its_loader(tmp_path):
    # conftest's enable() loaded through a private connection that it closed at once.
    hermes_guard.enable()  # again: idempotent
    conn = sqlite3.connect(tmp_path / "state.db", isolation_level=None)  # no URI, no VFS named
    try:
        assert conn.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
        conn.execute("CREATE TABLE t(x)")
        conn.execute("INSERT INTO t VALUES (1)")
        guard = hermes_guard.status(conn)
        assert isinstance(guard, hermes_guard.GuardStatus)
        assert guard.database == str(tmp_path / "state.db")
        assert not guard.retired and guard.reason is None and guard.refusals == 0
        assert guard.main == tuple(os.stat(tmp_path / "state.db")[i] for i in (2, 1))
        assert guard.wal == tuple(os.stat(tmp_path / "state.db-wal")[i] for i in (2, 1))
        assert guard.shield_active and guard.shield_off_reason is None
        assert guard.capture is None and guard.backfill_at_loss is None
    finally:
        hermes_guard.close(conn)


def test_status_of_a_database_not_opened_through_the_guard_says_how(tmp_path):
    conn = open_db(tmp_path / "stock.db", stock=True)
    try:
        with pytest.raises(hermes_guard.NotGuardedError, match="not opened through the hermes-guard VFS"):
            hermes_guard.status(conn)
    finally:
        conn.close()
    memory = sqlite3.connect(":memory:")
    with pytest.raises(hermes_guard.NotGuardedError, match="in memory"):
        hermes_guard.status(memory)
    memory.close()


def test_status_of_an_attached_schema(tmp_path):
    conn = open_db(tmp_path / "main.db")
    try:
        conn.execute("ATTACH ? AS aux", (str(tmp_path / "aux.db"),))
        assert hermes_guard.status(conn, "aux").database == str(tmp_path / "aux.db")
        assert hermes_guard.status(conn).database == str(tmp_path / "main.db")
    finally:
        conn.close()


def test_errors_that_are_not_refusals_are_other(tmp_path):
    conn = open_db(tmp_path / "state.db")
    try:
        conn.execute("CREATE TABLE u(x UNIQUE)")
        conn.execute("INSERT INTO u VALUES (1)")
        with pytest.raises(sqlite3.IntegrityError) as dup:
            conn.execute("INSERT INTO u VALUES (1)")
        assert not hermes_guard.is_retired(dup.value)
        assert hermes_guard.classify(conn, dup.value) is hermes_guard.ErrorClass.OTHER
        assert not hermes_guard.is_retired(ValueError("not SQLite"))
        assert hermes_guard.classify(conn, ValueError("x")) is hermes_guard.ErrorClass.OTHER
    finally:
        conn.close()


def test_a_replaced_main_file_is_classified_main_replaced(tmp_path):
    path = tmp_path / "state.db"
    conn = open_db(path)
    try:
        insert(conn, "before the restore")
        restored = tmp_path / "restored.db"
        other = open_db(restored, stock=True)
        other.execute("PRAGMA journal_mode=DELETE")
        other.close()
        os.replace(restored, path)  # a snapshot restore over the live file
        with pytest.raises(sqlite3.OperationalError) as refused:
            insert(conn, "after the restore")
        assert hermes_guard.is_retired(refused.value)
        assert hermes_guard.classify(conn, refused.value) is hermes_guard.MainReplaced
        assert hermes_guard.status(conn).reason is hermes_guard.RetireReason.MAIN_REPLACED
    finally:
        conn.close()


def test_retry_pending_captures_has_nothing_pending():
    assert hermes_guard.retry_pending_captures() == 0


LOAD_WITHOUT_DEFAULT = """
    import json, sqlite3, sys
    import hermes_guard
    loader = sqlite3.connect(":memory:")
    hermes_guard.load(loader)
    try:  # load() switched extension loading back off on the connection it was given
        loader.execute("SELECT load_extension(?)", (hermes_guard.extension_path(),)).fetchall()
        load_after = None
    except sqlite3.OperationalError as e:
        load_after = str(e)
    loader.close()
    plain = sqlite3.connect(sys.argv[1] + "/plain.db")
    try:
        hermes_guard.status(plain)
        plain_guarded = True
    except hermes_guard.NotGuardedError:
        plain_guarded = False
    named = hermes_guard.connect(sys.argv[1] + "/named.db")
    uri = sqlite3.connect(hermes_guard.guarded_uri(sys.argv[1] + "/uri.db"), uri=True)
    print(json.dumps({
        "load_after": load_after,
        "plain_guarded": plain_guarded,
        "named": hermes_guard.status(named).database,
        "uri": hermes_guard.status(uri).database,
        "function": json.loads(named.execute("SELECT hermes_guard_status()").fetchone()[0])["database"],
    }))
"""


def test_load_registers_the_vfs_without_making_it_the_default(tmp_path):
    probe = last_json(run_python(LOAD_WITHOUT_DEFAULT, str(tmp_path)))
    assert "not authorized" in probe["load_after"]
    assert probe["plain_guarded"] is False
    assert probe["named"] == str(tmp_path / "named.db")
    assert probe["uri"] == str(tmp_path / "uri.db")
    assert probe["function"] == str(tmp_path / "named.db")


def test_the_console_script_runs_the_packaged_cli(tmp_path):
    script = Path(sys.executable).parent / "hermes-guard"
    assert script.is_file(), f"pip installed no console script at {script}"
    version = subprocess.run([str(script), "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("hermes-guard "), version
    assert os.path.dirname(hermes_guard.cli_path()) == os.path.dirname(hermes_guard.__file__)
    # And on a real capture: `captures` lists it as verified.
    path = tmp_path / "state.db"
    conn = open_db(path)
    wal_only_sentinel(conn)
    lose_sidecars(path)
    conn.close()
    listed = subprocess.run([str(script), "captures", str(path)], capture_output=True, text=True)
    assert listed.returncode == 0 and "verified" in listed.stdout, listed
    [capture] = hermes_guard.captures(path)
    assert str(capture.path) in listed.stdout


def test_a_directory_that_is_not_a_capture_is_a_clear_error(tmp_path):
    with pytest.raises(hermes_guard.CaptureFormatError, match="has no manifest.json"):
        hermes_guard.Capture(tmp_path)
    partial = tmp_path / "state.db.retired-wal-20261201-000000-1.partial"
    partial.mkdir()
    with pytest.raises(hermes_guard.CaptureFormatError, match="interrupted capture"):
        hermes_guard.Capture(partial)
    assert not hermes_guard.verify(partial).ok
    with pytest.raises(hermes_guard.BadInputError, match="not a hermes-guard capture"):
        hermes_guard.verify(tmp_path)
    with pytest.raises(hermes_guard.BadInputError, match="nothing was written"):
        hermes_guard.recover(tmp_path, tmp_path / "state.db")


# ── A Python whose sqlite3 cannot load extensions ───────────────────────────────────────────────

NO_LOADING = """
    import sqlite3, sys
    import hermes_guard
    assert not hasattr(sqlite3.Connection, "enable_load_extension"), "this Python can load extensions"
    conn = hermes_guard.connect(sys.argv[1])
    conn.execute("PRAGMA journal_mode=WAL")
    assert not hermes_guard.status(conn).retired  # NotGuardedError if opened around the guard
    try:
        hermes_guard.load(sqlite3.connect(":memory:"))
    except hermes_guard.ExtensionLoadingUnavailable as e:
        print(e)
    else:
        raise SystemExit("no error")
"""


def test_a_python_that_cannot_load_extensions_is_guarded_through_its_sqlite_library(tmp_path):
    """HERMES_GUARD_NO_LOADEXT_PYTHON: a Python whose sqlite3 has no enable_load_extension
    (pyenv's default build), with this package installed from the wheel (python/run-tests.sh
    makes one; it also runs the README's quick start there): connect() guards a database through
    the SQLite library _sqlite3 links, and load(conn), which needs the module's own loading, says
    so once and names what works."""
    python = os.environ.get("HERMES_GUARD_NO_LOADEXT_PYTHON")
    if not python:
        skip_unless_ci("HERMES_GUARD_NO_LOADEXT_PYTHON is not set (python/run-tests.sh sets it)")
    done = run_python(NO_LOADING, str(tmp_path / "state.db"), python=python)
    message = done.stdout.strip()
    assert "cannot load SQLite extensions" in message
    assert "hermes_guard.enable() and hermes_guard.connect() work on this Python" in message
    assert python in message, "the message names the interpreter"
    assert done.stderr == "", done.stderr  # one error, handled: nothing else printed


# ── is_retired(e) on every interpreter the wheel went into ──────────────────────────────────────


def _wheel_pythons():
    """This interpreter and each one python/run-tests.sh installed the wheel into
    (HERMES_GUARD_WHEEL_PYTHONS, os.pathsep-separated: the distribution's Python and every CPython
    3.9+ it found, 3.9 and 3.10 among them in CI)."""
    listed = os.environ.get("HERMES_GUARD_WHEEL_PYTHONS", "").split(os.pathsep)
    return list(dict.fromkeys([sys.executable, *filter(None, listed)]))


def _python_id(python):
    # run-tests.sh names each venv after its interpreter: venv-wheel-3.9.18
    return "this-python" if python == sys.executable else Path(python).parents[1].name


every_python = pytest.mark.parametrize("python", _wheel_pythons(), ids=_python_id)

# A guarded database with one committed row; `answer(e)` is what is_retired(e) said: True, False,
# or the error it raised instead.
ERROR_PROBE = """
    import json, os, sqlite3, sys
    import hermes_guard
    hermes_guard.enable(log="off")
    path = os.path.join(sys.argv[1], "state.db")
    conn = sqlite3.connect(path, isolation_level=None, timeout=0)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE notes(body TEXT UNIQUE)")
    conn.execute("INSERT INTO notes VALUES ('acknowledged')")

    def error_of(connection, statement):
        try:
            connection.execute(statement)
        except sqlite3.Error as e:
            return e
        raise SystemExit(f"{statement!r} raised nothing")

    def answer(error):
        try:
            return hermes_guard.is_retired(error)
        except hermes_guard.ExtendedCodeUnavailable as e:
            return {"raised": type(e).__name__, "message": str(e)}

    def report(**fields):
        print(json.dumps({"python": list(sys.version_info[:2]), **fields}))
"""

REFUSAL = ERROR_PROBE + """
    os.remove(path + "-wal")  # what a cleanup script does
    refused = error_of(conn, "INSERT INTO notes VALUES ('next')")
    report(error=type(refused).__name__, message=str(refused), is_retired=answer(refused),
           classify=hermes_guard.classify(conn, refused).value,
           retired=hermes_guard.status(conn).retired)
"""

ORDINARY_ERRORS = ERROR_PROBE + """
    errors = [
        error_of(conn, "INSERT INTO notes VALUES ('acknowledged')"),  # UNIQUE
        error_of(conn, "SELECT * FROM no_such_table"),
        ValueError("not from SQLite"),
    ]
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the write lock, held
    errors.append(error_of(conn, "INSERT INTO notes VALUES ('while locked')"))
    holder.rollback()
    report(answers={f"{type(e).__name__}: {e}": answer(e) for e in errors},
           retired=hermes_guard.status(conn).retired)
"""

READ_ONLY_OPEN = ERROR_PROBE + """
    reader = sqlite3.connect(hermes_guard.guarded_uri(path) + "&mode=ro", uri=True)
    refused = error_of(reader, "INSERT INTO notes VALUES ('next')")
    report(error=type(refused).__name__, message=str(refused), is_retired=answer(refused),
           retired=hermes_guard.status(reader).retired)
"""


def _has_extended_codes(probe):
    return tuple(probe["python"]) >= (3, 11)  # sqlite3.Error.sqlite_errorcode


@every_python
def test_is_retired_never_answers_false_for_a_real_refusal(tmp_path, python):
    """The -wal removed under a guarded connection, its next write refused: is_retired(e) is True
    where the error carries its extended code (3.11+); on 3.9 and 3.10, where it cannot, it raises
    ExtendedCodeUnavailable naming classify(conn, e) — which answers WalLost there."""
    probe = last_json(run_python(REFUSAL, str(tmp_path), python=python))
    assert probe["error"] == "OperationalError" and probe["retired"], probe
    assert probe["message"] == "attempt to write a readonly database", probe
    assert probe["classify"] == "wal-lost", probe
    if _has_extended_codes(probe):
        assert probe["is_retired"] is True, probe
    else:
        assert probe["is_retired"]["raised"] == "ExtendedCodeUnavailable", probe
        assert "hermes_guard.classify(conn, e)" in probe["is_retired"]["message"], probe


@every_python
def test_is_retired_is_false_for_errors_that_cannot_be_a_refusal(tmp_path, python):
    """A UNIQUE violation, a missing table, a locked database, a non-SQLite error: False on every
    Python, 3.9 and 3.10 included (their class or message rules a refusal out)."""
    probe = last_json(run_python(ORDINARY_ERRORS, str(tmp_path), python=python))
    assert not probe["retired"], probe
    assert probe["answers"] == {
        "IntegrityError: UNIQUE constraint failed: notes.body": False,
        "OperationalError: no such table: no_such_table": False,
        "OperationalError: database is locked": False,
        "ValueError: not from SQLite": False,
    }, probe


@every_python
def test_a_read_only_open_reads_like_a_refusal_so_is_retired_never_guesses_from_the_message(
    tmp_path, python
):
    """A write into a database opened read-only (mode=ro) is no refusal of the guard, yet SQLite
    words it exactly alike: is_retired(e) is False where the extended code tells them apart
    (3.11+), and raises ExtendedCodeUnavailable on 3.9 and 3.10 rather than guess."""
    probe = last_json(run_python(READ_ONLY_OPEN, str(tmp_path), python=python))
    assert probe["error"] == "OperationalError" and not probe["retired"], probe
    assert probe["message"] == "attempt to write a readonly database", probe
    if _has_extended_codes(probe):
        assert probe["is_retired"] is False, probe
    else:
        assert probe["is_retired"]["raised"] == "ExtendedCodeUnavailable", probe


# ── apsw ────────────────────────────────────────────────────────────────────────────────────────

APSW_SCENARIO = """
    import json, sys
    import apsw
    import hermes_guard
    from helpers import lose_sidecars
    from pathlib import Path
    path = Path(sys.argv[1]) / "state.db"
    loader = apsw.Connection(":memory:")
    hermes_guard.load(loader)
    loader.close()
    conn = apsw.Connection(str(path), vfs=hermes_guard.VFS_NAME)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE messages(id INTEGER PRIMARY KEY, session TEXT, content TEXT)")
    conn.execute("INSERT INTO messages(session, content) VALUES ('a', 'only in the WAL')")
    lose_sidecars(path)
    try:
        conn.execute("INSERT INTO messages(session, content) VALUES ('a', 'after the loss')")
        refused = None
    except apsw.Error as e:
        refused = {"type": type(e).__name__, "retired": hermes_guard.is_retired(e),
                   "kind": hermes_guard.classify(conn, e).value}
    guard = hermes_guard.status(conn)
    capture = hermes_guard.Capture(guard.capture)
    try:
        hermes_guard.enable()
        mixed = None
    except hermes_guard.LoadError as e:
        mixed = str(e)
    # By hand, past the package's check: the extension itself refuses a second SQLite library,
    # and apsw's connection goes on working on its own.
    import sqlite3
    by_hand = sqlite3.connect(":memory:")
    by_hand.enable_load_extension(True)
    try:
        by_hand.execute("SELECT load_extension(?)", (hermes_guard.extension_path(),)).fetchall()
        second_library = None
    except sqlite3.OperationalError as e:
        second_library = str(e)
    still = conn.execute("SELECT count(*) FROM messages").fetchone()[0]
    print(json.dumps({"sqlite": apsw.sqlite_lib_version(), "refused": refused,
                      "trigger": capture.trigger, "commits": capture.wal.commits,
                      "mixed": mixed, "second_library": second_library, "still": still}))
"""


def test_apsw_connections_are_guarded_through_load(tmp_path):
    try:
        import apsw  # noqa: F401
    except ImportError:
        skip_unless_ci("apsw is not installed in this environment")
    probe = last_json(run_python(APSW_SCENARIO, str(tmp_path)))
    assert probe["refused"] == {"type": "ReadOnlyError", "retired": True, "kind": "wal-lost"}, probe
    assert probe["trigger"] == "halt" and probe["commits"] >= 1
    # The extension went into apsw's own SQLite; the stdlib's is another library.
    assert "already loaded into apsw's SQLite" in probe["mixed"]
    assert "already loaded into another copy of the SQLite library" in probe["second_library"]
    assert probe["still"] == 1


def test_the_sqlite3_shell_loads_the_packaged_extension(tmp_path):
    shell = shutil.which("sqlite3")
    if shell is None:
        skip_unless_ci("no sqlite3 shell on PATH")
    done = subprocess.run(
        [shell, ":memory:"],
        input=f".load {hermes_guard.extension_path()}\n"
        f".open file:{tmp_path}/state.db?vfs=hermes-guard\n"
        "PRAGMA journal_mode=WAL;\nCREATE TABLE t(x);\n"
        "SELECT json_extract(hermes_guard_status(), '$.retired');\n",
        capture_output=True, text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["wal", "0"]


def test_a_database_name_that_is_not_utf8_round_trips_through_status_and_manifest(tmp_path):
    path = tmp_path / os.fsdecode(b"st\xffate.db")  # a surrogate-escaped str, as os gives it
    conn = hermes_guard.connect(path, isolation_level=None)
    try:
        assert conn.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
        conn.execute("CREATE TABLE messages(id INTEGER PRIMARY KEY, session TEXT, content TEXT)")
        insert(conn, "only in the WAL")
        assert hermes_guard.status(conn).database == str(path)
        lose_sidecars(path)
        with pytest.raises(sqlite3.OperationalError) as refused:
            insert(conn, "after the loss")
        assert hermes_guard.is_retired(refused.value)
        guard = hermes_guard.status(conn)
        assert guard.capture is not None and guard.capture.is_dir()
        capture = hermes_guard.Capture(guard.capture)
        assert capture.database == str(path) and os.fsencode(capture.database) == os.fsencode(path)
        assert capture.files_match()
    finally:
        conn.close()


README_CHECK = """
    import os, sys
    os.chdir(sys.argv[2])
    exec(sys.argv[1])  # the README's quick start, verbatim
"""


def test_the_readme_quick_start_runs_and_says_what_happened(tmp_path):
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    quick_start = readme.split("```python\n", 1)[1].split("```", 1)[0]  # the first screen's
    done = run_python(README_CHECK, quick_start, str(tmp_path))
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "refused (attempt to write a readonly database); WAL lost: True", done.stdout
    prefix = f"every committed row is in {tmp_path / 'state.db'}.retired-wal-"
    assert len(lines) == 2 and lines[1].startswith(prefix), done.stdout
    capture = Path(lines[1].split(" in ", 1)[1])
    assert (capture / "manifest.json").is_file()
