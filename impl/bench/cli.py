"""``python -m impl.bench``: attention's n² cost, measured — naive, tiled (flash), PyTorch and JAX.

One head, float32, d_k = d_v = 128 by default, n doubling from 512 to 16,384 tokens. For each
implementation and size it reports the median wall time over ``--repeat`` samples, the useful
GFLOP/s, the time ratio per doubling (pure n² gives 4) and the peak traced memory.
``--backward`` times the gradients instead: ``flash_attention_backward`` against autograd of
PyTorch's fused SDPA forward (and the dense ``attention_backward`` as "naive"). ``--sparse TOPK``
times flash's top-k sparse path against its dense path as n grows at that top-k
(`impl.bench.sparse`; default sizes 512 … 8192).

The command line: its flags, the checks that refuse a bad one before any timing (one line on
stderr, exit status 2), and what each mode prints and writes. How it measures is in
`impl.bench.measure`, what it compares in `impl.bench.calls`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections.abc import Sequence

from cmdline import Parser, UsageError, check_output_dir, fail, int_at_least, seconds_between
from impl.bench.calls import PEERS, available_names, found
from impl.bench.measure import NAIVE_MAX, PAUSE_S, blas_runtime, run_benchmark
from impl.bench.plot import plot
from impl.bench.profiling import profile_lines
from impl.bench.render import format_profile, format_report, loads, markdown
from impl.bench.sparse import format_sparse, run_sparse

PROG = "python -m impl.bench"
DEFAULT_SIZES = (512, 1024, 2048, 4096, 8192, 16384)
SPARSE_SIZES = (512, 1024, 2048, 4096, 8192)


_positive = int_at_least(1)
_seconds = seconds_between(0, 60)


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", type=_positive, default=None, metavar="N",
                   help="numbers of tokens (default: 512 … 16384, doubling; --sparse: 512 … 8192)")
    p.add_argument("--repeat", type=_positive, default=5, help="timed samples per size (default 5)")
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True,
                   help="causal mask (default on)")
    p.add_argument("--backward", action="store_true",
                   help="time the gradients: flash_attention_backward against autograd of torch's fused SDPA")
    p.add_argument("--sparse", type=_positive, metavar="TOPK",
                   help="time flash's top-k sparse path (TOPK keys per query) against its dense path; "
                        "prints a table, --json writes the record")
    p.add_argument("--d-k", type=_positive, default=128, help="query/key width (default 128)")
    p.add_argument("--d-v", type=_positive, default=128, help="value width (default 128)")
    p.add_argument("--impl", action="append", dest="impls", metavar="NAME",
                   help="an implementation to run: naive, flash, torch, jax (repeatable; default all found)")
    p.add_argument("--naive-max", type=_positive, default=NAIVE_MAX,
                   help=f"largest n for the naive path (default {NAIVE_MAX}; it needs O(n²) memory)")
    p.add_argument("--pause", type=_seconds, default=PAUSE_S, metavar="SECONDS",
                   help=f"sleep before each timed call, so idle worker threads settle (default {PAUSE_S})")
    p.add_argument("--json", metavar="FILE", help="write the record as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="write a log-log plot (needs matplotlib)")
    p.add_argument("--markdown", metavar="FILE.md", help="write the report as Markdown, for the docs")
    p.add_argument("--from-json", metavar="FILE", help="time nothing: render the record a --json run stored "
                   "(text, and --markdown/--plot when given)")
    p.add_argument("--profile", action="store_true",
                   help="instead of timing peers, profile flash's tile loop line by line at each size "
                        "(one thread; needs line_profiler)")
    return p


def _check(args: argparse.Namespace) -> list[str]:
    """Refuse what would fail only after minutes of timing."""
    if args.sparse is not None:
        given = [flag for flag, on in (("--backward", args.backward), ("--profile", args.profile),
                                       ("--impl", args.impls), ("--from-json", args.from_json),
                                       ("--plot", args.plot), ("--markdown", args.markdown)) if on]
        if given:
            raise UsageError(f"--sparse times flash's two paths and writes --json only: not with {given[0]}")
        if args.json:
            check_output_dir("--json", args.json)
        return ["sparse", "dense"]
    if args.from_json:
        if args.json or args.profile:
            raise UsageError("--from-json renders a stored record: use --markdown or --plot, "
                             "not --json or --profile")
        if not os.path.isfile(args.from_json):
            raise UsageError(f"--from-json: no file {args.from_json!r}")
    available = available_names(backward=args.backward)
    names = args.impls or available
    known = ("naive", "flash", *PEERS)
    for name in names:
        if name not in known:
            raise UsageError(f"--impl: unknown implementation {name!r} (choose {', '.join(known)})")
        if name == "jax" and args.backward:
            raise UsageError("--impl jax: --backward compares with torch only (JAX has no fused CPU kernel)")
        if name not in available:
            hint = "pip install torch==2.13.0" if name == "torch" else "pip install jax"
            raise UsageError(f"--impl {name}: {name} is not installed ({hint})")
    names = list(dict.fromkeys(names))
    for flag, path in (("--json", args.json), ("--plot", args.plot), ("--markdown", args.markdown)):
        if path:
            check_output_dir(flag, path)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--plot needs matplotlib, which is not installed") from None
    if args.profile:
        if args.plot or args.json:
            raise UsageError("--profile writes a report only: use --markdown, not --json or --plot")
        if not found("line_profiler"):
            raise UsageError("--profile needs line_profiler, which is not installed "
                             "(pip install line_profiler)")
    return names


def _profile(args: argparse.Namespace, command: str) -> int:
    """``--profile``: print (and with ``--markdown``, write) the line profile at each size."""
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    load = os.getloadavg()
    reports = [
        format_profile(profile_lines(n, args.d_k, args.d_v, causal=args.causal, backward=args.backward))
        for n in args.sizes
    ]
    blas = ", ".join(f"{b['internal_api']} {b['version']} ({b['architecture']} kernels)"
                     for b in blas_runtime())
    footer = (f"one thread, one-thread BLAS ({blas}); load average before {loads(load)}, "
              f"after {loads(os.getloadavg())}; {date}")
    text = "\n\n".join([*reports, footer])
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join([
                f"# Where flash's time goes, line by line: {'backward' if args.backward else 'forward'}",
                "",
                f"Generated by `{command}` on {date}; regenerate with the same command, never edit by hand.",
                "",
                text,
                "",
            ]))
    return 0


def _sparse(args: argparse.Namespace, command: str) -> int:
    """``--sparse TOPK``: print (and with ``--json``, write) the sparse against dense record."""
    record = run_sparse(args.sizes or list(SPARSE_SIZES), topk=args.sparse, d_k=args.d_k, d_v=args.d_v,
                        repeat=args.repeat, causal=args.causal, pause=args.pause, command=command)
    print(format_sparse(record))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1, allow_nan=False)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; 0 on success, 2 (and one line on stderr) on a bad one."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = _parser().parse_args(argv)
        names = _check(args)
    except UsageError as err:
        return fail(PROG, err)
    except SystemExit as done:  # --help
        return int(done.code or 0)
    command = " ".join([PROG, *argv])
    if args.sparse is not None:
        return _sparse(args, command)
    args.sizes = args.sizes or list(DEFAULT_SIZES)
    if args.profile:
        return _profile(args, command)
    if args.from_json:
        try:
            with open(args.from_json, encoding="utf-8") as f:
                record = json.load(f)
            format_report(record)
        except (ValueError, KeyError, TypeError) as err:
            return fail(PROG, f"--from-json: {args.from_json} is not a record of "
                        f"python -m impl.bench --json ({type(err).__name__}: {err})")
    else:
        record = run_benchmark(args.sizes, names=names, repeat=args.repeat, causal=args.causal,
                               d_k=args.d_k, d_v=args.d_v, naive_max=args.naive_max, pause=args.pause,
                               backward=args.backward, command=command)
    print(format_report(record))
    if args.json and not args.from_json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1, allow_nan=False)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(record, args.markdown))
    if args.plot:
        plot(record, args.plot)
    return 0
