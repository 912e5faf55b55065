"""The golden, the baseline and the tolerance policy.

Golden: attention computed in float64 from the target's own inputs, written here independently
of `impl` (log-sum-exp form, so it shares no code path with the reference under test).
Baseline: the naive formula computed in the target's dtype — what a plain, correct
implementation at that precision gets. A target passes when

    max|out − golden| ≤ k·max|baseline − golden| + floor

with k the target's tolerance factor (2 by default) and the floor the a-priori forward error of
a correct computation at that precision:

    floor = eps·max|V|·(4 + √n_k + (d_k + 2)·S),   S = |scale|·max_ij Σ_l |q_il|·|k_jl|

(rounding of the d_k-term dot products moves each score by at most ~d_k·eps·S/2, which moves
the softmax weights by twice that; the weighted sum of n_k values adds ~√n_k·eps·max|V|). The
floor keeps a lucky, error-free baseline from failing a correct target; the baseline term
tracks the conditioning of each example. NaN or Inf where the golden is finite always fails.

Dtypes: float16, float32, float64 and bfloat16 (NumPy's from ``ml_dtypes``, which JAX installs;
8 significand bits, eps = 2⁻⁷, float32's range). ``eps`` and ``tiny`` come from ``ml_dtypes.finfo``
for bfloat16, ``np.finfo`` otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from spec import compared, dtypes
from spec import golden as golden_oracle
from spec.dtypes import BFLOAT16, eps

Array = np.ndarray


def golden(q: Array, k: Array, v: Array, *, visible: Array, scale: float) -> tuple[Array, Array]:
    """Attention in float64 and its pattern (`spec.golden.forward` without the lse).

    [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v], [..., n_q, n_k] -> [..., n_q, d_v], [..., n_q, n_k]
    """
    out, weights, _ = golden_oracle.forward(q, k, v, visible=visible, scale=scale)
    return out, weights


def baseline(
    q: Array, k: Array, v: Array, *, visible: Array, scale: float,
    terms: golden_oracle.Terms = golden_oracle.PLAIN,
) -> Array:
    """The textbook computation in the inputs' dtype: max-shifted softmax, then weights @ V, with
    the keywords' terms in the golden's order (``terms``: the baseline versions, every step in
    the dtype, as `spec.oracle.terms` binds them).

    [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v], [..., n_q, n_k] -> [..., n_q, d_v]

    Every intermediate is rounded to the dtype, and every sum is accumulated as NumPy does for its
    own floats — pairwise, or by BLAS — and rounded once. For bfloat16 that takes care: NumPy (with
    ml_dtypes) computes ``bfloat16 @ bfloat16`` in float32 and returns float32, and ``np.sum`` on
    bfloat16 adds one element at a time in bfloat16 (the sum of 1,000 × 0.3 is 128). So for
    bfloat16 the products are rounded back to bfloat16 and the denominator is summed in float32 and
    rounded once: what a correct bfloat16 kernel does (PyTorch's and XLA's CPU ones accumulate in
    float32), and not the one-key-at-a-time bfloat16 sum that ``long_rows_every_dtype`` exists to
    catch — a baseline with that bug would excuse it.
    """
    weights = baseline_pattern(q, k, visible=visible, scale=scale, terms=terms).weights
    return _rounded(_matmul(weights, v), q.dtype)


@dataclass(frozen=True)
class Pattern:
    """The baseline's softmax, every step in the inputs' dtype: the scaled scores before each
    transform and after the last (``stages``: raw, f₁(raw), ...), the weights ``[..., n_q, n_k]``
    and each row's sink weight ``[..., n_q, 1]`` (None without sinks)."""

    stages: tuple[Array, ...]
    weights: Array
    sink: Array | None


def _rounded(x: Array, dtype: np.dtype) -> Array:  # a no-op for NumPy's floats, whose results keep the dtype
    return np.asarray(x).astype(dtype, copy=False)


