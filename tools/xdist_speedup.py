"""What pytest-xdist workers give a slow target: the pytest door run on one process (``-n 0``) and
on N workers (``-n N``), alternately, ``--rounds`` times each; wall and CPU seconds (the pytest
process and its workers) of each run, the median speed-up, and the bound that splitting laws over
workers cannot pass: the whole run over its slowest law (read from the ``-n 0`` runs' durations).

    python tools/xdist_speedup.py TARGET [--profile quick] [--workers 2] [--rounds 2] [--only LAW ...]

TARGET as the pytest door takes it (``--attention-target``), e.g. ``examples/triton_attention.py:target``
(with ``TRITON_INTERPRET=1`` in the environment). Figures depend on the machine (cores, load):
docs/tutorial.md shows them with their stamp; no test compares them.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SLOWEST = re.compile(r"^\s*(?P<seconds>[\d.]+)s call\s+attention-spec::(?P<law>\w+)", re.MULTILINE)
OUTCOME = re.compile(r"^(?P<line>(?:\d+ \w+, )*\d+ \w+.* in [\d.]+s.*)$", re.MULTILINE)


def run(target: str, profile: str, workers: int, only: list[str]) -> tuple[float, float, str, str]:
    """One run of the pytest door (the laws ``only`` names, every law without): wall seconds, CPU
    seconds of its processes, its outcome line, and its output."""
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--attention-only",
               f"--attention-target={target}", f"--attention-profile={profile}", "-n", str(workers),
               "--durations=1", *(["-k", " or ".join(only)] if only else [])]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=os.environ.copy())
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    outcome = OUTCOME.findall(done.stdout)
    if done.returncode not in (0, 5) or not outcome:
        raise SystemExit(f"pytest -n {workers} exited {done.returncode}:\n"
                         f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return wall, cpu, outcome[-1].strip("= "), done.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/xdist_speedup.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("target")
    parser.add_argument("--profile", default="quick", choices=["quick", "ci", "thorough"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", nargs="+", default=[], metavar="LAW", help="these laws alone")
    args = parser.parse_args(argv)
    if args.workers < 2 or args.rounds < 1:
        parser.error(f"--workers must be at least 2 and --rounds at least 1, "
                     f"got {args.workers} and {args.rounds}")
    rows, walls = [], {0: [], args.workers: []}
    slowest: list[tuple[float, str]] = []
    for round_ in range(1, args.rounds + 1):
        for workers in (0, args.workers):
            wall, cpu, outcome, out = run(args.target, args.profile, workers, args.only)
            walls[workers].append(wall)
            if workers == 0:
                found = SLOWEST.search(out)
                if found:
                    slowest.append((float(found["seconds"]), found["law"]))
            rows.append((round_, f"-n {workers}", f"{wall:.1f}", f"{cpu:.1f}", outcome))
    from tabulate import tabulate

    print(f"{args.target}, pytest door at profile {args.profile}, {args.rounds} rounds")
    print(tabulate(rows, headers=["round", "workers", "wall s", "CPU s", "outcome"], tablefmt="github"))
    one, many = statistics.median(walls[0]), statistics.median(walls[args.workers])
    print(f"speed-up of -n {args.workers} over -n 0 (median wall): {one / many:.2f}x")
    if slowest:
        seconds, law = max(slowest)
        print(f"slowest law: {law}, {seconds:.1f} s of the -n 0 run's {one:.1f} s, so no split of the laws "
              f"over workers passes {one / max(seconds, one / args.workers):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
