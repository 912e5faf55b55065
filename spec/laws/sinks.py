"""Laws of ``sinks=``: one extra logit per query head (``[heads]``, ``[1]`` for 2-D inputs) that
joins every row's softmax denominator and carries no value (gpt-oss, DeepSeek-V4), so a row's
weights sum to 1 − the sink's weight.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from spec.cases import Case, cases
from spec.dtypes import finfo
from spec.keywords.lse import LSE
from spec.keywords.sinks import SINKS
from spec.laws import _needs
from spec.laws._helpers import (
    assert_empty_rows_follow_policy,
    assert_matches,
    assert_same,
    expected,
    first_true,
    pattern,
    run,
    run_lse,
    sees_any,
    slack,
)
from spec.laws.lse import assert_lse_close
from spec.registry import law
from spec.target import Target

Array = np.ndarray


needs_sinks = _needs.keyword(SINKS)


def sink_cases(target: Target, **given: object) -> st.SearchStrategy[Case]:
    return cases(target, n_max=48, keywords=(SINKS,), **given)  # type: ignore[arg-type]


@law(strategy=lambda t: sink_cases(t, masks=("none", "random"), scale=True), needs=needs_sinks)
def sinks_matches_golden(target: Target, case: Case) -> None:
    """With ``sinks=`` the output equals the float64 golden, whose row i is
    Σ_j exp(s_ij − lse_i)·v_j with lse_i = log(Σ_j exp(s_ij) + exp(sink_h)).

    Catches: the sink's value included as a key with value v_0 (weights sum to 1 again); the
    sink added to the denominator before the row maximum is subtracted (exp(sink) against
    exp(s − max): the sink's weight is off by e^max).
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs), what="with sinks=, the output")


@law(strategy=lambda t: sink_cases(t, pattern=True, masks=("none", "random")), needs=needs_sinks,
     reads_pattern=True)
def sinks_rows_sum_below_one(target: Target, case: Case) -> None:
    """Read via V = I, every row's weights are ≥ 0 and sum to 1 − the sink's weight
    exp(sink − lse) < 1, within the row-sum slack.

    Catches: weights renormalised to sum to 1 after the sink joined the denominator (the sink
    then has no effect); a sink counted twice, or never.
    """
    p, inputs = pattern(target, case)
    rows = sees_any(target, inputs)
    want = expected(target, inputs).weights.sum(axis=-1)  # 1 − the sink's weight
    tol = target.tolerance * slack(target, inputs)
    sums = p.sum(axis=-1)
    bad = rows & ~(np.abs(sums - want) <= tol)
    if (at := first_true(bad)) is not None:
        raise AssertionError(f"row {list(at)} of the pattern sums to {float(sums[at])!r}, expected "
                             f"1 − sink weight = {float(want[at])!r} (±{tol:.2g})")
    low = float(np.min(np.where(rows[..., None], p, 0.0), initial=0.0))
    assert low >= -tol, f"a pattern entry is negative: {low!r}"


@law(strategy=lambda t: sink_cases(t, masks=("none", "random")), needs=needs_sinks)
def sinks_neg_inf_is_no_sink(target: Target, case: Case) -> None:
    """A sink of −inf adds exp(−inf) = 0 to the denominator: the output equals the call without
    sinks (within tolerance) and the golden of plain attention.

    Catches: a sink taken as logit 0 whatever its value (the "softmax + 1" of off-by-one
    attention hard-coded); −inf − (−inf) = NaN when the sink is folded into the row maximum of a
    row that sees nothing.
    """
    inputs = case.inputs()
    sinks = inputs.get("sinks")
    inputs = inputs.replace(sinks=np.full(sinks.shape, -np.inf, dtype=sinks.dtype))
    out = run(target, inputs)
    assert_matches(target, inputs, out, what="with every sink −inf, the output")
    none = inputs.replace(sinks=None)
    assert_same(target, none, run(target, none), out, what="sinks = −inf against no sinks")


@st.composite
def _per_head_cases(draw: st.DrawFn, target: Target) -> Case:
    case = draw(sink_cases(target, ndims=(3, 4), gqa=target.supports_gqa and draw(st.booleans())))
    sinks = tuple(float(x) for x in np.linspace(-4.0, 4.0, case.heads))  # one distinct sink per head
    return case.with_keyword("sinks", sinks[::-1] if draw(st.booleans()) else sinks)


