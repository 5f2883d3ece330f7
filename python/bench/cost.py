"""The guard's cost in a Python host: a guarded and a stock standard-library `sqlite3` connection,
in the same interpreter, on one-row autocommit INSERTs (W1) and point SELECTs (R1), counted in
syscalls (`strace -c -f`) and user-space instructions (`valgrind --tool=callgrind`) per operation.

Each workload runs in a child process of this interpreter (`cost.py child ...`), once per
side (stock: plain `sqlite3.connect()` with nothing loaded; guard: `hermes_guard.enable()`, then
the same `sqlite3.connect()`), under each tool, at two run lengths; the difference of the counts
divided by the difference of the lengths is the cost of one operation, so start-up, the import
of the package, opening and closing cancel. The statements are the Rust bench's W1 and R1
(cli/src/bench/workloads.rs): the table `t(id INTEGER PRIMARY KEY, k, payload)`, a 96-byte
payload, WAL, `synchronous=NORMAL`, default autocheckpoint; R1 reads a 100,000-row database.

Usage (from a venv where the package is installed, e.g. python/run-tests.sh's):

    python python/bench/cost.py                 # W1 and R1, about a minute
    python python/bench/cost.py --only W1       # one workload
    python python/bench/cost.py --smoke         # tiny run lengths: checks the script, numbers mean nothing

Targets, those of the Rust bench (docs/benchmarks.md): W1 at most one extra syscall per write
transaction (plus one per checkpoint) and +1 % instructions; R1 no extra syscall and +1 %.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

ALLOCATOR_SYSCALLS = {"brk", "mmap", "munmap", "mremap", "madvise"}
READ_ROWS = 100_000
LENGTHS = {"W1": (500, 2500), "R1": (2000, 12000)}
SMOKE_LENGTHS = {"W1": (5, 15), "R1": (10, 30)}
TITLES = {"W1": "1-row INSERT per txn, WAL, synchronous=NORMAL", "R1": "point SELECT by primary key"}
TARGET_INSTRUCTIONS = 1.0  # percent


def payload(i: int) -> str:
    return f"{i:>12} the quick brown fox jumps over the lazy dog; message body of a typical turn .."


def make_read_db(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, k INTEGER NOT NULL, payload TEXT NOT NULL)")
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO t (k, payload) VALUES (?, ?)", ((i, payload(i)) for i in range(READ_ROWS)))
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def child(workload: str, side: str, ops: int, directory: Path) -> None:
    """One measured run: open, `ops` operations, report the checkpoints, close."""
    if side == "guard":
        import hermes_guard

        hermes_guard.enable()
    if workload == "W1":
        path = directory / "w.db"
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, k INTEGER NOT NULL, payload TEXT NOT NULL)")
        insert = "INSERT INTO t (k, payload) VALUES (?, ?)"
        for i in range(ops):
            conn.execute(insert, (i, payload(i)))
    else:
        path = directory / "r.db"
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("SELECT count(*), sum(length(payload)) FROM t").fetchone()  # warm the cache
        select = "SELECT payload FROM t WHERE id = ?"
        key = 0x9E3779B97F4A7C15
        for _ in range(ops):  # xorshift64, as the Rust bench
            key ^= (key << 13) & 0xFFFFFFFFFFFFFFFF
            key ^= key >> 7
            key ^= (key << 17) & 0xFFFFFFFFFFFFFFFF
            conn.execute(select, (key % READ_ROWS + 1,)).fetchone()
    if side == "guard":
        assert hermes_guard.status(conn).wal is not None, "the guarded side is not guarded"
    wal = Path(str(path) + "-wal")
    header = wal.read_bytes()[:16] if wal.exists() else b""
    print("checkpoints", int.from_bytes(header[12:16], "big") if len(header) == 16 else 0, flush=True)
    conn.close()


def strace_counts(summary: str) -> dict:
    counts = {}
    for line in summary.splitlines():
        fields = line.split()
        # % time, seconds, usecs/call, calls, [errors,] syscall
        if len(fields) < 5 or not re.fullmatch(r"[\d.]+", fields[0]) or fields[-1] == "total":
            continue
        counts[fields[-1]] = int(fields[3])
    return counts


def callgrind_total(text: str) -> int:
    for key in ("totals:", "summary:"):
        for line in text.splitlines():
            if line.startswith(key):
                return int(line.split()[1])
    raise RuntimeError("no totals:/summary: line in callgrind's output")


class Runner:
    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.env = dict(os.environ, PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1")
        self.env.pop("HERMES_GUARD_DEFAULT", None)

    def child_args(self, workload: str, side: str, ops: int, directory: Path) -> list:
        return [sys.executable, os.path.abspath(__file__), "child", workload, side, str(ops), str(directory)]

    def scratch(self, workload: str, read_db: Path) -> Path:
        d = Path(tempfile.mkdtemp(dir=self.workdir))
        if workload == "R1":
            for suffix in ("", "-wal", "-shm"):
                if Path(str(read_db) + suffix).exists():
                    shutil.copyfile(str(read_db) + suffix, d / ("r.db" + suffix))
        return d

    def run(self, tool: list, args: list) -> str:
        done = subprocess.run(tool + args, env=self.env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(tool + args)} exited with {done.returncode}: {done.stderr[-2000:]}")
        return done.stdout

    def syscalls(self, workload: str, side: str, ops: int, read_db: Path):
        d = self.scratch(workload, read_db)
        out = d / "strace.txt"
        stdout = self.run(["strace", "-f", "-c", "-o", str(out), "--"], self.child_args(workload, side, ops, d))
        checkpoints = int(re.search(r"^checkpoints (\d+)", stdout, re.M).group(1))
        return strace_counts(out.read_text()), checkpoints

    def instructions(self, workload: str, side: str, ops: int, read_db: Path) -> int:
        d = self.scratch(workload, read_db)
        out = d / "callgrind.out"
        self.run(["valgrind", "--tool=callgrind", "-q", f"--callgrind-out-file={out}"],
                 self.child_args(workload, side, ops, d))
        return callgrind_total(out.read_text())


def measure(workloads: list, smoke: bool) -> int:
    for tool in ("strace", "valgrind"):
        if shutil.which(tool) is None:
            sys.exit(f"cost.py needs {tool} (apt-get install strace valgrind)")
    import hermes_guard  # the guarded side needs the package in this interpreter

    lengths = SMOKE_LENGTHS if smoke else LENGTHS
    print(f"python {sys.version.split()[0]} ({sys.executable}), SQLite {sqlite3.sqlite_version}, "
          f"hermes_guard from {os.path.dirname(hermes_guard.__file__)}")
    print("per operation, from the difference of two run lengths "
          + ", ".join(f"{w} {a}/{b}" for w, (a, b) in lengths.items() if w in workloads))
    header = (f"{'id':<4} {'workload':<46}{'sys stock':>10}{'sys guard':>10}{'extra':>8}"
              f"{'instr stock':>13}{'instr guard':>13}{'extra':>9}   {'target':<22}result")
    lines, details, failed = [], [], 0
    with tempfile.TemporaryDirectory(prefix="hermes-guard-py-cost-") as tmp:
        workdir = Path(tmp)
        read_db = workdir / "read.db"
        if "R1" in workloads:
            make_read_db(read_db)
        runner = Runner(workdir)
        for w in workloads:
            short, long = lengths[w]
            per = {}
            for side in ("stock", "guard"):
                (s_counts, s_ck), (l_counts, l_ck) = (runner.syscalls(w, side, n, read_db) for n in (short, long))
                i_short, i_long = (runner.instructions(w, side, n, read_db) for n in (short, long))
                names = set(s_counts) | set(l_counts)
                by_name = {n: (l_counts.get(n, 0) - s_counts.get(n, 0)) / (long - short) for n in names}
                per[side] = {
                    "sys": sum(v for n, v in by_name.items() if n not in ALLOCATOR_SYSCALLS),
                    "alloc": sum(v for n, v in by_name.items() if n in ALLOCATOR_SYSCALLS),
                    "by_name": by_name,
                    "instr": (i_long - i_short) / (long - short),
                    "checkpoints": (l_ck - s_ck) / (long - short),
                }
            stock, guard = per["stock"], per["guard"]
            extra_sys = guard["sys"] - stock["sys"]
            extra_instr = 100.0 * (guard["instr"] - stock["instr"]) / stock["instr"]
            allowed = (1.0 + guard["checkpoints"]) if w == "W1" else 0.0
            ok = extra_sys <= allowed + 0.005 and extra_instr <= TARGET_INSTRUCTIONS
            failed += not ok
            target = f"+{allowed:.2f} sys, +{TARGET_INSTRUCTIONS:g}%"
            lines.append(f"{w:<4} {TITLES[w]:<46}{stock['sys']:>10.2f}{guard['sys']:>10.2f}{extra_sys:>+8.2f}"
                         f"{stock['instr']:>13,.0f}{guard['instr']:>13,.0f}{extra_instr:>+8.2f}%   {target:<22}"
                         f"{'PASS' if ok else 'MISS'}")
            extra_by_name = {n: guard["by_name"].get(n, 0) - stock["by_name"].get(n, 0)
                             for n in set(guard["by_name"]) | set(stock["by_name"])}
            listed = ", ".join(f"{n} {v:+.3f}" for n, v in sorted(extra_by_name.items()) if abs(v) >= 0.0005)
            details.append(f"{w}: extra syscalls per operation by name: {listed or 'none'}; "
                           f"allocator's (not in the columns) stock {stock['alloc']:.3f}, guard "
                           f"{guard['alloc']:.3f}; checkpoints per operation {guard['checkpoints']:.3f}")
    print(header)
    print("\n".join(lines))
    print()
    print("\n".join(details))
    if smoke:
        print("(--smoke: run lengths too short for the numbers to mean anything)")
        return 0
    return 1 if failed else 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        _, _, workload, side, ops, directory = sys.argv
        child(workload, side, int(ops), Path(directory))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="W1,R1", help="workloads, comma-separated: W1, R1")
    parser.add_argument("--smoke", action="store_true", help="tiny run lengths (the numbers mean nothing)")
    args = parser.parse_args()
    workloads = [w.strip().upper() for w in args.only.split(",") if w.strip()]
    unknown = [w for w in workloads if w not in LENGTHS]
    if unknown or not workloads:
        parser.error(f"unknown workload(s) {unknown}: choose from {', '.join(LENGTHS)}")
    return measure(workloads, args.smoke)


if __name__ == "__main__":
    sys.exit(main())
