"""``python -m spec check TARGET``: the conformance suite from the command line.

Exit 0: the target conforms. Exit 1: at least one law failed. Exit 2: usage error or a
target that does not load — one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from typing import Any

import numpy as np
from tabulate import tabulate

from cmdline import Parser, UsageError, fail, int_at_least, positive_number
from spec.builtin import BUILTIN, load_merge_target, load_rank_target
from spec.html import render_html
from spec.profiles import PROFILES
from spec.registry import LAWS
from spec.report import LOUD, Report, Result, render, strict_json
from spec.runner import OWN_KIND_FAMILIES, check, configure, load, select
from spec.shard import Shard, merge, parse_shard, report_from_dict
from spec.target import TargetError

_positive = int_at_least(1)
_seed = int_at_least(0)
_seconds = positive_number("expected a positive number of seconds")
_gib = positive_number("expected a positive number of GiB")


def _shard(text: str) -> Shard:
    """An argparse type: ``I/N`` (`spec.shard.parse_shard`)."""
    try:
        return parse_shard(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parser() -> argparse.ArgumentParser:
    top = Parser(prog="python -m spec", description="Check an attention implementation against the laws "
                  "of scaled dot-product attention.")
    commands = top.add_subparsers(dest="command", required=True, parser_class=Parser)
    check = commands.add_parser("check", help="run the properties against a target")
    check.add_argument("target", nargs="?",
                       help=f"built-in name ({', '.join(BUILTIN)}), package.module:attr or "
                       "path/to/file.py:attr")
    check.add_argument("--profile", choices=list(PROFILES), default="ci",
                       help="quick: 10 examples per law; ci: 40, derandomized (default); thorough: 400; "
                       "scale: the scale laws alone, a few calls each at the sizes where kernels overflow; "
                       "judge: every ci law and the long runs (64 calls in a row, then 100 each judged)")
    check.add_argument("--memory", type=_gib, metavar="GIB",
                       help="with --profile scale: what one call may need on the target's device, in GiB "
                       "(default: half the memory this machine has available); a case over it is not run, "
                       "and the report says so")
    check.add_argument("--max-examples", type=_positive, metavar="N", help="examples per law")
    check.add_argument("--seed", type=_seed, metavar="N",
                       help="random seed (changes the example stream; without it ci and quick are fixed)")
    check.add_argument("--shard", type=_shard, metavar="I/N",
                       help="run shard I of N (counted from 1) of the check: every law, under the shard's "
                       "own seed (shard 1: the check's; the others derived from --seed), so N shards draw N "
                       "times the examples; python -m spec merge makes one report of the shards' --json")
    check.add_argument("--only", nargs="+", action="extend", metavar="NAME",
                       help="run only these properties (repeatable)")
    check.add_argument("--isolation", choices=["thread", "caller", "process"],
                       help="where each call runs (overrides the target's declaration): thread (default: "
                       "a worker thread under the deadline), caller (this thread, no deadline), process "
                       "(a forked worker process: a crash such as SIGSEGV or a call stuck in C is that "
                       "law's failure and the run goes on; Linux/macOS; fork copies one thread: torch "
                       "runs single-threaded in the worker, and a library whose own thread pool ran "
                       "before the fork may hang there, which the deadline then fails)")
    check.add_argument("--deadline", type=_seconds, metavar="SECONDS",
                       help="time limit per call (overrides the profile's and the target's)")
    check.add_argument("--keep-going", action="store_true",
                       help="run every law, even after the target missed its deadline in two laws or "
                       "raised the same exception in three in a row (without it the run ends there, the "
                       "laws left reported not run)")
    check.add_argument("--power", action="store_true",
                       help="also judge the suite's own cases, never the target: which trivial kernels "
                       "(zeros, the mean of V, uniform weights, ignoring the mask or the scale, a lower "
                       "precision) each law's calls tell from the golden; each law's note says its power, "
                       "a section sums it up and flags a law whose cases reject none (JSON: \"power\")")
    check.add_argument("--budget-s", type=_seconds, metavar="SECONDS",
                       help="bound the wall time of the whole check: once spent no call of the target "
                       "starts, the law in progress stops and the laws left are reported not run (the "
                       "summary then says the run is incomplete)")
    check.add_argument("--expected-failures", metavar="FILE",
                       help="known deviations, one 'law[dtype]  # reason' (or 'law  # reason') a line: "
                       "such a law still runs; a failure is XFAIL (the run conforms), a pass XPASS (the "
                       "run fails)")
    check.add_argument("--device", metavar="DEVICE",
                       help="for the framework targets (torch, jax, ...): the device their arrays go to "
                       "(torch: cpu, cuda, cuda:1; jax: cpu, gpu); default cpu")
    check.add_argument("--json", metavar="FILE", help="also write the report as JSON ('-' for stdout only); "
                       "a non-finite number is the string \"Infinity\", \"-Infinity\" or \"NaN\"")
    check.add_argument("--html", metavar="FILE", help="also write the report as one self-contained HTML page "
                       "(whatever the verdict): the table, each failure, and a heat map of the error of "
                       "each failure that compared arrays")
    audit = commands.add_parser("audit", help="run another harness's check (a problem file) and the suite on "
                                "wrong kernels, side by side")
    audit.add_argument("problem", metavar="PROBLEM",
                       help="a Python file in KernelBench's shape: get_inputs() (q, k, v), "
                       "reference(q, k, v) or a class Model, atol and rtol")
    audit.add_argument("--trials", type=_positive, default=5, metavar="N",
                       help="the check's trials, each with get_inputs() under its own seed (default 5)")
    audit.add_argument("--profile", choices=list(PROFILES), default="quick",
                       help="the suite's profile for each kernel (default quick)")
    audit.add_argument("--json", metavar="FILE", help="also write the rows as JSON ('-' for stdout only)")
    merge = commands.add_parser("merge", help="merge the --json reports of a check's shards (--shard I/N) "
                                "into one report")
    merge.add_argument("reports", nargs="+", metavar="REPORT",
                       help="the shards' JSON reports, each shard of the check once, in any order")
    merge.add_argument("--json", metavar="FILE",
                       help="also write the merged report as JSON ('-' for stdout only)")
    merge.add_argument("--html", metavar="FILE", help="also write the merged report as one HTML page")
    check.add_argument("--list", action="store_true", help="list the properties (and, with TARGET, "
                       "which it would skip) and exit")
    return top


def list_properties(target_spec: str | None) -> str:
    own = (load_rank_target(target_spec) or load_merge_target(target_spec)) if target_spec else None
    target = own or (load(target_spec) if target_spec else None)
    family = next((f for f, kind in OWN_KIND_FAMILIES.items() if type(own).__name__ in kind), "")
    rows = []
    for name, prop in LAWS.items():
        if own is not None and prop.family != family:
            kind = f"a {prop.family} law" if prop.family in OWN_KIND_FAMILIES else "an attention law"
            skip: str | None = f"{kind} (the target is {OWN_KIND_FAMILIES[family]})"
        else:
            skip = prop.needs(target) if target else None
        rows.append([name, ("skipped: " + skip) if skip else prop.statement.replace("``", "")])
    return tabulate(rows, headers=["law", "statement"], tablefmt="simple", maxcolwidths=[None, 80])


def writable(path: str, flag: str) -> None:
    """Raise UsageError naming ``flag`` when ``path`` cannot be written (a folder missing or not
    writable, a folder at the path), before anything runs."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        why = "is a folder" if os.path.isdir(path) else "its folder is not writable" \
            if os.path.isdir(folder) else "its folder does not exist"
        raise UsageError(f"cannot write {flag} {path}: {why}")


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line, options before or after TARGET: ``--only NAME... TARGET`` gives the
    last name to TARGET when it is not a law (``--only`` takes several names)."""
    args = parser().parse_args(argv)
    if args.command == "check" and args.target is None and args.only and args.only[-1] not in LAWS:
        args.target = args.only.pop()
        if not args.only:
            raise UsageError("--only needs at least one law NAME before TARGET")
    return args


def audit_main(args: argparse.Namespace) -> int:
    """``python -m spec audit PROBLEM``: exit 0 when the suite rejects every wrong kernel, 1 when
    one conforms, 2 for a problem file that cannot be read."""
    from spec import audit

    try:
        if args.json and args.json != "-":
            writable(args.json, "--json")
        problem = audit.load_problem(args.problem)
        with np.errstate(all="ignore"):  # the wrong kernels' overflows are theirs to make
            rows = audit.audit(problem, trials=args.trials, profile=args.profile,
                               each=lambda r: print(f"  {r.kernel} …", file=sys.stderr, flush=True))
    except (UsageError, ValueError, TypeError) as e:
        return fail("python -m spec audit", e)
    if args.json:
        text = strict_json({"problem": problem.name, "atol": problem.atol, "rtol": problem.rtol,
                            "trials": args.trials, "profile": args.profile,
                            "rows": [r.to_dict() for r in rows]})
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w", encoding="utf-8") as f:
                f.write(text + "\n")
    if args.json != "-":
        print(audit.render(problem, rows, args.trials, args.profile))
    return 0 if all(not r.suite_ok for r in rows) else 1


def read_report(path: str) -> Report:
    """The JSON report at ``path`` (`spec.shard.report_from_dict`); UsageError naming it when it
    cannot be read or is no report."""
    try:
        with open(path, encoding="utf-8") as f:
            return report_from_dict(json.load(f))
    except OSError as e:
        raise UsageError(f"cannot read REPORT {path}: {e.strerror}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        said = f"no {e}" if isinstance(e, KeyError) else str(e)
        raise UsageError(f"REPORT {path}: {said}") from None


def merge_main(args: argparse.Namespace) -> int:
    """``python -m spec merge REPORT...``: the shards' reports as one; exit as ``check``'s (0: the
    merged check conforms, 1: a law failed in some shard, 2: reports that are not the shards of one
    check)."""
    try:
        for flag in ("json", "html"):
            if getattr(args, flag) and getattr(args, flag) != "-":
                writable(getattr(args, flag), f"--{flag}")
        reports = [read_report(path) for path in args.reports]
        report = merge(reports, args.reports)
    except (UsageError, ValueError) as e:
        return fail("python -m spec merge", e)
    return written(report, args.json, args.html, "python -m spec merge")


def written(report: Report, json_to: str | None, html_to: str | None, prog: str) -> int:
    """Write ``report`` where ``--json`` and ``--html`` say, print it (unless the JSON goes to
    stdout); the exit status: 0 when it conforms, 1 when not, 2 when a file cannot be written."""
    to_stdout = json_to == "-"
    if json_to:
        text = report.to_json()
        if to_stdout:
            print(text)
        else:
            try:
                with open(json_to, "w", encoding="utf-8") as f:  # UTF-8: laws use √, ≤, −
                    f.write(text + "\n")
            except OSError as e:
                return fail(prog, f"cannot write --json {json_to}: {e.strerror}")
    if html_to:
        try:
            with open(html_to, "w", encoding="utf-8") as f:
                f.write(render_html(report))
        except OSError as e:
            return fail(prog, f"cannot write --html {html_to}: {e.strerror}")
    if not to_stdout:
        print(render(report))
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(argv)
        if args.command == "audit":
            return audit_main(args)
        if args.command == "merge":
            return merge_main(args)
        if args.list:
            print(list_properties(args.target))
            return 0
        if not args.target:
            raise UsageError("check needs a TARGET (a built-in name, package.module:attr or "
                             "path/to/file.py:attr)")
        select(args.only)  # unknown law names: exit 2 before anything runs
        if args.memory is not None and args.profile != "scale":
            raise UsageError("--memory is the budget of --profile scale; give --profile scale")
        if args.html:
            writable(args.html, "--html")
        target: Any = load_rank_target(args.target) or load_merge_target(args.target)
        if target is not None and (args.device or args.isolation or args.deadline or args.expected_failures):
            kind = "context-parallel target" if type(target).__name__ == "RankTarget" else "merge operator"
            raise UsageError("--device, --isolation, --deadline and --expected-failures apply to attention "
                             f"targets, not to the {kind} {args.target!r}")
        if target is None:
            target = configure(load(args.target, device=args.device), isolation=args.isolation,
                               deadline=args.deadline, expected_failures=args.expected_failures)
    except (UsageError, TargetError, ValueError) as e:
        return fail("python -m spec", e)
    to_stdout = args.json == "-"

    def progress(result: Result) -> None:
        if not to_stdout:
            status = result.status.upper() if result.status in LOUD else result.status
            print(f"  {result.name} … {status}", file=sys.stderr, flush=True)

    # What is loaded by now (NumPy, Hypothesis, the laws, the target) lives as long as the process:
    # frozen, it is out of the collector's reach, so the run's collections scan only what the run
    # makes, and the workers it forks share those pages instead of copying them (Python's gc docs).
    gc.freeze()
    try:
        report = check(target, profile=args.profile, max_examples=args.max_examples, seed=args.seed,
                       only=args.only, each=progress, source=args.target, memory=args.memory,
                       keep_going=args.keep_going, power=args.power, budget_s=args.budget_s,
                       shard=args.shard)
    except KeyboardInterrupt:  # Ctrl-C: the laws done so far were listed; every worker is reaped
        print("python -m spec: interrupted", file=sys.stderr)
        return 130  # 128 + SIGINT, as a shell reports it
    return written(report, args.json, args.html, "python -m spec")
