"""What every gallery module shares: the textbook formula each broken variant changes in one
place, and the record pairing a broken target with the law that must reject it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from impl.attention import compute_dtype
from impl.masks import causal_mask
from spec import Target

Array = np.ndarray


def scores(q: Array, k: Array, scale: float) -> Array:  # [..., n_q, d_k], [..., n_k, d_k] -> [..., n_q, n_k]
    work = compute_dtype(q.dtype)
    return (q.astype(work) @ np.swapaxes(k.astype(work), -1, -2)) * work.type(scale)


def stable_softmax(s: Array) -> Array:
    top = np.max(s, axis=-1, keepdims=True, initial=-np.inf)  # -inf over no keys (n_k = 0)
    e = np.exp(s - np.where(np.isfinite(top), top, 0))
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total > 0, total, 1)


def plain(q: Array, k: Array, v: Array, *, causal: bool = False, mask: Array | None = None,
          scale: float | None = None) -> Array:  # -> [..., n_q, d_v]
    """The textbook formula: the skeleton every broken variant below changes in one place."""
    s = scores(q, k, 1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    keep = np.ones(s.shape, dtype=bool)
    if causal:
        keep &= causal_mask(q.shape[-2], k.shape[-2])
    if mask is not None:
        keep &= mask
    w = stable_softmax(np.where(keep, s, -np.inf))
    return (w @ v.astype(w.dtype)).astype(q.dtype)


@dataclass(frozen=True)
class Broken:
    target: Target
    catches: str  # the property that must reject it
    bug: str
    profile: str = "ci"  # the profile it is judged at (a scale bug: "scale" alone)
    sizes: Any = None  # at profile "scale": the sizes it is judged at (spec.scale_plan.Sizes)


def broken(fn: Any, catches: str, bug: str, name: str = "", profile: str = "ci", sizes: Any = None,
           **declared: Any) -> Broken:
    return Broken(Target(fn, name=name or fn.__name__, **declared), catches, bug, profile, sizes)
