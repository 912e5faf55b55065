"""The core laws of attention, one named function each.

Every law takes ``(target, case)``, builds its inputs from the case, calls the target and
raises ``AssertionError`` saying what broke. Its docstring says the law (first paragraph) and a
real bug it catches (the paragraph starting "Catches"). ``@law`` marks it with the cases it
wants and the capability it needs; `spec.registry` collects it, `spec.runner` hands
it to Hypothesis.

An output-only target is read through identity values: with ``V = I`` (n_k × n_k) the output
row i *is* the pattern row softmax(q_i Kᵀ·scale), so no target needs to return its weights.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from spec import dtypes, golden
from spec.call import call
from spec.cases import (
    SEEDS,
    Case,
    boundary_cases,
    cases,
    grid_length,
    grid_width,
    largest_products,
    one_of,
    pick,
    served,
    widths_for,
)
from spec.inputs import Inputs
from spec.laws import _needs
from spec.laws._helpers import (
    assert_empty_rows_follow_policy,
    assert_hidden_unmoved,
    assert_matches,
    assert_same,
    differs_at,
    first_true,
    observe,
    pattern,
    run,
    sees_any,
    short,
    slack,
    visible,
)
from spec.laws._range import at_edge, values_at_edge
from spec.registry import Need, law
from spec.target import Target

Array = np.ndarray


# --- the laws ------------------------------------------------------------------------------


@law(scope="call")
def output_shape_dtype(target: Target, case: Case) -> None:
    """The output has shape (..., n_q, d_v) and the inputs' dtype.

    Catches: weights @ K instead of weights @ V (width d_k, wrong whenever d_v ≠ d_k); a result
    silently upcast to float64 from float32 inputs, doubling memory downstream.
    """
    inputs = case.inputs()
    out = call(target, inputs)
    assert out.dtype == inputs.q.dtype, f"output dtype is {out.dtype}, inputs are {inputs.q.dtype}"


@law(strategy=lambda t: cases(t, masks=("none", "random")))
def inputs_not_mutated(target: Target, case: Case) -> None:
    """q, k, v (and mask) are bit-for-bit the same after the call.

    Catches: an in-place ``q *= scale`` or ``scores.masked_fill_`` on a view of the caller's
    array — the next layer then reads scaled queries.
    """
    given = {name: np.array(x) for name, x in case.inputs().arrays().items()}  # writable, the caller's
    kept = {name: x.copy() for name, x in given.items()}
    inputs = case.inputs().replace(**given)
    call(target, inputs, copy=False)
    for name, x in given.items():
        assert np.array_equal(x, kept[name], equal_nan=x.dtype != bool), (
            f"the target changed its input {name} (first change at index {list(differs_at(x, kept[name]))})"
        )


@law(strategy=lambda t: cases(t, masks=("none", "random"), scale=True, tiles=True),
     grid=lambda t: boundary_cases(t, tiles=True, long=True), scope="generic")
def matches_golden(target: Target, case: Case) -> None:
    """The output equals an independent float64 attention within the tolerance policy.

    Catches: tiling that drops the last (partial) block of keys; an online softmax that forgets to
    rescale the accumulator when the running maximum grows; any error that no single law names.
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs))


@law(strategy=lambda t: cases(t, pattern=True, n_max=130, tiles=True), reads_pattern=True,
     grid=lambda t: boundary_cases(t, pattern=True, tiles=True))
def rows_sum_to_one(target: Target, case: Case) -> None:
    """Every query row that sees a key has attention weights ≥ 0 summing to 1 (read via V = I).

    Catches: softmax over the wrong axis (columns sum to 1, rows do not); masking applied after the
    softmax without renormalising (rows sum to less than 1).
    """
    p, inputs = pattern(target, case)
    rows = sees_any(target, inputs)
    tol = target.tolerance * slack(target, inputs)
    sums = p.sum(axis=-1)
    bad = rows & ~(np.abs(sums - 1) <= tol)
    if (at := first_true(bad)) is not None:
        raise AssertionError(f"row {list(at)} of the pattern sums to {float(sums[at])!r}, not 1 (±{tol:.2g})")
    low = float(np.min(np.where(rows[..., None], p, 0.0), initial=0.0))
    assert low >= -tol, f"a pattern entry is negative: {low!r}"


