"""Laws of ``softcap=c``: logit soft-capping (Gemma 2, FlashAttention's ``softcap``) — the
scaled scores ``s`` become ``c·tanh(s / c)`` before the bias and the masks, so they never exceed
c in magnitude and a hidden key stays hidden.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from spec import dtypes, tolerance
from spec.cases import Case, cases
from spec.keywords.softcap import CAPS, SOFTCAP
from spec.laws import _needs
from spec.laws._helpers import (
    assert_hidden_unmoved,
    assert_matches,
    assert_same,
    first_true,
    pattern,
    run,
    sees_any,
    visible,
)
from spec.laws._range import at_edge
from spec.registry import law
from spec.target import Target

Array = np.ndarray

needs_softcap = _needs.keyword(SOFTCAP)


def softcap_cases(target: Target, **given: object) -> st.SearchStrategy[Case]:
    """Cases with a cap c from `CAPS` and scores of magnitude ~c."""
    return cases(target, n_max=48, values=("normal",), keywords=(SOFTCAP,), **given)  # type: ignore[arg-type]


@law(strategy=lambda t: softcap_cases(t, masks=("none", "random"), scale=True), needs=needs_softcap)
def softcap_matches_golden(target: Target, case: Case) -> None:
    """With ``softcap=c`` the output equals the float64 golden of softmax(c·tanh(s/c))·V, s the
    scaled scores, within the tolerance policy.

    Catches: the cap applied before the scale (c·tanh(q·k/c)·scale); the cap written c·tanh(s)
    (without dividing by c); the cap applied after the mask, so −inf becomes −c and hidden keys
    get weight (see softcap_keeps_hidden_keys_hidden).
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs),
                   what=f"with softcap={case.param('softcap'):g}, the output")


@st.composite
def _huge_cases(draw: st.DrawFn, target: Target) -> Case:
    base = cases(target, pattern=True, n_max=48, values=("normal",))
    case = draw(at_edge(target, base, fractions=(0.01, 0.1, 0.5)))
    return case.with_keyword("softcap", draw(st.sampled_from(CAPS)))


@law(strategy=_huge_cases, needs=needs_softcap, reads_pattern=True)
def softcap_bounds_scores(target: Target, case: Case) -> None:
    """Capped scores never exceed c in magnitude, however large the logits: with scores up to
    the edge of the dtype's range, every visible weight (read via V = I) is finite and within a
    factor e^(2c) of its row's largest, and the output matches the golden.

    Catches: tanh computed as (e^(2x) − 1)/(e^(2x) + 1), which overflows to inf/inf = NaN for
    large logits; a one-sided cap (only positive scores capped), which lets a very negative score
    vanish to weight 0 instead of e^(−2c) of the largest.
    """
    p, inputs = pattern(target, case)
    rows = sees_any(target, inputs)
    vis = visible(target, inputs)
    c = float(case.param("softcap"))
    bad = rows[..., None] & ~np.isfinite(p)
    if (at := first_true(bad)) is not None:
        raise AssertionError(f"weight {list(at)} is {p[at]} with softcap={c:g} and scores "
                             f"of magnitude ~{case.amplitude:.3g}")
    top = np.max(np.where(vis, p, 0.0), axis=-1, keepdims=True)
    # Each capped score lies in [−c, c]: no visible weight falls below e^(−2c) of the row's top,
    # less what rounding may take (relative eps·(scores up to 2c)); checked where that bound is a
    # normal number of the dtype with room to spare.
    work = target.precision(case.dtype)
    rel = target.tolerance * tolerance.weight_sum_slack(work, case.n_k, 4 * c)
    floor = top * math.exp(-2 * c) * (1 - rel)
    low = vis & rows[..., None] & (p < floor) & (floor >= 16 * dtypes.tiny(work))
    if (at := first_true(low)) is not None:
        raise AssertionError(
            f"weight {list(at)} is {float(p[at]):.3g}, below e^(−2c) = {math.exp(-2 * c):.3g} of its "
            f"row's largest {float(top[at[:-1]][0]):.3g}: a score beyond −c survived softcap={c:g}")
    assert_matches(target, inputs, p, what=f"with softcap={c:g} and huge scores, the pattern")


