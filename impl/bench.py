"""``python -m impl.bench``: attention's n² cost, measured — naive, tiled (flash) and PyTorch.

One head, float32, d_k = d_v = 128 by default, n doubling from 512 to 16,384 tokens. For each
implementation and size it reports the median wall time over ``--repeat`` samples, the useful
GFLOP/s, the time ratio per doubling (pure n² gives 4) and the peak traced memory.

Method:

* Useful FLOPs count only visible (query, key) pairs: ``2·(d_k + d_v)`` per pair (a multiply and an
  add for each entry of q·k and of weight·v), ``n(n+1)/2`` pairs under the causal mask, ``n²``
  without it. Every implementation is credited the same count, so GFLOP/s compares like with like.
* The sgemm floor is the time those FLOPs take at the rate of one plain float32 matrix product
  (2048 × 2048 × 2048, NumPy's BLAS), timed just before each size in every round: no attention
  can beat it on the same BLAS without doing less arithmetic.
* Rounds interleave everything — for each round, for each size, each implementation and the
  floor run back to back — so a machine shared with other work slows all of them alike and the
  ratios stay meaningful. ``os.getloadavg()`` before and after is recorded.
* A sample is as many back-to-back calls as last at least 0.05 s (one call from 2048 tokens up;
  as timeit's autorange), so a scheduler hiccup on a busy machine is not a whole millisecond-long
  measurement. Each sample starts after a pause (``--pause``, 0.2 s): BLAS and OpenMP worker
  threads spin for a while after a call before they sleep, and would otherwise steal the next
  sample's cores.
* Peak memory: one extra (untimed, warm-up) call per size under :mod:`tracemalloc`, which sees
  NumPy's buffers; the inputs are made before tracing starts, so the figure is what the call
  itself allocates, output included. PyTorch's allocator is invisible to tracemalloc, so its
  memory is not reported. Bytes are exact; the table shows MiB (2²⁰ bytes).
* The naive path materialises the n × n pattern and its temporaries (several GiB at 16,384
  tokens), so it is skipped above ``--naive-max`` (default 8192), and the output says so.

JSON (``--json FILE``), for other tools; keys are kept, more may be added:

* ``config.{sizes, d_k, d_v, dtype, causal, repeat, naive_max, pause_s, implementations}``
* ``machine.{cpu_count, load_before, load_after, numpy, blas, torch, torch_threads, openblas_env}``
  — ``load_*`` are the 1/5/15-minute load averages; ``openblas_env`` holds OPENBLAS_CORETYPE and
  OPENBLAS_L2_SIZE as set (null when unset).
* ``sgemm.{size, times_s, gflops}`` — the floor's reference product, all its timed samples (size
  by size, round by round), its median rate.
* ``memory_method`` — how ``peak_bytes`` was measured, in words.
* ``results[].{implementation, n_tokens, flops, times_s, calls_per_sample, time_s, gflops, ratio,
  peak_bytes, skipped}`` — one entry per implementation and size: the useful FLOPs (exact), the
  seconds per call of every timed sample, the calls in each sample, their median, the median rate,
  ``time_s`` over the previous size's (null for the first), the peak traced bytes (null when not
  measured) and, for a size not run, the reason (else null).
* ``floor[].{n_tokens, flops, times_s, time_s}`` — the sgemm floor per size: the useful FLOPs at the
  rate of the sgemm timed just before that size, per round, and their median.
* ``paired[].{n_tokens, flash_over_torch, flash_over_floor}`` — per size, the median over rounds of
  flash's time over torch's and over the floor's in the same round (null when one is missing):
  samples taken seconds apart share the machine's load, so these ratios are the steadiest figures.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from impl.attention import attention
from impl.cli import Parser, UsageError, check_output_dir, int_at_least
from impl.flash import flash_attention

DEFAULT_SIZES = (512, 1024, 2048, 4096, 8192, 16384)
SGEMM_SIZE = 2048
NAIVE_MAX = 8192
PAUSE_S = 0.2
MIN_SAMPLE_S = 0.05
MIB = 1 << 20

Attention = Callable[[Any, Any, Any, bool], Any]


def visible_pairs(n_q: int, n_k: int, *, causal: bool) -> int:
    """(query, key) pairs the softmax weighs: query i sees keys j ≤ i under the causal mask."""
    if not causal:
        return n_q * n_k
    full = max(0, n_q - n_k)  # queries past the last key see all n_k keys
    seen = min(n_q, n_k)  # the first queries see 1, 2, … keys
    return seen * (seen + 1) // 2 + full * n_k


def useful_flops(n: int, d_k: int, d_v: int, *, causal: bool) -> int:
    """FLOPs of q·kᵀ and weights·v over the visible pairs only: 2·(d_k + d_v) per pair."""
    return 2 * (d_k + d_v) * visible_pairs(n, n, causal=causal)


def _naive(q: Any, k: Any, v: Any, causal: bool) -> Any:
    return attention(q, k, v, causal=causal)


def _flash(q: Any, k: Any, v: Any, causal: bool) -> Any:
    return flash_attention(q, k, v, causal=causal)


def _torch_impl() -> Attention | None:
    try:
        import torch
    except ImportError:
        return None
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def run(q: Any, k: Any, v: Any, causal: bool) -> Any:
        return sdpa(q, k, v, is_causal=causal)

    return run


def available_names() -> list[str]:
    """The implementations installed here; torch is looked up, not imported (that takes seconds)."""
    try:
        has_torch = importlib.util.find_spec("torch") is not None
    except ValueError:  # a torch module without a spec, e.g. one stubbed out
        has_torch = False
    return ["naive", "flash", *(["torch"] if has_torch else [])]


def implementation(name: str) -> Attention:
    """The implementation called ``name``: naive, flash or torch (imported only when asked for)."""
    if name == "torch":
        torch_run = _torch_impl()
        if torch_run is None:
            raise ValueError("torch is not installed")
        return torch_run
    return {"naive": _naive, "flash": _flash}[name]


def _inputs(name: str, n: int, d_k: int, d_v: int) -> tuple[Any, Any, Any]:
    rng = np.random.default_rng(n)
    q, k = (rng.standard_normal((n, d_k), dtype=np.float32) for _ in range(2))
    v = rng.standard_normal((n, d_v), dtype=np.float32)
    if name == "torch":
        import torch

        return torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v)
    return q, k, v


def timed(fn: Callable[[], Any]) -> float:
    """Wall seconds of one call."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


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


