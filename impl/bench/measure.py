"""Timing: the interleaved rounds, the samples and their sizes, the sgemm floor, traced memory, the record.

* Useful FLOPs count only visible (query, key) pairs: ``n(n+1)/2`` pairs under the causal mask,
  ``n²`` without it; ``2·(d_k + d_v)`` per pair forward (a multiply and an add for each entry of
  q·k and of weight·v), ``2·(3·d_k + 2·d_v)`` backward (FlashAttention-2's five products: S
  recomputed, dV, dP, dQ, dK). Every implementation is credited the same count.
* The sgemm floor is the time those FLOPs take at the rate of one plain float32 matrix product
  (2048 × 2048 × 2048, NumPy's BLAS on all its threads), timed just before each size in every
  round: no attention can beat it on the same BLAS without doing less arithmetic.
* Rounds interleave everything — for each round, for each size, the floor and each
  implementation run back to back — so a machine shared with other work slows all of them alike
  and the paired ratios stay meaningful. ``os.getloadavg()`` before and after is recorded.
* A sample is as many back-to-back calls as last at least 0.05 s (one call from 2048 tokens up;
  as timeit's autorange). Each sample starts after a pause (``--pause``, 0.2 s): BLAS and OpenMP
  worker threads spin for a while after a call before they sleep, and would otherwise steal the
  next sample's cores.
* Peak memory: one extra (untimed, warm-up) call per size under `tracemalloc`, which sees
  NumPy's buffers; the inputs (and, backward, the forward's out and lse) are made before tracing
  starts, so the figure is what the call itself allocates, output included. PyTorch's and XLA's
  allocators are invisible to tracemalloc, so their memory is not reported. Bytes are exact;
  the table shows MiB (2²⁰ bytes).
* The naive path materialises the n × n pattern and its temporaries (several GiB at 16,384
  tokens), so it is skipped above ``--naive-max`` (default 8192), and the output says so.

The record `run_benchmark` returns (``--json FILE`` writes it), for other tools; keys are kept,
more may be added:

* ``command`` — the command line that produced the record; ``date`` — when (UTC, ISO 8601).
* ``config.{mode, sizes, d_k, d_v, dtype, causal, repeat, naive_max, pause_s, implementations}``
* ``machine.{cpu_count, load_before, load_after, numpy, blas, blas_runtime, torch, torch_threads,
  jax, openblas_env}`` — ``load_*`` are the 1/5/15-minute load averages; ``blas_runtime`` is what
  threadpoolctl reports of the loaded BLAS (library, version, kernel architecture, threads);
  ``openblas_env`` holds OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE as set (null when unset).
* ``paths.{NAME}`` — the path each implementation took: ``layout``, ``input_ndim``, ``threads``,
  ``version``, ``fused`` (true when the n × n pattern is never materialised) and what else that
  library tells (PyTorch's chosen SDPA ``backend``, its autograd node; JAX's device and jit).
* ``sgemm.{size, times_s, gflops}`` — the floor's reference product, all its timed samples (size
  by size, round by round), its median rate.
* ``tile_products[].{name, shape, transposed, numpy_gflops, torch_gflops}`` — backward only (else
  empty): the five matrix products of one tile of ``flash_attention_backward`` at its default tile
  (``[m, k, n]``, which operands arrive as transposed views), each timed on one thread of NumPy's
  BLAS and of PyTorch's (null without torch): at these shapes the kernels can be no faster than
  their BLAS.
* ``memory_method`` — how ``peak_bytes`` was measured, in words.
* ``results[].{implementation, n_tokens, flops, times_s, calls_per_sample, time_s, gflops, ratio,
  peak_bytes, skipped}`` — one entry per implementation and size: the useful FLOPs (exact), the
  seconds per call of every timed sample, the calls in each sample, their median, the median rate,
  ``time_s`` over the previous size's (null for the first), the peak traced bytes (null when not
  measured) and, for a size not run, the reason (else null).
* ``floor[].{n_tokens, flops, times_s, time_s}`` — the sgemm floor per size: the useful FLOPs at the
  rate of the sgemm timed just before that size, per round, and their median.
* ``paired[].{n_tokens, flash_over_torch, flash_over_jax, flash_over_floor, torch_over_floor,
  jax_over_floor}`` — per size, the median over rounds of flash's time over each peer's and over
  the floor's, and of each peer's over the floor's, in the same round (null when one is missing):
  samples taken seconds apart share the machine's load, so these ratios are the steadiest figures.
"""

