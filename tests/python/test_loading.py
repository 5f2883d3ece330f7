"""Loading the extension into a host: the VFS it registers, the SQL functions it adds, the two ways
of making it the default VFS, and the clear refusal of a host SQLite too old for it. Whatever
changes the process-wide default VFS, or needs another SQLite, runs in a child Python process."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import harness
from harness import insert, open_guarded, open_stock, status, wal_only_sentinel

HERE = Path(__file__).parent


def run_child(code: str, env: dict | None = None, pythonpath: str | None = None) -> dict:
    """Runs `code` in a fresh Python process with `harness` importable; returns the JSON it prints
    last. The child's own exit code must be 0: a crash in the extension would show here."""
    child_env = {k: v for k, v in os.environ.items() if k != "HERMES_GUARD_DEFAULT"}
    child_env.update(env or {})
    if pythonpath is not None:
        child_env["PYTHONPATH"] = pythonpath
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=HERE,
        env=child_env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, f"child exited with {done.returncode}: {done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_vfs_outlives_the_connection_that_loaded_it(tmp_path):
    harness.load_extension()  # again: idempotent, and its loading connection is closed at once
    conn = open_guarded(tmp_path / "state.db")
    try:
        insert(conn, "written through the guard")
        guard = status(conn)
        assert guard["database"] == str(tmp_path / "state.db")
        assert guard["wal"] is not None and not guard["retired"]
        assert harness.is_guarded(conn)
    finally:
        conn.close()


def test_the_vfs_keyword_opens_through_the_guard_too(tmp_path):
    path = tmp_path / "state.db"
    conn = harness.connect(str(path), vfs=harness.VFS_NAME)
    try:
        harness.prepare(conn)
        assert harness.is_guarded(conn)
        assert status(conn)["database"] == str(path)
    finally:
        conn.close()


def test_status_is_the_calling_connections_own(tmp_path):
    first = open_guarded(tmp_path / "first.db")
    second = open_guarded(tmp_path / "second.db")
    try:
        wal_only_sentinel(first)
        harness.lose_sidecars(tmp_path / "first.db", rename=False)
        with pytest.raises(harness.ReadOnlyError):
            insert(first, "after the loss")
        assert status(first)["retired"] and status(first)["refusals"] == 1
        assert status(first)["database"] == str(tmp_path / "first.db")
        assert not status(second)["retired"] and status(second)["refusals"] == 0
        assert status(second)["database"] == str(tmp_path / "second.db")
        insert(second, "the other database is unaffected")
    finally:
        first.close()
        second.close()


def test_status_of_an_attached_schema_is_asked_by_name(tmp_path):
    conn = open_guarded(tmp_path / "main.db")
    try:
        conn.execute("ATTACH ? AS aux", (harness.guarded_uri(tmp_path / "aux.db"),))
        assert status(conn, "aux")["database"] == str(tmp_path / "aux.db")
        assert status(conn)["database"] == str(tmp_path / "main.db")
        with pytest.raises(harness.SQLError, match='unknown database "nonesuch"'):
            status(conn, "nonesuch")
    finally:
        conn.close()


def test_status_of_an_unguarded_database_says_how_to_guard_it(tmp_path):
    conn = open_stock(tmp_path / "stock.db")
    try:
        with pytest.raises(harness.SQLError, match="not opened through the hermes-guard VFS"):
            status(conn)
    finally:
        conn.close()


def test_capture_function_captures_a_retired_generation_before_any_write(tmp_path):
    path = tmp_path / "state.db"
    conn = open_guarded(path)
    try:
        wal_only_sentinel(conn)
        harness.lose_sidecars(path, rename=False)
        assert harness.artifacts(tmp_path) == []
        captured = json.loads(conn.execute("SELECT hermes_guard_capture()").fetchone()[0])
        assert captured["retired"] and captured["capture"] is not None
        assert harness.artifacts(tmp_path) == [Path(captured["capture"])]
        assert harness.manifest(Path(captured["capture"]))["trigger"] == "close"
    finally:
        conn.close()
    assert len(harness.artifacts(tmp_path)) == 1


CAPTURE_FAILS_PROBE = """
    import json, resource, signal, sys
    from pathlib import Path
    import harness
    directory = Path(sys.argv[1])
    path = directory / "state.db"
    harness.load_extension()
    conn = harness.open_guarded(path)
    sentinel = harness.wal_only_sentinel(conn)
    harness.lose_sidecars(path, rename=False)
    # No file of this process may grow past 1 KiB, as on a full disk: the capture cannot be written.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, hard))
    try:
        conn.execute("SELECT hermes_guard_capture()").fetchall()
        capture_error = None
    except harness.Error as e:
        capture_error = str(e)
    after_failure = harness.status(conn)
    conn.close()  # closed uncaptured: the guard keeps the generation's descriptors for a retry
    probe = harness.connect(":memory:")
    pending_while_full = probe.execute("SELECT hermes_guard_retry_pending()").fetchone()[0]
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    pending_after = probe.execute("SELECT hermes_guard_retry_pending()").fetchone()[0]
    print(json.dumps({
        "sentinel": sentinel, "capture_error": capture_error, "after_failure": after_failure,
        "pending_while_full": pending_while_full, "pending_after": pending_after,
    }))
"""