@law(strategy=lambda t: cases(t, masks=("none", "random")), scope="broad")
def convex_combination(target: Target, case: Case) -> None:
    """Each output coordinate lies between the min and max of that coordinate over the *visible*
    values (the output is a convex combination of them).

    Catches: a softmax that is never normalised (outputs scale with the number of keys); masked
    scores multiplied by 0 instead of set to −∞ (invisible values get weight e⁰ = 1).
    """
    inputs = case.inputs()
    out = run(target, inputs)
    vis = visible(target, inputs)
    v = golden.with_kv_heads(inputs.q, inputs.v)
    v64 = np.broadcast_to(v.astype(np.float64)[..., None, :, :], (*vis.shape, case.d_v))
    hidden = ~vis[..., None]
    lo = np.min(np.where(hidden, np.inf, v64), axis=-2)  # [..., n_q, d_v]
    hi = np.max(np.where(hidden, -np.inf, v64), axis=-2)
    vmax = float(np.max(np.abs(v64), initial=0.0))
    tol = target.tolerance * slack(target, inputs) * vmax
    rows = sees_any(target, inputs)[..., None]
    with np.errstate(invalid="ignore"):
        bad = rows & ~((out >= lo - tol) & (out <= hi + tol))
    if (at := first_true(bad)) is not None:
        raise AssertionError(
            f"output {list(at)} = {out[at]:.6g} lies outside [{lo[at]:.6g}, {hi[at]:.6g}], "
            "the range of the values that query sees"
        )


@law(strategy=lambda t: cases(t, masks=("none", "random")), scope="broad")
def uniform_scores_average(target: Target, case: Case) -> None:
    """When every key is the same, all scores in a row tie and the output is the plain mean of
    the visible values (under the causal mask: the running mean v_0..v_i).

    Catches: a causal mask off by one in either direction (j < i: query 0 sees nothing; j ≤ i+1:
    the mean includes the next value); dividing by n_k instead of the number of visible keys.
    """
    k = case.inputs().k
    inputs = case.inputs().replace(k=np.ascontiguousarray(np.broadcast_to(k[..., :1, :], k.shape)))
    assert_matches(target, inputs, run(target, inputs), what="with all keys equal, the output")


@law(strategy=lambda t: cases(t, pattern=True, n_k_min=2, n_max=64, values=("normal",), scale=True),
     reads_pattern=True)
def scale_is_inv_sqrt_dk(target: Target, case: Case) -> None:
    """The scores are q·k times exactly 1/√d_k (or the scale= given): recovered from the pattern's
    log-ratios, log(P_ij / P_ij') = scale·q_i·(k_j − k_j'), by least squares.

    Catches: scaling by 1/d_k, by 1/√d_v or by 1/√(h·d_k) (the model width) instead of 1/√d_k;
    no scaling at all; a ``scale=`` argument that is accepted and ignored. A pattern that is not
    finite where a query sees keys has no scale to recover: that fails too.
    """
    p, inputs = pattern(target, case)
    _assert_finite_where_seen(target, inputs, p, "the pattern read through V = I")
    vis = visible(target, inputs)
    q64 = inputs.q.astype(np.float64)
    k64 = golden.with_kv_heads(q64, inputs.k.astype(np.float64))
    raw = q64 @ np.swapaxes(k64, -1, -2)  # q·k without any scale
    # Compare each key with the row's most likely one; keep entries well above underflow.
    top = np.argmax(np.where(vis, p, -np.inf), axis=-1)[..., None]
    p_top = np.take_along_axis(p, top, axis=-1)
    # Subnormal weights carry few significant bits: keep only normal numbers.
    usable = vis & (p > 1e-3 * p_top) & (p >= 16 * dtypes.tiny(target.precision(case.dtype)))
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.log(p) - np.log(p_top)
    x = raw - np.take_along_axis(raw, top, axis=-1)
    x, y = x[usable], y[usable]
    if float(np.sum(x * x)) < 1e-6:
        return  # no two distinguishable visible keys: nothing to recover (rare: n_k ≥ 2 is drawn)
    recovered = float(np.sum(x * y) / np.sum(x * x))
    want = inputs.scale_value
    # Each log-ratio carries the relative error of two weights; least squares spreads it over |x|.
    dtype_eps = dtypes.eps(target.precision(case.dtype))
    s_abs = abs(want) * float(np.max(np.abs(q64) @ np.swapaxes(np.abs(k64), -1, -2)))
    rel_err = dtype_eps * (8 + (case.d_k + 2) * s_abs)
    tol = target.tolerance * 2 * rel_err * float(np.sum(np.abs(x)) / np.sum(x * x))
    observe(f"scale error ratio {target.precision_text(case.dtype)}",
            abs(recovered - want) / tol if tol > 0 else float("inf"))
    assert abs(recovered - want) <= tol, (
        f"recovered scale {recovered:.6g} (1/√{1 / recovered**2:.4g}), expected {want:.6g} "
        f"({'1/√d_k' if case.scale is None else 'scale='}) for d_k = {case.d_k}; tolerance {tol:.2g}"
    )


