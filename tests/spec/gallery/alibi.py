"""Gallery of the ALiBi laws: broken slopes, each rejected by its law, and a correct variant that
turns the slopes into the explicit bias."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gallery._keywords import KEYWORDS, textbook
from gallery.base import broken
from gallery.window import SERVING
from impl import attention
from spec import Target

Array = np.ndarray

DECLARED = KEYWORDS | {"supports_alibi": True, "ndims": (2, 3, 4)}


def slopes_bias(q: Array, k: Array, slopes: Any, *, top_left: bool = False, signed: bool = False,
                row0: bool = False, wrap: bool = False) -> Array:
    # -> [..., n_q, n_k]: −slope·|i + n_k − n_q − j| per (batch row,) head, with one named bug (or none)
    n_q, n_k = q.shape[-2], k.shape[-2]
    m = np.asarray(slopes, dtype=np.float64)
    if row0 and m.ndim == 2:
        m = m[0]  # [batch, heads] read as [heads]: batch row 0's slopes everywhere
    if wrap:
        heads = m.shape[-1]
        m = m[..., np.arange(heads) % 2 ** math.floor(math.log2(heads))]
    diag = np.arange(n_q)[:, None] + (0 if top_left else n_k - n_q)
    offset = np.arange(n_k)[None, :] - diag
    distance = offset if signed else np.abs(offset)
    per_row = m[..., None, None] if q.ndim >= 3 or m.ndim == 2 else m[:, None]
    return -per_row * distance


def with_alibi(**bug: bool) -> Any:
    def fn(q: Array, k: Array, v: Array, *, alibi_slopes: Any = None, bias: Any = None, **kw: Any) -> Array:
        if alibi_slopes is not None:
            added = slopes_bias(q, k, alibi_slopes, **bug)
            bias = added if bias is None else np.asarray(bias, dtype=np.float64) + added
        return textbook(q, k, v, bias=bias, **kw)

    fn.__name__ = fn.__qualname__ = "alibi_" + ("_".join(bug) or "as_bias")
    return fn


BROKEN = [
    broken(with_alibi(top_left=True), "alibi_matches_golden",
           "distance from the top-left diagonal |i − j|: wrong whenever n_q ≠ n_k", **DECLARED),
    broken(with_alibi(signed=True), "alibi_equals_its_bias",
           "slope applied to (j − diag) without the absolute value: keys after the diagonal gain",
           **DECLARED),
    broken(with_alibi(row0=True), "alibi_per_batch_and_head",
           "[batch, heads] slopes read as [heads]: batch row 0's for every row", **DECLARED),
    broken(with_alibi(wrap=True), "alibi_heads_not_a_power_of_two",
           "slopes indexed by h mod 2^⌊log₂ H⌋: the last heads wrap onto the first", **DECLARED),
]

def heads_alibi_kernel(q: Array, k: Array, v: Array, *, alibi_slopes: Any = None, **kw: Any) -> Array:
    """ALiBi slopes ``[heads]`` only."""
    if alibi_slopes is not None and np.ndim(alibi_slopes) != 1:
        raise ValueError(f"alibi_slopes must be [heads], got shape {np.shape(alibi_slopes)}")
    return attention(q, k, v, alibi_slopes=alibi_slopes, **kw)


CORRECT = [Target(with_alibi(), name="alibi_as_bias", empty_keys="raise",
                  **DECLARED),  # textbook: max over no keys raises
           Target(heads_alibi_kernel, name="heads_alibi",
                  supports_alibi=True, alibi_shape="heads", **SERVING)]
