"""``python -m calc.bench [--runs N]``: cold-start time of ``python -m calc gpt3``, as JSON.

Each run is a fresh interpreter (SymPy import included), so this is the time a user waits. Wall time
depends on what else the machine runs; CPU time (user + system, from the OS) much less, so both are
reported, with the same for ``import sympy`` alone and for an empty interpreter, to show where the
time goes. Goal: ≤ 1.0 s wall.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {
    "python -m calc gpt3": [sys.executable, "-m", "calc", "gpt3"],
    "python -c 'import sympy'": [sys.executable, "-c", "import sympy"],
    "python -c pass": [sys.executable, "-c", "pass"],
}


def time_run(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one subprocess."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def bench(runs: int) -> dict[str, object]:
    subprocess.run(COMMANDS["python -m calc gpt3"], cwd=ROOT, stdout=subprocess.DEVNULL, check=True)  # .pyc
    results: dict[str, object] = {"runs": runs, "python": sys.version.split()[0], "cpus": os.cpu_count(),
                                  "load_average_1min": os.getloadavg()[0]}
    for name, argv in COMMANDS.items():
        walls, cpus = zip(*(time_run(argv) for _ in range(runs)), strict=True)
        results[name] = {
            "wall_s_median": round(statistics.median(walls), 3),
            "wall_s_min": round(min(walls), 3),
            "cpu_s_median": round(statistics.median(cpus), 3),
        }
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calc.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="fresh interpreters per command (default: 5)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be a positive integer, got {args.runs}")
    print(json.dumps(bench(args.runs), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
