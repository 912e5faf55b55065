"""``python -m impl.bench``: attention's n² cost, measured — naive, tiled (flash), PyTorch and JAX.

One head, float32, d_k = d_v = 128 by default, n doubling from 512 to 16,384 tokens. For each
implementation and size it reports the median wall time over ``--repeat`` samples, the useful
GFLOP/s, the time ratio per doubling (pure n² gives 4) and the peak traced memory.
``--backward`` times the gradients instead: ``flash_attention_backward`` against autograd of
PyTorch's fused SDPA forward (and the dense ``attention_backward`` as "naive").

Method:

* Every peer takes its best path, and the record says which it took (``paths``): PyTorch gets
  contiguous ``(batch, heads, n, d) = (1, 1, n, d)`` tensors under ``torch.no_grad()`` — the
  layout its fused CPU flash kernel takes (2-D inputs fall back to the unfused math path, which
  materialises the n × n pattern) — and the kernel SDPA chose is recorded; JAX gets
  ``jax.nn.dot_product_attention`` jitted, in its ``(batch, n, heads, d)`` layout, compiled by
  a warm-up call before timing. The backward pair: ``torch.autograd.grad`` of that fused forward's
  output (graph kept, so only the backward kernel is timed) against ``flash_attention_backward``
  from a forward's ``(out, lse)`` made before timing.
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

JSON (``--json FILE``), for other tools; keys are kept, more may be added:

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

``--markdown FILE`` writes the report with its command, date and machine, for the docs
(``python -m impl.bench --markdown docs/bench_results.md``): figures there are regenerated, never
edited by hand. ``--from-json FILE`` renders a stored record again (text, ``--markdown``,
``--plot``) without timing anything, for a change of the page's layout.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import importlib.util
import inspect
import itertools
import json
import math
import os
import shlex
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

import impl.flash
from cmdline import Parser, UsageError, check_output_dir, int_at_least
from impl.attention import attention
from impl.flash import DEFAULT_BACKWARD_BLOCK, flash_attention, flash_attention_backward
from impl.grad import attention_backward

DEFAULT_SIZES = (512, 1024, 2048, 4096, 8192, 16384)
SGEMM_SIZE = 2048
NAIVE_MAX = 8192
PAUSE_S = 0.2
MIN_SAMPLE_S = 0.05
MIB = 1 << 20
PEERS = ("torch", "jax")  # the libraries flash is compared with, when installed

Call = Callable[[], Any]
Path = dict[str, Any]


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


def _found(module: str) -> bool:
    """Whether ``module`` is installed; looked up, not imported (torch and jax take seconds)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # a module without a spec, e.g. one stubbed out
        return False


def available_names(*, backward: bool = False) -> list[str]:
    """The implementations installed here (JAX has no backward pair here: no fused kernel on CPU)."""
    peers = ("torch",) if backward else PEERS
    return ["naive", "flash", *(name for name in peers if _found(name))]


def bench_arrays(n: int, d_k: int, d_v: int) -> tuple[np.ndarray, ...]:
    """q, k [n, d_k], v, d_out [n, d_v]: float32 standard normals, the same for every implementation."""
    rng = np.random.default_rng(n)
    q, k = (rng.standard_normal((n, d_k), dtype=np.float32) for _ in range(2))
    v, d_out = (rng.standard_normal((n, d_v), dtype=np.float32) for _ in range(2))
    return q, k, v, d_out


def _numpy_call(
    name: str, arrays: tuple[np.ndarray, ...], *, causal: bool, backward: bool
) -> tuple[Call, Path]:
    """naive (impl.attention / attention_backward) or flash, on (n, d) arrays."""
    q, k, v, d_out = arrays
    path: Path = {"layout": "(n, d)", "input_ndim": 2, "version": f"numpy {np.__version__}",
                  "fused": name == "flash"}
    if name == "naive":
        path["threads"] = "BLAS's own"
        if backward:
            return lambda: attention_backward(q, k, v, d_out, causal=causal), path
        return lambda: attention(q, k, v, causal=causal), path
    path["threads"] = f"{os.cpu_count()} row/key blocks at once, one-thread BLAS each"
    if backward:
        out, lse = flash_attention(q, k, v, causal=causal, return_lse=True)
        return lambda: flash_attention_backward(q, k, v, out, lse, d_out, causal=causal), path
    return lambda: flash_attention(q, k, v, causal=causal), path


