"""Small serving kernels of our own, each with a narrow contract it enforces: every call outside it
is refused with ValueError, as a production kernel that has no spelling for it. Each is declared
with `Target`'s serving declarations alone (`causal_only`, `decode_only`, `keys_cover_queries`,
`self_attention_only`), and each has a broken variant its laws must still catch.

Inputs in the suite's ``bhnd`` layout: ``[n, d]``, ``[heads, n, d]`` or ``[batch, heads, n, d]``;
computed in float64, returned in the inputs' dtype.
"""

from __future__ import annotations

import numpy as np

Array = np.ndarray


def _attend(q: Array, k: Array, v: Array, visible: Array, scale: float | None = None) -> Array:
    # [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v], [..., n_q, n_k] bool -> [..., n_q, d_v]
    """softmax(scale · q kᵀ over the visible keys) v, a row that sees no key giving zeros."""
    s = (q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2)) * (
        1.0 / np.sqrt(q.shape[-1]) if scale is None else scale)
    s = np.where(visible, s, -np.inf)
    top = np.max(s, axis=-1, keepdims=True, initial=-np.inf)
    w = np.where(visible, np.exp(s - np.where(np.isfinite(top), top, 0.0)), 0.0)
    total = np.sum(w, axis=-1, keepdims=True)
    w = w / np.where(total > 0, total, 1.0)
    return (w @ v.astype(np.float64)).astype(q.dtype)


def _diagonal_mask(n_q: int, n_k: int, offset: int) -> Array:  # -> [n_q, n_k] bool
    """Query i sees key j ≤ i + offset."""
    return np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + offset


def causal_only(q: Array, k: Array, v: Array, *, causal: bool = False, off_by_one: bool = False) -> Array:
    """Causal attention, top-left aligned (query i sees keys j ≤ i), and nothing else: a call
    without ``causal=True`` is refused. ``off_by_one``: the broken variant, whose mask hides the
    diagonal (j < i)."""
    if not causal:
        raise ValueError("causal must be True: this kernel has no non-causal mode")
    visible = _diagonal_mask(q.shape[-2], k.shape[-2], -1 if off_by_one else 0)
    return _attend(q, k, v, visible)


def decode_only(q: Array, k: Array, v: Array, *, causal: bool = False, drop_last: bool = False) -> Array:
    """One query per call over every key (causal or not: the single query comes after every key, a
    bottom-right diagonal); more queries are refused. ``drop_last``: the broken variant, which
    never reads the newest key."""
    if q.shape[-2] != 1:
        raise ValueError(f"q must hold one query per sequence (decoding), got n_q={q.shape[-2]}")
    visible = np.ones((1, k.shape[-2]), dtype=bool)
    if drop_last and k.shape[-2] > 1:
        visible[:, -1] = False
    return _attend(q, k, v, visible)


def prefix_plus_new_keys(q: Array, k: Array, v: Array, *, causal: bool = False,
                         kv_lengths: Array | None = None, stale_prefix: bool = False) -> Array:
    """Chunked prefill: each batch row's keys are a cached prefix plus one new key per query (its
    first ``kv_lengths[b]`` keys, n_k without ``kv_lengths=``), the last query aligned with the
    last key (causal: query i sees keys j ≤ i + L − n_q). A call with fewer keys than queries, in
    the call or in any row, is refused. ``stale_prefix``: the broken variant, whose causal diagonal
    is placed as if the prefix were one key shorter (j ≤ i + L − n_q − 1)."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    if n_k < n_q:
        raise ValueError(f"k must hold at least as many keys as there are queries, got n_k={n_k} < n_q={n_q}")
    if kv_lengths is None:
        lengths = np.full(q.shape[0] if q.ndim == 4 else 1, n_k)
    else:
        lengths = np.asarray(kv_lengths)
        if q.ndim != 4 or lengths.shape != (q.shape[0],):
            raise ValueError(f"kv_lengths must be [batch] with 4-D inputs, got {lengths.shape} "
                             f"for q {q.shape}")
        if np.any(lengths < n_q) or np.any(lengths > n_k):
            raise ValueError(f"kv_lengths must lie in [n_q, n_k] = [{n_q}, {n_k}], got {lengths.tolist()}")
    shift = 1 if stale_prefix else 0
    rows = []
    for length in lengths.tolist():
        visible = np.arange(n_k)[None, :] < length
        if causal:
            visible = visible & _diagonal_mask(n_q, n_k, length - n_q - shift)
        rows.append(np.broadcast_to(visible, (n_q, n_k)))
    visible = np.stack(rows)[:, None] if q.ndim == 4 else rows[0]
    return _attend(q, k, v, visible)


def self_attention_only(q: Array, k: Array, v: Array, *, causal: bool = False,
                        cu_seqlens_q: Array | None = None, cu_seqlens_k: Array | None = None,
                        causal_leak: bool = False) -> Array:
    """Self-attention prefill: n_q = n_k in the call and in each packed sequence (``cu_seqlens_q``
    equal to ``cu_seqlens_k``), causal within each sequence; anything else is refused.
    ``causal_leak``: the broken variant, whose causal mask lets each query see one key ahead."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    if n_q != n_k:
        raise ValueError(f"q and k must hold as many tokens (self-attention), got n_q={n_q}, n_k={n_k}")
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise ValueError("cu_seqlens_q and cu_seqlens_k must be given together")
    offsets = np.array([0, n_q]) if cu_seqlens_q is None else np.asarray(cu_seqlens_q)
    if cu_seqlens_k is not None and not np.array_equal(offsets, np.asarray(cu_seqlens_k)):
        raise ValueError(f"cu_seqlens_k must equal cu_seqlens_q (self-attention), got "
                         f"{np.asarray(cu_seqlens_k).tolist()} and {offsets.tolist()}")
    visible = np.zeros((n_q, n_k), dtype=bool)
    for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
        n = end - start
        block = _diagonal_mask(n, n, 1 if causal_leak else 0) if causal else np.ones((n, n), dtype=bool)
        visible[start:end, start:end] = block
    return _attend(q, k, v, visible)