def test_a_capture_that_cannot_be_written_is_an_error_and_is_retried_after_close(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CAPTURE_FAILS_PROBE), str(tmp_path)],
        cwd=HERE,
        env={k: v for k, v in os.environ.items() if k != "HERMES_GUARD_DEFAULT"},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    assert probe["capture_error"] is not None and "File too large" in probe["capture_error"]
    assert probe["after_failure"]["retired"] and probe["after_failure"]["capture"] is None
    assert "File too large" in probe["after_failure"]["capture_error"]
    assert "could not capture the retired generation" in done.stderr  # logged, not silent
    assert probe["pending_while_full"] == 1
    assert probe["pending_after"] == 0

    [artifact] = [p for p in harness.artifacts(tmp_path) if not p.name.endswith(".partial")]
    assert harness.manifest(artifact)["trigger"] == "close"
    recovered = harness.recover(artifact, "state.db", tmp_path / "recovered")
    try:
        assert harness.count_like(recovered, probe["sentinel"]) == 1
        assert harness.integrity_ok(recovered)
    finally:
        recovered.close()


def test_the_functions_are_top_level_only_never_from_a_schemas_views(tmp_path):
    conn = open_guarded(tmp_path / "state.db")
    try:
        conn.execute("CREATE VIEW guard AS SELECT hermes_guard_status() AS s")
        with pytest.raises(harness.SQLError, match="unsafe use of hermes_guard_status"):
            conn.execute("SELECT s FROM guard").fetchall()
    finally:
        conn.close()


# ── Making it the default VFS ───────────────────────────────────────────────────────────────────

DEFAULT_PROBE = """
    import json
    import harness
    try:
        harness.load_extension({entrypoint})
    except harness.Error as e:
        print(json.dumps({{"error": str(e), "registered": harness.vfs_registered(harness.VFS_NAME)}}))
        raise SystemExit(0)
    conn = harness.connect({path!r})  # no VFS named
    print(json.dumps({{
        "error": None, "registered": harness.vfs_registered(harness.VFS_NAME),
        "guarded": harness.is_guarded(conn),
    }}))
    conn.close()
"""


def probe_default(tmp_path: Path, entrypoint: str | None = None, env: dict | None = None) -> dict:
    code = DEFAULT_PROBE.format(entrypoint=repr(entrypoint), path=str(tmp_path / "plain.db"))
    return run_child(code, env=env)


def test_loaded_plainly_the_guard_is_not_the_default_vfs(tmp_path):
    probe = probe_default(tmp_path)
    assert probe["error"] is None
    assert probe["registered"]
    assert probe["guarded"] is False


def test_the_default_entry_point_makes_the_guard_the_default_vfs(tmp_path):
    probe = probe_default(tmp_path, entrypoint="sqlite3_hermesguard_default_init")
    assert probe["error"] is None
    assert probe["registered"]
    assert probe["guarded"] is True  # a database opened without naming a VFS is guarded


def test_hermes_guard_default_1_makes_the_guard_the_default_vfs(tmp_path):
    probe = probe_default(tmp_path, env={"HERMES_GUARD_DEFAULT": "1"})
    assert probe["error"] is None
    assert probe["guarded"] is True


def test_a_default_setting_other_than_0_or_1_fails_the_load_and_says_why(tmp_path):
    probe = probe_default(tmp_path, env={"HERMES_GUARD_DEFAULT": "yes"})
    assert "HERMES_GUARD_DEFAULT must be 0 or 1" in probe["error"]
    assert not probe["registered"]


# ── A host SQLite too old for the extension ─────────────────────────────────────────────────────

TOO_OLD_PROBE = """
    import json
    import harness
    try:
        harness.load_extension()
        error = None
    except harness.Error as e:
        error = f"{type(e).__name__}: {e}"
    print(json.dumps({
        "sqlite": harness.sqlite_version(), "error": error,
        "load_error": error is not None and error.startswith(harness.LoadError.__name__),
        "registered": harness.vfs_registered(harness.VFS_NAME),
    }))
"""


def test_a_host_sqlite_too_old_gets_a_clear_error_at_load_time():
    """No apsw wheel carries a SQLite older than 3.34: the too-old host is the standard library's
    sqlite3 of the distribution's Python (HERMES_GUARD_DISTRO_PYTHON, default /usr/bin/python3)
    on a libsqlite3 older than the minimum (HERMES_GUARD_TOO_OLD_LIB, the directory holding it;
    ext/build-and-test.sh builds SQLite 3.32.3 there)."""
    too_old = os.environ.get("HERMES_GUARD_TOO_OLD_LIB")
    if not too_old:
        skipped = os.environ.get("HERMES_GUARD_TOO_OLD_SKIPPED")
        if skipped:
            pytest.skip(f"no too-old host SQLite: {skipped}")
        pytest.fail(
            "HERMES_GUARD_TOO_OLD_LIB is not set: ext/build-and-test.sh builds a libsqlite3 older "
            "than the extension's minimum and points this variable at its directory"
        )
    python = os.environ.get("HERMES_GUARD_DISTRO_PYTHON", "/usr/bin/python3")
    env = {k: v for k, v in os.environ.items() if k != "HERMES_GUARD_DEFAULT"}
    env.update(LD_LIBRARY_PATH=too_old, HERMES_GUARD_PY_BINDING="sqlite3")
    env.pop("PYTHONPATH", None)  # the distro's Python, its own stdlib only
    done = subprocess.run(
        [python, "-c", textwrap.dedent(TOO_OLD_PROBE)], cwd=HERE, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, f"child exited with {done.returncode}: {done.stderr}"
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    old = probe["sqlite"]
    assert tuple(int(p) for p in old.split(".")) < (3, 34, 0), f"{old} is not too old"
    assert probe["error"] is not None, f"SQLite {old} loaded the extension"
    assert probe["load_error"], probe["error"]
    assert f"hermes-guard needs SQLite 3.34.0 or newer, but this program runs SQLite {old}" in probe["error"]
    assert not probe["registered"]
