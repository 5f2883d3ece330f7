"""The gateway writer of the seed scenario, in its own process: opens the database through the
extension, seeds and checkpoints history, leaves rows only in its WAL, then serves commands from
stdin (`write`, `close`, `quit`), answering each with one JSON line on stdout.

Usage: python gateway_writer.py <database> <wal-only rows>
"""

import json
import sys
from pathlib import Path

import harness


def emit(event: str, **fields) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def main() -> int:
    path = Path(sys.argv[1])
    wal_rows = int(sys.argv[2])
    harness.load_extension()
    conn = harness.open_guarded(path)
    conn.execute("PRAGMA wal_autocheckpoint=0")
    for i in range(20):
        harness.insert(conn, f"history {i}")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    for i in range(wal_rows):
        harness.insert(conn, f"uncheckpointed {i}")
    emit("ready", wal=harness.status(conn)["wal"])

    for line in sys.stdin:
        command = line.strip()
        if command == "write":
            try:
                harness.insert(conn, "after the loss")
            except harness.Error as e:
                emit(
                    "write",
                    refused=harness.is_refusal(e),
                    error=str(e),
                    artifact=harness.status(conn)["capture"],
                )
            else:
                emit("write", refused=False, error=None, artifact=None)
        elif command == "close":
            try:
                conn.close()
            except harness.Error as e:
                emit("closed", error=str(e))
            else:
                emit("closed", error=None)
        elif command == "quit":
            return 0
        else:
            emit("unknown", command=command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
