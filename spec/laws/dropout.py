"""Laws of attention dropout (``dropout_p=``, ``seed=``): each weight is dropped with
probability p, independently, after the softmax; the kept ones are scaled by ``1/(1 − p)``.

Two laws are exact (p = 0 changes nothing; a seed fixes the output) and two are statistical. For
those the false-alarm rate — the probability that a *correct* target fails one example — is
derived in the docstring from a tail bound that needs no approximation (Hoeffding, Bernstein), and
set to at most ``FALSE_ALARM`` = 1e-9 per example; ``tests/spec/test_spec_laws_dropout.py`` checks it
empirically on the reference.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from spec import tolerance
from spec.cases import Case, cases
from spec.keywords.dropout import DROPOUT
from spec.laws import _needs
from spec.laws._helpers import (
    differs_at,
    expected,
    first_true,
    observe,
    pattern_inputs,
    run,
    run_pattern,
    slack,
)
from spec.registry import law
from spec.target import Target

Array = np.ndarray

FALSE_ALARM = 1e-9
"""δ: the probability that a correct target fails one example of a statistical dropout law."""
SEEDS = 32
"""Seeds averaged by `dropout_unbiased`."""
PATTERN_ENTRIES = 2048
"""Pattern entries (at least) read by `dropout_drops_fraction_p`."""
OUTPUT_ENTRIES = 512
"""Output entries (at least) averaged by `dropout_unbiased`."""


needs_dropout = _needs.keyword(DROPOUT)


def dropout_cases(t: Target, n_max: int = 32) -> st.SearchStrategy[Case]:
    return cases(t, masks=("none", "random"), n_max=n_max, values=("normal",), keywords=(DROPOUT,))


def _assert_identical(a: Array, b: Array, what: str) -> None:
    __tracebackhide__ = True
    if not np.array_equal(a, b, equal_nan=True):
        at = differs_at(a, b)
        raise AssertionError(f"{what}: entry {list(at)} is {float(b[at])!r} instead of {float(a[at])!r}")


@law(strategy=dropout_cases, needs=needs_dropout)
def dropout_zero_is_identity(target: Target, case: Case) -> None:
    """``dropout_p=0`` (with a seed) gives bit-for-bit the output of a call without dropout.

    Catches: ``p = dropout_p or default_p`` — 0 is falsy in Python, so an explicit p = 0 falls
    back to the module's training rate; a dropout branch taken whenever the argument is given,
    with its own (differently rounded) kernel.
    """
    inputs = case.inputs()
    plain = run(target, inputs.replace(dropout_p=None, seed=None))
    zero = run(target, inputs.replace(dropout_p=0.0))
    _assert_identical(plain, zero, f"with dropout_p=0 and seed={inputs.get('seed')}, the output")


@law(strategy=dropout_cases, needs=needs_dropout)
def dropout_same_seed_same_output(target: Target, case: Case) -> None:
    """Two calls with the same ``dropout_p`` and ``seed`` give bit-identical outputs.

    Catches: a seed accepted and ignored, the mask drawn from a global generator (each call then
    drops different weights, and a training run cannot be replayed); a generator seeded once per
    process instead of per call.
    """
    inputs = case.inputs()
    first, second = run(target, inputs), run(target, inputs)
    _assert_identical(first, second, f"a second call with dropout_p={inputs.get('dropout_p')}, "
                                     f"seed={inputs.get('seed')}")


@st.composite
def _fraction_cases(draw: st.DrawFn, t: Target) -> Case:
    """Pattern cases (d_v = n_k, no mask, not causal) with at least PATTERN_ENTRIES weights."""
    case = draw(dropout_cases(t, n_max=24).filter(lambda c: c.n_k >= 2))
    case = case.replace(d_v=case.n_k, batch=1, causal=False, mask="none")
    return _many_rows(case, PATTERN_ENTRIES, case.n_k, within_keys=t.queries_within_keys)


@law(strategy=_fraction_cases, needs=needs_dropout, reads_pattern=True)
def dropout_drops_fraction_p(target: Target, case: Case) -> None:
    """Read through ``V = I``, every entry of the dropped pattern is either 0 or the undropped
    weight ×1/(1 − p) (within tolerance), and the fraction dropped is p. The fraction f̂ is taken
    over the N ≥ 2048 entries whose weight w/(1 − p) stands clear of 0 by twice the tolerance
    (which entries those are depends on the golden alone, not on the draw); the drops are
    independent Bernoulli(p), so by Hoeffding P(|f̂ − p| ≥ t) ≤ 2·exp(−2Nt²). With
    t = √(ln(2/δ)/(2N)), δ = 1e-9, that is t ≤ 0.073 and a correct target fails an example with
    probability ≤ 1e-9. p is drawn from {0.1, 0.2, 0.3, 0.7, 0.8, 0.9}, so a swapped keep
    probability (|1 − 2p| ≥ 0.4) is far outside the band.

    Catches: ``dropout_p`` taken as the keep probability (TensorFlow 1's ``keep_prob`` against
    PyTorch's ``p``); kept weights not rescaled, or rescaled by 1/p; dropout applied to the scores
    before the softmax (the kept weights are then renormalised, not w/(1 − p)).
    """
    inputs = pattern_inputs(case)
    p = float(inputs.get("dropout_p"))
    dropped = run_pattern(target, inputs)
    weights = expected(target, inputs).weights
    kept_value = weights / (1 - p)
    tol = target.tolerance * slack(target, inputs) / (1 - p)
    decidable = kept_value > 2 * tol
    is_zero = np.abs(dropped) <= tol
    is_kept = np.abs(dropped - kept_value) <= tol
    bad = decidable & ~is_zero & ~is_kept
    if (at := first_true(bad)) is not None:
        raise AssertionError(
            f"dropped pattern entry {list(at)} is {float(dropped[at])!r}: neither 0 nor the weight "
            f"{float(weights[at]):.6g} × 1/(1 − {p}) = {float(kept_value[at]):.6g} (±{tol:.2g})")
    n = int(decidable.sum())
    if n == 0:
        return  # nothing readable (not drawn in practice: weights ~1/n_k, n_k ≤ 24)
    fraction = float((decidable & is_zero).sum()) / n
    band = math.sqrt(math.log(2 / FALSE_ALARM) / (2 * n))
    observe("dropped fraction error / band", abs(fraction - p) / band)
    assert abs(fraction - p) <= band, (
        f"dropped {fraction:.4f} of {n} weights with dropout_p={p}, expected {p} ± {band:.3f} "
        f"(Hoeffding, false-alarm rate {FALSE_ALARM:g})")


def bernstein_threshold(variance: float, bound: float, delta: float = FALSE_ALARM) -> float:
    """t with P(|T| ≥ t) ≤ δ for T a sum of independent zero-mean terms of total variance
    ``variance``, each at most ``bound`` in magnitude (Bernstein: P ≤ 2·exp(−t²/(2(σ² + Mt/3))),
    solved for t: t = LM/3 + √((LM/3)² + 2Lσ²), L = ln(2/δ))."""
    ln = math.log(2 / delta)
    return ln * bound / 3 + math.sqrt((ln * bound / 3) ** 2 + 2 * ln * variance)


def _many_rows(case: Case, entries: int, width: int, *, within_keys: bool = False) -> Case:
    """The case with more heads (3-D, 4-D) or more queries (2-D), so that its output has at least
    ``entries`` rows × ``width``."""
    if case.ndim == 2:
        n_q = max(case.n_q, -(-entries // width))  # past n_k: causal only where defined there
        return case.replace(n_q=n_q, causal=case.causal and (n_q <= case.n_k or not within_keys))
    heads = max(case.heads, -(-entries // (case.n_q * width)))
    return case.replace(heads=heads, kv_heads=None)


@st.composite
def _unbiased_cases(draw: st.DrawFn, t: Target) -> Case:
    case = draw(dropout_cases(t, n_max=16))
    return _many_rows(case, OUTPUT_ENTRIES, case.d_v, within_keys=t.queries_within_keys)


@law(strategy=_unbiased_cases, needs=needs_dropout)
def dropout_unbiased(target: Target, case: Case) -> None:
    """The mean of the output over 32 seeds is the undropped output: dropout is unbiased (on
    outputs of at least 512 entries, more heads or queries drawn as needed). The
    statistic is the sign-weighted total deviation T = Σ_s Σ_(i,c) sign(g_ic)·(out_s,ic − g_ic),
    g the undropped golden. For a correct target T = Σ_s Σ_(i,j) a_ij·(m_s,ij/(1 − p) − 1) with
    a_ij = w_ij·Σ_c sign(g_ic)·v_jc and m ~ Bernoulli(1 − p) independent: a sum of independent
    zero-mean terms of variance a²·p/(1 − p), each at most |a|·max(1, p/(1 − p)). Bernstein's
    inequality bounds P(|T| ≥ t) by δ = 1e-9 at the t of `bernstein_threshold`; the rounding
    of the 32 outputs (each within the tolerance policy, ×1/(1 − p)) is added to t. So a correct
    target fails an example with probability ≤ 1e-9.

    Catches: kept weights not rescaled by 1/(1 − p) (the mean shrinks to (1 − p)·out); dropout
    applied to the scores before the softmax (the renormalised weights are biased towards the
    largest score).
    """
    inputs = case.inputs()
    p = float(inputs.get("dropout_p"))
    want = expected(target, inputs)
    gold, weights, base, floor = want.out, want.weights, want.baseline, want.floor
    seed0 = int(inputs.get("seed"))
    outs = [run(target, inputs.replace(seed=seed0 + s)) for s in range(SEEDS)]
    sign = np.sign(gold)  # [..., n_q, d_v]
    v = inputs.v if case.kv_heads is None else np.repeat(inputs.v, case.heads // case.kv_heads, axis=-3)
    a = weights * (sign @ np.swapaxes(v.astype(np.float64), -1, -2))  # [..., n_q, n_k]
    variance = SEEDS * p / (1 - p) * float(np.sum(a * a))
    bound = float(np.max(np.abs(a), initial=0.0)) * max(1.0, p / (1 - p))
    rows = weights.sum(axis=-1) > 0
    allowed = tolerance.allowance(gold, base, rows=rows, tolerance=target.tolerance, floor_=floor)
    rounding = SEEDS * float(np.sum(np.abs(sign))) * allowed / (1 - p)
    threshold = bernstein_threshold(variance, bound) + rounding
    total = float(sum(np.sum(sign * (out - gold)) for out in outs))
    observe("dropout mean deviation / threshold", abs(total) / threshold if threshold > 0 else 0.0)
    assert abs(total) <= threshold, (
        f"over {SEEDS} seeds from {seed0}, the sign-weighted total deviation of the mean output from "
        f"the undropped output is {total:.4g}, beyond {threshold:.4g} (Bernstein, false-alarm rate "
        f"{FALSE_ALARM:g}; dropout_p={p})")
