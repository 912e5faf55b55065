"""Gallery for the ragged-batch laws (`spec.laws.lengths`): key lengths and packed sequences.

The broken ones change one thing against `impl.attention`'s keyword path; the correct ones
compute the same thing another way (a loop over batch rows, a loop over packed sequences).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gallery.base import broken
from impl import attention
from spec import Target

Array = np.ndarray


# --- broken ------------------------------------------------------------------------------------


def kv_lengths_ignored(q: Array, k: Array, v: Array, *, kv_lengths: Any = None, **kw: Any) -> Array:
    return attention(q, k, v, **kw)


def kv_lengths_off_by_one(q: Array, k: Array, v: Array, *, kv_lengths: Any = None, **kw: Any) -> Array:
    if kv_lengths is not None:
        kv_lengths = np.minimum(np.asarray(kv_lengths) + 1, k.shape[-2])  # j ≤ L instead of j < L
    return attention(q, k, v, kv_lengths=kv_lengths, **kw)


def _per_sequence(q: Array, k: Array, v: Array, cu_q: Array, cu_k: Array, *, causal: bool,
                  bounds: Any, **kw: Any) -> Array:  # [h, total_q, d] ... -> [h, total_q, d_v]
    out = np.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)
    for i in range(len(cu_q) - 1):
        rows = slice(int(cu_q[i]), int(cu_q[i + 1]))
        keys = bounds(i)
        if rows.stop > rows.start and keys.stop > keys.start:
            args = q[..., rows, :], k[..., keys, :], v[..., keys, :]
            out[..., rows, :] = attention(*args, causal=causal, **kw)
    return out


def varlen_reads_neighbour(q: Array, k: Array, v: Array, *, causal: bool = False, cu_seqlens_q: Any = None,
                           cu_seqlens_k: Any = None, **kw: Any) -> Array:
    if cu_seqlens_q is None:
        return attention(q, k, v, causal=causal, **kw)
    cu_k = np.asarray(cu_seqlens_k)
    # A tile that runs one key past its sequence's end, into the next sequence.
    return _per_sequence(q, k, v, np.asarray(cu_seqlens_q), cu_k, causal=causal,
                         bounds=lambda i: slice(int(cu_k[i]), min(int(cu_k[i + 1]) + 1, k.shape[-2])), **kw)


def varlen_packed_diagonal(q: Array, k: Array, v: Array, *, causal: bool = False, cu_seqlens_q: Any = None,
                           cu_seqlens_k: Any = None, **kw: Any) -> Array:
    if cu_seqlens_q is None or not causal:
        return attention(q, k, v, causal=causal, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, **kw)
    # The causal diagonal of the packed positions (i sees j ≤ i over the whole pack), ANDed with
    # "same sequence", instead of each sequence's own diagonal.
    cu_q, cu_k = np.asarray(cu_seqlens_q), np.asarray(cu_seqlens_k)
    seq_q = np.searchsorted(cu_q, np.arange(q.shape[-2]), side="right")
    seq_k = np.searchsorted(cu_k, np.arange(k.shape[-2]), side="right")
    same = seq_q[:, None] == seq_k[None, :]
    packed = np.arange(k.shape[-2])[None, :] <= np.arange(q.shape[-2])[:, None]
    return attention(q, k, v, mask=same & packed, **kw)


def kv_lengths_nan_rows(q: Array, k: Array, v: Array, *, kv_lengths: Any = None, **kw: Any) -> Array:
    """Key lengths as a −inf mask and a plain softmax: a row of length 0 is 0/0 = NaN."""
    if kv_lengths is None:
        return attention(q, k, v, **kw)
    keep = (np.arange(k.shape[-2]) < np.asarray(kv_lengths)[:, None])[:, None, None, :]
    s = np.where(keep, (q @ np.swapaxes(k, -1, -2)) / np.sqrt(q.shape[-1]), -np.inf)
    with np.errstate(invalid="ignore"):
        e = np.exp(s - np.max(s, axis=-1, keepdims=True))
        return ((e / e.sum(axis=-1, keepdims=True)) @ v).astype(q.dtype)


BROKEN = [
    broken(kv_lengths_nan_rows, "kv_lengths_zero_rows", "a row of length 0 gives NaN (onnxruntime#27831)",
           supports_kv_lengths=True, ndims=(2, 3, 4), causal_alignment=None),
    broken(kv_lengths_ignored, "kv_lengths_is_truncation", "kv_lengths accepted and ignored (jax#23349)",
           supports_kv_lengths=True, ndims=(2, 3, 4)),
    broken(kv_lengths_off_by_one, "kv_lengths_is_truncation", "keys j ≤ L visible instead of j < L",
           supports_kv_lengths=True, ndims=(2, 3, 4)),
    broken(varlen_reads_neighbour, "varlen_no_cross_talk", "each sequence reads one key of the next",
           supports_varlen=True, ndims=(2, 3, 4)),
    broken(varlen_packed_diagonal, "varlen_is_each_sequence_alone",
           "causal diagonal of the packed positions, not per sequence", supports_varlen=True,
           ndims=(2, 3, 4)),
]


# --- correct -----------------------------------------------------------------------------------


def kv_lengths_per_row(q: Array, k: Array, v: Array, *, kv_lengths: Any = None, mask: Any = None,
                       **kw: Any) -> Array:
    """kv_lengths by truncation: one call per batch row on its first L_b keys (zeros when L_b = 0)."""
    if kv_lengths is None:
        return attention(q, k, v, mask=mask, **kw)
    out = np.zeros((*np.broadcast_shapes(q.shape[:-2], v.shape[:-2]), q.shape[-2], v.shape[-1]), q.dtype)
    for b, n in enumerate(np.asarray(kv_lengths).tolist()):
        if n > 0:
            m = None if mask is None else np.broadcast_to(mask, (*out.shape[:-1], k.shape[-2]))[b, ..., :n]
            out[b] = attention(q[b], k[b, ..., :n, :], v[b, ..., :n, :], mask=m, **kw)
    return out


def varlen_per_sequence(q: Array, k: Array, v: Array, *, causal: bool = False, cu_seqlens_q: Any = None,
                        cu_seqlens_k: Any = None, **kw: Any) -> Array:
    """Packed sequences by a loop: one call per sequence on its own rows and keys."""
    if cu_seqlens_q is None:
        return attention(q, k, v, causal=causal, **kw)
    cu_k = np.asarray(cu_seqlens_k)
    return _per_sequence(q, k, v, np.asarray(cu_seqlens_q), cu_k, causal=causal,
                         bounds=lambda i: slice(int(cu_k[i]), int(cu_k[i + 1])), **kw)


CORRECT = [
    Target(kv_lengths_per_row, name="kv_lengths_per_row", supports_kv_lengths=True, supports_mask=True,
           supports_scale=True, ndims=(2, 3, 4), dtypes=("float16", "float32", "float64")),
    Target(varlen_per_sequence, name="varlen_per_sequence", supports_varlen=True, supports_scale=True,
           ndims=(2, 3, 4), dtypes=("float16", "float32", "float64")),
]
