"""Gallery for the laws of the call (`spec.laws.calls`): determinism and strided views."""

from __future__ import annotations

from typing import Any

import numpy as np

from gallery.base import broken, plain
from spec import Target

Array = np.ndarray

_SCRATCH: dict[tuple[int, ...], Array] = {}


def scratch_not_zeroed(q: Array, k: Array, v: Array, *, causal: bool = False) -> Array:
    out = plain(q, k, v, causal=causal)
    buf = _SCRATCH.setdefault(out.shape, np.zeros(out.shape))
    buf += out  # accumulated into, never zeroed between calls
    return buf.astype(q.dtype)


def ignores_strides(q: Array, k: Array, v: Array, *, causal: bool = False) -> Array:
    # Reads each input's elements in memory order, as if it were C-contiguous: a transposed or
    # Fortran-ordered view is read as the matrix it was made from.
    q, k, v = (np.ravel(x, order="K").reshape(x.shape) for x in (q, k, v))
    return plain(q, k, v, causal=causal)


BROKEN = [
    broken(scratch_not_zeroed, "deterministic_calls", "a scratch buffer accumulated into across calls"),
    broken(ignores_strides, "strided_views", "strides ignored: memory read in order"),
]


def einsum_on_views(q: Array, k: Array, v: Array, *, causal: bool = False, **kw: Any) -> Array:
    """Correct: np.einsum straight on whatever strides it is given, in float64, rounded at the end."""
    s = np.einsum("...id,...jd->...ij", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.arange(k.shape[-2])[None, :] <= np.arange(q.shape[-2])[:, None], s, -np.inf)
    top = np.max(s, axis=-1, keepdims=True, initial=-np.inf)
    e = np.exp(s - np.where(np.isfinite(top), top, 0))
    total = e.sum(axis=-1, keepdims=True)
    w = e / np.where(total > 0, total, 1)
    return np.einsum("...ij,...jd->...id", w, v.astype(np.float64)).astype(q.dtype)


CORRECT = [Target(einsum_on_views, name="einsum_on_views", ndims=(2, 3, 4))]