def _exact_in(dtype: np.dtype) -> np.dtype:
    """Where the baseline does an add, subtract, multiply, divide, max, mask or sum whose result
    it rounds to ``dtype``: float32 for float16 and bfloat16, ``dtype`` itself otherwise. Their
    ufuncs (NumPy's float16, ml_dtypes' bfloat16) convert element by element — a float16
    subtract or row maximum costs 10–20 times its float32 twin, a bfloat16 one 2–7 times — while
    float32 holds every value of either exactly and gives each of those steps the same value once
    rounded: its 24 significand bits are at least 2p + 2 (p = 11 for float16, 8 for bfloat16), so
    rounding twice is rounding once. Sums need nothing: NumPy adds float16 in float32, and
    `_sum_last` does so for bfloat16. ``exp`` stays the dtype's own: float32's, rounded, differs
    from NumPy's float16 one for some inputs."""
    return np.dtype(np.float32) if dtype == np.float16 or dtype.name == BFLOAT16 else dtype


def baseline_pattern(
    q: Array, k: Array, *, visible: Array, scale: float, terms: golden_oracle.Terms = golden_oracle.PLAIN,
) -> Pattern:  # [..., n_q, d_k], [..., n_k, d_k], [..., n_q, n_k] -> Pattern
    """The weights of `baseline` (the same steps, the same rounding), with what the backward
    baseline needs besides: the scores at each transform, and the sinks' weights."""
    dtype = q.dtype
    exact = _exact_in(dtype)

    def rounded(x: Array) -> Array:
        return _rounded(x, dtype)

    def up(x: Array) -> Array:  # a value in the dtype, for a step done in `exact`
        return x.astype(exact, copy=False)

    with np.errstate(over="ignore"):  # a naive product may overflow where the scaled scores fit
        stages = [rounded(up(rounded(_matmul(q, np.swapaxes(k, -1, -2)))) * exact.type(dtype.type(scale)))]
    for transform, _ in terms.transforms:  # the golden's order: transforms, then added terms, then masks
        stages.append(rounded(transform(stages[-1])))
    scores = stages[-1]
    for added in terms.added:
        with np.errstate(invalid="ignore", over="ignore"):
            scores = rounded(up(scores) + np.asarray(added).astype(dtype))
    scores = np.where(visible, up(scores), exact.type(-np.inf))
    top = np.max(scores, axis=-1, keepdims=True)
    sink = None
    if terms.sinks is not None:  # a logit per row [..., n_q] -> [..., n_q, 1]
        sink = np.asarray(terms.sinks).astype(dtype)[..., None]
        top = np.maximum(top, sink)
    with np.errstate(invalid="ignore", over="ignore"):
        shift = np.where(np.isfinite(top), top, exact.type(0))
        e = rounded(np.exp(rounded(scores - shift)))
        total = _sum_last(e)
        if sink is not None:
            e_sink = rounded(np.exp(rounded(sink - shift)))
            total = rounded(total + e_sink)
        denominator = np.where(total > 0, total, dtype.type(1))
        weights = rounded(up(e) / denominator)
        sink_weight = None if sink is None else rounded(e_sink / denominator)
    return Pattern(tuple(stages), weights, sink_weight)


def _matmul(a: Array, b: Array) -> Array:
    """``a @ b`` accumulated as NumPy does for the dtype, rounded once: NumPy's float16 matmul is a
    loop that adds each product (exact in float32) to a float32 sum and rounds it once; float32
    BLAS does the same additions in another order, in milliseconds instead of a quarter of a
    second at 2,000 × 2,000. The order moves about one result in ten by one float16 rounding
    (measured on 300 random products), well inside what the baseline measures."""
    if a.dtype == np.float16:
        return (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)
    return a @ b


