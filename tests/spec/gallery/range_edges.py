"""Gallery of float16's range: bugs that only scores near the edge of the dtype's range reveal
(drawn by `spec.laws._range`), each rejected by its law, and a float16 kernel that scales
first and conforms."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gallery.base import broken, stable_softmax
from gallery.core import additive_finfo_mask
from impl.masks import causal_mask
from spec import Target

Array = np.ndarray


def scores_in_half_before_scale(q: Array, k: Array, v: Array, *, causal: bool = False) -> Array:
    s = q @ np.swapaxes(k, -1, -2)  # q·kᵀ formed in the input dtype: float16 overflows to inf
    s = s.astype(np.float32) * np.float32(1 / math.sqrt(q.shape[-1]))  # ... before the scale
    if causal:
        s = np.where(causal_mask(q.shape[-2], k.shape[-2]), s, -np.inf)
    with np.errstate(invalid="ignore"):
        return (stable_softmax(s) @ v.astype(np.float32)).astype(q.dtype)


def finfo_min_additive_mask(q: Array, k: Array, v: Array, *, causal: bool = False, mask: Any = None) -> Array:
    s = (q @ np.swapaxes(k, -1, -2)).astype(np.float32) * np.float32(1 / math.sqrt(q.shape[-1]))
    keep = np.ones(s.shape[-2:], dtype=bool) if mask is None else mask
    if causal:
        keep = keep & causal_mask(q.shape[-2], k.shape[-2])
    fill = np.finfo(q.dtype).min  # added in the input dtype: min + a negative score = −inf
    with np.errstate(over="ignore", invalid="ignore"):
        s = (s.astype(q.dtype) + np.where(keep, 0, fill).astype(q.dtype)).astype(np.float32)
        return (stable_softmax(s) @ v.astype(np.float32)).astype(q.dtype)


BROKEN = [
    broken(scores_in_half_before_scale, "large_logits",
           "q·kᵀ formed in float16 before the scale overflows although the scaled scores fit (pytorch#60939)",
           dtypes=("float16", "float32")),
    broken(finfo_min_additive_mask, "masked_rows_policy",
           "additive finfo(float16).min mask: plus a negative score it overflows to −inf, so a fully "
           "masked row is no longer uniform, or NaN (transformers#17306)",
           dtypes=("float16",), supports_mask=True, masked_rows="uniform"),
    broken(additive_finfo_mask, "masked_rows_policy",
           "the same fill in float32: finfo(float32).min plus a score below −2e31 overflows to −inf, so at "
           "the edge of float32's range a fully masked row is no longer uniform",
           name="additive_finfo_mask_float32", supports_mask=True, masked_rows="uniform"),
]


def half_scale_first(q: Array, k: Array, v: Array, *, causal: bool = False) -> Array:
    """Correct in float16 throughout: q is scaled before the product (the fix of pytorch#60939)."""
    s = (q * q.dtype.type(1 / math.sqrt(q.shape[-1]))) @ np.swapaxes(k, -1, -2)
    if causal:
        s = np.where(causal_mask(q.shape[-2], k.shape[-2]), s, -np.inf)
    return (stable_softmax(s) @ v).astype(q.dtype)


CORRECT = [Target(half_scale_first, name="half_scale_first", dtypes=("float16",))]
