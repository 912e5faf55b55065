"""The drawing primitives that the cases (`spec.cases`) and the keywords' draws (`spec.keywords`)
share: cached strategies (a strategy built afresh is validated afresh on each draw) and the
lengths a target's shape limits admit. Below both, so a keyword's draw needs no case module."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from hypothesis import strategies as st

if TYPE_CHECKING:
    from spec.target import Target


@functools.cache
def choice(options: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    """``st.sampled_from(options)``, made once per options: a case draws a dozen of these, and a
    strategy built afresh is validated afresh on each draw (a tenth of a run's drawing time)."""
    return st.sampled_from(options)


def pick(draw: st.DrawFn, options: tuple[Any, ...]) -> Any:
    """``draw(choice(options))``, without a draw when there is one option: a one-element
    ``sampled_from`` is ``just``, and drawing even that costs Hypothesis as much as a real choice
    (tens of microseconds, for a value known in advance)."""
    return options[0] if len(options) == 1 else draw(choice(options))


def one_of(draw: st.DrawFn, branches: tuple[st.SearchStrategy[Any], ...]) -> Any:
    """``draw(st.one_of(*branches))`` with the same choices, one draw fewer: the branch is sampled
    as ``one_of`` samples it (``sampled_from`` over the branches), then drawn."""
    return draw(draw(choice(branches)))


@functools.cache
def between(low: int, high: int) -> st.SearchStrategy[int]:
    """``st.integers(low, high)``, made once per bounds (see `choice`)."""
    return st.integers(low, high)


BOOLEANS = st.booleans()


SHAPE_GRID = (1, 17, 129)
"""The lengths a target that compiles per shape (`Target.compiles_per_shape`) is drawn at: one
query or key, a partial tile past the smallest tile (16 + 1), and one past 128 (a row block's
edge). Calls a law derives from its cases (one query alone, a row truncated) keep their sizes.
Such a target is also drawn at one rank (its highest), with two heads and two batch rows, and
d_v = d_k (except where a law reads the pattern through V = I)."""


def admissible_lengths(target: Target, n_min: int, n_max: int) -> tuple[int, ...] | None:
    """The lengths in [n_min, n_max] the target's limits admit, where they restrict the draw to a
    few (None: any): multiples of ``seq_multiple`` (n_max raised to one multiple, so a law's small
    sizes still reach one tile), the `SHAPE_GRID` of a target that compiles per shape; at most
    ``max_seq``."""
    return _admissible(target.seq_multiple, target.max_seq, target.compiles_per_shape, n_min, n_max)


@functools.cache
def _admissible(multiple: int | None, cap: int | None, compiles: bool, n_min: int,
                n_max: int) -> tuple[int, ...] | None:
    m = multiple or 1
    high = min(max(n_max, m), cap) if cap is not None else max(n_max, m)
    if compiles:
        grid = [n for n in SHAPE_GRID if n % m == 0] or [m]
        return tuple(n for n in grid if n_min <= n <= high) or tuple(n for n in grid[:1] if n >= n_min)
    if m == 1:
        return None
    return tuple(range(-(-max(n_min, 0) // m) * m, high + 1, m))
