"""Tiled attention with an online softmax (FlashAttention's algorithm, in NumPy).

Keys and values are visited a block at a time; each query row keeps a running maximum ``m``,
a running denominator ``l`` and an unnormalised output ``acc``. When a new block raises the
maximum from m to m', everything accumulated so far is rescaled by exp(m − m'), so the result is
exactly softmax(s)·V without the n_q × n_k pattern ever existing: memory is O(n·block).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from impl.attention import Array, check_qkv, check_scale, compute_dtype

DEFAULT_BLOCK = 128


def flash_attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    scale: float | None = None,
    block: int = DEFAULT_BLOCK,
) -> Array:  # [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v] -> [..., n_q, d_v]
    """Attention computed in ``block × block`` tiles; equal to :func:`impl.attention` up to rounding.

    ``causal`` is top-left aligned (query i sees keys j ≤ i); tiles that lie entirely above the
    diagonal are skipped. A query with no visible key gets zeros.
    """
    q, k, v, batch = check_qkv(q, k, v)
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block <= 0:
        raise ValueError(f"block must be a positive integer, got {block!r}")
    n_q, d_k = q.shape[-2:]
    n_k, d_v = v.shape[-2:]
    scale = check_scale(scale, d_k)
    work = compute_dtype(q.dtype)
    out = np.zeros((*batch, n_q, d_v), dtype=work)

    for q0 in range(0, n_q, block):
        q1 = min(q0 + block, n_q)
        qb = q[..., q0:q1, :].astype(work) * work.type(scale)  # [..., bq, d_k]
        m = np.full((*batch, q1 - q0, 1), -np.inf, dtype=work)  # running row max
        l = np.zeros((*batch, q1 - q0, 1), dtype=work)  # running softmax denominator
        acc = np.zeros((*batch, q1 - q0, d_v), dtype=work)  # running unnormalised output
        # Under the causal mask no key after the last query of this block is visible.
        k_end = min(n_k, q1) if causal else n_k
        for k0 in range(0, k_end, block):
            k1 = min(k0 + block, k_end)
            s = qb @ np.swapaxes(k[..., k0:k1, :], -1, -2).astype(work)  # [..., bq, bk]
            if causal and k1 - 1 > q0:  # the tile crosses the diagonal
                keep = np.arange(k0, k1)[None, :] <= np.arange(q0, q1)[:, None]
                s = np.where(keep, s, -np.inf)
            m_new = np.maximum(m, np.max(s, axis=-1, keepdims=True))
            # Rows with nothing visible yet keep m = -inf; shift them by 0 to avoid -inf - -inf.
            shift = np.where(np.isneginf(m_new), 0.0, m_new)
            p = np.exp(s - shift)
            rescale = np.exp(m - shift)  # exp(m − m'): the correction for what came before
            l = rescale * l + np.sum(p, axis=-1, keepdims=True)
            acc = rescale * acc + p @ v[..., k0:k1, :].astype(work)
            m = m_new
        out[..., q0:q1, :] = acc / np.where(l == 0, 1, l)
    return out.astype(q.dtype, copy=False)
