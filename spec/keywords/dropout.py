"""Dropout on the attention weights (``dropout_p=``, ``seed=``).

Its declaration (`DROPOUT`) and the functions it is made of; its laws are `spec.laws.dropout`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from hypothesis import strategies as st

from spec.keywords.record import Keyword, Leaves

if TYPE_CHECKING:
    from spec.cases import Case
    from spec.target import Target

Array = np.ndarray


DROP_RATES = (0.1, 0.2, 0.3, 0.7, 0.8, 0.9)
"""p drawn by the laws; not 0.5, where dropping with p and keeping with p cannot be told apart."""


def draw(draw: st.DrawFn, target: Target, case: Case) -> Case:
    """A drop rate from `DROP_RATES` and a seed."""
    return case.with_keyword("dropout", (draw(st.sampled_from(DROP_RATES)), draw(st.integers(0, 2**31 - 1))))


DROPOUT = Keyword(
    name="dropout",
    field="supports_dropout",
    passes=("dropout_p", "seed"),
    meaning="dropout_p=, seed=: dropout on the attention weights after the softmax, kept weights scaled "
            "by 1/(1 - p); the same seed gives the same output.",
    terms=(Leaves("the kept set is the target's own random draw: the golden is the undropped output, and "
                  "the dropout laws read the kept set through V = I"),),
    received=lambda case, drawn: (float(drawn[0]), int(drawn[1])),
    draw=draw,
)
