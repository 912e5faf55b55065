"""The scale profile's own cost: the golden at sampled rows against the full golden, and the suite's
time per call beside the target's own, as n grows.

For a causal square of n queries and keys (one head, d = 32, float32: the scale profile's
``causal_square``), each size is timed for: ``flash`` (`impl.flash_attention`, the built-in
target) on the call; the suite's judgement of that call at the sampled rows — the inputs
(`spec.scale_plan.inputs_of`), the rows (`rows_of`), the golden, baseline and floor there
(`spec.sampled.expected_rows`, `spec.laws.scale.long_row_floor`) and the comparison — which is what
``scale_matches_golden`` adds to the call; and the full golden (`spec.oracle.golden_of`: every
row, the n × n pattern in float64) up to ``--full-max``. A second table fixes n and varies the
rows checked, to show the golden's cost linear in rows × n_k.

    python tools/scale_bench.py --json docs/bench_scale.json --markdown docs/bench_scale.md \\
        --plot docs/bench_scale.png

Each cell is the fastest of ``--repeat`` rounds after one round not timed (flash past
``--flash-repeat-max``: one round, after one not timed). The figures depend on the machine and
its load: the page carries the command, the date and the machine (`tools.docs_outputs.machine`);
regenerate it with the same command, never by hand.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from spec import oracle, sampled, tolerance  # noqa: E402
from spec.builtin import load_target  # noqa: E402
from spec.cases import Case  # noqa: E402
from spec.laws import scale  # noqa: E402
from spec.scale_plan import inputs_of, rows_of  # noqa: E402
from tools.docs_outputs import machine  # noqa: E402

SIZES = (1_024, 2_048, 4_096, 8_192, 16_384, 32_768, 65_536)
ROWS = (8, 32, 128, 512, 2_048)
WIDTH = 32


def timed(fn: Callable[[], Any], repeat: int) -> float:
    """The fastest wall time of ``repeat`` calls, in seconds (the one least disturbed by other work
    on the machine), after one call not timed (the first pays for imports, caches, BLAS's threads)."""
    fn()
    found = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        found.append(time.perf_counter() - start)
    return min(found)


def case_of(n: int) -> Case:
    return Case(dtype="float32", ndim=4, batch=1, heads=1, n_q=n, n_k=n, d_k=WIDTH, d_v=WIDTH, seed=2,
                causal=True)


def judge(target: Any, case: Case, out: np.ndarray) -> float:
    """What ``scale_matches_golden`` does beside the call, timed once: the ratio it finds."""
    inputs = inputs_of(case)
    rows = rows_of(target, case, inputs)
    want = sampled.expected_rows(target, inputs, rows, baseline_in=scale.accumulator(target, inputs))
    cmp = tolerance.compare(out[..., rows, :], want.out, want.baseline, rows=want.seen,
                            tolerance=target.tolerance, floor_=scale.long_row_floor(target, inputs, rows))
    return cmp.ratio


def by_size(sizes: tuple[int, ...], full_max: int, repeat: int,
            flash_repeat_max: int) -> list[dict[str, Any]]:
    from impl import flash_attention

    target = load_target("flash")
    found = []
    for n in sizes:
        case = case_of(n)
        inputs = inputs_of(case)
        rows = rows_of(target, case, inputs)
        times = repeat if n <= flash_repeat_max else 1
        out_box: list[np.ndarray] = []

        def call(inputs: Any = inputs, box: list[np.ndarray] = out_box) -> None:
            box[:] = [flash_attention(inputs.q, inputs.k, inputs.v, causal=True)]

        t_flash = timed(call, times)
        out = out_box[0].astype(np.float64)
        ratio = judge(target, case, out)
        t_suite = timed(lambda case=case, out=out: judge(target, case, out), repeat)
        t_sampled = timed(lambda inputs=inputs, rows=rows: sampled.golden_rows(inputs, rows), repeat)
        t_full = timed(lambda inputs=inputs: oracle.golden_of(inputs), repeat) if n <= full_max else None
        print(f"n={n}: flash {t_flash:.3g} s, suite {t_suite:.3g} s, sampled golden {t_sampled:.3g} s, "
              f"full golden {t_full if t_full is None else round(t_full, 3)} s", file=sys.stderr, flush=True)
        found.append({"n": n, "rows": len(rows), "rows_x_n_k": len(rows) * n, "flash_s": t_flash,
                      "suite_s": t_suite, "sampled_golden_s": t_sampled, "full_golden_s": t_full,
                      "suite_over_flash": t_suite / t_flash, "ratio": ratio})
    return found


def by_rows(n: int, counts: tuple[int, ...], repeat: int) -> list[dict[str, Any]]:
    inputs = inputs_of(case_of(n))
    found = []
    for count in counts:
        rows = np.unique(np.linspace(0, n - 1, count).astype(np.int64))
        t = timed(lambda rows=rows: sampled.golden_rows(inputs, rows, "top_left"), repeat)
        found.append({"n": n, "rows": len(rows), "rows_x_n_k": len(rows) * n, "sampled_golden_s": t,
                      "ns_per_row_key": t / (len(rows) * n) * 1e9})
        print(f"rows={len(rows)} at n={n}: {t:.3g} s", file=sys.stderr, flush=True)
    return found


def _fmt(x: float | None, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}g}"


