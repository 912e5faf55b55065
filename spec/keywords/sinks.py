"""Attention sinks (``sinks=``): one logit per head joining every row's denominator.

Its declaration (`SINKS`) and the functions it is made of; its laws are `spec.laws.sinks`'s.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np
from hypothesis import strategies as st

from spec.keywords.record import Geometry, Keyword, Sinks

if TYPE_CHECKING:
    from spec.cases import Case
    from spec.target import Target

Array = np.ndarray


def per_row(geo: Geometry, sinks: Array) -> Array:  # [heads] ([1] for 2-D) -> broadcastable to [*lead, n_q]
    """Each row's sink logit: the head's, broadcast over the batch and the queries."""
    s = np.asarray(sinks, dtype=np.float64)
    return s[:, None] if geo.ndim >= 3 else s


def logit_dtype(case: Case) -> type:
    """Sinks are float32 logits (float64 for float64 cases), as kernels take them."""
    return np.float64 if case.dtype == "float64" else np.float32


@functools.cache
def sink_values(heads: int, low: float = -4.0, high: float = 4.0) -> st.SearchStrategy[tuple[float, ...]]:
    """One sink logit per head, in [low, high] (by default a sink that takes from 2% to 98% of a
    short row; made once per arguments: see `spec.draws.choice`)."""
    return st.lists(st.floats(low, high, allow_nan=False), min_size=heads, max_size=heads).map(tuple)


def draw(draw: st.DrawFn, target: Target, case: Case) -> Case:
    """One sink logit per query head (one for 2-D inputs), in [−4, 4]."""
    return case.with_keyword("sinks", draw(sink_values(case.heads if case.ndim >= 3 else 1)))


SINKS = Keyword(
    name="sinks",
    field="supports_sinks",
    passes=("sinks",),
    meaning="A float array [heads] ([1] for 2-D inputs): one extra logit per query head that joins every "
            "row's softmax denominator and carries no value; a row's weights then sum to less than 1.",
    terms=(Sinks(per_row, grad="dsinks"),),
    received=lambda case, sinks: (np.asarray(sinks, dtype=logit_dtype(case)),),
    draw=draw,
)