from __future__ import annotations

import datetime
import functools
import math
import os
import statistics
import time
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cmdline.blas import one_thread_blas
from impl.bench.calls import PEERS, Call, Path, make_call
from impl.flash import DEFAULT_BACKWARD_BLOCK

SGEMM_SIZE = 2048
NAIVE_MAX = 8192
PAUSE_S = 0.2
MIN_SAMPLE_S = 0.05


def visible_pairs(n_q: int, n_k: int, *, causal: bool) -> int:
    """(query, key) pairs the softmax weighs: query i sees keys j ≤ i under the causal mask."""
    if not causal:
        return n_q * n_k
    full = max(0, n_q - n_k)  # queries past the last key see all n_k keys
    seen = min(n_q, n_k)  # the first queries see 1, 2, … keys
    return seen * (seen + 1) // 2 + full * n_k


def useful_flops(n: int, d_k: int, d_v: int, *, causal: bool, backward: bool = False) -> int:
    """FLOPs over the visible pairs only: forward q·kᵀ and weights·v, 2·(d_k + d_v) per pair;
    backward FlashAttention-2's five products (S, dV, dP, dQ, dK), 2·(3·d_k + 2·d_v) per pair."""
    per_pair = 2 * (3 * d_k + 2 * d_v) if backward else 2 * (d_k + d_v)
    return per_pair * visible_pairs(n, n, causal=causal)


def timed(fn: Callable[[], Any]) -> float:
    """Wall seconds of one call."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def calls_per_sample(fn: Callable[[], Any]) -> int:
    """How many back-to-back calls of ``fn`` last at least MIN_SAMPLE_S (as timeit's autorange),
    from one timed call."""
    return max(1, math.ceil(MIN_SAMPLE_S / max(timed(fn), 1e-9)))


def seconds_per_call(fn: Callable[[], Any], count: int) -> float:
    """Wall seconds per call over one sample of ``count`` back-to-back calls."""
    return timed(lambda: [fn() for _ in range(count)]) / count


def peak_traced_bytes(fn: Callable[[], Any]) -> int:
    """Peak bytes traced by tracemalloc during one call (what the call allocates)."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def sgemm_seconds(size: int | None = None) -> float:
    """Wall seconds of one float32 ``size³`` matrix product: the machine's plain BLAS rate."""
    size = SGEMM_SIZE if size is None else size
    a = np.ones((size, size), dtype=np.float32)
    return timed(lambda: a @ a)


def _blas_name() -> str:
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas['name']} {blas['version']}"
    except Exception:  # the config layout is NumPy's, not ours; its absence is not an error
        return "unknown"


def blas_runtime() -> list[dict[str, Any]]:
    """What threadpoolctl sees of the loaded BLAS: library, version, kernel architecture, threads."""
    from threadpoolctl import threadpool_info

    keys = ("internal_api", "version", "architecture", "threading_layer", "num_threads", "filepath")
    return [{key: lib.get(key) for key in keys} for lib in threadpool_info() if lib["user_api"] == "blas"]