def _sum_last(x: Array) -> Array:  # [..., n] -> [..., 1], in x's dtype
    """NumPy's sum over the last axis; for bfloat16 in float32 and rounded once (see baseline)."""
    if x.dtype.name == BFLOAT16:
        return np.sum(x.astype(np.float32), axis=-1, keepdims=True).astype(x.dtype)
    return np.sum(x, axis=-1, keepdims=True)


def floor(q: Array, k: Array, v: Array, *, scale: float, added: tuple[Array, ...] = (),
          dtype: Any = None, score_error: float = 0.0) -> float:
    """The a-priori error of a correct computation in ``dtype`` (q's by default; see the module
    docstring); each ``added`` term (a bias, ALiBi) adds 2·max|added| to the score term (each
    biased score is rounded once more, to eps·|s + bias|/2, which moves the weights by twice that).
    ``score_error``: what a transform of the scores may add to each, in units of eps (softcap's
    2c: `spec.keywords.record.Transforms.error`); it adds twice itself, as any score error does.
    q, k, v may be wider than ``dtype`` (float8 caches as they mean, in float64): the floor is
    read off their magnitudes, never off a cast that could overflow."""
    if v.size == 0 or q.size == 0 or k.size == 0:
        return 0.0
    d_k, n_k = q.shape[-1], k.shape[-2]
    q64, k64 = np.abs(q.astype(np.float64, copy=False)), np.abs(k.astype(np.float64, copy=False))
    s_abs = abs(scale) * float(np.max(q64 @ np.swapaxes(k64, -1, -2)))
    vmax = float(np.max(np.abs(v.astype(np.float64, copy=False))))
    b_abs = 0.0
    for a in added:
        b = np.abs(np.asarray(a, dtype=np.float64))
        b_abs += float(np.max(np.where(np.isfinite(b), b, 0.0), initial=0.0))
    unit = eps(q.dtype if dtype is None else dtype)
    return unit * vmax * (4 + np.sqrt(n_k) + (d_k + 2) * s_abs + 2 * b_abs + 2 * score_error)


def accumulator(dtype: str) -> str:
    """The dtype a correct kernel sums a row in when it computes in ``dtype``: float32 for float16
    and bfloat16, ``dtype`` itself otherwise (FlashAttention, PyTorch's CPU kernels, XLA and
    `impl` all accumulate a 16-bit row in float32). A textbook softmax in float16 sums a diffuse
    row of 350,000 keys to inf (its denominator is past 65,504): a baseline in float16 would
    excuse the very overflow the long rows of ``--profile scale`` look for."""
    return "float32" if dtypes.as_dtype(dtype).itemsize < 4 else dtype


def long_row_floor(q: Array, k: Array, v: Array, *, scale: float, dtype: str) -> float:
    """`floor` with the weighted sum of the n_k values counted in the accumulator a correct kernel
    keeps (`accumulator`): float32 for float16 and bfloat16, ``dtype`` itself otherwise.

    [..., r, d_k], [..., n_k, d_k], [..., n_k, d_v] -> float (q: the rows judged)

    `floor` counts √n_k·eps of the dtype for that sum (a sum in the dtype), which past a few
    thousand keys exceeds the output itself for the 16-bit dtypes (at 350,000 keys in float16,
    √n_k·eps ≈ 0.58 times max|V|) and would excuse exactly the float16 running sum the long rows
    exist to catch; a float32 accumulator's √n_k·eps is 7·10⁻⁵ at 350,000 keys. The scores'
    rounding, (d_k + 2)·S·eps of ``dtype``, stays as it is (S taken a block of keys at a time, the
    K/V heads repeated as `spec.golden.with_kv_heads` reads them)."""
    eps, acc = dtypes.eps(dtype), dtypes.eps(accumulator(dtype))
    q64 = np.abs(q.astype(np.float64))
    k64 = golden_oracle.with_kv_heads(q64, np.abs(k.astype(np.float64)))
    s_abs = scale * _max_products(q64, k64)
    vmax = float(np.max(np.abs(v.astype(np.float32)), initial=0.0))
    return eps * vmax * (4 + (q.shape[-1] + 2) * s_abs) + acc * vmax * math.sqrt(k.shape[-2])


