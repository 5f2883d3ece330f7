"""The extension is loaded once per test process, the way a host would: through a connection that
is closed right after, so every test also proves the VFS outlives the connection that loaded it."""

import os

import pytest

import harness


def pytest_report_header(config):
    return [
        f"host SQLite {harness.sqlite_version()} through {harness.binding_description()}",
        f"extension {os.environ.get('HERMES_GUARD_EXT', '<HERMES_GUARD_EXT not set>')}",
    ]


@pytest.fixture(scope="session", autouse=True)
def extension_loaded():
    # A run meant for one host SQLite must not quietly test another (PYTHONPATH picks the apsw,
    # LD_LIBRARY_PATH the stdlib's libsqlite3).
    expected = os.environ.get("HERMES_GUARD_EXPECT_SQLITE")
    if expected and harness.sqlite_version() != expected:
        pytest.exit(
            f"this run was meant for SQLite {expected} but {harness.binding_description()} "
            f"runs {harness.sqlite_version()}",
            returncode=3,
        )
    harness.load_extension()
    assert harness.vfs_registered(harness.VFS_NAME)
