"""The golden, the baseline and the tolerance policy.

Golden: attention computed in float64 from the target's own inputs, written here independently
of :mod:`impl` (log-sum-exp form, so it shares no code path with the reference under test).
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

from dataclasses import dataclass
from typing import Any

import numpy as np

from spec import golden as golden_oracle
from spec.dtypes import BFLOAT16, eps

Array = np.ndarray


def repeat_kv(x: Array, heads: int) -> Array:  # [..., g, n, d] -> [..., h, n, d]
    """K/V heads repeated so that query head i reads K/V head i // (h // g)."""
    return np.repeat(x, heads // x.shape[-3], axis=-3)


def golden(q: Array, k: Array, v: Array, *, visible: Array, scale: float) -> tuple[Array, Array]:
    """Attention in float64 and its pattern (:func:`spec.golden.forward` without the lse).

    [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v], [..., n_q, n_k] -> [..., n_q, d_v], [..., n_q, n_k]
    """
    out, weights, _ = golden_oracle.forward(q, k, v, visible=visible, scale=scale)
    return out, weights


def baseline(
    q: Array, k: Array, v: Array, *, visible: Array, scale: float,
    bias: Array | None = None, softcap: float | None = None, sinks: Array | None = None,
) -> Array:
    """The textbook computation in the inputs' dtype: max-shifted softmax, then weights @ V
    (with the §2b softcap, bias and sinks when given, in the golden's order).

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
    dtype = q.dtype

    def rounded(x: Array) -> Array:  # no-op for NumPy's own floats, whose results keep the dtype
        return np.asarray(x).astype(dtype, copy=False)

    with np.errstate(over="ignore"):  # a naive product may overflow where the scaled scores fit
        scores = rounded(rounded(q @ np.swapaxes(k, -1, -2)) * dtype.type(scale))
    if softcap is not None:  # the §2b order: cap, then bias, then masks
        scores = rounded(dtype.type(softcap) * rounded(np.tanh(rounded(scores / dtype.type(softcap)))))
    if bias is not None:
        scores = rounded(scores + np.asarray(bias).astype(dtype))
    scores = np.where(visible, scores, dtype.type(-np.inf))
    top = np.max(scores, axis=-1, keepdims=True)
    sink = None
    if sinks is not None:  # [heads] -> [..., heads, 1, 1] (2-D: [1])
        sink = np.asarray(sinks).astype(dtype).reshape((-1, 1, 1) if q.ndim >= 3 else (1,))
        top = np.maximum(top, sink)
    with np.errstate(invalid="ignore", over="ignore"):
        shift = np.where(np.isfinite(top), top, dtype.type(0))
        e = rounded(np.exp(rounded(scores - shift)))
        total = _sum_last(e)
        if sink is not None:
            total = rounded(total + rounded(np.exp(rounded(sink - shift))))
        return rounded(rounded(e / np.where(total > 0, total, dtype.type(1))) @ v)


def _sum_last(x: Array) -> Array:  # [..., n] -> [..., 1], in x's dtype
    """NumPy's sum over the last axis; for bfloat16 in float32 and rounded once (see baseline)."""
    if x.dtype.name == BFLOAT16:
        return np.sum(x.astype(np.float32), axis=-1, keepdims=True).astype(x.dtype)
    return np.sum(x, axis=-1, keepdims=True)


def floor(q: Array, k: Array, v: Array, *, scale: float, bias: Array | None = None) -> float:
    """The a-priori error of a correct computation in q's dtype (see the module docstring); a
    ``bias`` adds 2·max|bias| to the score term (each biased score is rounded once more, to
    eps·|s + bias|/2, which moves the weights by twice that)."""
    if v.size == 0 or q.size == 0 or k.size == 0:
        return 0.0
    d_k, n_k = q.shape[-1], k.shape[-2]
    q64, k64 = np.abs(q.astype(np.float64)), np.abs(k.astype(np.float64))
    s_abs = abs(scale) * float(np.max(q64 @ np.swapaxes(k64, -1, -2)))
    vmax = float(np.max(np.abs(v.astype(np.float64))))
    b = np.abs(np.asarray(bias, dtype=np.float64)) if bias is not None else np.zeros(1)
    b_abs = float(np.max(np.where(np.isfinite(b), b, 0.0), initial=0.0))
    return eps(q.dtype) * vmax * (4 + np.sqrt(n_k) + (d_k + 2) * s_abs + 2 * b_abs)


def weight_sum_slack(dtype: Any, n_k: int, max_score: float) -> float:
    """How far from 1 a correct implementation's weights may sum: the n_k-term sum of the
    denominator (≤ n_k·eps/2) plus the rounding of a log-sum-exp of size ~max|score| (a
    log-space softmax, exp(s − lse), is off by eps·|lse|)."""
    return eps(dtype) * (2 + n_k / 2 + max_score)


def max_score(q: Array, k: Array, *, visible: Array, scale: float) -> float:
    """max |q·k·scale| over the visible pairs (0 when none is visible)."""
    s = np.abs((q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2)) * scale)
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
        """error / allowed: ≤ 1 passes."""
        if self.error == 0:
            return 0.0
        return self.error / self.allowed if self.allowed > 0 else float("inf")

    @property
    def ok(self) -> bool:
        return self.ratio <= 1.0

    def explain(self) -> str:
        return (
            f"max|out − golden| = {self.error:.3g} at index {list(self.where)}, allowed {self.allowed:.3g} "
            f"(baseline error {self.baseline_error:.3g}); ratio {self.ratio:.3g}"
        )


def compare(
    out: Array, gold: Array, base: Array, *, rows: Array, tolerance: float, floor_: float
) -> Comparison:
    """Compare ``out`` with the golden on the query rows selected by ``rows`` [..., n_q] (bool)."""
    sel = np.broadcast_to(rows[..., None], gold.shape)
    out64 = np.asarray(out, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(sel, np.abs(out64 - gold), 0.0)
        base_diff = np.where(sel, np.abs(base.astype(np.float64) - gold), 0.0)
    diff = np.where(sel & ~np.isfinite(diff), np.inf, diff)
    if diff.size == 0:
        return Comparison(0.0, 0.0, floor_, ())
    worst = np.unravel_index(int(np.argmax(diff)), diff.shape)
    base_err = float(np.max(base_diff))
    if not np.isfinite(base_err):  # the naive baseline overflowed: fall back on the floor
        base_err = 0.0
    return Comparison(
        error=float(diff[worst]),
        baseline_error=base_err,
        allowed=tolerance * base_err + floor_,
        where=tuple(int(i) for i in worst),
    )
