"""The gallery of `spec.laws.edges`: each broken variant mishandles n_k = 0 in one way that
real kernels have (an unguarded online-softmax division, an unguarded reduction, a declared
refusal that is not kept); the correct ones handle it or refuse it as declared."""

from __future__ import annotations

import math

import numpy as np

from gallery.base import broken, plain, scores
from spec import Target

Array = np.ndarray


def _unnormalised(q: Array, k: Array, v: Array, causal: bool) -> tuple[Array, Array]:
    """(Σ_j e^(s_ij − m_i) v_j, Σ_j e^(s_ij − m_i)): the two running sums of an online softmax."""
    s = scores(q, k, 1 / math.sqrt(q.shape[-1]))
    if causal:
        s = np.where(np.arange(k.shape[-2])[None, :] <= np.arange(q.shape[-2])[:, None], s, -np.inf)
    top = np.max(s, axis=-1, keepdims=True, initial=-np.inf)
    e = np.exp(s - np.where(np.isfinite(top), top, 0))
    return e @ v.astype(e.dtype), e.sum(axis=-1, keepdims=True)


def unguarded_division(q: Array, k: Array, v: Array, *, causal: bool = False) -> Array:
    acc, total = _unnormalised(q, k, v, causal)
    with np.errstate(invalid="ignore"):
        return (acc / total).astype(q.dtype)  # 0/0 = NaN when there are no keys


def unguarded_max(q: Array, k: Array, v: Array, *, causal: bool = False) -> Array:
    s = scores(q, k, 1 / math.sqrt(q.shape[-1]))
    s.max(axis=-1)  # raises on an empty axis: "zero-size array to reduction operation maximum"
    return plain(q, k, v, causal=causal)


def zeros_like_queries(q: Array, k: Array, v: Array, *, causal: bool = False) -> Array:
    if k.shape[-2] == 0:
        return np.zeros_like(q)  # [..., n_q, d_k]: the wrong width whenever d_v ≠ d_k
    return plain(q, k, v, causal=causal)


def guarded(q: Array, k: Array, v: Array, *, causal: bool = False) -> Array:
    acc, total = _unnormalised(q, k, v, causal)
    return (acc / np.where(total > 0, total, 1)).astype(q.dtype)


def refuses(q: Array, k: Array, v: Array, *, causal: bool = False) -> Array:
    if k.shape[-2] == 0:
        raise ValueError(f"k must hold at least one key, got shape {k.shape}")
    return plain(q, k, v, causal=causal)


def nan_without_keys(q: Array, k: Array, v: Array, *, causal: bool = False) -> Array:
    if k.shape[-2] == 0:
        return np.full((*q.shape[:-1], v.shape[-1]), np.nan, dtype=q.dtype)
    return plain(q, k, v, causal=causal)

BROKEN = [
    broken(unguarded_division, "empty_keys", "acc / l with l = 0 when no key exists: NaN, zeros declared"),
    broken(unguarded_max, "empty_keys", "np.max over an empty key axis raises; declares it computes n_k = 0",
           empty_keys="compute"),
    broken(nan_without_keys, "empty_keys", "declares empty_keys='raise' and returns NaN silently",
           empty_keys="raise"),
    broken(zeros_like_queries, "empty_keys", "early return of zeros_like(q): width d_k, not d_v"),
]

CORRECT = [
    Target(guarded, name="online_softmax_guarded"),
    Target(refuses, name="refuses_empty_keys", empty_keys="raise"),
    Target(nan_without_keys, name="nan_without_keys", masked_rows="nan"),
]
