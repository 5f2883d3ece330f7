"""The extension is loaded once per test process, the way a host would: through a connection that
is closed right after, so every test also proves the VFS outlives the connection that loaded it."""

import os

import apsw
import pytest

import harness


def pytest_report_header(config):
    return [
        f"host SQLite {apsw.sqlite_lib_version()} (apsw {apsw.apsw_version()})",
        f"extension {os.environ.get('HERMES_GUARD_EXT', '<HERMES_GUARD_EXT not set>')}",
    ]


@pytest.fixture(scope="session", autouse=True)
def extension_loaded():
    # A run meant for one host SQLite must not quietly test another (PYTHONPATH picks the apsw).
    expected = os.environ.get("HERMES_GUARD_EXPECT_SQLITE")
    if expected and apsw.sqlite_lib_version() != expected:
        pytest.exit(
            f"this run was meant for SQLite {expected} but apsw carries {apsw.sqlite_lib_version()}",
            returncode=3,
        )
    harness.load_extension()
    assert harness.VFS_NAME in apsw.vfs_names()
