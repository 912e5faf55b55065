"""What rank threads cost against rank processes: the built-in ``ring`` checked at one profile and
seed with its ranks as threads of this process (``in_process=True``, as it is declared) and as
forked processes (``in_process=False``), alternately, each run ``--runs`` times; one row per law
with the median seconds of each and their ratio. Laws that always run on processes
(``ranks_match_golden``, the backward) are the control: their ratio is the machine's noise.

    python tools/rank_hosts.py [--profile ci] [--seed 0] [--runs 2] [--json]

Figures depend on the machine (cores, load); docs/targets.md shows them with their stamp.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import spec
from spec.builtin import load_rank_target
from spec.laws.ranks import IN_PROCESS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/rank_hosts.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="ci", choices=["quick", "ci", "thorough"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", type=int, default=2, help="runs of each host, alternating (default 2)")
    parser.add_argument("--json", action="store_true", help="the rows as JSON")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    ring = load_rank_target("ring")
    hosts = {"threads": ring.replace(in_process=True), "processes": ring.replace(in_process=False)}
    seconds: dict[str, dict[str, list[float]]] = {}
    for _ in range(args.runs):
        for host, target in hosts.items():
            report = spec.check(target, profile=args.profile, seed=args.seed)
            if not report.ok:
                print(f"ring failed on {host}: {[r.name for r in report.failures]}", file=sys.stderr)
                return 1
            for result in report.results:
                seconds.setdefault(result.name, {}).setdefault(host, []).append(result.seconds)
    rows = [{"law": law,
             "on threads when declared": "yes" if law in IN_PROCESS else "no (processes in both)",
             "in_process=True s": round(statistics.median(by["threads"]), 2),
             "in_process=False s": round(statistics.median(by["processes"]), 2),
             "ratio": round(statistics.median(by["threads"]) / statistics.median(by["processes"]), 2)}
            for law, by in seconds.items()]
    if args.json:
        print(json.dumps({"profile": args.profile, "seed": args.seed, "runs": args.runs, "rows": rows},
                         indent=1))
        return 0
    from tabulate import tabulate

    print(f"ring, profile {args.profile}, seed {args.seed}, median of {args.runs} runs of each host")
    print(tabulate(rows, headers="keys", tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