SCORE_VARIANCE_BAND = 0.25
SCORE_BAND_SIGMAS = 5.65
"""The band's half-width in standard deviations of the estimate, at every d_k (`score_samples`)."""


def score_samples(d_k: int) -> int:
    """The heads `score_variance` measures at width d_k: the fewest, in whole batches of 64, for
    which the standard deviation of its estimate, √((8 + 24/d_k)/N)/2, is at most
    `SCORE_VARIANCE_BAND` / `SCORE_BAND_SIGMAS`: 4,096 at d_k = 1, 1,088 at d_k = 128 (the
    estimate's spread shrinks as d_k grows, so fewer heads keep the same false-alarm rate)."""
    need = (8 + 24 / d_k) / (2 * SCORE_VARIANCE_BAND / SCORE_BAND_SIGMAS) ** 2
    return 64 * math.ceil(need / 64)


SCORE_WIDTHS = (st.sampled_from((1, 2, 8, 64, 128)), st.integers(1, 128))  # branches for `one_of`


@st.composite
def _score_variance_cases(draw: st.DrawFn, t: Target) -> Case:
    rank = 4 if 4 in t.ndims else 3
    d_k = one_of(draw, widths_for(t, 128) if t.compiles_per_shape or t.head_dims else SCORE_WIDTHS)
    samples = score_samples(d_k)
    return Case(dtype=pick(draw, t.dtypes), ndim=rank, batch=64 if rank == 4 else 1,
                heads=samples // 64 if rank == 4 else samples, n_q=1, n_k=2, d_k=d_k, d_v=2,
                seed=draw(SEEDS))


@law(strategy=_score_variance_cases, needs=_needs.ndim(3, 4), reads_pattern=True)
def score_variance(target: Target, case: Case) -> None:
    """For q, k with independent unit-variance entries the scaled scores have variance 1,
    whatever d_k. Measured on N independent heads, each one query against two keys:
    x = log(P_1/P_0) = s_1 − s_0 has E[x²] = 2, so v̂ = mean(x²)/2 must lie within 1 ± 0.25.
    The standard deviation of v̂ is √((8 + 24/d_k)/N)/2, and N is chosen per d_k
    (`score_samples`: 4,096 heads at d_k = 1, down to 1,088 at d_k = 128) so that it is at most
    0.044: the band is ≥ 5.65σ wide at every d_k, and a correct target fails with probability
    below 1e-7 per example (normal approximation; for wide heads x is nearly normal and v̂ a
    χ²_N/N, whose two-sided tail beyond 0.25 is 3.0e-8 at N = 1,088, by the regularised gamma
    function), i.e. about once in 10⁵ CI runs of 40 examples.

    Catches: scaling by 1/d_k (variance 1/d_k) or not at all (variance d_k) for d_k ≥ 2; a scale
    taken from the model width h·d_k instead of the head width.
    """
    p, _ = pattern(target, case)
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.log(p[..., 0, 1]) - np.log(p[..., 0, 0])
    estimate = float(np.mean(x * x) / 2)
    want = 1.0 if case.scale is None else case.scale**2 * case.d_k
    assert abs(estimate - want) <= SCORE_VARIANCE_BAND, (
        f"variance of the scaled scores is {estimate:.4g} for d_k = {case.d_k}, expected 1 ± "
        f"{SCORE_VARIANCE_BAND}"
    )