def torch_inputs(arrays: tuple[np.ndarray, ...]) -> tuple[Any, ...]:
    """The arrays as contiguous ``(batch, heads, n, d) = (1, 1, n, d)`` tensors: SDPA's fused layout."""
    import torch

    return tuple(torch.from_numpy(x).reshape(1, 1, *x.shape).contiguous() for x in arrays)


def _torch_call(arrays: tuple[np.ndarray, ...], *, causal: bool, backward: bool) -> tuple[Call, Path]:
    """PyTorch's SDPA on 4-D tensors: under no_grad, or the backward of its fused forward."""
    import torch
    from torch.nn.attention import SDPBackend

    sdpa = torch.nn.functional.scaled_dot_product_attention
    q, k, v, d_out = torch_inputs(arrays)
    try:  # which kernel SDPA dispatches these inputs to (a private helper; its absence is no error)
        backend = SDPBackend(torch._fused_sdp_choice(q, k, v, is_causal=causal)).name
    except Exception:
        backend = "unknown"
    path: Path = {"layout": "(batch, heads, n, d) = (1, 1, n, d), contiguous", "input_ndim": q.ndim,
                  "threads": torch.get_num_threads(), "version": f"torch {torch.__version__}",
                  "backend": backend, "fused": backend == "FLASH_ATTENTION"}
    if not backward:
        path["grad"] = "torch.no_grad()"

        def run() -> Any:
            with torch.no_grad():
                return sdpa(q, k, v, is_causal=causal)

        return run, path
    q_, k_, v_ = leaves = tuple(x.clone().requires_grad_(True) for x in (q, k, v))
    out = sdpa(q_, k_, v_, is_causal=causal)
    path["grad"] = "torch.autograd.grad of the forward's output, graph kept: the backward alone"
    path["autograd_node"] = type(out.grad_fn).__name__
    return lambda: torch.autograd.grad(out, leaves, d_out, retain_graph=True), path


def _jax_call(arrays: tuple[np.ndarray, ...], *, causal: bool) -> tuple[Call, Path]:
    """jax.nn.dot_product_attention, jitted, on ``(batch, n, heads, d)`` arrays; compiled here."""
    import jax

    q, k, v = (jax.numpy.asarray(x.reshape(1, x.shape[0], 1, x.shape[1])) for x in arrays[:3])
    fn = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal))
    fn(q, k, v).block_until_ready()  # compile now: compile time is not attention time
    path: Path = {"layout": "(batch, n, heads, d) = (1, n, 1, d)", "input_ndim": q.ndim,
                  "threads": "XLA's CPU pool", "version": f"jax {jax.__version__}",
                  "device": str(jax.devices()[0]), "jit": "jax.jit, compiled before timing",
                  "fused": False}
    return lambda: fn(q, k, v).block_until_ready(), path


def make_call(
    name: str, n: int, d_k: int, d_v: int, *, causal: bool, backward: bool = False
) -> tuple[Call, Path]:
    """A zero-argument call of ``name`` at ``n`` tokens on its best path, and that path in words."""
    arrays = bench_arrays(n, d_k, d_v)
    if name == "torch":
        return _torch_call(arrays, causal=causal, backward=backward)
    if name == "jax":
        return _jax_call(arrays, causal=causal)
    return _numpy_call(name, arrays, causal=causal, backward=backward)


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