@law(strategy=_per_head_cases, needs=needs_sinks & _needs.ndim(3, 4))
def sinks_per_head(target: Target, case: Case) -> None:
    """Each query head uses its own sink (sinks spread from −4 to 4 over the heads; with grouped
    K/V heads when the target declares them): the output matches the golden head by head.

    Catches: the sink indexed by the K/V head (sinks[i // group]) instead of the query head; head
    0's sink used for every head.
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs), what="with one sink per head, the output")


@law(strategy=lambda t: sink_cases(t, causal=(False,), n_q_min=2), needs=needs_sinks)
def sinks_single_query_matches_batch(target: Target, case: Case) -> None:
    """A query decoded alone (n_q = 1) against the same keys gives its row of the batched call,
    with the same sinks (no causal mask; both within tolerance of the golden).

    Catches: a single-query (decoding) path that applies the sinks differently from the batched
    path, so cached decoding diverges from recomputation (mlx#3452).
    """
    inputs = case.inputs()
    out = run(target, inputs)
    i = int(case.rng(41).integers(0, case.n_q))
    one = inputs.replace(q=inputs.q[..., i:i + 1, :],
                         mask=None if inputs.mask is None else inputs.mask[..., i:i + 1, :])
    alone = run(target, one)
    assert_matches(target, one, alone, what=f"query {i} alone, the output")
    assert_same(target, one, out[..., i:i + 1, :], alone,
                what=f"query {i} alone against its row of the batched call")


def edge_sinks(target: Target, case: Case, draw: st.DrawFn) -> tuple[float, ...]:
    """Sink logits up to the edge of the logits' range and beyond what an exponent takes:
    ±(1, 10², 10⁴, half the largest finite float32 — float64 where the target computes float64),
    so that exp(sink − max) overflows wherever a kernel leaves the sink out of the row maximum."""
    work = target.precision(case.dtype)
    edge = float(finfo("float64" if work == "float64" else "float32").max) / 2
    magnitudes = st.sampled_from((1.0, 1e2, 1e4, edge))
    one = st.tuples(magnitudes, st.sampled_from((-1.0, 1.0))).map(lambda ms: ms[0] * ms[1])
    return tuple(draw(st.lists(one, min_size=case.heads if case.ndim >= 3 else 1,
                               max_size=case.heads if case.ndim >= 3 else 1)))


@st.composite
def _edge_sink_cases(draw: st.DrawFn, target: Target) -> Case:
    masks = ("none", "random", "rows") if target.supports_mask else ("none",)
    case = draw(cases(target, n_max=48, masks=masks))
    return case.with_keyword("sinks", edge_sinks(target, case, draw))


@law(strategy=_edge_sink_cases, needs=needs_sinks)
def sinks_at_range_edge(target: Target, case: Case) -> None:
    """Sink logits up to half the largest finite float32 (float64 for float64 inputs), of either
    sign, with rows that see no key among them: every row that sees a key is finite and matches the
    golden (a huge sink takes nearly all the weight, so the output goes to 0, not to NaN), and a
    row that sees no key holds zeros when its sink is finite (the sink takes all its weight) —
    otherwise what the target declares.

    Catches: the sink left out of the row maximum, so exp(sink − max) overflows to inf and the row
    becomes inf/inf = NaN once the sink is large (the class reviewed in flash-attention#2752); a
    row that sees no key divided by its sink-only denominator as 0/0.
    """
    inputs = case.inputs()
    out = run(target, inputs)
    bad = sees_any(target, inputs)[..., None] & ~np.isfinite(out)
    if (at := first_true(bad)) is not None:
        raise AssertionError(f"output {list(at)} is {out[at]} with sinks {case.param('sinks')}")
    assert_empty_rows_follow_policy(target, inputs, out)
    assert_matches(target, inputs, out, what=f"with sinks {case.param('sinks')}, the output")


@law(strategy=_edge_sink_cases, needs=needs_sinks & _needs.keyword(LSE))
def sinks_in_lse(target: Target, case: Case) -> None:
    """With sinks and ``return_lse=True`` (sinks up to the range's edge, rows that see no key
    among them), lse includes the sink: log(Σ_j exp(s_ij) + exp(sink)), the sink itself for a
    row that sees no key (never −inf while the sink is finite), within the scores' rounding.

    Catches: an lse computed before the sink joins the denominator, so merging split-KV partial
    results counts the sink once per partition or never; the −inf of an empty row returned where
    the sink makes the denominator finite.
    """
    inputs = case.inputs()
    _, lse = run_lse(target, inputs)
    assert_lse_close(target, inputs, lse, expected(target, inputs).lse, what="with sinks, lse")
