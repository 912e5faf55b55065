"""Amplitudes at the edge of a dtype's range, derived from ``finfo``.

A law that wants "scores as large as the dtype allows" draws a *fraction* of the edge; the
edge depends on the case's own q and k, so it is computed here from the arrays the case makes
(at amplitude 1) and stored in the case as the magnitude its largest products reach
(``Case.score_max``; values: ``Case.v_max``), which then replays exactly. The case stores
magnitudes, never the factor that realises them: that factor, edge / P, overflows to inf in
float64 whenever P < 1/4 (a single small q·k), and a case of infinite values would blame a
correct target for the suite's overflow.

The edge, for a case in dtype D computed in C (float32 for float16/bfloat16/float32, float64 for
float64 — what a correct kernel accumulates in); a target that declares it computes a dtype in a
narrower one (``Target.computes``) has that narrower D and C:

    A·scale·P ≤ max(D) / 2      every scaled score is representable in D, with room to spare
    A·P       ≤ max(C) / 4      the unscaled products q·k (and their partial sums) fit in C

with ``P = max_ij Σ_l |q_il|·|k_jl|`` at amplitude 1. So float16 reaches scaled scores near
65504/2 — where q·k formed in float16 *before* the scale overflows (pytorch#60939) and
``finfo(float16).min + score`` overflows to −inf (transformers#17306) — while a correct kernel,
which scales in float32 or scales q first, stays finite.

Values have an edge of their own (`values_at_edge`, the ``large_values`` law): the output is
a convex combination of the rows of V, and a kernel that shifts by the running max sums n_k terms
e^(s − m)·v with weights ≤ 1, so max|v| = max(D) / (4·n_k) keeps every partial sum within a
quarter of D's range — while an unshifted e^s·v already overflows there.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import strategies as st

from spec import tolerance
from spec.cases import Case, largest_products
from spec.dtypes import finfo
from spec.target import Target

EDGE_FRACTIONS = (1e-3, 1e-2, 0.1, 0.5, 1.0)
"""Fractions of the edge a law draws (1.0 = the edge itself)."""


def score_edge(target: Target, case: Case, scale: float) -> float:
    """The largest products ``P`` (module docstring) this case may reach: the edge in the dtype the
    target computes the case's dtype in, lowered where reaching it would take a q or k entry past
    half the largest value of the case's dtype (when one of q, k is much smaller than the other
    everywhere). A finite number; 0 when the case has no queries or no keys."""
    q, k, _ = dataclasses.replace(case, amplitude=1.0, score_max=None).arrays()
    products = largest_products(q, k, case.heads, case.kv_heads)
    if products == 0:
        return 0.0
    work = target.precision(case.dtype)
    summed = tolerance.accumulator(work)  # what the q·k products are summed in
    limit = min(float(finfo(work).max) / (2 * abs(float(scale))), float(finfo(summed).max) / 4)
    # q and k are each scaled by √(edge / products): keep their largest entry within half the range
    entries = max(float(np.max(np.abs(q.astype(np.float64)))), float(np.max(np.abs(k.astype(np.float64)))))
    with np.errstate(over="ignore"):  # an overflow to inf only means no lower bound
        representable = float(products * (np.float64(finfo(case.dtype).max) / (2 * entries)) ** 2)
    return min(limit, representable)


def values_at_edge(target: Target, case: Case) -> Case:
    """The case with ``v_max`` = max(D) / (4·n_k), D the dtype the target computes in: the largest
    values for which every sum of n_k weights ≤ 1 times values stays within a quarter of D's range
    (stored as the magnitude, not as a factor, which overflows for small drawn values)."""
    edge = float(finfo(target.precision(case.dtype)).max)
    return dataclasses.replace(case, v_max=edge / (4 * max(case.n_k, 1)))


@st.composite
def at_edge(
    draw: st.DrawFn, target: Target, base: st.SearchStrategy[Case], *,
    fractions: tuple[float, ...] = EDGE_FRACTIONS, keep: float = 0.0,
) -> Case:
    """Cases from ``base`` with amplitude a drawn fraction of the edge; with probability
    ``keep`` the case keeps its own amplitude (moderate scores still get examples), but never
    beyond the edge."""
    case = draw(base)
    scale = 1.0 / np.sqrt(case.d_k) if case.scale is None else case.scale
    edge = score_edge(target, case, scale)
    if edge == 0:  # no query or no key: no score to scale
        return case
    if keep and draw(st.floats(0, 1)) < keep:
        q, k, _ = case.arrays()
        within = largest_products(q, k, case.heads, case.kv_heads) <= edge
        return case if within else dataclasses.replace(case, amplitude=1.0, score_max=edge)
    return dataclasses.replace(case, amplitude=1.0, score_max=draw(st.sampled_from(fractions)) * edge)