@law(strategy=lambda t: softcap_cases(t, masks=("random",), causal=(False, True), n_k_min=2),
     needs=needs_softcap & _needs.either(_needs.mask, _needs.causal_mode))
def softcap_keeps_hidden_keys_hidden(target: Target, case: Case) -> None:
    """A key hidden by the mask or the causal mask stays hidden after capping: the output
    matches the golden, and changing every hidden key and value (at their scale, or ×1e5; ×10 in
    float16) leaves the rows bit-identical (within tolerance if the target declares
    exact_masking=False).

    Catches: the cap applied after masking, c·tanh(−inf/c) = −c, so every hidden key gets
    weight e^(−2c) relative to the top instead of 0 (the Gemma 2 order is cap, then mask).
    """
    inputs = case.inputs()
    c = case.param("softcap")
    out = run(target, inputs)
    assert_matches(target, inputs, out, what=f"with softcap={c:g} and hidden keys, the output")
    # Change the keys one query cannot see; rows that see none of them must not move.
    row = int(case.rng(31).integers(0, case.n_q))
    assert_hidden_unmoved(target, case, inputs, ~visible(target, inputs)[..., row, :], before=out,
                          what=f"with softcap={c:g}, changing keys hidden from query {row}")


@law(strategy=lambda t: softcap_cases(t, masks=("none", "random")), needs=needs_softcap)
def softcap_far_above_is_no_cap(target: Target, case: Case) -> None:
    """A cap far above every score (c = 4·max|s|/√eps, where c·tanh(s/c) = s·(1 − s²/(3c²)) is s
    to within eps/48 relative) equals no cap, within tolerance. Only caps the dtype the target
    computes in can hold are drawn: past its largest finite value (float16's 65,504, for scores
    beyond ~511) a kernel that holds c in that dtype holds inf, and the baseline itself
    (c·tanh(s/c) rounded to the dtype) is inf·0 = NaN.

    The tolerance counts an error of 2c·eps in each capped score (`spec.keywords.softcap.
    capped_error`, the floor's score term): a correct float tanh is accurate to eps in [−1, 1],
    not to eps relative to a tiny tanh(s/c), and ×c that is c·eps. Kernels compute tanh through
    exponentials (x·(e^(s/x) − e^(−s/x))/(e^(s/x) + e^(−s/x)), 2σ(2x) − 1), which round near 1:
    at c = 3e4–6e4 over scores of ~1 in float32 they are 7.6e-4 to 2.3e-3 from the golden, about
    c·eps = 3.6e-3 to 7.2e-3 in the score, the same formula that is within 1e-6 at c = 30 or 50.
    That is the dtype's precision at the cap's magnitude, not a bug; the bugs this law is for move
    scores by O(1).

    Catches: a cap that always applies tanh without the c factors (tanh(s), squashing every score
    into [−1, 1]); a softcap argument that turns on a different code path, off by more than the
    cap's own rounding.
    """
    inputs = case.inputs()
    q, k = inputs.q.astype(np.float64), inputs.k.astype(np.float64)
    s = np.abs(q @ np.swapaxes(k, -1, -2)).max(initial=0.0) * inputs.scale_value
    far = float(max(1.0, 4 * s / np.sqrt(dtypes.eps(target.precision(case.dtype)))))
    assume(far <= float(dtypes.finfo(target.precision(case.dtype)).max))
    inputs = inputs.replace(softcap=far)
    out = run(target, inputs)
    assert_matches(target, inputs, out, what=f"with softcap={far:.3g}, the output")
    # judged with the capped call's allowance: the capped run carries the cap's rounding
    plain = inputs.replace(softcap=None)
    assert_same(target, inputs, run(target, plain), out, what=f"softcap={far:.3g} against no cap")
