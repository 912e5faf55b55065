"""Sliding windows (``window=(left, right)``) around each query's diagonal.

Its declaration (`WINDOW`) and the functions it is made of; its laws are `spec.laws.window`'s.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from spec.draws import one_of
from spec.keywords.record import Geometry, Keyword, Restricts

if TYPE_CHECKING:
    from spec.cases import Case
    from spec.target import Target

Array = np.ndarray


def window_visible(geo: Geometry, window: tuple[int, int]) -> Array:  # -> broadcastable to [*lead, n_q, n_k]
    """Query i sees key j when diag(i) − left ≤ j ≤ diag(i) + right."""
    left, right = window
    if int(left) != left or int(right) != right or left < 0 or right < 0:
        raise ValueError(f"window must be two integers >= 0, got {window!r}")
    j = np.arange(geo.n_k)
    return (j >= geo.diagonal - left) & (j <= geo.diagonal + right)


@functools.cache
def sides(n: int) -> tuple[st.SearchStrategy[int], ...]:
    """One side of a window: mostly small (0..4, where off-by-ones live), sometimes up to n + 2
    (branches for `spec.draws.one_of`, made once per n: see `spec.draws.choice`)."""
    return (st.integers(0, 4), st.integers(0, n + 2))


def draw(draw: st.DrawFn, target: Target, case: Case) -> Case:
    """A window of each side 0..4 or up to n_k + 2, on shapes the target's alignment defines
    (square_or_decoding: n_q = n_k or n_q = 1; queries_within_keys: n_q ≤ n_k and n_q ≤ each
    row's key length); a left side only, ``(left, 0)``, for ``window_sides="left"``, and the case
    made causal for ``window_needs_causal``."""
    assume(target.causal_shape_ok(case.n_q, case.n_k))
    lengths = case.param("kv_lengths")
    assume(lengths is None or all(target.causal_shape_ok(case.n_q, n) for n in lengths))
    left = one_of(draw, sides(case.n_k))
    right = 0 if target.window_sides == "left" else one_of(draw, sides(case.n_k))
    if target.window_needs_causal and not case.causal:
        case = case.replace(causal=True)
    return case.with_keyword("window", (left, right))


WINDOW = Keyword(
    name="window",
    field="supports_window",
    passes=("window",),
    meaning="window=(left, right), integers >= 0: query i sees keys from diag - left to diag + right, "
            "where diag is i (top-left) or i + n_k - n_q (bottom-right), per causal_alignment (per batch "
            "row, i + kv_lengths[b] - n_q, for causal_alignment='kv_lengths' and over a paged cache); "
            "ANDed with causal and mask.",
    terms=(Restricts(window_visible, cause="window"),),
    received=lambda case, window: (tuple(window),),
    draw=draw,
)
