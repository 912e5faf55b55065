"""The textbook formula with the keywords of real kernels (bias, window, softcap, sinks), in the
order of docs/targets.md: scale → cap → bias → hide → softmax with the sinks in the denominator → @ V. Each
broken variant of the keyword families changes it in one place; the correct variants compute
it differently (log-space, per row, tiled)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gallery.base import scores
from impl.masks import causal_mask, sliding_window_mask

Array = np.ndarray

KEYWORDS = {"supports_mask": True, "supports_scale": True, "supports_bias": True,
            "supports_window": True, "supports_softcap": True, "supports_sinks": True}
"""What the keyword variants declare (plain top-left causal, float32 and float64)."""


def scale_for(q: Array, scale: float | None) -> float:
    return 1 / math.sqrt(q.shape[-1]) if scale is None else scale


def visible(n_q: int, n_k: int, *, causal: bool, mask: Array | None, window: Any,
            align: str = "top_left") -> Array:  # -> [..., n_q, n_k] bool
    keep = np.ones((n_q, n_k), dtype=bool)
    if causal:
        keep = keep & causal_mask(n_q, n_k, align=align)  # type: ignore[arg-type]
    if window is not None:
        keep = keep & sliding_window_mask(n_q, n_k, window=tuple(window), align=align)  # type: ignore[arg-type]
    return keep if mask is None else keep & mask


def final_scores(q: Array, k: Array, *, causal: bool = False, mask: Array | None = None,
                 scale: float | None = None, bias: Array | None = None, window: Any = None,
                 softcap: float | None = None, align: str = "top_left") -> Array:
    # [..., n_q, d_k], [..., n_k, d_k] -> [..., n_q, n_k] in the compute dtype, -inf where hidden
    s = scores(q, k, scale_for(q, scale))
    if softcap is not None:
        s = s.dtype.type(softcap) * np.tanh(s / s.dtype.type(softcap))
    if bias is not None:
        s = s + np.asarray(bias).astype(s.dtype)
    return np.where(visible(q.shape[-2], k.shape[-2], causal=causal, mask=mask, window=window, align=align),
                    s, -np.inf)


def sink_logits(q: Array, sinks: Array | None, dtype: Any) -> Array:  # -> [heads, 1, 1] / [1, 1] or -inf
    if sinks is None:
        return np.asarray(-np.inf, dtype=dtype)
    s = np.asarray(sinks).astype(dtype)
    return s.reshape(-1, 1, 1) if q.ndim >= 3 else s.reshape(1, 1)


def softmax_with_sinks(s: Array, sink: Array) -> Array:  # [..., n_q, n_k], broadcastable -> same
    top = np.maximum(np.max(s, axis=-1, keepdims=True), sink)
    shift = np.where(np.isfinite(top), top, 0)
    e = np.exp(s - shift)
    total = e.sum(axis=-1, keepdims=True) + np.exp(sink - shift)
    return e / np.where(total > 0, total, 1)


def textbook(q: Array, k: Array, v: Array, *, sinks: Array | None = None, **kw: Any) -> Array:
    """The formula every keyword variant starts from."""
    s = final_scores(q, k, **kw)
    w = softmax_with_sinks(s, sink_logits(q, sinks, s.dtype))
    return (w @ v.astype(w.dtype)).astype(q.dtype)