def _max_products(q: Array, k: Array) -> float:
    """max_ij Σ_l |q_il|·|k_jl| over every slice, a block of keys at a time."""
    top = 0.0
    for start in range(0, k.shape[-2], 2**16):
        top = max(top, float(np.max(q @ np.swapaxes(k[..., start:start + 2**16, :], -1, -2), initial=0.0)))
    return top


def weights_floor(weights: Array, v: Array, fmt: str) -> float:
    """The error of a correct kernel that rounds its unnormalised weights to the float format
    ``fmt`` before the P·V product, as FlashAttention 3's float8 path does (P to
    ``float8_e4m3fn``, so that P·V runs on float8 tensor cores), for the golden pattern
    ``weights [..., n_q, n_k]`` and the values ``v`` as they mean (dequantized).

    Derivation. Row i's unnormalised weights are p_j = exp(s_j − m) ∈ [0, 1] (m the row
    maximum, so the largest is 1) and its output is Σ_j p̃_j v_j / ℓ, ℓ = Σ_j p_j, p̃_j = p_j
    rounded to ``fmt``: |p̃_j − p_j| ≤ u(p_j), half the spacing of ``fmt`` at p_j — eps·2^⌊log₂ p⌋/2
    for a normal p, half the smallest subnormal below ``fmt``'s tiny (e4m3: eps = 2⁻³, tiny = 2⁻⁶,
    subnormals 2⁻⁹ apart). The output then moves by at most max|V|·Σ_j u(p_j)/ℓ, and once more
    that much where ℓ is summed from the rounded p̃ (a kernel may do either): the bound is
    2·max|V|·max_i Σ_j u(p_ij)/ℓ_i. For e4m3 that is about max|V|/8 for a row of similar weights
    (eps/2 relative each) and less where most weights are subnormal or zero — large, as a
    float8 P·V is; the laws' scales (a factor of 4 or more between heads, rows, K and V) put
    every descale bug far beyond it. The p_j are the golden's weights divided by each row's
    largest; rows that see nothing count 0. Not counted: a kernel that also rounds q to float8
    (FlashAttention 3's q_descale), whose scores then move by ~eps·S/2; it declares a larger
    ``Target.tolerance``."""
    w = np.asarray(weights, dtype=np.float64)
    if w.size == 0 or v.size == 0:
        return 0.0
    info = dtypes.finfo(fmt)
    top = np.max(w, axis=-1, keepdims=True)
    p = np.where(top > 0, w / np.where(top > 0, top, 1.0), 0.0)  # exp(s − m), in [0, 1]
    with np.errstate(divide="ignore"):
        spacing = float(info.eps) * np.exp2(np.floor(np.log2(np.where(p > 0, p, 1.0))))
    half = np.where(p > 0, np.maximum(spacing, float(info.smallest_subnormal)) / 2, 0.0)
    ell = np.sum(p, axis=-1)
    per_row = np.where(ell > 0, np.sum(half, axis=-1) / np.where(ell > 0, ell, 1.0), 0.0)
    vmax = float(np.max(np.abs(np.asarray(v, dtype=np.float64)), initial=0.0))
    return 2.0 * vmax * float(np.max(per_row, initial=0.0))