def _blas_runtime() -> list[dict[str, Any]]:
    """What threadpoolctl sees of the loaded BLAS: library, version, kernel architecture, threads."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
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
        "blas_runtime": _blas_runtime(),
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
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    rates = []
    for product in products:
        m, k, n = product["shape"]
        ta, tb = product["transposed"]
        a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
        b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
        a, b, out = (a.T if ta else a), (b.T if tb else b), np.empty((m, n), dtype=np.float32)
        flops = 2 * m * k * n
        with threadpool_limits(1, user_api="blas"):
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


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """flash on one thread with a one-thread BLAS: line_profiler traces only the thread it runs in."""
    from threadpoolctl import threadpool_limits

    cores = impl.flash._cores
    impl.flash._cores = lambda: 1
    try:
        with threadpool_limits(1, user_api="blas"):
            yield
    finally:
        impl.flash._cores = cores


def profile_lines(n: int, d_k: int, d_v: int, *, causal: bool, backward: bool = False) -> dict[str, Any]:
    """Where one thread's time goes inside flash's tile loop, line by line (line_profiler).

    Profiles ``_row_block`` (forward) or ``_key_block`` (backward) over one whole call at ``n``
    tokens; lines under 0.5 % of the time are summed into one row.
    """
    from line_profiler import LineProfiler

    kernel = impl.flash._key_block if backward else impl.flash._row_block
    fn, _ = make_call("flash", n, d_k, d_v, causal=causal, backward=backward)
    profiler = LineProfiler()
    profiler.add_function(kernel)
    with _one_thread():
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


def format_profile(profile: dict[str, Any]) -> str:
    from tabulate import tabulate

    rows = [[row["line"] or "", f"`{row['source']}`", _fmt(100 * row["share"], ".1f"),
             _fmt(row["ns_per_pair"], ".3f")] for row in profile["lines"]]
    return "\n".join([
        f"{profile['function']}, n = {profile['n_tokens']}: {profile['traced_s'] * 1e3:.1f} ms in the "
        f"traced lines of one thread ({profile['wall_s'] * 1e3:.1f} ms wall with tracing), "
        f"{profile['visible_pairs']} visible pairs",
        "",
        tabulate(rows, ["line", "source", "% time", "ns / visible pair"], tablefmt="github",
                 disable_numparse=True),
    ])


def _fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def _ms(seconds: float | None) -> str:
    return _fmt(None if seconds is None else seconds * 1e3, ".1f")


def _describe(name: str, path: Path) -> str:
    """One line: the path an implementation took."""
    extra = [f"{key} {path[key]}" for key in ("backend", "autograd_node", "device", "jit", "grad")
             if key in path]
    fused = "fused (no n × n pattern)" if path["fused"] else "not fused"
    head = f"{name}: {path['version']}; {path['input_ndim']}-D {path['layout']}; threads: {path['threads']}"
    return "; ".join([head, *extra, fused])


def _load(values: Sequence[float]) -> str:
    return " ".join(f"{x:.2f}" for x in values)


def format_report(record: dict[str, Any]) -> str:
    """The record as text: a time table, a rate/memory table, the ratios that matter, the paths, the load."""
    heading, tables, notes, paths = _report_parts(record)
    return "\n".join([heading, "", *tables, *notes[:3], "paths:", *(f"  {p}" for p in paths), *notes[3:]])


def _report_parts(record: dict[str, Any]) -> tuple[str, list[str], list[str], list[str]]:
    """The report's pieces, for text and Markdown alike: its one-line heading, the two tables
    (each followed by an empty line), the notes (the floor, the ratios, memory, each size not run,
    the machine) and the path each implementation took."""
    from tabulate import tabulate

    config, names = record["config"], record["config"]["implementations"]
    peers = [name for name in PEERS if name in names]
    by = {(r["implementation"], r["n_tokens"]): r for r in record["results"]}
    floor = {f["n_tokens"]: f["time_s"] for f in record["floor"]}
    pairs = {p["n_tokens"]: p for p in record["paired"]}
    traced = [name for name in names if name not in PEERS]
    time_rows, rate_rows = [], []
    for n in config["sizes"]:
        row: list[Any] = [n]
        row += [_ms(by[name, n]["time_s"]) for name in names] + [_ms(floor[n])]
        row += [_fmt(by[name, n]["ratio"], ".2f") for name in names]
        row += [_fmt(pairs[n][f"flash_over_{peer}"], ".2f") for peer in peers]
        row += [_fmt(pairs[n]["flash_over_floor"], ".2f")]
        row += [_fmt(pairs[n][f"{peer}_over_floor"], ".2f") for peer in peers]
        time_rows.append(row)
        rate = [n] + [_fmt(by[name, n]["gflops"], ".1f") for name in names]
        rate += [_fmt(None if by[name, n]["peak_bytes"] is None else by[name, n]["peak_bytes"] / MIB, ".1f")
                 for name in traced]
        rate_rows.append(rate)
    time_head = ["n", *(f"{x} ms" for x in names), "floor ms", *(f"{x} ×/2n" for x in names)]
    time_head += [f"flash/{peer}" for peer in peers] + ["flash/floor"] + [f"{peer}/floor" for peer in peers]
    rate_head = ["n", *(f"{x} GFLOP/s" for x in names), *(f"{x} MiB" for x in traced)]
    mask = "causal" if config["causal"] else "no mask"
    what = "backward (dq, dk, dv)" if config.get("mode") == "backward" else "forward"
    machine = record["machine"]
    kernels = ", ".join(f"{b['internal_api']} {b['version']} ({b['architecture']} kernels, "
                        f"{b['num_threads']} threads)" for b in machine.get("blas_runtime", []))
    heading = (f"{what}, one head, float32, d_k = {config['d_k']}, d_v = {config['d_v']}, {mask}; "
               f"median of {config['repeat']} interleaved samples")
    tables = [tabulate(time_rows, time_head, tablefmt="github", disable_numparse=True), "",
              tabulate(rate_rows, rate_head, tablefmt="github", disable_numparse=True), ""]
    notes = [
        f"floor: useful FLOPs at the rate of a {record['sgemm']['size']}³ float32 sgemm timed before "
        f"each size (median {record['sgemm']['gflops']:.1f} GFLOP/s, {machine['blas']}"
        + (f"; {kernels}" if kernels else "") + ")",
        *_tile_note(record.get("tile_products") or []),
        "x/y columns: median over rounds of the ratio of back-to-back samples",
        f"memory: {record['memory_method']}; MiB = 2²⁰ bytes",
    ]
    paths = [_describe(name, record["paths"][name]) for name in names if name in record["paths"]]
    skipped = [r for r in record["results"] if r["skipped"]]
    notes += [f"{r['implementation']} at {r['n_tokens']}: {r['skipped']}" for r in skipped]
    env = {key: value for key, value in machine["openblas_env"].items() if value is not None}
    notes.append(
        f"{machine['cpu_count']} CPUs; load average before {_load(machine['load_before'])}, "
        f"after {_load(machine['load_after'])}; numpy {machine['numpy']}"
        + (f", torch {machine['torch']} ({machine['torch_threads']} threads)" if machine["torch"] else "")
        + (f", jax {machine['jax']}" if machine.get("jax") else "")
        + (f"; {', '.join(f'{k}={v}' for k, v in env.items())}" if env else "")
    )
    return heading, tables, notes, paths


def _tile_note(products: list[dict[str, Any]]) -> list[str]:
    """The note on the backward tile's products (none for a record without them)."""
    if not products:
        return []
    shown = "; ".join(
        f"{p['name']} {'×'.join(map(str, p['shape']))}: numpy {p['numpy_gflops']:.0f}"
        + (f", torch {p['torch_gflops']:.0f} ({p['torch_gflops'] / p['numpy_gflops']:.2f}×)"
           if p["torch_gflops"] else "")
        for p in products)
    return [f"one backward tile's five products (m×k×n, GFLOP/s on one thread of each library's BLAS): "
            f"{shown}"]


