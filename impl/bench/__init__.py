"""The benchmark behind ``python -m impl.bench`` (attention's n² cost, measured), one module per job:

* `impl.bench.calls` — what is timed: each implementation at n tokens on its best path, and that
  path in words;
* `impl.bench.measure` — the timing: interleaved rounds, samples, the sgemm floor, traced memory,
  and the record ``--json`` writes (its keys are listed in that module's docstring);
* `impl.bench.sparse` — ``--sparse TOPK``: flash's top-k sparse path against its dense path as n
  grows, time and traced memory;
* `impl.bench.profiling` — ``--profile``: one thread's time in flash's tile loop, line by line;
* `impl.bench.render` — the record as text and as a Markdown page, and the line profile's table;
* `impl.bench.plot` — the log-log plot (matplotlib, imported only when plotting);
* `impl.bench.cli` — the command line: ``main(argv) -> int``.
"""

from impl.bench.calls import bench_arrays, make_call, torch_inputs
from impl.bench.cli import main
from impl.bench.measure import run_benchmark, useful_flops, visible_pairs
from impl.bench.profiling import profile_lines
from impl.bench.render import format_profile, format_report, markdown

__all__ = [
    "bench_arrays",
    "format_profile",
    "format_report",
    "main",
    "make_call",
    "markdown",
    "profile_lines",
    "run_benchmark",
    "torch_inputs",
    "useful_flops",
    "visible_pairs",
]
