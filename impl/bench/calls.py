"""What the bench times: each implementation at n tokens on its best path, and that path in words.

Every peer takes its best path, and the record says which it took (``paths``): PyTorch gets
contiguous ``(batch, heads, n, d) = (1, 1, n, d)`` tensors under ``torch.no_grad()`` — the layout
its fused CPU flash kernel takes (2-D inputs fall back to the unfused math path, which materialises
the n × n pattern) — and the kernel SDPA chose is recorded; JAX gets ``jax.nn.dot_product_attention``
jitted, in its ``(batch, n, heads, d)`` layout, compiled by a warm-up call before timing. The
backward pair: ``torch.autograd.grad`` of that fused forward's output (graph kept, so only the
backward kernel is timed) against ``flash_attention_backward`` from a forward's ``(out, lse)`` made
before timing.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from impl.attention import attention
from impl.flash import flash_attention, flash_attention_backward
from impl.grad import attention_backward

PEERS = ("torch", "jax")  # the libraries flash is compared with, when installed

Call = Callable[[], Any]
Path = dict[str, Any]


def found(module: str) -> bool:
    """Whether ``module`` is installed; looked up, not imported (torch and jax take seconds)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # a module without a spec, e.g. one stubbed out
        return False


def available_names(*, backward: bool = False) -> list[str]:
    """The implementations installed here (JAX has no backward pair here: no fused kernel on CPU)."""
    peers = ("torch",) if backward else PEERS
    return ["naive", "flash", *(name for name in peers if found(name))]


def bench_arrays(n: int, d_k: int, d_v: int) -> tuple[np.ndarray, ...]:
    """q, k [n, d_k], v, d_out [n, d_v]: float32 standard normals, the same for every implementation."""
    rng = np.random.default_rng(n)
    q, k = (rng.standard_normal((n, d_k), dtype=np.float32) for _ in range(2))
    v, d_out = (rng.standard_normal((n, d_v), dtype=np.float32) for _ in range(2))
    return q, k, v, d_out


def _numpy_call(
    name: str, arrays: tuple[np.ndarray, ...], *, causal: bool, backward: bool, threads: int | None
) -> tuple[Call, Path]:
    """naive (impl.attention / attention_backward) or flash (on at most ``threads`` threads), on (n, d)
    arrays."""
    q, k, v, d_out = arrays
    path: Path = {"layout": "(n, d)", "input_ndim": 2, "version": f"numpy {np.__version__}",
                  "fused": name == "flash"}
    if name == "naive":
        path["threads"] = "BLAS's own"
        if backward:
            return lambda: attention_backward(q, k, v, d_out, causal=causal), path
        return lambda: attention(q, k, v, causal=causal), path
    path["threads"] = (f"{os.cpu_count()} row/key blocks at once, one-thread BLAS each" if threads is None
                       else f"at most {threads} row/key blocks at once")
    if backward:
        out, lse = flash_attention(q, k, v, causal=causal, return_lse=True)
        return (lambda: flash_attention_backward(q, k, v, out, lse, d_out, causal=causal, threads=threads),
                path)
    return lambda: flash_attention(q, k, v, causal=causal, threads=threads), path


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
    name: str, n: int, d_k: int, d_v: int, *, causal: bool, backward: bool = False, threads: int | None = None
) -> tuple[Call, Path]:
    """A zero-argument call of ``name`` at ``n`` tokens on its best path, and that path in words
    (``threads``: flash's ``threads=``, its default one per core)."""
    arrays = bench_arrays(n, d_k, d_v)
    if name == "torch":
        return _torch_call(arrays, causal=causal, backward=backward)
    if name == "jax":
        return _jax_call(arrays, causal=causal)
    return _numpy_call(name, arrays, causal=causal, backward=backward, threads=threads)