def markdown(record: dict[str, Any], page: str | None = None) -> str:
    """The report as a Markdown page that says how it was made (for docs; regenerate, never edit):
    titled by what was timed, the plot of the same run (the ``--plot`` of its command, linked
    relative to ``page``, the page's own path) above the tables, the notes as a list."""
    heading, tables, notes, paths = _report_parts(record)
    backward = record["config"].get("mode") == "backward"
    image = _plot_of(record)
    figure = []
    if image:
        where = os.path.relpath(image, os.path.dirname(page)) if page else image
        what = "backward" if backward else "forward"
        figure = [f"![{what} time against n, log-log]({where.replace(os.sep, '/')})", ""]
    return "\n".join([
        f"# Benchmark results: {'backward (dq, dk, dv)' if backward else 'forward'}",
        "",
        f"Generated by `{record['command']}` on {record['date']}; regenerate with the same command, "
        "never edit by hand. The figures depend on the machine and its load, both recorded below.",
        "",
        *figure,
        heading,
        "",
        *tables,
        "Notes:",
        "",
        *(f"- {note}" for note in notes),
        "- paths:",
        *(f"    - {path}" for path in paths),
        "",
    ])


def _plot_of(record: dict[str, Any]) -> str | None:
    """The ``--plot FILE`` of the command that made ``record``, or None."""
    words = shlex.split(record["command"])
    return next((after for flag, after in itertools.pairwise(words) if flag == "--plot"), None)


