"""ALiBi: linear biases by distance from the diagonal (``alibi_slopes=``).

Its declaration (`ALIBI`) and the functions it is made of; its laws are `spec.laws.alibi`'s.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
from hypothesis import strategies as st

from spec.keywords.record import Adds, Geometry, Keyword

if TYPE_CHECKING:
    from spec.cases import Case
    from spec.target import Target

Array = np.ndarray


def paper_slopes(heads: int) -> tuple[float, ...]:
    """The paper's slopes: 2^(−8(h+1)/H) for H a power of two; otherwise those of the largest power
    of two below H, then every other slope of twice that, until there are H (its reference code)."""
    if heads <= 0:
        return ()
    closest = 2 ** math.floor(math.log2(heads))
    first = tuple(2.0 ** (-8.0 * (h + 1) / closest) for h in range(closest))
    return first + paper_slopes(2 * closest)[0::2][:heads - closest] if heads > closest else first


def distances(geo: Geometry) -> Array:  # -> broadcastable to [*lead, n_q, n_k]
    """|i + n_k − n_q − j|: each key's distance from the query's bottom-right diagonal."""
    return np.abs(geo.bottom_right - np.arange(geo.n_k))


def alibi_bias(geo: Geometry, slopes: Array) -> Array:  # [heads] | [batch, heads] -> [..., n_q, n_k] float64
    """−slope·distance, the slope of each (batch row,) head: [heads] → [heads, 1, 1], [batch, heads] →
    [batch, heads, 1, 1], [1] for 2-D inputs → [1, 1]."""
    s = np.asarray(slopes, dtype=np.float64)
    per_row = s[..., None, None] if geo.ndim >= 3 or s.ndim == 2 else s[:, None]
    return -per_row * distances(geo)


def received(case: Case, slopes: tuple) -> tuple[Array]:
    return (np.asarray(slopes, dtype=np.float32),)


def heads_of(case: Case) -> int:
    return case.heads if case.ndim >= 3 else 1


def draw(draw: st.DrawFn, target: Target, case: Case) -> Case:
    """The paper's slopes for the case's heads, or slopes drawn in [0, 1] (0 included: no bias);
    with 4-D inputs sometimes one row of slopes per batch row (never for ``alibi_shape="heads"``)."""
    heads = heads_of(case)
    drawn = st.lists(st.floats(0.0, 1.0, width=32), min_size=heads, max_size=heads).map(tuple)
    row = st.one_of(st.just(paper_slopes(heads)), drawn)
    if case.ndim == 4 and target.alibi_shape == "both" and draw(st.booleans()):
        return case.with_keyword("alibi", tuple(draw(row) for _ in range(case.batch)))
    return case.with_keyword("alibi", draw(row))


ALIBI = Keyword(
    name="alibi",
    field="supports_alibi",
    passes=("alibi_slopes",),
    meaning="float32 slopes [heads] or [batch, heads] ([1] for 2-D inputs), adding "
            "-slope·|i + n_k - n_q - j| to the score of query i and key j (FlashAttention's definition, "
            "from the bottom-right diagonal), after the softcap, before the masks.",
    terms=(Adds(alibi_bias),),
    received=received,
    draw=draw,
)
