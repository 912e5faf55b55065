"""Attention layers built on `impl.attention`: one head, and multi-head with grouped K/V."""

from __future__ import annotations

from typing import Any

import numpy as np

from impl.attention import Array, attention


def _weight(name: str, w: Any, rows: int) -> Array:
    w = np.asarray(w)
    if w.ndim != 2 or w.shape[0] != rows:
        raise ValueError(f"{name} must have shape ({rows}, width), got {w.shape}")
    return w


def self_attention(
    x: Any, wq: Any, wk: Any, wv: Any, *, causal: bool = True
) -> tuple[Array, Array]:  # [..., n, d], [d, d_k], [d, d_k], [d, d_v] -> [..., n, d_v], [..., n, n]
    """One attention head over the tokens ``x``, the form of the article "How an LLM Works, Part 6:
    Attention".

    ``q, k, v = x W_Q, x W_K, x W_V``; returns the head's output and its pattern.
    """
    x = np.asarray(x)
    if x.ndim < 2:
        raise ValueError(f"x must have shape (..., n, d), got {x.shape}")
    d = x.shape[-1]
    q, k, v = (x @ _weight(name, w, d) for name, w in (("wq", wq), ("wk", wk), ("wv", wv)))
    out, pattern = attention(q, k, v, causal=causal, return_weights=True)
    return out, pattern


def _split_heads(t: Array, n: int) -> Array:  # [..., n_tok, n·w] -> [..., n, n_tok, w]
    return np.swapaxes(t.reshape(*t.shape[:-1], n, t.shape[-1] // n), -2, -3)


def multi_head_attention(
    x: Any,
    wq: Any,
    wk: Any,
    wv: Any,
    wo: Any,
    *,
    n_heads: int,
    n_kv_heads: int | None = None,
    causal: bool = True,
) -> Array:  # [..., n, d], [d, h·d_k], [d, g·d_k], [d, g·d_v], [h·d_v, d_out] -> [..., n, d_out]
    """Multi-head attention with ``h = n_heads`` query heads and ``g = n_kv_heads`` K/V heads.

    Head widths come from the weights: ``d_k = wq.shape[1] / h``, ``d_v = wv.shape[1] / g``
    (``d_k = d/h`` for the usual square weights). Heads are concatenated and mixed by ``wo``.
    ``g < h`` is grouped-query attention (``g = 1``: multi-query): query head i reads K/V head
    ``i // (h // g)``, the convention of PyTorch's ``enable_gqa`` and JAX — equal to plain MHA with
    each K/V head repeated ``h // g`` times.
    """
    x = np.asarray(x)
    if x.ndim < 2:
        raise ValueError(f"x must have shape (..., n, d), got {x.shape}")
    h = n_heads
    g = h if n_kv_heads is None else n_kv_heads
    for name, val in (("n_heads", h), ("n_kv_heads", g)):
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val <= 0:
            raise ValueError(f"{name} must be a positive integer, got {val!r}")
    if h % g:
        raise ValueError(f"n_heads ({h}) must be divisible by n_kv_heads ({g})")
    d = x.shape[-1]
    wq, wk, wv = (_weight(name, w, d) for name, w in (("wq", wq), ("wk", wk), ("wv", wv)))
    if wq.shape[1] % h:
        raise ValueError(f"wq width {wq.shape[1]} is not divisible by n_heads ({h})")
    d_k = wq.shape[1] // h
    if wk.shape[1] != g * d_k:
        raise ValueError(f"wk must have shape ({d}, n_kv_heads·d_k = {g * d_k}), got {wk.shape}")
    if wv.shape[1] % g:
        raise ValueError(f"wv width {wv.shape[1]} is not divisible by n_kv_heads ({g})")
    d_v = wv.shape[1] // g
    wo = _weight("wo", wo, h * d_v)

    q = _split_heads(x @ wq, h)  # [..., h, n, d_k]
    k = _split_heads(x @ wk, g)  # [..., g, n, d_k]
    v = _split_heads(x @ wv, g)  # [..., g, n, d_v]
    heads = attention(q, k, v, causal=causal)  # grouped-query attention: [..., h, n, d_v]
    concat = np.swapaxes(heads, -2, -3).reshape(*x.shape[:-1], h * d_v)  # [..., n, h·d_v]
    return concat @ wo
