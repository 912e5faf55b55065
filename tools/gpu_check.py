"""The suite against PyTorch's GPU attention, one kernel at a time: SDPA's backends (math, efficient,
flash, cuDNN), each forced with ``torch.nn.attention.sdpa_kernel``, and FlexAttention compiled,
per dtype, in one table.

    python tools/gpu_check.py                         # on cuda, profile quick
    python tools/gpu_check.py --device cpu            # the dry run: what runs on a CPU (math, flash)
    python tools/gpu_check.py --profile ci --json out.json --only matches_golden causal_no_leak

Each row is ``spec.check`` of one backend in one dtype, its arrays on the device bit for bit and
each call synchronized before its deadline is judged (``spec.from_torch(..., device=)``). Each
backend is declared with the limits its kernels document (the flash and cuDNN kernels: d_v = d_k,
float16 and bfloat16, no ``attn_mask``); a backend that cannot run on the device at all is one
row saying so. Prints the table; exits 1 if a row does not conform, 2 on a bad command line.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

BACKENDS = ("math", "efficient", "flash", "cudnn")
DTYPES = ("float16", "bfloat16", "float32", "float64")


@dataclass(frozen=True)
class Kernel:
    """One of PyTorch's attention kernels, as the suite is told about it on a device."""

    name: str
    dtypes: tuple[str, ...]
    declared: dict[str, Any] = field(default_factory=dict)  # Target fields beyond the dtypes


COMMON = {"supports_scale": True}


def kernels(device: str) -> dict[str, Kernel]:
    """Each backend's declaration on ``device``. On CUDA, the conditions SDPA's backend selection
    states for each kernel (torch 2.13's ``sdp_utils``): flash and cuDNN take float16 and bfloat16
    with d_v = d_k and no ``attn_mask``; the memory-efficient kernel takes float32 too, and masks;
    math takes everything. On a CPU (the dry run), as measured here: the flash kernel takes every
    dtype, masks and grouped heads, 4-D inputs with d_v = d_k, and no dropout."""
    everything = {**COMMON, "supports_mask": True, "supports_gqa": True, "supports_bias": True}
    if device == "cpu":
        return {"math": Kernel("math", DTYPES, {**everything, "ndims": (2, 3, 4)}),
                "flash": Kernel("flash", DTYPES, {**everything, "ndims": (4,), "equal_head_dims": True})}
    fused = {**COMMON, "ndims": (4,), "equal_head_dims": True}
    return {
        "math": Kernel("math", DTYPES, {**everything, "ndims": (2, 3, 4)}),
        "efficient": Kernel("efficient", ("float16", "bfloat16", "float32"),
                            {**COMMON, "supports_mask": True, "supports_bias": True, "ndims": (4,)}),
        "flash": Kernel("flash", ("float16", "bfloat16"), {**fused, "head_dims": (32, 64, 128, 256)}),
        "cudnn": Kernel("cudnn", ("float16", "bfloat16"), {**fused, "head_dims": (64, 128)}),
    }


def sdpa_on(backend: str, device: str) -> Callable[..., Any]:
    """The ``torch`` built-in's SDPA call (masks, causal and bias folded into one ``attn_mask`` as
    SDPA takes them) with one backend forced (``sdpa_kernel``): a kernel that cannot take a call
    raises instead of falling back to another. NumPy arrays in and out, tensors on ``device``."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from spec.adapters.torch import torch_attention

    chosen = {"math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION,
              "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]

    def attention(q: Any, k: Any, v: Any, **keywords: Any) -> Any:
        with sdpa_kernel(chosen):
            return torch_attention(q, k, v, device=device, **keywords)

    attention.__name__ = attention.__qualname__ = f"sdpa_{backend}"
    return attention


def available(backend: str, device: str) -> str | None:
    """None if the backend runs a small causal call in float16 (float32 on a CPU) on the device,
    else why not."""

    import numpy as np

    q = np.zeros((1, 1, 8, 64), dtype=np.float32 if device == "cpu" else np.float16)
    try:
        sdpa_on(backend, device)(q, q, q, causal=True)
    except RuntimeError as e:
        return str(e).splitlines()[0][:120]
    return None


def flex_target(device: str, dtype: str) -> Any:
    """FlexAttention compiled (``torch.compile(flex_attention)``), causal by its block mask."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    import spec

    compiled = torch.compile(flex_attention)

    def attention(q: Any, k: Any, v: Any, *, is_causal: bool = False, scale: float | None = None) -> Any:
        mask = None
        if is_causal:
            def causal(b: Any, h: Any, i: Any, j: Any) -> Any:
                return j <= i

            mask = create_block_mask(causal, None, None, q.shape[-2], k.shape[-2], device=device)
        return compiled(q, k, v, block_mask=mask, scale=scale)

    return spec.from_torch(attention, device=device, name=f"flex_attention (compiled) on {device}",
                           rename={"causal": "is_causal"}, dtypes=(dtype,), ndims=(4,), supports_scale=True,
                           compiles_per_shape=True, deadline_s=600.0)


