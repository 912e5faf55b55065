"""Gallery of the bias laws: broken biases, each rejected by its law, and a correct variant in
log-space."""

from __future__ import annotations

from typing import Any

import numpy as np

from gallery._keywords import (
    KEYWORDS,
    final_scores,
    scale_for,
    sink_logits,
    softmax_with_sinks,
    textbook,
    visible,
)
from gallery.base import broken, scores
from spec import Target

Array = np.ndarray


def bias_before_scale(q: Array, k: Array, v: Array, *, bias: Any = None, scale: Any = None,
                      causal: bool = False,
                      mask: Any = None, window: Any = None, sinks: Any = None, softcap: Any = None) -> Array:
    s = scores(q, k, 1.0)
    if bias is not None:
        s = s + np.asarray(bias).astype(s.dtype)
    s = s * s.dtype.type(scale_for(q, scale))  # (q·kᵀ + B)·scale: the bias shrinks with the scale
    s = np.where(visible(q.shape[-2], k.shape[-2], causal=causal, mask=mask, window=window), s, -np.inf)
    w = softmax_with_sinks(s, sink_logits(q, sinks, s.dtype))
    return (w @ v.astype(w.dtype)).astype(q.dtype)


def bias_after_max(q: Array, k: Array, v: Array, *, bias: Any = None, mask: Any = None, causal: bool = False,
                   **kw: Any) -> Array:
    s = final_scores(q, k, causal=causal, mask=mask, **kw)  # no bias yet
    top = np.max(s, axis=-1, keepdims=True)  # the running maximum, taken before the bias
    b = 0 if bias is None else np.asarray(bias).astype(s.dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(s + b - top)
        return ((e / e.sum(axis=-1, keepdims=True)) @ v.astype(s.dtype)).astype(q.dtype)


def bias_clamped(q: Array, k: Array, v: Array, *, bias: Any = None, **kw: Any) -> Array:
    clamped = None if bias is None else np.maximum(np.asarray(bias), -1e4)  # -inf becomes -1e4
    return textbook(q, k, v, bias=clamped, **kw)


def bias_head0_only(q: Array, k: Array, v: Array, *, bias: Any = None, **kw: Any) -> Array:
    b = None if bias is None else np.asarray(bias)
    if b is not None and b.ndim >= 3:
        b = b[..., :1, :, :]  # a per-batch bias path: head 0's bias for every head
    return textbook(q, k, v, bias=b, **kw)


def _declared(fn: Any, catches: str, bug: str, **more: Any) -> Any:
    return broken(fn, catches, bug, **(KEYWORDS | {"ndims": (2, 3, 4)} | more))


def bias_slab_by_flat_index(q: Array, k: Array, v: Array, *, bias: Any = None, **kw: Any) -> Array:
    """A bias of one slab per batch row ([batch, 1, n_q, n_k]) read at the flattened (batch, head)
    index: batch b takes slab (b·heads) mod batch (onnxruntime#24017 read past the bias)."""
    if bias is not None and q.ndim == 4 and np.shape(bias)[:2] == (q.shape[0], 1) and q.shape[0] > 1:
        slabs = np.asarray(bias)
        bias = slabs[(np.arange(q.shape[0]) * q.shape[1]) % q.shape[0]]
    return textbook(q, k, v, bias=bias, **kw)


BROKEN = [
    _declared(bias_slab_by_flat_index, "bias_broadcast_reaches_every_slice",
              "a bias broadcast over heads read at slab b·heads (onnxruntime#24017)"),
    _declared(bias_before_scale, "bias_matches_golden", "bias added before the scale: (q·kᵀ + B)·scale"),
    _declared(bias_after_max, "bias_row_shift_invariance",
              "row maximum taken over q·kᵀ before the bias is added: exp(s + B − max s) overflows"),
    _declared(bias_clamped, "bias_neg_inf_hides_keys",
              "−inf bias clamped to −1e4 (an old additive mask value): a hidden key with a larger "
              "score leaks"),
    _declared(bias_head0_only, "bias_per_head",
              "head 0's bias applied to every head (a per-batch bias path)"),
]


def logspace(q: Array, k: Array, v: Array, *, sinks: Any = None, **kw: Any) -> Array:
    """Correct, computed in log-space: weights exp(s − lse), lse = m + log Σ exp(s − m) over the
    keys and the sink, m the row maximum."""
    s = final_scores(q, k, **kw)
    every = np.concatenate([s, np.broadcast_to(sink_logits(q, sinks, s.dtype), (*s.shape[:-1], 1))], axis=-1)
    top = np.max(every, axis=-1, keepdims=True)
    m = np.where(np.isfinite(top), top, 0)
    with np.errstate(divide="ignore"):
        lse = m + np.log(np.sum(np.exp(every - m), axis=-1, keepdims=True))
    w = np.where(np.isfinite(lse), np.exp(s - np.where(np.isfinite(lse), lse, 0)), 0)
    return (w @ v.astype(w.dtype)).astype(q.dtype)


CORRECT = [Target(logspace, name="logspace_keywords", ndims=(2, 3, 4), **KEYWORDS)]
