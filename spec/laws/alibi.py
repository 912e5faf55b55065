"""Laws of ``alibi_slopes=``: ALiBi (Press et al., 2022, "Train Short, Test Long: Attention with
Linear Biases"), float32 slopes ``[heads]`` or ``[batch, heads]`` (``[1]`` for 2-D inputs), adding
``−slope·|i + n_k − n_q − j|`` to the score of query i and key j — FlashAttention's definition,
measured from the bottom-right diagonal whatever the causal alignment — after the softcap,
before the masks.

The whole keyword is this module: its declaration (`ALIBI`) and its laws; the suite's golden,
baseline, cases, calling layer and docs read the declaration.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from spec import oracle
from spec.cases import Case, cases
from spec.keywords.alibi import ALIBI, alibi_bias, paper_slopes
from spec.keywords.bias import BIAS
from spec.laws import _needs
from spec.laws._helpers import assert_matches, assert_same, run
from spec.registry import law
from spec.target import Target

Array = np.ndarray


needs_alibi = _needs.keyword(ALIBI)


def alibi_cases(target: Target, **given: object) -> st.SearchStrategy[Case]:
    return cases(target, n_max=48, keywords=(ALIBI,), **given)  # type: ignore[arg-type]


@law(strategy=lambda t: alibi_cases(t, masks=("none", "random"), scale=True), needs=needs_alibi)
def alibi_matches_golden(target: Target, case: Case) -> None:
    """With ``alibi_slopes=`` the output equals the float64 golden of
    softmax(scale·q·kᵀ − slope·|i + n_k − n_q − j|)·V within the tolerance policy, for the paper's
    slopes and for slopes drawn in [0, 1], whatever the causal mask and mask= hide.

    Catches: the distance measured from the top-left diagonal |i − j| (right only when n_q = n_k,
    wrong for decoding with a cache); the slope's sign flipped, so far keys gain weight; the bias
    added before the scale.
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs), what="with alibi_slopes=, the output")


@law(strategy=lambda t: alibi_cases(t, masks=("none", "random")), needs=needs_alibi & _needs.keyword(BIAS))
def alibi_equals_its_bias(target: Target, case: Case) -> None:
    """``alibi_slopes=m`` gives the output of ``bias=`` the explicit array −m·|i + n_k − n_q − j|
    (``[heads, n_q, n_k]``, ``[batch, heads, n_q, n_k]`` for per-batch slopes), within twice the
    tolerance: the keyword is exactly the bias it defines.

    Catches: a fused ALiBi path that is not the bias it defines: a slope applied to (j − i)
    without the absolute value, so keys after the diagonal gain; distances measured from the
    top-left diagonal where n_q ≠ n_k; [batch, heads] slopes read per head only.
    """
    inputs = case.inputs()
    geo = oracle.geometry(target.alignment, inputs)
    explicit = alibi_bias(geo, inputs.get("alibi_slopes")).astype(case.dtype)
    as_bias = inputs.replace(alibi_slopes=None, bias=np.broadcast_to(explicit, (*case.lead(), case.n_q,
                                                                                case.n_k)))
    assert_same(target, inputs, run(target, as_bias), run(target, inputs),
                what="alibi_slopes= against the explicit bias it defines")


@st.composite
def _per_batch_cases(draw: st.DrawFn, target: Target) -> Case:
    case = draw(alibi_cases(target, ndims=(4,)))
    case = case.replace(batch=max(case.batch, 2), heads=max(case.heads, 2), kv_heads=None)
    distinct = np.linspace(0.05, 1.0, case.batch * case.heads).reshape(case.batch, case.heads)
    order = draw(st.permutations(range(distinct.size)))
    slopes = distinct.reshape(-1)[list(order)].reshape(distinct.shape)
    return case.with_keyword("alibi", tuple(tuple(float(x) for x in row) for row in slopes))


@law(strategy=_per_batch_cases, needs=needs_alibi & _needs.ndim(4) &
     _needs.not_declared("alibi_shape", "heads", "[batch, heads] ALiBi slopes"))
def alibi_per_batch_and_head(target: Target, case: Case) -> None:
    """Slopes ``[batch, heads]``, all distinct (two or more of each), reach their own (batch row,
    head): the output matches the golden slice by slice.

    Catches: ``[batch, heads]`` slopes read as ``[heads]`` (batch row 0's for every row), or
    indexed by the flattened (head, batch) order; slopes indexed by the K/V head.
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs),
                   what="with per-(batch, head) alibi_slopes, the output")


NOT_POWERS_OF_TWO = (3, 5, 6, 7, 12)


@st.composite
def _odd_head_cases(draw: st.DrawFn, target: Target) -> Case:
    case = draw(cases(target, ndims=(3, 4), n_max=24))
    heads = draw(st.sampled_from(NOT_POWERS_OF_TWO))
    return case.replace(heads=heads, kv_heads=None).with_keyword("alibi", paper_slopes(heads))


@law(strategy=_odd_head_cases, needs=needs_alibi & _needs.ndim(3, 4))
def alibi_heads_not_a_power_of_two(target: Target, case: Case) -> None:
    """With 3, 5, 6, 7 or 12 heads and the paper's slopes for that count (interleaved from two
    powers of two), every head — the last ones, past the largest power of two, included — uses
    its own slope: the output matches the golden head by head.

    Catches: slopes indexed by h mod 2^⌊log₂ H⌋ (a kernel that assumes a power-of-two head count
    and wraps the last heads onto the first); slopes recomputed inside the kernel by the
    power-of-two formula 2^(−8(h+1)/H), ignoring the slopes passed.
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs),
                   what=f"with {case.heads} heads and their ALiBi slopes, the output")