def _machine(names: Sequence[str]) -> dict[str, Any]:
    torch_version: str | None = None
    torch_threads: int | None = None
    if "torch" in names:
        import torch

        torch_version, torch_threads = torch.__version__, torch.get_num_threads()
    return {
        "cpu_count": os.cpu_count(),
        "numpy": np.__version__,
        "blas": _blas_name(),
        "torch": torch_version,
        "torch_threads": torch_threads,
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
) -> dict[str, Any]:
    """Time ``names`` over ``sizes``, interleaved round by round; return the JSON record."""
    available = {name: implementation(name) for name in names}
    machine = {**_machine(names), "load_before": list(os.getloadavg())}
    inputs = {(name, n): _inputs(name, n, d_k, d_v) for name in names for n in sizes}

    def skip_reason(name: str, n: int) -> str | None:
        if name == "naive" and n > naive_max:
            return f"naive skipped above --naive-max {naive_max}: its n×n pattern needs ≥ 1 GiB at 16384"
        return None

    def call(name: str, n: int) -> Callable[[], Any]:
        q, k, v = inputs[name, n]
        return lambda: available[name](q, k, v, causal)

    def timed_call(name: str, n: int) -> float:
        """Seconds per call, over a sample of ``calls[name, n]`` calls."""
        fn, count = call(name, n), calls[name, n]
        time.sleep(pause)
        return timed(lambda: [fn() for _ in range(count)]) / count

    # Warm-up and memory: one untimed call per size; tracemalloc sees NumPy's buffers only. Then
    # one call sets how many calls make a sample of at least MIN_SAMPLE_S (as timeit's autorange).
    peak: dict[tuple[str, int], int | None] = {}
    calls: dict[tuple[str, int], int] = {}
    for n in sizes:
        for name in names:
            if skip_reason(name, n) is None:
                peak[name, n] = None if name == "torch" else peak_traced_bytes(call(name, n))
                if name == "torch":
                    call(name, n)()
                calls[name, n] = max(1, math.ceil(MIN_SAMPLE_S / max(timed(call(name, n)), 1e-9)))

    # Each round times, per size, the reference sgemm and then every implementation, back to back.
    times: dict[tuple[str, int], list[float]] = {key: [] for key in peak}
    sgemm: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeat):
        for n in sizes:
            time.sleep(pause)
            sgemm[n].append(sgemm_seconds())
            for name in names:
                if (name, n) in times:
                    times[name, n].append(timed_call(name, n))
    machine["load_after"] = list(os.getloadavg())

    all_sgemm = [t for n in sizes for t in sgemm[n]]
    sgemm_flops = 2 * SGEMM_SIZE**3
    floor = {n: [useful_flops(n, d_k, d_v, causal=causal) * t / sgemm_flops for t in sgemm[n]] for n in sizes}

    def paired(top: list[float] | None, bottom: list[float] | None) -> float | None:
        """Median of the per-round ratios of two back-to-back samples."""
        return statistics.median(a / b for a, b in zip(top, bottom, strict=True)) if top and bottom else None

    results = []
    for name in names:
        previous = None
        for n in sizes:
            flops = useful_flops(n, d_k, d_v, causal=causal)
            runs = times.get((name, n))
            median = statistics.median(runs) if runs else None
            results.append({
                "implementation": name,
                "n_tokens": n,
                "flops": flops,
                "times_s": runs or [],
                "calls_per_sample": calls.get((name, n)),
                "time_s": median,
                "gflops": flops / median / 1e9 if median else None,
                "ratio": median / previous if median and previous else None,
                "peak_bytes": peak.get((name, n)),
                "skipped": skip_reason(name, n),
            })
            previous = median
    return {
        "config": {
            "sizes": list(sizes), "d_k": d_k, "d_v": d_v, "dtype": "float32", "causal": causal,
            "repeat": repeat, "naive_max": naive_max, "pause_s": pause, "implementations": list(names),
        },
        "machine": machine,
        "sgemm": {
            "size": SGEMM_SIZE,
            "times_s": all_sgemm,
            "gflops": sgemm_flops / statistics.median(all_sgemm) / 1e9,
        },
        "memory_method": (
            "tracemalloc peak during one call, inputs made before tracing (NumPy paths only; "
            "PyTorch's allocator is not traced)"
        ),
        "results": results,
        "floor": [
            {"n_tokens": n, "flops": useful_flops(n, d_k, d_v, causal=causal), "times_s": floor[n],
             "time_s": statistics.median(floor[n])}
            for n in sizes
        ],
        "paired": [
            {"n_tokens": n, "flash_over_torch": paired(times.get(("flash", n)), times.get(("torch", n))),
             "flash_over_floor": paired(times.get(("flash", n)), floor[n])}
            for n in sizes
        ],
    }