def baseline_backward(
    q: Array, k: Array, v: Array, d_out: Array, *, visible: Array, scale: float,
    terms: golden_oracle.Terms = golden_oracle.PLAIN,
) -> golden_oracle.Gradients:  # the fields of spec.golden.backward's, in q's dtype
    """The textbook backward in the inputs' dtype, through the same terms as `baseline`
    (``terms`` bound in the dtype; ``terms.keep`` a dropout multiplier), every step rounded to it:

        P = baseline_pattern(...),  dP = (dO vᵀ) ∘ K,  D = rowsum(P ∘ dP),  dS = P ∘ (dP − D),
        dσ = −P_σ · D,  dS ← dS ∘ f'(s) back through each transform,
        dq = dS k · scale,  dk = dSᵀ q · scale,  dv = (P ∘ K)ᵀ dO

    (the ``D`` form of FlashAttention-2, Algorithm 2: a correct kernel in the dtype computes this,
    not the golden's full Jacobian). Grouped K/V heads sum their group's dk and dv.

    [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v], [..., n_q, d_v], [..., n_q, n_k] -> Gradients
    """
    dtype = q.dtype

    def rounded(x: Array) -> Array:
        return _rounded(x, dtype)

    kk, vv = golden_oracle.with_kv_heads(q, k), golden_oracle.with_kv_heads(q, v)
    pattern = baseline_pattern(q, kk, visible=visible, scale=scale, terms=terms)
    p = pattern.weights
    keep = None if terms.keep is None else np.asarray(terms.keep).astype(dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        dp = rounded(_matmul(d_out, np.swapaxes(vv, -1, -2)))
        used = p
        if keep is not None:
            dp, used = rounded(dp * keep), rounded(p * keep)
        p = np.broadcast_to(p, dp.shape)
        row = _sum_last(rounded(p * dp))  # D [..., n_q, 1]
        ds = rounded(p * rounded(dp - row))
        sinks = None if pattern.sink is None else rounded(-pattern.sink * row)[..., 0]
        added = tuple(ds for _ in terms.added)
        for (_, derivative), before in zip(reversed(terms.transforms), reversed(pattern.stages[:-1]),
                                           strict=True):
            ds = rounded(ds * rounded(derivative(before)))
        dq = rounded(rounded(_matmul(ds, kk)) * dtype.type(scale))
        dk = rounded(rounded(_matmul(np.swapaxes(ds, -1, -2), q)) * dtype.type(scale))
        dv = rounded(_matmul(np.swapaxes(np.broadcast_to(used, dp.shape), -1, -2), d_out))
    dk, dv = _group_sum(dk, k.shape), _group_sum(dv, v.shape)
    return golden_oracle.Gradients(dq, dk, dv, added, sinks, p)


def _group_sum(grad: Array, shape: tuple[int, ...]) -> Array:  # [..., h, n, d] -> [..., g, n, d]
    """Each grouped K/V head's gradient: the sum over the query heads it served, accumulated in
    float32 for the 16-bit dtypes and rounded once (as `_sum_last`)."""
    if grad.shape == shape:
        return grad
    g = shape[-3]
    split = grad.reshape(*grad.shape[:-3], g, grad.shape[-3] // g, *grad.shape[-2:])
    wide = split.astype(np.float32) if grad.dtype.itemsize < 4 else split
    return wide.sum(axis=-3).astype(grad.dtype)


def grad_floors(
    q: Array, k: Array, v: Array, d_out: Array, *, p: Array, scale: float,
    terms: golden_oracle.Terms = golden_oracle.PLAIN,
) -> golden_oracle.Gradients:  # each field an array of per-entry floors, float64
    """The a-priori error of a correct backward in q's dtype, entry by entry, as `Gradients`
    (dq, dk, dv; each added term's dS; each row's dσ). ``p`` is the golden's pattern and
    ``terms`` the golden's (float64) terms, ``keep`` included.

    A first-order bound in the forward's style (`floor`): each gradient is a sum of products
    whose sizes are bounded by the same backward run on absolute values (``|dP| ≤ (|dO||v|ᵀ) ∘ K``,
    ``|dS| ≤ P ∘ (|dP| + rowsum(P ∘ |dP|))``, ``|dσ| ≤ P_σ · rowsum(P ∘ |dP|)``, and a transform's
    derivative is at most 1 in size); each term carries the weights' relative error — the scores'
    (d_k + 2)·S·eps and 2·max|added|·eps, as in `floor` — twice (once in P, once in D), plus
    the rounding of the sums of n_q, n_k and d_v terms. A gradient summed over broadcast axes (a
    bias's) is bounded by the sum of its terms' floors.
    """
    if min(q.size, k.size, v.size) == 0:
        return golden_oracle.Gradients(np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape),
                                       tuple(np.zeros(np.shape(p)) for _ in terms.added),
                                       None if terms.sinks is None else np.zeros(np.shape(p)[:-1]), p)
    aq, ak, av, ado = (np.abs(np.asarray(x, dtype=np.float64)) for x in (q, k, v, d_out))
    ak, av = golden_oracle.with_kv_heads(aq, ak), golden_oracle.with_kv_heads(aq, av)
    s_abs = abs(scale) * float(np.max(aq @ np.swapaxes(ak, -1, -2)))
    b_abs = 0.0
    for a in terms.added:
        b = np.abs(np.asarray(a, dtype=np.float64))
        b_abs += float(np.max(np.where(np.isfinite(b), b, 0.0), initial=0.0))
    n_q, d_k = q.shape[-2:]
    n_k, d_v = v.shape[-2:]
    keep = 1.0 if terms.keep is None else np.asarray(terms.keep, dtype=np.float64)
    m_dp = (ado @ np.swapaxes(av, -1, -2)) * keep
    p = np.broadcast_to(p, m_dp.shape)
    m_row = np.sum(p * m_dp, axis=-1, keepdims=True)
    m_ds = p * (m_dp + m_row)
    c = eps(q.dtype) * (4 + np.sqrt(n_q) + np.sqrt(n_k) + np.sqrt(d_v) + 2 * (d_k + 2) * s_abs + 4 * b_abs)
    m_dq = abs(scale) * m_ds @ ak
    m_dk = _group_sum(abs(scale) * np.swapaxes(m_ds, -1, -2) @ aq, k.shape)
    m_dv = _group_sum(np.swapaxes(p * keep, -1, -2) @ ado, v.shape)
    sinks = None
    if terms.sinks is not None:
        sink_weight = np.clip(1.0 - np.sum(p, axis=-1), 0.0, 1.0)  # rows that see nothing: all or none
        sinks = c * sink_weight * m_row[..., 0]
    added = tuple(c * m_ds for _ in terms.added)
    return golden_oracle.Gradients(c * m_dq, c * m_dk, c * m_dv, added, sinks, p)


def weight_sum_slack(dtype: Any, n_k: int, max_score: float) -> float:
    """How far from 1 a correct implementation's weights may sum: the n_k-term sum of the
    denominator (≤ n_k·eps/2) plus the rounding of a log-sum-exp of size ~max|score| (a
    log-space softmax, exp(s − lse), is off by eps·|lse|)."""
    return eps(dtype) * (2 + n_k / 2 + max_score)


def max_score(q: Array, k: Array, *, visible: Array, scale: float) -> float:
    """max |q·k·scale| over the visible pairs (0 when none is visible)."""
    q64, k64 = (x.astype(np.float64, copy=False) for x in (q, k))
    s = np.abs((q64 @ np.swapaxes(k64, -1, -2)) * scale)
    return float(np.max(np.where(visible, s, 0.0), initial=0.0))


@dataclass(frozen=True)
class Comparison:
    """How far an output is from the golden, against what the policy allows."""

    error: float  # max|out − golden| over the compared rows (inf when out is NaN/Inf there)
    baseline_error: float  # max|baseline − golden| over the same rows
    allowed: float  # k·baseline_error + floor
    where: tuple[int, ...]  # index of the worst entry

    @property
    def ratio(self) -> float:
        """error / allowed: ≤ 1 passes. A non-finite error (NaN or inf where the golden is finite)
        is inf whatever is allowed: an allowance that overflows (the floor of scores at the edge of
        the dtype's range) lets any finite error pass, never a non-finite one."""
        if self.error == 0:
            return 0.0
        if not math.isfinite(self.error):
            return math.inf
        return self.error / self.allowed if self.allowed > 0 else math.inf

    @property
    def ok(self) -> bool:
        return self.ratio <= 1.0

    def explain(self) -> str:
        return (
            f"max|out − golden| = {self.error:.3g} at index {list(self.where)}, allowed {self.allowed:.3g} "
            f"(baseline error {self.baseline_error:.3g}); ratio {self.ratio:.3g}"
        )


class UnrepresentableGolden(AssertionError):
    """A law drew a case whose correct output the dtype it is returned in cannot hold: a bug in
    the law's draw, never the target's (`compare`)."""


FLOATS = ("float16", BFLOAT16, "float32")
"""The output dtypes whose range `compare` checks the golden against (float64 holds any golden)."""


def compare(
    out: Array, gold: Array, base: Array, *, rows: Array, tolerance: float, floor_: float, dtype: Any = None,
) -> Comparison:
    """Compare ``out`` with the golden on the query rows selected by ``rows`` [..., n_q] (bool).

    ``dtype``: the dtype the target returns ``out`` in (the inputs'; ``out`` itself may have been
    widened to float64 for the comparison). Raises `UnrepresentableGolden` when a finite golden
    entry on those rows lies past its largest finite value: no output in that dtype is correct
    there (a correctly rounded one is inf), so the case is a bug of the law that drew it, and is
    reported as one, not as an error of the target.

    The comparison is the run's last (`spec.compared.record`: what a failure draws)."""
    sel = np.broadcast_to(rows[..., None], gold.shape)
    if dtype is not None:
        _check_representable(dtypes.as_dtype(dtype), gold, sel)
    out64 = np.asarray(out, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(sel, np.abs(out64 - gold), 0.0)
        base_diff = np.where(sel, np.abs(base.astype(np.float64, copy=False) - gold), 0.0)
    diff = np.where(sel & ~np.isfinite(diff), np.inf, diff)
    if diff.size == 0:
        return Comparison(0.0, 0.0, floor_, ())
    worst = np.unravel_index(int(np.argmax(diff)), diff.shape)
    base_err = _baseline_error(base_diff)
    allowed = tolerance * base_err + floor_
    compared.record("output against the float64 golden", gold, out, allowed, rows=rows)
    return Comparison(
        error=float(diff[worst]),
        baseline_error=base_err,
        allowed=allowed,
        where=tuple(int(i) for i in worst),
    )


def _baseline_error(base_diff: Array) -> float:
    base_err = float(np.max(base_diff, initial=0.0))
    return base_err if np.isfinite(base_err) else 0.0  # the naive baseline overflowed: the floor alone


def allowance(gold: Array, base: Array, *, rows: Array, tolerance: float, floor_: float) -> float:
    """What `compare` allows an output on the rows ``rows`` [..., n_q] (bool): tolerance·max|baseline
    − golden| + floor, for a law that compares something other than an output with the golden
    (two outputs of the target, a gradient's sum)."""
    sel = np.broadcast_to(rows[..., None], gold.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        base_diff = np.where(sel, np.abs(base.astype(np.float64, copy=False) - gold), 0.0)
    return tolerance * _baseline_error(base_diff) + floor_


def _check_representable(dtype: np.dtype, gold: Array, sel: Array) -> None:
    if dtype.name not in FLOATS or gold.size == 0:
        return
    top = float(dtypes.finfo(dtype).max)
    with np.errstate(invalid="ignore"):
        past = sel & np.isfinite(gold) & (np.abs(gold) > top)
    if past.any():
        at = tuple(int(i) for i in np.argwhere(past)[0])
        raise UnrepresentableGolden(
            f"a bug in the law, not in the target: the golden at index {list(at)} is {float(gold[at]):.6g}, "
            f"past {dtype.name}'s largest finite value {top:.6g}, so no {dtype.name} output is correct "
            "there (the law drew a case its output dtype cannot hold)")
