"""``python -m impl.bench --sparse TOPK``: top-k sparse attention against the dense tiled path as n grows.

At a fixed top-k, `impl.flash_attention`'s sparse path (``topk_indices=``: each query gathers its
listed keys) does O(n · topk · d) work in O(n · topk) memory, where the dense tiled path does
O(n² · d) work: as n doubles the sparse path's time should double (×2) and the dense path's grow
×4, and the sparse path's traced memory per token stay flat. Each query i lists ``topk`` keys drawn
uniformly from those it may see (``0..i`` under the causal mask, else ``0..n−1``), with
replacement: a key drawn twice is gathered twice, as the path defines. Both paths run on one thread
(``threads=1``, under a one-thread BLAS), so the growth per step is the algorithm's, not a change
in how many cores a size is given, nor BLAS's threads contending with other work.

Timing and memory are measured as `impl.bench.measure` measures them (samples of back-to-back
calls lasting at least 0.05 s after a pause, their median; tracemalloc's peak over one untimed
call, the inputs made before tracing). The record ``--json`` writes:

* ``command``, ``date``; ``config.{mode: "sparse", sizes, topk, d_k, d_v, dtype, causal, repeat,
  pause_s, threads}``; ``machine.{cpu_count, numpy, blas, load_before, load_after}`` (``blas``: the loaded
  BLAS in words); ``memory_method``;
* ``results[].{implementation ("sparse" or "dense"), n_tokens, times_s, time_s, ratio,
  peak_bytes, peak_bytes_per_token}`` — ``ratio`` is ``time_s`` over the previous size's (null for
  the first).
"""

from __future__ import annotations

import datetime
import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from cmdline.blas import one_thread_blas
from impl.bench.calls import Call, bench_arrays
from impl.bench.measure import blas_runtime, calls_per_sample, peak_traced_bytes, seconds_per_call
from impl.flash import flash_attention

IMPLEMENTATIONS = ("sparse", "dense")
MIB = 1 << 20


def topk_lists(n: int, topk: int, *, causal: bool) -> np.ndarray:  # -> [n, topk] int32
    """Query i's ``topk`` keys, uniform with replacement over the keys it may see (seeded by n)."""
    rng = np.random.default_rng(n)
    visible = np.arange(1, n + 1)[:, None] if causal else n
    return (rng.random((n, topk)) * visible).astype(np.int32)


def _calls(n: int, topk: int, d_k: int, d_v: int, *, causal: bool) -> dict[str, Call]:
    q, k, v, _ = bench_arrays(n, d_k, d_v)
    indices = topk_lists(n, topk, causal=causal)
    return {
        "sparse": lambda: flash_attention(q, k, v, causal=causal, topk_indices=indices, threads=1),
        "dense": lambda: flash_attention(q, k, v, causal=causal, threads=1),
    }


def _measure(
    n: int, *, topk: int, d_k: int, d_v: int, repeat: int, causal: bool, pause: float,
) -> list[dict[str, Any]]:
    """Each path's samples, median and peak traced bytes at n tokens (``ratio`` is filled in later)."""
    calls = _calls(n, topk, d_k, d_v, causal=causal)
    rows = []
    for name in IMPLEMENTATIONS:
        fn = calls[name]
        peak = peak_traced_bytes(fn)  # also the warm-up
        count = calls_per_sample(fn)
        times = []
        for _ in range(repeat):
            time.sleep(pause)
            times.append(seconds_per_call(fn, count))
        median = statistics.median(times)
        rows.append({"implementation": name, "n_tokens": n, "times_s": times, "time_s": median,
                     "peak_bytes": peak, "peak_bytes_per_token": peak / n})
    return rows


def run_sparse(
    sizes: Sequence[int], *, topk: int, d_k: int, d_v: int, repeat: int, causal: bool, pause: float,
    command: str,
) -> dict[str, Any]:
    """Time and trace the sparse and dense paths at each size: the record the module docstring lists."""
    load_before = list(os.getloadavg())
    results: list[dict[str, Any]] = []
    with one_thread_blas():
        for n in sizes:
            results += _measure(n, topk=topk, d_k=d_k, d_v=d_v, repeat=repeat, causal=causal, pause=pause)
    for name in IMPLEMENTATIONS:
        previous: float | None = None
        for row in (r for r in results if r["implementation"] == name):
            row["ratio"] = None if previous is None else row["time_s"] / previous
            previous = row["time_s"]
    return {
        "command": command,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "config": {"mode": "sparse", "sizes": list(sizes), "topk": topk, "d_k": d_k, "d_v": d_v,
                   "dtype": "float32", "causal": causal, "repeat": repeat, "pause_s": pause, "threads": 1},
        "machine": {"cpu_count": os.cpu_count(), "numpy": np.__version__,
                    "blas": ", ".join(f"{b['internal_api']} {b['version']} ({b['architecture']} kernels)"
                                      for b in blas_runtime()),
                    "load_before": load_before, "load_after": list(os.getloadavg())},
        "memory_method": "tracemalloc peak over one untimed call, inputs and lists made before tracing",
        "results": results,
    }


def format_sparse(record: dict[str, Any]) -> str:
    """The record as a table: per size, each path's median time, its ratio per size step, its peak
    memory and that memory per token."""
    config, machine = record["config"], record["machine"]
    lines = [f"top-k sparse (topk {config['topk']}) against dense tiled attention, float32, "
             f"d_k {config['d_k']}, d_v {config['d_v']}, {'causal' if config['causal'] else 'not causal'}, "
             f"one thread, median of {config['repeat']}",
             f"{'n':>7}  {'path':<7}{'ms':>10}{'×/step':>8}{'peak MiB':>10}{'KiB/token':>11}"]
    for row in record["results"]:
        ratio = "—" if row["ratio"] is None else f"{row['ratio']:.2f}"
        lines.append(f"{row['n_tokens']:>7}  {row['implementation']:<7}{row['time_s'] * 1e3:>10.1f}{ratio:>8}"
                     f"{row['peak_bytes'] / MIB:>10.2f}{row['peak_bytes_per_token'] / 1024:>11.2f}")
    lines.append(f"{machine['cpu_count']} CPUs, {machine['blas']}; load average before "
                 f"{' '.join(f'{x:.2f}' for x in machine['load_before'])}, after "
                 f"{' '.join(f'{x:.2f}' for x in machine['load_after'])}")
    return "\n".join(lines)
