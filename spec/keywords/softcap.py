"""Logit soft-capping (``softcap=c``): the scaled scores become c·tanh(s / c).

Its declaration (`SOFTCAP`) and the functions it is made of; its laws are `spec.laws.softcap`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from hypothesis import strategies as st

from spec.keywords.record import Keyword, Transforms

if TYPE_CHECKING:
    from spec.cases import Case
    from spec.target import Target

Array = np.ndarray


CAPS = (1.0, 5.0, 20.0, 50.0)  # Gemma 2 caps attention logits at 50


def capped(s: Array, c: float) -> Array:
    """c·tanh(s / c) in float64."""
    return c * np.tanh(s / c)


def capped_in(s: Array, dtype: np.dtype, c: float) -> Array:
    """c·tanh(s / c) with every step rounded to ``dtype``, as a kernel in that dtype computes it."""
    cap = dtype.type(c)

    def rounded(x: Array) -> Array:
        return np.asarray(x).astype(dtype, copy=False)

    return rounded(cap * rounded(np.tanh(rounded(s / cap))))


def capped_derivative(s: Array, c: float) -> Array:
    """d(c·tanh(s/c))/ds = 1 − tanh²(s/c)."""
    return 1.0 - np.tanh(s / c) ** 2


def capped_error(c: float) -> float:
    """What a correct float computation of c·tanh(s/c) may add to a score, in units of the eps of
    the dtype computed in: 2c. Kernels compute tanh through exponentials (x·(e^(s/x) − e^(−s/x)) /
    (e^(s/x) + e^(−s/x)), 2σ(2x) − 1, (e^(2x) − 1)/(e^(2x) + 1)), each rounded near 1 and off by up
    to 1.22, 1.49 and 1.12 eps absolutely (float32, 200,000 x each in 1e-6 to 20 in magnitude),
    not relatively: the tanh of a score far below c is off by eps, not by eps·|s|/c, and ×c
    makes that c·eps in the capped score (docs/tolerance.md, "Softcap")."""
    return 2.0 * float(c)


def draw(draw: st.DrawFn, target: Target, case: Case) -> Case:
    """A cap c from `CAPS`, with scores of magnitude ~c (amplitude 1, c or 4c), so the cap bends them."""
    c = draw(st.sampled_from(CAPS))
    return case.replace(amplitude=draw(st.sampled_from((1.0, c, 4 * c)))).with_keyword("softcap", c)


SOFTCAP = Keyword(
    name="softcap",
    field="supports_softcap",
    passes=("softcap",),
    meaning="softcap=c, a float > 0: the scaled scores s become c·tanh(s / c), then the bias, then the "
            "masks (a hidden key stays hidden).",
    terms=(Transforms(golden=capped, baseline=capped_in, derivative=capped_derivative, error=capped_error),),
    received=lambda case, c: (float(c),),
    draw=draw,
)
