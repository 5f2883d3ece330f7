"""A loss healed into the live file at close is never merged again: the capture says
it was healed (`Capture.healed`), and `recover(..., apply=True)` merges nothing from it — 50 rows
stay 50."""

import sqlite3

import pytest

import hermes_guard
from helpers import SENTINEL_PREFIX, count_like, insert, integrity_ok, lose_sidecars, open_db


def test_a_healed_loss_is_not_merged_again_by_recover(tmp_path):
    path = tmp_path / "state.db"
    conn = open_db(path)
    conn.execute("PRAGMA wal_autocheckpoint=0")
    for i in range(20):
        insert(conn, f"history {i}")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    for i in range(50):
        insert(conn, f"{SENTINEL_PREFIX}{i}")
    lose_sidecars(path)
    with pytest.raises(sqlite3.OperationalError):
        insert(conn, "refused")
    conn.close()  # the heal at close puts the 50 rows back into the live file

    live = open_db(path)
    assert count_like(live, SENTINEL_PREFIX + "%") == 50
    live.close()
    [capture] = hermes_guard.captures(path)
    assert capture.heal == "healed"
    assert capture.healed

    merged = capture.recover(path, apply=True)
    assert merged.exit_code == 0, merged.report
    assert merged.healed_at_close, merged.report
    assert merged.inserted == 0
    live = open_db(path)
    try:
        assert count_like(live, SENTINEL_PREFIX + "%") == 50, "50 rows stay 50"
        assert integrity_ok(live)
    finally:
        live.close()
