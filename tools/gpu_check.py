"""The suite against PyTorch's GPU attention, one kernel at a time: SDPA's backends (math, efficient,
flash, cuDNN), each forced with ``torch.nn.attention.sdpa_kernel``, FlexAttention compiled, and,
where installed on a Hopper GPU, FlashMLA's dense decode and sparse prefill kernels and
FlashAttention 3's ``qv``, per dtype, in one table.

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
import importlib.util
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

BACKENDS = ("math", "efficient", "flash", "cudnn")
DTYPES = ("float16", "bfloat16", "float32", "float64")
MLA = {"flash_mla_decode": "flash_mla", "flash_mla_sparse": "flash_mla", "fa3_qv": "flash_attn_interface"}
"""The MLA kernels (each by the module that provides it), checked where installed on a Hopper GPU."""


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


def mla_available(kernel: str, device: str) -> str | None:
    """None if ``kernel``'s module is installed and ``device`` is a Hopper GPU (compute capability
    9.x, what FlashMLA and FlashAttention 3 are built for), else why not."""
    if importlib.util.find_spec(MLA[kernel]) is None:
        return f"{MLA[kernel]} is not installed"
    if not device.startswith("cuda"):
        return f"needs a Hopper GPU (compute capability 9.x), not {device!r}"
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return None if major == 9 else f"needs a Hopper GPU (compute capability 9.x), found {major}.{minor}"


def one_block_per_row(k: Any, block_size: int) -> tuple[Any, Any, Any]:
    """Contiguous keys ``[b, n_k, g, d]`` (bnhd) as a paged pool of ``block_size``-key blocks, each
    row's keys in blocks of its own (the last zero-padded), its table and lengths: for a kernel that
    reads paged caches only. A copy: no number changes."""
    import numpy as np

    batch, n_k, g, d = k.shape
    per_row = max(-(-n_k // block_size), 1)
    pool = np.zeros((batch * per_row, block_size, g, d), dtype=k.dtype)
    flat = pool.reshape(batch, per_row * block_size, g, d)
    flat[:, :n_k] = k
    table = np.arange(batch * per_row, dtype=np.int32).reshape(batch, per_row)
    return flat.reshape(pool.shape), table, np.full(batch, n_k, dtype=np.int32)


def flash_mla_decode_target(device: str, dtype: str) -> Any:
    """FlashMLA's dense decode, ``flash_mla_with_kvcache``, on its shared latent (``v_from_k``: d_k =
    576, d_v = 512, V the first 512 columns of K) over a paged cache of 64-key blocks, causal per
    sequence; contiguous keys reach it as a pool (`one_block_per_row`). Returns its natural-log LSE
    ``[b, h_q, s_q]``."""
    import numpy as np
    import torch

    import spec
    from spec.adapters.torch import _from_torch, _to_torch

    def decode(q: Any, k: Any, v: Any, *, d_v: int, block_table: Any = None, kv_lengths: Any = None,
               causal: bool = False, scale: float | None = None, return_lse: bool = False) -> Any:
        import flash_mla

        if block_table is None:
            k, block_table, kv_lengths = one_block_per_row(k, 64)
        seqlens = torch.from_numpy(np.asarray(kv_lengths, dtype=np.int32)).to(device)
        table = torch.from_numpy(np.asarray(block_table, dtype=np.int32)).to(device)
        s_q, h_q, h_kv = q.shape[1], q.shape[2], k.shape[2]
        try:
            metadata, splits = flash_mla.get_mla_metadata(seqlens, s_q * h_q // h_kv, h_kv)
        except TypeError:  # FlashMLA's newer interface plans inside the call
            metadata, splits = flash_mla.get_mla_metadata()
        out, lse = flash_mla.flash_mla_with_kvcache(_to_torch(q, device), _to_torch(k, device), table,
                                                    seqlens, d_v, metadata, splits, softmax_scale=scale,
                                                    causal=causal)
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        return (_from_torch(out), _from_torch(lse)) if return_lse else _from_torch(out)

    return spec.Target(decode, name=f"FlashMLA decode on {device}", layout="bnhd", dtypes=(dtype,),
                       ndims=(4,), v_from_k=True, head_dims=(512, 576), supports_scale=True,
                       supports_gqa=True, supports_paged_kv=True, block_multiple=64,
                       causal_alignment="kv_lengths", returns_lse=True, empty_lse=float("inf"),
                       deadline_s=120.0)


def flash_mla_sparse_target(device: str, dtype: str) -> Any:
    """FlashMLA's sparse prefill, ``flash_mla_sparse_fwd(q [s_q, h_q, 576], kv [s_kv, h_kv, 576],
    indices [s_q, h_kv, topk], sm_scale, d_v=512)``, given the suite's 3-D ``(heads, n, d)`` arrays
    transposed to its token-major order (a copy), ``sm_scale`` 1/√d_k unless ``scale=``, each row's
    entries past ``topk_length`` given as −1 (its prefill has no length), every row padded with −1
    to a multiple of 64 entries, and every key listed where the call gives no list; returns its
    base-2 LSE (``lse_base=2``); a row with no valid index gives zeros and an LSE of +inf."""
    import numpy as np
    import torch

    import spec
    from spec.adapters.torch import _from_torch, _to_torch

    def sparse(q: Any, k: Any, v: Any, *, d_v: int, topk_indices: Any = None, topk_length: Any = None,
               scale: float | None = None, return_lse: bool = False) -> Any:
        import flash_mla

        scale = q.shape[-1] ** -0.5 if scale is None else scale  # it takes sm_scale always
        if topk_indices is None:  # no list: every key, listed by every row
            topk_indices = np.broadcast_to(np.arange(k.shape[-2]), (k.shape[0], q.shape[-2], k.shape[-2]))
        if topk_length is not None:  # its prefill reads whole rows: the entries past the length become −1
            past = np.arange(np.shape(topk_indices)[-1]) >= np.asarray(topk_length)[:, None]
            topk_indices = np.where(past, -1, topk_indices)
        width = np.shape(topk_indices)[-1]  # padded with −1 to a multiple of 64, the tile its kernel reads
        topk_indices = np.pad(topk_indices, ((0, 0), (0, 0), (0, -width % 64)), constant_values=-1)

        def tokens_first(x: Any) -> Any:  # (heads, n, ...) -> (n, heads, ...), a copy on the device
            return _to_torch(np.ascontiguousarray(np.swapaxes(x, 0, 1)), device)

        out, _, lse = flash_mla.flash_mla_sparse_fwd(tokens_first(q), tokens_first(k),
                                                     tokens_first(np.asarray(topk_indices, dtype=np.int32)),
                                                     scale, d_v)
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        out = np.swapaxes(_from_torch(out), 0, 1)
        return (out, np.swapaxes(_from_torch(lse), 0, 1)) if return_lse else out

    return spec.Target(sparse, name=f"FlashMLA sparse prefill on {device}", dtypes=(dtype,), ndims=(3,),
                       v_from_k=True, head_dims=(512, 576), supports_scale=True, supports_gqa=True,
                       supports_topk=True, causal_alignment=None, returns_lse=True, lse_base=2,
                       empty_lse=float("inf"), deadline_s=120.0)


def fa3_qv_target(device: str, dtype: str) -> Any:
    """FlashAttention 3's ``flash_attn_func`` with its extra query term ``qv`` (absorbed MLA:
    d_k = 64 scored against the keys, qv of d_v = 512 against the values), bnhd."""
    import spec

    def attention(q: Any, k: Any, v: Any, *, qv: Any = None, softmax_scale: float | None = None,
                  causal: bool = False, return_lse: bool = False) -> Any:
        import flash_attn_interface

        found = flash_attn_interface.flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal,
                                                     qv=qv, return_attn_probs=return_lse)
        if return_lse:
            return found[0], found[1]
        return found[0] if isinstance(found, tuple) else found

    return spec.from_torch(attention, device=device, name=f"FlashAttention 3 with qv on {device}",
                           rename={"scale": "softmax_scale", "causal": "causal", "qv": "qv"},
                           layout="bnhd", dtypes=(dtype,), ndims=(4,), supports_qv=True, supports_scale=True,
                           supports_gqa=True,
                           head_dims=(64, 512), causal_alignment="bottom_right", returns_lse=True,
                           deadline_s=120.0)


MLA_TARGETS = {"flash_mla_decode": flash_mla_decode_target, "flash_mla_sparse": flash_mla_sparse_target,
               "fa3_qv": fa3_qv_target}


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
    parser.add_argument("--mla", action=argparse.BooleanOptionalAction, default=True,
                        help="FlashMLA's decode and sparse kernels and FlashAttention 3's qv, where "
                             "installed on a Hopper GPU (default on; a row saying why where not)")
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
    for kernel in MLA if args.mla else ():
        why = mla_available(kernel, args.device)
        if why is not None:
            rows.append({"kernel": kernel, "dtype": "-", "conforms": None,
                         "failures": [f"not available: {why}"]})
            continue
        for dtype in (d for d in args.dtypes if d in ("float16", "bfloat16")):
            try:
                target = MLA_TARGETS[kernel](args.device, dtype)
            except Exception as e:  # a kernel whose interface differs: one row saying so
                rows.append({"kernel": kernel, "dtype": dtype, "conforms": False, "failures": [f"{e}"]})
                continue
            rows.append(row(kernel, dtype, target, args.profile, args.only))
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