@law(strategy=lambda t: cases(t, causal=(False,), masks=("none", "random"), n_k_min=2))
def kv_permutation_invariance(target: Target, case: Case) -> None:
    """Without a causal mask, permuting the keys together with their values (and the mask's
    columns) leaves the output unchanged: attention sees a set, not a sequence.

    Catches: a causal mask (or position bias) applied even when ``causal=False``.
    """
    inputs = case.inputs()
    mask = inputs.mask
    perm = case.rng(2).permutation(case.n_k)
    out = run(target, inputs)
    moved = run(target, inputs.replace(k=inputs.k[..., perm, :], v=inputs.v[..., perm, :],
                                       mask=None if mask is None else mask[..., perm]))
    assert_same(target, inputs, out, moved,
                what=f"with keys and values permuted by {short(perm)}, the output")


@law(strategy=lambda t: cases(t, causal=(False,), masks=("none", "random"), n_q_min=2))
def query_permutation_equivariance(target: Target, case: Case) -> None:
    """Without a causal mask, permuting the queries permutes the output rows the same way.

    Catches: a position-dependent transform of the queries inside the kernel (rotary embedding
    applied twice); output tiles written back at the wrong row offset.
    """
    inputs = case.inputs()
    mask = inputs.mask
    perm = case.rng(2).permutation(case.n_q)
    out = run(target, inputs)
    moved = run(target, inputs.replace(q=inputs.q[..., perm, :],
                                       mask=None if mask is None else mask[..., perm, :]))
    back = np.empty_like(moved)
    back[..., perm, :] = moved
    assert_same(target, inputs, out, back,
                what=f"with queries permuted by {short(perm)}, the un-permuted output")


def _several_slices(t: Target) -> st.SearchStrategy[Case]:
    return cases(t, ndims=(3, 4), n_max=48, masks=("none", "random")).filter(
        lambda c: c.batch * c.heads >= 2)


@law(strategy=_several_slices, needs=_needs.ndim(3, 4))
def batch_head_independence(target: Target, case: Case) -> None:
    """Each (batch, head) slice of a batched call equals the call on that slice alone.

    Catches: heads mixed by a wrong reshape ((b, h, n, d) viewed as (b, n, h, d)); a softmax
    normalised over the heads or batch axis.
    """
    inputs = case.inputs()
    q, k, v, mask = inputs.q, inputs.k, inputs.v, inputs.mask
    out = run(target, inputs)
    for index in np.ndindex(*case.lead()):
        one = tuple(slice(i, i + 1) for i in index)  # keep the rank: (1, 1, n, d)
        slice_inputs = inputs.replace(q=q[one], k=k[one], v=v[one], mask=None if mask is None else mask[one])
        alone = run(target, slice_inputs)
        assert_same(target, slice_inputs, out[one], alone,
                    what=f"(batch, head) slice {list(index)} alone, against the batched call")


def _large_logit_cases(t: Target) -> st.SearchStrategy[Case]:
    return at_edge(t, cases(t, values=("normal",), n_max=64, amplitudes=(1e2, 1e3, 1e4)), keep=0.3)


@law(strategy=_large_logit_cases, scope="generic")
def large_logits(target: Target, case: Case) -> None:
    """With scores of magnitude 1e2–1e4 and up to the edge of the dtype's range (scaled scores
    near half its largest finite value, derived from finfo: see `spec.laws._range`) every
    row that sees a key has a finite output that still matches the golden.

    Catches: a softmax that exponentiates without subtracting the row maximum (exp overflows to
    inf, inf/inf = NaN); scores q·k formed in float16 before the scale, which overflow to inf
    although the scaled scores are representable (pytorch#60939).
    """
    inputs = case.inputs()
    out = run(target, inputs)
    q, k, _ = case.arrays()
    largest = abs(inputs.scale_value) * largest_products(q, k, case.heads, case.kv_heads)
    _assert_finite_where_seen(target, inputs, out, f"scaled scores up to {largest:.3g} ({case.dtype})")
    assert_matches(target, inputs, out)