def _fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def _ms(seconds: float | None) -> str:
    return _fmt(None if seconds is None else seconds * 1e3, ".1f")


def format_report(record: dict[str, Any]) -> str:
    """The record as text: a time table, a rate/memory table, the ratios that matter, the load."""
    from tabulate import tabulate

    config, names = record["config"], record["config"]["implementations"]
    by = {(r["implementation"], r["n_tokens"]): r for r in record["results"]}
    floor = {f["n_tokens"]: f["time_s"] for f in record["floor"]}
    pairs = {p["n_tokens"]: p for p in record["paired"]}
    time_rows, rate_rows = [], []
    for n in config["sizes"]:
        row: list[Any] = [n]
        row += [_ms(by[name, n]["time_s"]) for name in names] + [_ms(floor[n])]
        row += [_fmt(by[name, n]["ratio"], ".2f") for name in names]
        row += [_fmt(pairs[n]["flash_over_torch"], ".2f")] if "torch" in names else []
        row += [_fmt(pairs[n]["flash_over_floor"], ".2f")]
        time_rows.append(row)
        rate = [n] + [_fmt(by[name, n]["gflops"], ".1f") for name in names]
        rate += [
            _fmt(None if by[name, n]["peak_bytes"] is None else by[name, n]["peak_bytes"] / MIB, ".1f")
            for name in names if name != "torch"
        ]
        rate_rows.append(rate)
    time_head = ["n", *(f"{x} ms" for x in names), "floor ms", *(f"{x} ×/2n" for x in names)]
    time_head += ["flash/torch"] if "torch" in names else []
    time_head += ["flash/floor"]
    rate_head = ["n", *(f"{x} GFLOP/s" for x in names), *(f"{x} MiB" for x in names if x != "torch")]
    mask = "causal" if config["causal"] else "no mask"
    machine = record["machine"]
    lines = [
        f"one head, float32, d_k = {config['d_k']}, d_v = {config['d_v']}, {mask}; "
        f"median of {config['repeat']} interleaved samples",
        "",
        tabulate(time_rows, time_head, tablefmt="github", disable_numparse=True),
        "",
        tabulate(rate_rows, rate_head, tablefmt="github", disable_numparse=True),
        "",
        f"floor: useful FLOPs at the rate of a {record['sgemm']['size']}³ float32 sgemm timed before "
        f"each size (median {record['sgemm']['gflops']:.1f} GFLOP/s, {machine['blas']})",
        "flash/x columns: median over rounds of the ratio of back-to-back samples",
        f"memory: {record['memory_method']}; MiB = 2²⁰ bytes",
    ]
    skipped = [r for r in record["results"] if r["skipped"]]
    lines += [f"{r['implementation']} at {r['n_tokens']}: {r['skipped']}" for r in skipped]
    lines.append(
        f"{machine['cpu_count']} CPUs; load average before "
        f"{' '.join(f'{x:.2f}' for x in machine['load_before'])}, after "
        f"{' '.join(f'{x:.2f}' for x in machine['load_after'])}; numpy {machine['numpy']}"
        + (f", torch {machine['torch']} ({machine['torch_threads']} threads)" if machine["torch"] else "")
    )
    return "\n".join(lines)


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
    ax.set(xscale="log", yscale="log", xlabel="tokens n", ylabel="seconds (median)",
           title=f"one head, float32, d_k = {record['config']['d_k']}"
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
    p.add_argument("--d-k", type=_positive, default=128, help="query/key width (default 128)")
    p.add_argument("--d-v", type=_positive, default=128, help="value width (default 128)")
    p.add_argument("--impl", action="append", dest="impls", metavar="NAME",
                   help="an implementation to run: naive, flash, torch (repeatable; default all found)")
    p.add_argument("--naive-max", type=_positive, default=NAIVE_MAX,
                   help=f"largest n for the naive path (default {NAIVE_MAX}; it needs O(n²) memory)")
    p.add_argument("--pause", type=_seconds, default=PAUSE_S, metavar="SECONDS",
                   help=f"sleep before each timed call, so idle worker threads settle (default {PAUSE_S})")
    p.add_argument("--json", metavar="FILE", help="write the record as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="write a log-log plot (needs matplotlib)")
    return p


def _check(args: argparse.Namespace) -> list[str]:
    """Refuse what would fail only after minutes of timing."""
    available = available_names()
    names = args.impls or available
    for name in names:
        if name not in ("naive", "flash", "torch"):
            raise UsageError(f"--impl: unknown implementation {name!r} (choose naive, flash, torch)")
        if name not in available:
            raise UsageError(f"--impl {name}: torch is not installed (pip install torch==2.13.0)")
    names = list(dict.fromkeys(names))
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        if path:
            check_output_dir(flag, path)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--plot needs matplotlib, which is not installed") from None
    return names


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        names = _check(args)
    except UsageError as err:
        print(f"python -m impl.bench: error: {err}", file=sys.stderr)
        return 2
    except SystemExit as done:  # --help
        return int(done.code or 0)
    record = run_benchmark(args.sizes, names=names, repeat=args.repeat, causal=args.causal,
                           d_k=args.d_k, d_v=args.d_v, naive_max=args.naive_max, pause=args.pause)
    print(format_report(record))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1, allow_nan=False)
    if args.plot:
        plot(record, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
