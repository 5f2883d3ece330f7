"""The seed scenarios of shared/seeds/test_retired_wal_generation_capture.py, replayed from Python
through the loadable extension: the sidecars are lost for real, and the exact retired generation
must be captured next to the database at the first refused write (or at close), located by inode
rather than by pathname, and recoverable from the capture alone, also after the writer process has
exited, while a newer generation at the path stays intact."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import harness

from harness import (
    artifacts, count_like, descriptor_contents, descriptor_for, identity_of, insert, integrity_ok,
    is_refusal, lose_sidecars, manifest, open_guarded, open_stock, recover, sha256, sidecar, status,
    wal_only_sentinel,
)


# ── Capture at the first halt ───────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("rename", [False, True], ids=["unlink", "rename"])
def test_halt_captures_the_exact_retired_generation(tmp_path, rename):
    path = tmp_path / "state.db"
    conn = open_guarded(path)
    sentinel = wal_only_sentinel(conn)
    identity = tuple(status(conn)["wal"])
    lose_sidecars(path, rename=rename)
    original = descriptor_contents(descriptor_for(identity))

    with pytest.raises(harness.ReadOnlyError) as refused:
        insert(conn, "after the loss")
    assert is_refusal(refused.value), refused.value

    guard = status(conn)
    assert guard["retired"] and guard["reason"] == "wal-lost"
    artifact = Path(guard["capture"])
    assert artifact.is_dir() and artifact.parent == tmp_path
    found = manifest(artifact)
    assert found["trigger"] == "halt"
    assert tuple(found["wal"]["identity"]) == identity
    captured = (artifact / "state.db-wal").read_bytes()
    assert captured == original and captured
    assert found["wal"]["sha256"] == sha256(captured)
    assert found["main"]["mode"] == "copied" and found["main"]["header"]["valid"]
    assert (artifact / "state.db").stat().st_size == found["main"]["bytes"]

    recovered = recover(artifact, "state.db", tmp_path / "recovered")
    try:
        assert count_like(recovered, sentinel) == 1
        assert integrity_ok(recovered)
    finally:
        recovered.close()

    conn.close()
    assert artifacts(tmp_path) == [artifact]  # captured once, not again at close


def test_close_captures_when_the_loss_is_first_seen_at_close(tmp_path):
    path = tmp_path / "state.db"
    conn = open_guarded(path)
    sentinel = wal_only_sentinel(conn)
    lose_sidecars(path, rename=False)

    conn.close()  # no write in between: the close itself must notice the loss and capture

    [artifact] = artifacts(tmp_path)
    assert manifest(artifact)["trigger"] == "close"
    recovered = recover(artifact, "state.db", tmp_path / "recovered")
    try:
        assert count_like(recovered, sentinel) == 1
        assert integrity_ok(recovered)
    finally:
        recovered.close()


def test_close_without_the_close_checkpoint_captures_a_wal_unlinked_after_the_last_write(tmp_path):
    """With SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE (what hermes-agent sets) SQLite's close never asks
    SQLITE_FCNTL_HAS_MOVED: the host's close() must still find the loss where the connection lets
    go of its WAL, and capture it."""
    if harness.BINDING != "apsw":
        pytest.skip("Python 3.11's sqlite3 cannot set SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE (3.12+)")
    import apsw

    path = tmp_path / "state.db"
    conn = open_guarded(path)
    conn.config(apsw.SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1)
    sentinel = wal_only_sentinel(conn)
    sidecar(path, "-wal").unlink()

    conn.close()

    [artifact] = artifacts(tmp_path)
    assert manifest(artifact)["trigger"] == "close"
    recovered = recover(artifact, "state.db", tmp_path / "recovered")
    try:
        assert count_like(recovered, sentinel) == 1
    finally:
        recovered.close()


def test_capture_selects_the_recorded_inode_not_the_pathname(tmp_path):
    """A second deleted WAL under the same pathname belongs to another owner: it must be neither
    captured as ours nor touched."""
    path = tmp_path / "state.db"
    wal = sidecar(path, "-wal")
    conn = open_guarded(path)
    sentinel = wal_only_sentinel(conn)
    identity = tuple(status(conn)["wal"])
    lose_sidecars(path, rename=False)
    original = descriptor_contents(descriptor_for(identity))

    other_path = tmp_path / "other.db"
    other = harness.connect(str(other_path), vfs="unix")
    try:
        assert other.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
        other.execute("CREATE TABLE independent (content TEXT)")
        other.execute("INSERT INTO independent VALUES ('another owner committed this')")
        sidecar(other_path, "-wal").rename(wal)  # same pathname as our lost WAL
        other_identity = identity_of(wal)
        wal.unlink()
        assert other_identity != identity
        other_before = descriptor_contents(descriptor_for(other_identity))

        with pytest.raises(harness.ReadOnlyError) as refused:
            insert(conn, "after the loss")
        assert is_refusal(refused.value), refused.value

        artifact = Path(status(conn)["capture"])
        assert (artifact / "state.db-wal").read_bytes() == original
        assert tuple(manifest(artifact)["wal"]["identity"]) == identity
        assert descriptor_contents(descriptor_for(other_identity)) == other_before
        recovered = recover(artifact, "state.db", tmp_path / "recovered")
        try:
            assert count_like(recovered, sentinel) == 1
        finally:
            recovered.close()
        conn.close()
        assert descriptor_contents(descriptor_for(other_identity)) == other_before
    finally:
        other.close()


# ── Recoverable after the writer process has exited ─────────────────────────────────────────────
#
# The gateway writer runs in its OWN Python process with the extension loaded, seeds and
# checkpoints history, leaves rows only in its WAL and then serves stdin commands. This process
# takes its sidecars away, drives one refused write (halt + capture), writes and checkpoints a newer
# generation through the path itself, then has the writer close and exit normally. The retired rows
# must be recoverable from the capture alone afterwards, and the newer generation untouched.


class GatewayWriter:
    def __init__(self, path: Path, wal_rows: int):
        self.path = path
        script = Path(__file__).with_name("gateway_writer.py")
        self.proc = subprocess.Popen(
            [sys.executable, str(script), str(path), str(wal_rows)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def next_event(self, expected: str) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"the writer exited before {expected!r}: {self.stderr_text()}")
        event = json.loads(line)
        assert event["event"] == expected, event
        return event

    def send(self, command: str) -> None:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def stderr_text(self) -> str:
        self.proc.kill()
        return self.proc.stderr.read()

    def wait_exit(self) -> int:
        self.proc.stdin.close()
        code = self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()
        return code


def write_second_generation(path: Path, n_rows: int) -> int:
    """Another process (this one) writes and checkpoints a newer generation at the path."""
    conn = open_stock(path)
    try:
        with conn:
            for i in range(n_rows):
                insert(conn, f"second generation {i}")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        return conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
    finally:
        conn.close()


@pytest.mark.parametrize("rename", [False, True], ids=["unlink", "rename"])
def test_retired_rows_recoverable_after_the_writer_process_exits(tmp_path, rename):
    path = tmp_path / "state.db"
    writer = GatewayWriter(path, wal_rows=4)
    try:
        writer.next_event("ready")
        lose_sidecars(path, rename=rename)

        writer.send("write")
        refused = writer.next_event("write")
        assert refused["refused"] is True, refused
        artifact = Path(refused["artifact"])
        assert artifact.is_dir() and manifest(artifact)["trigger"] == "halt"

        expected = write_second_generation(path, n_rows=400)

        writer.send("close")
        assert writer.next_event("closed")["error"] is None
        writer.send("quit")
        assert writer.wait_exit() == 0
    finally:
        if writer.proc.poll() is None:
            writer.proc.kill()
            writer.proc.wait()

    # The writer is gone and its unlinked WAL inode with it: recovery comes from the capture alone.
    recovered = recover(artifact, "state.db", tmp_path / "recovered")
    try:
        assert count_like(recovered, "uncheckpointed %") == 4, "retired WAL-only rows lost across exit"
        assert integrity_ok(recovered), "captured image + WAL do not form a consistent database"
    finally:
        recovered.close()

    # The writer's close neither checkpointed its stale frames over the newer generation nor deleted
    # the newer generation's sidecars.
    live = harness.connect(str(path), vfs="unix")
    try:
        assert integrity_ok(live)
        assert live.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == expected
        assert count_like(live, "second generation %") == 400
        assert count_like(live, "uncheckpointed %") == 0
    finally:
        live.close()
