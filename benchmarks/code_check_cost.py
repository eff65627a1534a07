"""Cost of one python_tests check (plugins/code): wall seconds per check of a small passing program,
for each isolation level the machine allows and for 1 and all workers; prints the CPU model (lscpu)
and the load average it ran under.

    .venv/bin/python benchmarks/code_check_cost.py [--checks 60]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from typing import Literal

from star_code.checker import PythonTestsChecker, gold_answer
from star_code.sandbox import namespaces_work

PROGRAM = "def f(x):\n    return sorted(x)[::-1]\n"
GOLD = gold_answer("", "assert f([3, 1, 2]) == [3, 2, 1]\nassert f([]) == []")


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except OSError:
        return "unknown (no lscpu)"
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "unknown")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checks", type=int, default=60)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    print(f"CPU: {cpu_model()}; usable cores: {cores}; load average before: {os.getloadavg()}")
    levels: list[Literal["namespaces", "process"]] = ["process"]
    if namespaces_work() is None:
        levels.append("namespaces")
    for isolation in levels:
        for workers in sorted({1, cores}):
            checker = PythonTestsChecker(isolation=isolation, workers=workers)
            checker.check(PROGRAM, PROGRAM, GOLD)  # warm the file cache
            t0 = time.perf_counter()
            verdicts = checker.check_many([(PROGRAM, PROGRAM, GOLD)] * args.checks)
            seconds = time.perf_counter() - t0
            assert all(v.correct for v in verdicts)
            print(f"isolation={isolation:10s} workers={workers}: {args.checks} checks in {seconds:.2f} s = "
                  f"{1000 * seconds / args.checks:.1f} ms per check, {args.checks / seconds:.1f} checks/s")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