def _assert_finite_where_seen(target: Target, inputs: Inputs, out: Array, said: str) -> None:
    """Every output row that sees a key is finite; else say where, and for which inputs (``said``)."""
    bad = sees_any(target, inputs)[..., None] & ~np.isfinite(out)
    if (at := first_true(bad)) is not None:
        raise AssertionError(f"output {list(at)} is {out[at]} for {said}")


def _large_value_cases(t: Target) -> st.SearchStrategy[Case]:
    return cases(t, masks=("none", "random"), n_max=64, amplitudes=(1.0, 10.0)).map(
        lambda c: values_at_edge(t, c))


@law(strategy=_large_value_cases, scope="generic")
def large_values(target: Target, case: Case) -> None:
    """With values as large as max(dtype) / (4·n_k) — so that every sum of weights ≤ 1 times
    values stays within a quarter of the dtype's range — every row that sees a key has a finite
    output that still matches the golden: the output is a convex combination of the values, and
    an online softmax shifted by its running max never holds more than n_k·max|v|.

    Catches: an online softmax that skips the max subtraction while the scores are small (safe for
    exp, which stays far from overflow) and so accumulates e^s·v unnormalised, which overflows to
    inf for values near max/n_k; normalising only after summing unshifted weights times values.
    """
    inputs = case.inputs()
    out = run(target, inputs)
    top = float(np.max(np.abs(inputs.v.astype(np.float64)), initial=0.0))
    _assert_finite_where_seen(target, inputs, out, f"values up to {top:.3g} ({case.dtype}, n_k = {case.n_k})")
    assert_matches(target, inputs, out)


@law(strategy=lambda t: cases(t, causal=(True,), n_k_min=2, tiles=True), needs=_needs.causal_mode,
     grid=lambda t: boundary_cases(t, causal=(True,), n_k_min=2, tiles=True, long=True))
def causal_no_leak(target: Target, case: Case) -> None:
    """Changing the keys and values from position t on leaves every output that cannot see
    position t bit-identical (up to the sign of zero; within tolerance if the target declares
    exact_masking=False) — the causal-mask experiment of the article "How an LLM Works, Part 6:
    Attention", generalised.

    Catches: a mask off by one (j ≤ i + 1); the mask built transposed (j ≥ i) or not applied;
    a row maximum taken before masking, so future scores move the rounding of past outputs.
    """
    t = int(case.rng(3).integers(1, case.n_k)) if case.n_k > 1 else 0
    assert_hidden_unmoved(target, case, case.inputs(), np.arange(case.n_k) >= t,
                          what=f"changing keys/values from position {t} on")


def _masked_rows_cases(t: Target) -> st.SearchStrategy[Case]:
    if t.supports_mask:
        return at_edge(t, cases(t, masks=("rows",)), keep=0.3)
    return at_edge(t, cases(t, causal=(True,), n_q_min=2).filter(lambda c: c.n_q > c.n_k), keep=0.3)


def _masked_rows_grid(t: Target) -> list[Case]:
    if t.supports_mask:
        return boundary_cases(t, mask="rows")
    return boundary_cases(t, causal=(True,), n_q_min=2, keep=lambda c: c.n_q > c.n_k)


def _queries_before_keys(t: Target) -> str | None:
    if t.causal_alignment not in ("bottom_right", "kv_lengths"):
        return "needs bottom-right causal alignment"
    if t.queries_within_keys:
        return ("target declares queries_within_keys=True: no causal case with a query before the first "
                "key (n_q > n_k) is drawn")
    return None


empties_rows = _needs.either(_needs.mask, Need(
    _queries_before_keys, "bottom-right causal alignment (to produce rows that see no key)"))


