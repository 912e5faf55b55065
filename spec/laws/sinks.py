"""Laws of ``sinks=``: one extra logit per query head (``[heads]``, ``[1]`` for 2-D inputs) that
joins every row's softmax denominator and carries no value (gpt-oss, DeepSeek-V4), so a row's
weights sum to 1 − the sink's weight.

Each law needs ``supports_sinks``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import strategies as st

from spec import golden, tolerance
from spec.cases import Case, cases
from spec.laws._helpers import (
    assert_matches,
    assert_same,
    needs_keyword,
    pattern,
    run,
    scale_of,
    sees_any,
    slack,
)
from spec.registry import law
from spec.target import Target

Array = np.ndarray

needs_sinks = needs_keyword("sinks")


def sink_values(heads: int) -> st.SearchStrategy[tuple[float, ...]]:
    """One sink logit per head, in [−4, 4] (a sink that takes from 2% to 98% of a short row)."""
    return st.lists(st.floats(-4.0, 4.0, allow_nan=False), min_size=heads, max_size=heads).map(tuple)


@st.composite
def sink_cases(draw: st.DrawFn, target: Target, **given: object) -> Case:
    """Cases with one sink logit per query head (heads = 1 for 2-D inputs)."""
    case = draw(cases(target, n_max=48, **given))  # type: ignore[arg-type]
    return dataclasses.replace(case, sinks=draw(sink_values(case.heads if case.ndim >= 3 else 1)))


@law(strategy=lambda t: sink_cases(t, masks=("none", "random"), scale=True), needs=needs_sinks)
def sinks_matches_golden(target: Target, case: Case) -> None:
    """With ``sinks=`` the output equals the float64 golden, whose row i is
    Σ_j exp(s_ij − lse_i)·v_j with lse_i = log(Σ_j exp(s_ij) + exp(sink_h)).

    Catches: the sink's value included as a key with value v_0 (weights sum to 1 again); the
    sink added to the denominator before the row maximum is subtracted (exp(sink) against
    exp(s − max): the sink's weight is off by e^max).
    """
    q, k, v = case.arrays()
    assert_matches(target, case, run(target, case, q, k, v), q, k, v, what="with sinks=, the output")


def sink_weights(target: Target, case: Case, q: Array, k: Array) -> Array:  # -> [*lead, n_q]
    """Each row's sink weight exp(sink − lse), from the float64 golden."""
    if case.kv_heads is not None:
        k = tolerance.repeat_kv(k, case.heads)
    v = np.zeros((*k.shape[:-1], 1))
    _, _, lse = case.golden(target, q, k, v, scale=scale_of(case))
    sinks = np.asarray(case.sinks, dtype=np.float64)
    per_row = sinks[:, None] if case.ndim >= 3 else sinks
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(lse), np.exp(per_row - np.where(np.isfinite(lse), lse, 0.0)), 1.0)


@law(strategy=lambda t: sink_cases(t, pattern=True, masks=("none", "random")), needs=needs_sinks,
     reads_pattern=True)
def sinks_rows_sum_below_one(target: Target, case: Case) -> None:
    """Read via V = I, every row's weights are ≥ 0 and sum to 1 − the sink's weight
    exp(sink − lse) < 1, within the row-sum slack.

    Catches: weights renormalised to sum to 1 after the sink joined the denominator (the sink
    then has no effect); a sink counted twice, or never.
    """
    p, q, k = pattern(target, case)
    rows = sees_any(target, case)
    want = 1 - sink_weights(target, case, q, k)
    tol = target.tolerance * slack(target, case, q, k)
    sums = p.sum(axis=-1)
    bad = rows & ~(np.abs(sums - want) <= tol)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
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
    q, k, v = case.arrays()
    assert case.sinks is not None
    none = dataclasses.replace(case, sinks=None)
    dtype = np.float64 if case.dtype == "float64" else np.float32
    out = run(target, case, q, k, v, sinks=np.full(len(case.sinks), -np.inf, dtype=dtype))
    assert_matches(target, none, out, q, k, v, what="with every sink −inf, the output")
    assert_same(target, none, run(target, none, q, k, v), out, q, k, v, what="sinks = −inf against no sinks")


@st.composite
def _per_head_cases(draw: st.DrawFn, target: Target) -> Case:
    case = draw(sink_cases(target, ndims=(3, 4), gqa=target.supports_gqa and draw(st.booleans())))
    sinks = tuple(float(x) for x in np.linspace(-4.0, 4.0, case.heads))  # one distinct sink per head
    return dataclasses.replace(case, sinks=sinks[::-1] if draw(st.booleans()) else sinks)


@law(strategy=_per_head_cases,
     needs=lambda t: needs_sinks(t) or (None if {3, 4} & set(t.ndims) else "needs 3-D or 4-D inputs"),
     requires="sinks= (supports_sinks) and inputs with a head axis (ndims 3 or 4)")
def sinks_per_head(target: Target, case: Case) -> None:
    """Each query head uses its own sink (sinks spread from −4 to 4 over the heads; with grouped
    K/V heads when the target declares them): the output matches the golden head by head.

    Catches: the sink indexed by the K/V head (sinks[i // group]) instead of the query head; head
    0's sink used for every head.
    """
    q, k, v = case.arrays()
    assert_matches(target, case, run(target, case, q, k, v), q, k, v,
                   what="with one sink per head, the output")


@law(strategy=lambda t: sink_cases(t, causal=(False,), n_q_min=2), needs=needs_sinks)
def sinks_single_query_matches_batch(target: Target, case: Case) -> None:
    """A query decoded alone (n_q = 1) against the same keys gives its row of the batched call,
    with the same sinks (no causal mask; both within tolerance of the golden).

    Catches: a single-query (decoding) path that applies the sinks differently from the batched
    path, so cached decoding diverges from recomputation (mlx#3452).
    """
    q, k, v = case.arrays()
    out = run(target, case, q, k, v)
    i = int(case.rng(41).integers(0, case.n_q))
    one = dataclasses.replace(case, n_q=1)
    alone = run(target, one, q[..., i:i + 1, :], k, v)
    vis = golden.visibility(one.lead(), 1, case.n_k)
    assert_matches(target, one, alone, q[..., i:i + 1, :], k, v, visible=vis,
                   what=f"query {i} alone, the output")
    assert_same(target, one, out[..., i:i + 1, :], alone, q[..., i:i + 1, :], k, v, visible=vis,
                what=f"query {i} alone against its row of the batched call")