def sdpa_target(backend: str, device: str, dtype: str) -> Any:
    import spec

    kernel = kernels(device)[backend]
    return spec.Target(sdpa_on(backend, device), name=f"sdpa {backend} on {device}", dtypes=(dtype,),
                       deadline_s=120.0, **kernel.declared)


def row(name: str, dtype: str, target: Any, profile: str, only: list[str] | None) -> dict[str, Any]:
    """One ``spec.check`` as a row of the table."""
    import spec

    start = time.perf_counter()
    report = spec.check(target, profile, only=only)
    ratios = [v for r in report.results for k, v in r.observed.items()
              if k.startswith("error ratio") and math.isfinite(v)]
    counts = {s: sum(r.status == s for r in report.results) for s in ("pass", "fail", "skip", "xfail")}
    return {"kernel": name, "dtype": dtype, "conforms": report.ok, **counts,
            "worst error ratio": max(ratios) if ratios else None,
            "seconds": round(time.perf_counter() - start, 1),
            "failures": [f"{r.name}: {r.message}" for r in report.failures]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/gpu_check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu for the dry run")
    parser.add_argument("--profile", default="quick", choices=["quick", "ci", "thorough"])
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS,
                        help="the SDPA backends (default all; on a CPU, math and flash run)")
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--flex", action=argparse.BooleanOptionalAction, default=None,
                        help="FlexAttention compiled too (default: on a GPU only; each shape compiles)")
    parser.add_argument("--only", nargs="+", metavar="LAW", help="only these laws")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    try:
        import torch
    except ModuleNotFoundError:
        print("python tools/gpu_check.py: error: needs torch: pip install torch", file=sys.stderr)
        return 2
    try:
        torch.empty(0, device=args.device)
    except (RuntimeError, AssertionError) as e:
        print(f"python tools/gpu_check.py: error: no device {args.device!r}: {e}", file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    declared = kernels(args.device)
    for backend in args.backends:
        missing = f"no {backend} kernel on {args.device}"
        why = available(backend, args.device) if backend in declared else missing
        if why is not None:
            rows.append({"kernel": backend, "dtype": "-", "conforms": None,
                         "failures": [f"not available: {why}"]})
            continue
        for dtype in (d for d in args.dtypes if d in declared[backend].dtypes):
            target = sdpa_target(backend, args.device, dtype)
            rows.append(row(backend, dtype, target, args.profile, args.only))
            print(f"  {backend} {dtype}: {'conforms' if rows[-1]['conforms'] else 'does not conform'}",
                  file=sys.stderr, flush=True)
    if args.flex if args.flex is not None else args.device != "cpu":
        for dtype in (d for d in args.dtypes if d != "float64"):
            target = flex_target(args.device, dtype)
            rows.append(row("flex (compiled)", dtype, target, args.profile, args.only))
    print(table(rows, f"torch {torch.__version__} on {args.device}, profile {args.profile}"))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2)
    return 1 if any(r["conforms"] is False for r in rows) else 0


def table(rows: list[dict[str, Any]], title: str) -> str:
    from tabulate import tabulate

    columns = ("kernel", "dtype", "conforms", "pass", "fail", "skip", "xfail", "worst error ratio", "seconds")
    shown = [{key: row.get(key, "") for key in columns} for row in rows]
    notes = [f"{row['kernel']} {row['dtype']}: {failure}" for row in rows
             for failure in row.get("failures", [])]
    return "\n".join([title, tabulate(shown, headers="keys", tablefmt="github", floatfmt=".3g"), *notes])


if __name__ == "__main__":
    sys.exit(main())
