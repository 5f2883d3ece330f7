"""The test process guards every connection the way an application would: `enable()` once, then
plain `sqlite3.connect()`. The package under test is the installed one (pip install ./python),
never the source tree."""

import os
import sqlite3

import pytest

import hermes_guard


def pytest_report_header(config):
    return [
        f"hermes_guard from {os.path.dirname(hermes_guard.__file__)}",
        f"stdlib sqlite3 on SQLite {sqlite3.sqlite_version}",
    ]


@pytest.fixture(scope="session", autouse=True)
def guard_enabled():
    package = os.path.dirname(os.path.abspath(hermes_guard.__file__))
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "hermes_guard")
    assert os.path.realpath(package) != os.path.realpath(source), (
        "the tests import hermes_guard from the source tree, not the installed package"
    )
    hermes_guard.enable()