def plot(record: dict[str, Any], path: str) -> None:
    """Log-log time against n for each implementation and the sgemm floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for name in record["config"]["implementations"]:
        pts = [(r["n_tokens"], r["time_s"]) for r in record["results"]
               if r["implementation"] == name and r["time_s"]]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=name)
    ns = [f["n_tokens"] for f in record["floor"]]
    # The floor is a fixed rate times the n² FLOPs: it doubles as the slope-2 guide.
    ax.plot(ns, [f["time_s"] for f in record["floor"]], "k--", label="sgemm floor (∝ n²)")
    mode = record["config"].get("mode", "forward")
    ax.set(xscale="log", yscale="log", xlabel="tokens n", ylabel="seconds (median)",
           title=f"{mode}, one head, float32, d_k = {record['config']['d_k']}"
           + (", causal" if record["config"]["causal"] else ""))
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


_positive = int_at_least(1)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 60:
        raise argparse.ArgumentTypeError(f"expected seconds between 0 and 60, got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m impl.bench", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", type=_positive, default=list(DEFAULT_SIZES), metavar="N",
                   help="numbers of tokens (default: 512 … 16384, doubling)")
    p.add_argument("--repeat", type=_positive, default=5, help="timed samples per size (default 5)")
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True,
                   help="causal mask (default on)")
    p.add_argument("--backward", action="store_true",
                   help="time the gradients: flash_attention_backward against autograd of torch's fused SDPA")
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
        if not _found("line_profiler"):
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
                     for b in _blas_runtime())
    footer = (f"one thread, one-thread BLAS ({blas}); load average before {_load(load)}, "
              f"after {_load(os.getloadavg())}; {date}")
    text = "\n\n".join([*reports, footer])
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join([
                "# Where flash's time goes, line by line",
                "",
                f"Generated by `{command}` on {date}; regenerate with the same command, never edit by hand.",
                "",
                text,
                "",
            ]))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = _parser().parse_args(argv)
        names = _check(args)
    except UsageError as err:
        print(f"python -m impl.bench: error: {err}", file=sys.stderr)
        return 2
    except SystemExit as done:  # --help
        return int(done.code or 0)
    command = " ".join(["python -m impl.bench", *argv])
    if args.profile:
        return _profile(args, command)
    if args.from_json:
        try:
            with open(args.from_json, encoding="utf-8") as f:
                record = json.load(f)
            format_report(record)
        except (ValueError, KeyError, TypeError) as err:
            print(f"python -m impl.bench: error: --from-json: {args.from_json} is not a record of "
                  f"python -m impl.bench --json ({type(err).__name__}: {err})", file=sys.stderr)
            return 2
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
