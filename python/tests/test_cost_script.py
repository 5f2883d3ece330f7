"""python/bench/cost.py cannot rot: its smoke run (tiny lengths) must print W1's row, and even
at those lengths the guard's extra syscalls per write transaction are exactly its one
`epoll_pwait` (docs/benchmarks.md has the real run)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

from helpers import skip_unless_ci

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "cost.py"


def test_the_cost_script_measures_one_extra_syscall_per_write_transaction():
    missing = [tool for tool in ("strace", "valgrind") if shutil.which(tool) is None]
    if missing:
        skip_unless_ci(f"the cost script needs {' and '.join(missing)}")
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--only", "W1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    row = re.search(r"^W1 .*?(\d+\.\d+)\s+(\d+\.\d+)\s+([+-]\d+\.\d+)\s", done.stdout, re.M)
    assert row, done.stdout
    assert row.group(3) == "+1.00", done.stdout
    assert "epoll_pwait +1.000" in done.stdout, done.stdout