def markdown(result: dict[str, Any]) -> str:
    lines = ["# Benchmark results: the scale profile's own cost", "",
             f"Generated by `{result['command']}` on {result['date']}; {result['machine']}. Regenerate with "
             "the same command, never edit by hand. The figures depend on the machine and its load.", "",
             "![time against n, log-log](bench_scale.png)", "",
             f"A causal square of n queries and keys, one head, d = {WIDTH}, float32 (the scale profile's "
             "`causal_square`); the fastest of the rounds after one not timed (flash's largest sizes: one "
             "round). *flash*: "
             "`impl.flash_attention` on the call; *suite*: what `scale_matches_golden` adds to it (the "
             "inputs, the sampled rows' golden, baseline and floor, the comparison); *sampled golden*: "
             "`spec.sampled.golden_rows` alone; *full golden*: `spec.oracle.golden_of` (every row).", "",
             # two tables of six columns: one of ten ran past a 1280 px page
             "| n | rows | rows × n_k | flash s | suite s | suite / flash |", "|---|---|---|---|---|---|"]
    for r in result["sizes"]:
        lines.append(f"| {r['n']:,} | {r['rows']} | {r['rows_x_n_k']:,} | {_fmt(r['flash_s'])} | "
                     f"{_fmt(r['suite_s'])} | {r['suite_over_flash']:.1%} |")
    lines += ["", "| n | sampled golden s | sampled / flash | full golden s | error ratio |",
              "|---|---|---|---|---|"]
    for r in result["sizes"]:
        lines.append(f"| {r['n']:,} | {_fmt(r['sampled_golden_s'])} | "
                     f"{r['sampled_golden_s'] / r['flash_s']:.1%} | {_fmt(r['full_golden_s'])} | "
                     f"{_fmt(r['ratio'])} |")
    n = result["rows"][0]["n"]
    lines += ["", f"The sampled golden at n = {n:,} as the rows checked grow. The last column is its time "
              "per row and key: where it is flat the cost is linear in rows × n_k (at a few rows a call's "
              "fixed cost weighs; on a shared machine the load moves every figure).", "",
              "| rows | rows × n_k | sampled golden s | ns per row × key |", "|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['rows']} | {r['rows_x_n_k']:,} | {_fmt(r['sampled_golden_s'])} | "
                     f"{r['ns_per_row_key']:.3g} |")
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = result["sizes"]
    n = [r["n"] for r in sizes]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.loglog(n, [r["flash_s"] for r in sizes], "o-", label="flash (the call)")
    ax.loglog(n, [r["suite_s"] for r in sizes], "s-", label="suite at sampled rows")
    ax.loglog(n, [r["sampled_golden_s"] for r in sizes], "^-", label="sampled golden")
    full = [(r["n"], r["full_golden_s"]) for r in sizes if r["full_golden_s"] is not None]
    ax.loglog([a for a, _ in full], [b for _, b in full], "v-", label="full golden")
    ax.set_xlabel("n (causal square, d = 32, float32)")
    ax.set_ylabel("seconds")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python tools/scale_bench.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    p.add_argument("--rows", type=int, nargs="+", default=list(ROWS), help="rows checked in the second table")
    p.add_argument("--rows-at", type=int, default=16_384, help="n of the second table")
    p.add_argument("--full-max", type=int, default=8_192, help="the largest n the full golden is timed at")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--flash-repeat-max", type=int, default=16_384,
                   help="flash is timed in one round past this n")
    p.add_argument("--json")
    p.add_argument("--markdown")
    p.add_argument("--plot")
    p.add_argument("--from", dest="source", metavar="JSON",
                   help="write the page and the plot from this run's JSON instead of timing again")
    args = p.parse_args(argv)
    if args.source:
        result = json.loads(Path(args.source).read_text(encoding="utf-8"))
        if args.markdown:
            Path(args.markdown).write_text(markdown(result), encoding="utf-8")
        if args.plot:
            plot(result, args.plot)
        return 0
    command = "python tools/scale_bench.py" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    result = {"command": command, "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
              "machine": machine(), "width": WIDTH,
              "sizes": by_size(tuple(args.sizes), args.full_max, args.repeat, args.flash_repeat_max),
              "rows": by_rows(args.rows_at, tuple(args.rows), args.repeat)}
    text = json.dumps(result, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    if args.markdown:
        Path(args.markdown).write_text(markdown(result), encoding="utf-8")
    if args.plot:
        plot(result, args.plot)
    if not (args.json or args.markdown or args.plot):
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
