"""Where one thread's time goes inside flash's tile loop, line by line (``--profile``, line_profiler).

line_profiler traces only the thread it runs in, so the profiled call runs on one thread: flash's
own ``threads=1`` (every row or key block in the calling thread) under a one-thread BLAS
(threadpoolctl). Nothing of `impl.flash` is changed for it.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

import impl.flash
from cmdline.blas import one_thread_blas
from impl.bench.calls import make_call
from impl.bench.measure import visible_pairs


def profile_lines(n: int, d_k: int, d_v: int, *, causal: bool, backward: bool = False) -> dict[str, Any]:
    """Where one thread's time goes inside flash's tile loop, line by line (line_profiler).

    Profiles ``_row_block`` (forward) or ``_key_block`` (backward) over one whole call at ``n``
    tokens; lines under 0.5 % of the time are summed into one row.
    """
    from line_profiler import LineProfiler

    kernel = impl.flash._key_block if backward else impl.flash._row_block
    fn, _ = make_call("flash", n, d_k, d_v, causal=causal, backward=backward, threads=1)
    profiler = LineProfiler()
    profiler.add_function(kernel)
    with one_thread_blas():
        fn()  # warm-up, untraced
        start = time.perf_counter()
        profiler.enable_by_count()
        fn()
        profiler.disable_by_count()
        wall = time.perf_counter() - start
    stats = profiler.get_stats()
    ((_, first, name), timings), = stats.timings.items()
    source = inspect.getsourcelines(kernel)[0]
    total = sum(t for _, _, t in timings) * stats.unit
    pairs = visible_pairs(n, n, causal=causal)
    lines, rest = [], 0.0
    for line, hits, t in timings:
        seconds = t * stats.unit
        if seconds < 0.005 * total:
            rest += seconds
            continue
        lines.append({"line": line, "source": source[line - first].strip(), "hits": hits, "time_s": seconds,
                      "share": seconds / total, "ns_per_pair": seconds / pairs * 1e9})
    lines.append({"line": None, "source": "(every other line)", "hits": None, "time_s": rest,
                  "share": rest / total, "ns_per_pair": rest / pairs * 1e9})
    return {"function": f"impl.flash.{name}", "n_tokens": n, "visible_pairs": pairs, "traced_s": total,
            "wall_s": wall, "lines": lines}