@law(strategy=_masked_rows_cases, needs=_needs.policy_declared & empties_rows, grid=_masked_rows_grid)
def masked_rows_policy(target: Target, case: Case) -> None:
    """A query that sees no key at all returns what the target declares for the cause that
    emptied it: exact zeros, all NaN, the plain mean of all values, or the output it would have
    unmasked; the other rows are unaffected. Scores are drawn up to the edge of the dtype's range
    (finfo), where a finite fill plus a negative score can leave the range.

    Catches: a plain softmax over an all −∞ row (0/0 = NaN) in a target that promises zeros; a
    finite −1e9 additive mask (uniform weights) where zeros were promised; an additive
    ``finfo(float16).min`` mask, which plus a score below −16 overflows to −∞ and turns a fully
    masked row NaN (transformers#17306).
    """
    inputs = case.inputs()
    out = run(target, inputs)
    assert_empty_rows_follow_policy(target, inputs, out)
    assert_matches(target, inputs, out, what="rows that see a key")


WIDE_GROUPS = ((17, 1), (34, 2), (60, 3))
"""(query heads, K/V heads) of the GQA law's grid: groups of 17, 17 and 20 query heads, past 16
and no multiple of it, where a kernel's programs of 16 query heads straddle two groups (the
drawn cases have groups of 2 or 3)."""


def _wide_groups(t: Target) -> list[Case]:
    """One case per `WIDE_GROUPS` entry: the largest rank of 3 and 4 the target has, one batch
    row, the boundary grid's longest square and its width, the dtypes in rotation; narrowed to
    the serving declarations (`spec.cases.served`: one query over the keys for a decode kernel,
    causal for a causal-only one)."""
    ranks = [r for r in (4, 3) if r in t.ndims]
    if not ranks:
        return []
    n, width = grid_length(t), grid_width(t)
    grid = [served(t, Case(dtype=t.dtypes[i % len(t.dtypes)], ndim=ranks[0], batch=1, heads=heads, kv_heads=g,
                           n_q=n, n_k=n, d_k=width, d_v=width, seed=heads))
            for i, (heads, g) in enumerate(WIDE_GROUPS)]
    return [case for case in grid if case is not None]


@law(strategy=lambda t: cases(t, ndims=(3, 4), gqa=True, n_max=48), needs=_needs.gqa, grid=_wide_groups)
def gqa_matches_repeated_kv(target: Target, case: Case) -> None:
    """With g K/V heads shared by h query heads, the output equals plain multi-head attention with
    each K/V head repeated h/g times (query head i reads K/V head i // (h/g)); groups of 17 and
    20 query heads first (`WIDE_GROUPS`), then drawn ones of 2 or 3.

    Catches: K/V heads tiled instead of repeated (head i reads i mod g), the interleaving bug
    between the PyTorch/JAX convention and a hand-written broadcast; a kernel whose programs
    take 16 query heads each and read the K/V head of a program's first head for all 16, wrong
    where a group is past 16 and not a multiple of it (34 heads over 2: heads 17–31).
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs), what="grouped-query output")


@law(strategy=lambda t: at_edge(t, cases(t, n_k_min=2, tiles=True), keep=0.5), needs=_needs.mask,
     grid=lambda t: boundary_cases(t, n_k_min=2, tiles=True))
def mask_semantics(target: Target, case: Case) -> None:
    """``mask=True`` means *may attend*: an all-True mask changes nothing, and the causal mask
    passed as ``mask=`` equals ``causal=True``; half the examples with scores up to the edge of
    the dtype's range (finfo).

    Catches: the inverted convention (True = masked out, as in PyTorch's old key_padding_mask);
    an additive ``finfo(float16).min`` mask, under which a hidden key whose score exceeds a
    visible one's by more than 65504 outweighs it.
    """
    lead = (*case.lead(), case.n_q, case.n_k)
    all_true = case.inputs().replace(causal=False, mask=np.ones(lead, dtype=bool))
    assert_matches(target, all_true, run(target, all_true), what="with an all-True mask, the output")
    if target.causal_alignment is not None and target.causal_shape_ok(case.n_q, case.n_k):
        causal = case.inputs().replace(causal=True, mask=None)
        as_mask = all_true.replace(mask=np.ascontiguousarray(np.broadcast_to(visible(target, causal), lead)))
        assert_matches(target, as_mask, run(target, as_mask),
                       what="with the causal mask passed as mask=, the output")