def _machine(names: Sequence[str]) -> dict[str, Any]:
    versions: dict[str, Any] = {"torch": None, "torch_threads": None, "jax": None}
    if "torch" in names:
        import torch

        versions.update(torch=torch.__version__, torch_threads=torch.get_num_threads())
    if "jax" in names:
        import jax

        versions["jax"] = jax.__version__
    return {
        "cpu_count": os.cpu_count(),
        "numpy": np.__version__,
        "blas": _blas_name(),
        "blas_runtime": blas_runtime(),
        **versions,
        "openblas_env": {key: os.environ.get(key) for key in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")},
    }


def run_benchmark(
    sizes: Sequence[int],
    *,
    names: Sequence[str],
    repeat: int,
    causal: bool = True,
    d_k: int = 128,
    d_v: int = 128,
    naive_max: int = NAIVE_MAX,
    pause: float = PAUSE_S,
    backward: bool = False,
    command: str = "",
) -> dict[str, Any]:
    """Time ``names`` over ``sizes``, interleaved round by round; return the JSON record."""
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    machine = {**_machine(names), "load_before": list(os.getloadavg())}

    def skip_reason(name: str, n: int) -> str | None:
        if name == "naive" and n > naive_max:
            return f"naive skipped above --naive-max {naive_max}: its n×n pattern needs ≥ 1 GiB at 16384"
        return None

    # Set-up, untimed: each call on its path (JAX compiles here), then one call under tracemalloc
    # (NumPy paths only), then one call to size a sample of at least MIN_SAMPLE_S (as timeit's
    # autorange).
    calls: dict[tuple[str, int], Call] = {}
    paths: dict[str, Path] = {}
    peak: dict[tuple[str, int], int | None] = {}
    per_sample: dict[tuple[str, int], int] = {}
    for n in sizes:
        for name in names:
            if skip_reason(name, n) is None:
                fn, paths[name] = make_call(name, n, d_k, d_v, causal=causal, backward=backward)
                calls[name, n] = fn
                peak[name, n] = None if name in PEERS else peak_traced_bytes(fn)
                fn()
                per_sample[name, n] = calls_per_sample(fn)

    def timed_sample(name: str, n: int) -> float:
        """Seconds per call, over a sample of ``per_sample[name, n]`` calls."""
        time.sleep(pause)
        return seconds_per_call(calls[name, n], per_sample[name, n])

    # The backward tile's products on one thread of each BLAS, untimed by the rounds.
    products = tile_product_rates(backward_products(d_k, d_v), torch_too="torch" in names) if backward else []

    # Each round times, per size, the reference sgemm and then every implementation, back to back.
    times: dict[tuple[str, int], list[float]] = {key: [] for key in calls}
    sgemm: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeat):
        for n in sizes:
            time.sleep(pause)
            sgemm[n].append(sgemm_seconds())
            for name in names:
                if (name, n) in times:
                    times[name, n].append(timed_sample(name, n))
    machine["load_after"] = list(os.getloadavg())

    def flops(n: int) -> int:
        return useful_flops(n, d_k, d_v, causal=causal, backward=backward)

    all_sgemm = [t for n in sizes for t in sgemm[n]]
    sgemm_flops = 2 * SGEMM_SIZE**3
    floor = {n: [flops(n) * t / sgemm_flops for t in sgemm[n]] for n in sizes}

    def paired(top: list[float] | None, bottom: list[float] | None) -> float | None:
        """Median of the per-round ratios of two back-to-back samples."""
        return statistics.median(a / b for a, b in zip(top, bottom, strict=True)) if top and bottom else None

    results = []
    for name in names:
        previous = None
        for n in sizes:
            runs = times.get((name, n))
            median = statistics.median(runs) if runs else None
            results.append({
                "implementation": name,
                "n_tokens": n,
                "flops": flops(n),
                "times_s": runs or [],
                "calls_per_sample": per_sample.get((name, n)),
                "time_s": median,
                "gflops": flops(n) / median / 1e9 if median else None,
                "ratio": median / previous if median and previous else None,
                "peak_bytes": peak.get((name, n)),
                "skipped": skip_reason(name, n),
            })
            previous = median
    return {
        "command": command,
        "date": date,
        "config": {
            "mode": "backward" if backward else "forward",
            "sizes": list(sizes), "d_k": d_k, "d_v": d_v, "dtype": "float32", "causal": causal,
            "repeat": repeat, "naive_max": naive_max, "pause_s": pause, "implementations": list(names),
        },
        "machine": machine,
        "paths": paths,
        "sgemm": {
            "size": SGEMM_SIZE,
            "times_s": all_sgemm,
            "gflops": sgemm_flops / statistics.median(all_sgemm) / 1e9,
        },
        "tile_products": products,
        "memory_method": (
            "tracemalloc peak during one call, inputs made before tracing (NumPy paths only; "
            "PyTorch's and XLA's allocators are not traced)"
        ),
        "results": results,
        "floor": [
            {"n_tokens": n, "flops": flops(n), "times_s": floor[n], "time_s": statistics.median(floor[n])}
            for n in sizes
        ],
        "paired": [
            {"n_tokens": n,
             **{f"flash_over_{peer}": paired(times.get(("flash", n)), times.get((peer, n)))
                for peer in PEERS},
             "flash_over_floor": paired(times.get(("flash", n)), floor[n]),
             **{f"{peer}_over_floor": paired(times.get((peer, n)), floor[n]) for peer in PEERS}}
            for n in sizes
        ],
    }


