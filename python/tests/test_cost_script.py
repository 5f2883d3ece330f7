"""python/bench/cost.py cannot rot: its smoke run (tiny lengths) must print W1's row, and even
at those lengths the guard's one `epoll_pwait` per write transaction shows exactly. The row's
total difference is not asserted: at smoke lengths the allocator's `mmap`/`munmap`/`read` calls
differ between two short runs by a few tenths (measured: +0.80 once), which is a benchmark's
business (docs/benchmarks.md has the real run), not a test's."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

from helpers import skip_unless_ci

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "cost.py"


def test_the_cost_script_counts_one_epoll_pwait_per_write_transaction():
    missing = [tool for tool in ("strace", "valgrind") if shutil.which(tool) is None]
    if missing:
        skip_unless_ci(f"the cost script needs {' and '.join(missing)}")
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--only", "W1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    row = re.search(r"^W1 .*?(\d+\.\d+)\s+(\d+\.\d+)\s+([+-]\d+\.\d+)\s", done.stdout, re.M)
    assert row, done.stdout
    assert "epoll_pwait +1.000" in done.stdout, done.stdout
