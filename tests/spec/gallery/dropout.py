"""Gallery for the dropout laws (`spec.laws.dropout`). Each broken variant changes one thing
in the dropout step; the correct one draws its mask from another generator (Philox) and applies
it to the weights `impl.attention` returns."""

from __future__ import annotations

from typing import Any

import numpy as np

from gallery.base import broken
from impl import attention
from impl.attention import compute_dtype
from spec import Target

Array = np.ndarray


def _dropped(q: Array, k: Array, v: Array, kept: Any, rescale: float, **kw: Any) -> Array:
    """out = (weights · kept · rescale) @ v, kept a function of the weights' shape."""
    _, w = attention(q, k, v, return_weights=True, **kw)
    w = np.where(kept(w.shape), w * w.dtype.type(rescale), w.dtype.type(0))
    return (w @ v.astype(compute_dtype(q.dtype))).astype(q.dtype)


def philox(q: Array, k: Array, v: Array, *, dropout_p: float = 0.0, seed: int | None = None,
           **kw: Any) -> Array:
    """Correct: the mask from NumPy's Philox generator, not the reference's PCG64."""
    if not dropout_p:
        return attention(q, k, v, **kw)
    rng = np.random.Generator(np.random.Philox(seed))
    return _dropped(q, k, v, lambda shape: rng.random(shape) >= dropout_p, 1 / (1 - dropout_p), **kw)


def p_or_default(q: Array, k: Array, v: Array, *, dropout_p: float | None = None, seed: int | None = None,
                 **kw: Any) -> Array:
    if dropout_p is None:
        return attention(q, k, v, **kw)
    return philox(q, k, v, dropout_p=dropout_p or 0.1, seed=seed or 0, **kw)  # 0 is falsy


def global_generator(q: Array, k: Array, v: Array, *, dropout_p: float = 0.0, seed: int | None = None,
                     **kw: Any) -> Array:
    if not dropout_p:
        return attention(q, k, v, **kw)
    rng = np.random.default_rng()  # the seed is ignored
    return _dropped(q, k, v, lambda shape: rng.random(shape) >= dropout_p, 1 / (1 - dropout_p), **kw)


def keep_probability(q: Array, k: Array, v: Array, *, dropout_p: float = 0.0, seed: int | None = None,
                     **kw: Any) -> Array:
    if not dropout_p:
        return attention(q, k, v, **kw)
    rng = np.random.default_rng(seed)  # p taken as the probability of keeping a weight
    return _dropped(q, k, v, lambda shape: rng.random(shape) < dropout_p, 1 / (1 - dropout_p), **kw)


def no_rescale(q: Array, k: Array, v: Array, *, dropout_p: float = 0.0, seed: int | None = None,
               **kw: Any) -> Array:
    if not dropout_p:
        return attention(q, k, v, **kw)
    rng = np.random.default_rng(seed)
    return _dropped(q, k, v, lambda shape: rng.random(shape) >= dropout_p, 1.0, **kw)  # no 1/(1 − p)


_DECLARED = {"supports_dropout": True, "ndims": (2, 3, 4), "supports_mask": True, "supports_scale": True}

BROKEN = [
    broken(p_or_default, "dropout_zero_is_identity", "dropout_p=0 falls back to a default 0.1", **_DECLARED),
    broken(global_generator, "dropout_same_seed_same_output", "seed ignored: a fresh generator per call",
           **_DECLARED),
    broken(keep_probability, "dropout_drops_fraction_p", "dropout_p taken as the keep probability",
           **_DECLARED),
    broken(no_rescale, "dropout_unbiased", "kept weights not scaled by 1/(1 − p)", **_DECLARED),
]

CORRECT = [Target(philox, name="dropout_philox", dtypes=("float16", "float32", "float64"), **_DECLARED)]