def backward_products(d_k: int, d_v: int) -> list[dict[str, Any]]:
    """The five matrix products of one tile of `flash_attention_backward` at its default tile
    (``DEFAULT_BACKWARD_BLOCK`` = query rows × keys), as `impl.flash._key_block` makes them:
    name, ``shape`` ``[m, k, n]`` and which operands arrive transposed (a view, as there)."""
    rows, cols = DEFAULT_BACKWARD_BLOCK
    return [
        {"name": "S - lse", "shape": [rows, d_k + 1, cols], "transposed": [False, True]},
        {"name": "dV", "shape": [cols, rows, d_v], "transposed": [True, False]},
        {"name": "dP - D", "shape": [rows, d_v + 1, cols], "transposed": [False, True]},
        {"name": "dQ", "shape": [rows, cols, d_k], "transposed": [False, False]},
        {"name": "dK", "shape": [cols, rows, d_k], "transposed": [True, False]},
    ]


def _rate(fn: Call, flops: int, samples: int = 5) -> float:
    """GFLOP/s of ``fn``: the median of ``samples`` samples of at least MIN_SAMPLE_S each."""
    fn()
    count = calls_per_sample(fn)
    return flops / statistics.median(seconds_per_call(fn, count) for _ in range(samples)) / 1e9


def tile_product_rates(products: list[dict[str, Any]], *, torch_too: bool) -> list[dict[str, Any]]:
    """Each product's rate on one thread of NumPy's BLAS and, with ``torch_too``, of PyTorch's
    (``numpy_gflops``, ``torch_gflops``; null when not measured), on the same operand layouts:
    where the two libraries' BLAS differ in speed at these shapes, so do the two kernels."""

    rng = np.random.default_rng(0)
    rates = []
    for product in products:
        m, k, n = product["shape"]
        ta, tb = product["transposed"]
        a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
        b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
        a, b, out = (a.T if ta else a), (b.T if tb else b), np.empty((m, n), dtype=np.float32)
        flops = 2 * m * k * n
        with one_thread_blas():
            numpy_rate = _rate(functools.partial(np.matmul, a, b, out=out), flops)
        torch_rate = None
        if torch_too:
            import torch

            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                pair = torch.from_numpy(a), torch.from_numpy(b)  # the same strides: transposed views stay so
                torch_rate = _rate(functools.partial(torch.mm, *pair, out=torch.from_numpy(out)), flops)
            finally:
                torch.set_num_threads(threads)
        rates.append({**product, "numpy_gflops": numpy_rate, "torch_gflops": torch_rate})
    return rates
