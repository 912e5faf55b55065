"""Bias: a float array added to the scaled scores (``bias=``).

Its declaration (`BIAS`) and the functions it is made of; its laws are `spec.laws.bias`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from hypothesis import strategies as st

from spec.keywords.record import Adds, Keyword

if TYPE_CHECKING:
    from spec.cases import Case
    from spec.target import Target

Array = np.ndarray


AMPLITUDES = (0.5, 1.0, 2.0, 8.0)  # a bias that matters against unit scores


def bias_shape(case: Case, broadcast: str) -> tuple[int, ...]:
    """The shape of the drawn bias: the scores' ``[*lead, n_q, n_k]``, with the head axis
    (``"heads"``) or the batch axis (``"batch"``) of size 1."""
    lead = list(case.lead())
    if broadcast == "heads" and case.ndim >= 3:
        lead[-1] = 1
    if broadcast == "batch" and case.ndim == 4:
        lead[0] = 1
    return (*lead, case.n_q, case.n_k)


def received(case: Case, parameter: tuple[float, str]) -> tuple[Array]:
    amplitude, broadcast = parameter
    shape = bias_shape(case, broadcast)
    return ((case.rng(11).standard_normal(shape) * amplitude).astype(case.np_dtype),)


def broadcasts(case: Case) -> tuple[str, ...]:
    """The bias shapes this case can take: full, and broadcast over each axis it has."""
    return ("",) + (("heads",) if case.ndim >= 3 else ()) + (("batch",) if case.ndim == 4 else ())


def draw(draw: st.DrawFn, target: Target, case: Case) -> Case:
    """A bias of amplitude 0.5–8, full-shape or broadcast over heads or batch; a broadcast over
    the heads comes with two or more batch rows, over the batch with two or more heads (where
    reading the wrong slab shows)."""
    broadcast = draw(st.sampled_from(broadcasts(case)))
    if broadcast == "heads" and case.ndim == 4 and case.batch < 2:
        case = case.replace(batch=2)
    if broadcast == "batch" and case.heads < 2:
        case = case.replace(heads=2, kv_heads=None)
    return case.with_keyword("bias", (draw(st.sampled_from(AMPLITUDES)), broadcast))


BIAS = Keyword(
    name="bias",
    field="supports_bias",
    passes=("bias",),
    meaning="A float array broadcastable to [batch, heads, n_q, n_k], added to the scaled (and capped) "
            "scores before the softmax; -inf hides a key (relative-position biases, additive masks).",
    terms=(Adds(lambda geo, bias: np.asarray(bias, dtype=np.float64), grad="dbias", cause="bias"),),
    received=received,
    draw=draw,
)
