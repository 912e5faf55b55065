"""Merging attention states: the results of attention over two (or more) disjoint key sets,
combined into the result over their union by their logsumexps (split-KV decoding, ring attention,
cascade attention).

    lse = log(e^lse_a + e^lse_b),   out = e^(lse_a − lse)·out_a + e^(lse_b − lse)·out_b

A state is ``(out [..., n_q, d_v], lse [..., n_q])`` with a natural-log LSE; a part that saw no
key is empty: ``out = 0`` and ``lse = −inf``, the identity of the merge.
"""

from __future__ import annotations

import numpy as np

from impl.attention import compute_dtype

Array = np.ndarray


def _weights(lses: Array) -> tuple[Array, Array]:  # [s, ..., n_q] -> weights [s, ..., n_q], lse [..., n_q]
    """Each part's share e^(lse_i − lse) and the merged lse, shifted by the largest lse so that no
    exponential overflows; every part empty gives zero weights and lse = −inf (never −inf − −inf)."""
    top = np.max(lses, axis=0)
    shift = np.where(np.isfinite(top), top, 0.0)  # all parts empty: nothing to shift by
    e = np.exp(lses - shift)  # ≤ 1; an empty part's e^−inf = 0
    total = np.sum(e, axis=0)
    with np.errstate(divide="ignore"):  # log 0 = −inf: every part empty
        lse = shift + np.log(total)
    return e / np.where(total > 0, total, 1), lse


def merge_states_n(outs: Array, lses: Array) -> tuple[Array, Array]:
    # [s, ..., n_q, d_v], [s, ..., n_q] -> [..., n_q, d_v], [..., n_q]
    """The n-way merge of ``s`` states, in float32 for 16-bit inputs (float64 stays float64);
    returned in the dtypes given."""
    outs, lses = np.asarray(outs), np.asarray(lses)
    if outs.ndim < 3 or lses.shape != outs.shape[:-1]:
        raise ValueError(f"outs must be [s, ..., n_q, d_v] and lses [s, ..., n_q], got {outs.shape} and "
                         f"{lses.shape}")
    work = compute_dtype(outs.dtype)
    w, lse = _weights(lses.astype(work))
    out = np.sum(w[..., None].astype(work) * outs.astype(work), axis=0)
    return out.astype(outs.dtype), lse.astype(lses.dtype)


def merge_states(out_a: Array, lse_a: Array, out_b: Array, lse_b: Array) -> tuple[Array, Array]:
    # [..., n_q, d_v], [..., n_q], [..., n_q, d_v], [..., n_q] -> [..., n_q, d_v], [..., n_q]
    """Two states merged (`merge_states_n` of the pair)."""
    out_a, out_b, lse_a, lse_b = map(np.asarray, (out_a, out_b, lse_a, lse_b))
    if out_a.shape != out_b.shape or lse_a.shape != lse_b.shape or lse_a.shape != out_a.shape[:-1]:
        raise ValueError(f"out_a, out_b must be [..., n_q, d_v] and lse_a, lse_b [..., n_q] alike, got "
                         f"{out_a.shape}, {out_b.shape}, {lse_a.shape}, {lse_b.shape}")
    return merge_states_n(np.stack([out_a, out_b]), np.stack([lse_a, lse_b]))
