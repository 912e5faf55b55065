"""``python -m spec.peers``: the framework targets (`spec.adapters`) run once per dtype,
as a table: how many laws passed, which failed, and the worst error ratio.

The ratios are read from each result's ``observed`` figures (data), never from message text.
"""

from __future__ import annotations

import math
import sys
import textwrap
from typing import Any

from spec import adapters
from spec.dtypes import bfloat16_if_installed
from spec.runner import check
from spec.target import Target


def dtype_rows(target: Target, dtypes: tuple[str, ...], *, profile: str = "ci",
               max_examples: int | None = None) -> list[dict[str, Any]]:
    """Run every law once per dtype (``target`` restricted to it) and summarise: how many
    passed, which failed, which failed as the target declares (``expected``: XFAIL), and the worst
    error ratio (error / allowed of the tolerance policy; ≤ 1 passes) over all properties that
    compare with the golden, failed ones included."""
    rows = []
    for dtype in dtypes:
        report = check(target.with_dtypes((dtype,)), profile, max_examples=max_examples)
        ratios = [value for r in report.results for key, value in r.observed.items()
                  if key.startswith("error ratio") and math.isfinite(value)]
        rows.append({
            "target": target.name, "dtype": dtype, "declared": dtype in target.dtypes,
            "passed": sum(r.status == "pass" for r in report.results),
            "failed": len(report.failures),
            "expected": len(report.expected_failures),
            "worst error ratio": max(ratios) if ratios else None,
            "failures": [(r.name, r.message) for r in report.failures]
            + [(f"{r.name} (expected)", r.message) for r in report.expected_failures],
        })
    return rows


WIDTH = 100
"""The columns a failure line is wrapped to (a terminal, and the docs' code blocks, show it whole)."""


def failure_lines(rows: list[dict[str, Any]], width: int = WIDTH) -> list[str]:
    """Each failure of ``rows`` as ``dtype law: message``, wrapped to ``width`` columns, the lines
    after its first indented by four spaces."""
    return [line for row in rows for name, message in row["failures"]
            for line in textwrap.wrap(f"{row['dtype']} {name}: {message}", width, subsequent_indent="    ",
                                      break_long_words=False, break_on_hyphens=False)]


def main(argv: list[str] | None = None) -> int:
    """``python -m spec.peers [torch] [jax] [torch_flex_paged] [torch_flex_topk] [mlx] [onnxruntime]
    [onnx_reference]
    [--profile P] [--max-examples N]``: the per-dtype table.

    torch, JAX and the ONNX reference evaluator run in float16, bfloat16, float32 and float64: those
    they do not declare too (JAX's float64, the ONNX reference's float64), to show the recorded
    deviations; ONNX Runtime in float16, float32 and float64 (its bfloat16 Attention is refused when
    the session is made: docs/peers.md). torch_flex_paged (FlexAttention's eager path over a paged
    cache, minutes per dtype), torch_flex_topk (its eager path given top-k lists) and mlx run in the
    dtypes they declare.
    """
    import argparse

    from tabulate import tabulate

    parser = argparse.ArgumentParser(prog="python -m spec.peers", description=main.__doc__)
    every = ("float16", *bfloat16_if_installed(), "float32", "float64")
    # each peer and the dtypes it runs in (None: those it declares)
    peers = {"torch": every, "jax": every, "torch_flex_paged": None, "torch_flex_topk": None, "mlx": None,
             "onnxruntime": ("float16", "float32", "float64"), "onnx_reference": every}
    parser.add_argument("peers", nargs="*", choices=list(peers), default=["torch", "jax"])
    parser.add_argument("--profile", choices=["quick", "ci", "thorough"], default="ci")
    parser.add_argument("--max-examples", type=int, default=None)
    args = parser.parse_args(argv)

    rows = []
    for name in args.peers:
        dtypes = peers[name]
        try:
            target = adapters.factory(name)()
        except ModuleNotFoundError as e:
            print(f"{name}: not installed ({e.name})", file=sys.stderr)
            return 2
        rows += dtype_rows(target, dtypes or target.dtypes, profile=args.profile,
                           max_examples=args.max_examples)
    table = [{key: value for key, value in row.items() if key != "failures"} for row in rows]
    print(tabulate(table, headers="keys", tablefmt="github", floatfmt=".3g"))
    for line in failure_lines(rows):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
