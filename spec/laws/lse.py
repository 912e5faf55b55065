"""Laws of the logsumexp a fused kernel returns (``return_lse=True``): the natural-log
normaliser of each row's final scores, what split-KV decoding and ring attention merge partial
results with, and the backward pass recomputes the pattern from.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from spec import dtypes, golden, oracle
from spec.cases import Case, cases, split_point
from spec.inputs import Inputs
from spec.keywords.lse import LSE
from spec.laws import _needs
from spec.laws._helpers import (
    assert_matches,
    assert_same,
    expected,
    first_true,
    observe,
    run,
    run_lse,
    visible,
)
from spec.registry import Need, law
from spec.target import Target

Array = np.ndarray

needs_lse = _needs.keyword(LSE)

needs_empty_rows = Need(
    lambda t: None if t.policies <= {"zeros", "nan"} else (
        f"needs rows that see no key to stay empty (target declares masked_rows={t.masked_rows!r}: "
        "such a row is not empty for it, so its lse is finite)"),
    "rows that see no key left empty (masked_rows \"zeros\" or \"nan\")") & needs_lse & _needs.mask


def lse_allowance(target: Target, inputs: Inputs) -> float:
    """How far a target's lse may lie from the golden's: the scores' rounding in the dtype the
    target computes in (each score q·k·scale carries ≲ (d_k + 2)·eps·scale·Σ|q||k|) plus the sum's
    (≲ n_k·eps relative, i.e. n_k·eps in the log), times the target's tolerance factor. lse is
    returned in float32 or float64, never coarser, so that dtype's eps bounds both."""
    eps = dtypes.eps(target.precision(np.dtype(inputs.q.dtype).name))
    q64 = np.abs(inputs.q.astype(np.float64))
    k64 = golden.with_kv_heads(q64, np.abs(inputs.k.astype(np.float64)))
    s_abs = abs(inputs.scale_value) * float(np.max(q64 @ np.swapaxes(k64, -1, -2), initial=0.0))
    return target.tolerance * eps * (8 + inputs.n_k + (inputs.d_k + 2) * s_abs)


def assert_lse_close(target: Target, inputs: Inputs, lse: Array, gold: Array, *, what: str) -> None:
    """Finite golden entries within `lse_allowance`; ``-inf`` ones (rows that see no key) exactly
    ``-inf`` where the row's declared policy leaves it empty (``zeros``, ``nan``): under
    ``uniform`` or ``unmasked`` a finite fill gave the row scores, and its lse is theirs."""
    __tracebackhide__ = True
    allowed = lse_allowance(target, inputs)
    finite = np.isfinite(gold)
    with np.errstate(invalid="ignore"):
        err = np.where(finite, np.abs(lse - np.where(finite, gold, 0.0)), 0.0)
    err = np.where(np.isnan(err), np.inf, err)
    if err.size:
        at = np.unravel_index(int(np.argmax(err)), err.shape)
        observe(f"lse error ratio {target.precision_text(np.dtype(inputs.q.dtype).name)}",
                float(err[at]) / allowed if allowed > 0 else 0.0)
        assert err[at] <= allowed, (
            f"{what}: lse {list(map(int, at))} is {float(lse[at])!r}, the golden {float(gold[at])!r} "
            f"(difference {float(err[at]):.3g}, allowed {allowed:.3g})")
    policy = oracle.policies(target, inputs)
    left_empty = np.isin(policy, ("", "zeros", "nan"))
    empty = ~finite & ~np.isneginf(lse) & left_empty
    if (row := first_true(empty)) is not None:
        raise AssertionError(f"{what}: row {list(row)} sees no key, so its lse must be -inf, "
                             f"got {float(lse[row])!r}")


@law(strategy=lambda t: cases(t, masks=("none", "random"), scale=True, n_max=96), needs=needs_lse)
def lse_matches_golden(target: Target, case: Case) -> None:
    """With ``return_lse=True``, lse is the natural-log logsumexp of each row's scaled, masked
    scores (base 2 for a target that declares ``lse_base=2``: read times ln 2), within the
    scores' rounding of the float64 golden, and the output is the call's without it, within
    twice the tolerance. Not bit-identical: asking for lse may rightly select
    another fused graph (measured on JAX's XLA path: 4e-9 apart in float32).

    Catches: an unnormalised accumulator returned as the output when lse is asked for (the
    caller is then expected to divide); the lse of the Triton fused-attention tutorial, kept in
    base 2 (m + log2 l, scores pre-multiplied by log2 e), read as a natural log; an lse of the
    unscaled scores (scale applied after the softmax); log Σ exp(s − max) returned without the
    max added back.
    """
    inputs = case.inputs()
    out, lse = run_lse(target, inputs)
    assert_same(target, inputs, run(target, inputs), out,
                what="with return_lse=True, against the call without it, the output")
    assert_lse_close(target, inputs, lse, expected(target, inputs).lse,
                     what="lse" if target.lse_base == "e" else "lse (lse_base=2, read times ln 2)")
    assert_matches(target, inputs, out, what="with return_lse=True, the output")


def _masked_row_cases(t: Target) -> st.SearchStrategy[Case]:
    return cases(t, masks=("rows",), n_max=48)


@law(strategy=_masked_row_cases, needs=needs_empty_rows)
def lse_empty_row_as_declared(target: Target, case: Case) -> None:
    """A query row that sees no key has the lse the target declares (``empty_lse``): −inf by
    default (the log of an empty sum, so that merging it with any other block gives that block's
    result unchanged), +inf for FlashAttention's CUDA kernels; rows that see a key have a finite
    lse.

    Catches: an undeclared +inf (FlashAttention 2's convention, which its backward relies on), by
    which a merge by logsumexp weights the empty block by exp(+inf − +inf) = NaN; an lse of 0 or of
    a finite fill (−1e30 + log n_k), which gives the empty block weight in the merge.
    """
    inputs = case.inputs()
    _, lse = run_lse(target, inputs, as_returned=True)
    sees = np.asarray(visible(target, inputs).any(axis=-1))
    wrong = (~sees & (lse != target.empty_lse)) | (sees & ~np.isfinite(lse))
    if (at := first_true(wrong)) is not None:
        want = f"{target.empty_lse!r} (it sees no key)" if not sees[at] else "finite (it sees a key)"
        raise AssertionError(f"lse of row {list(at)} is {float(lse[at])!r}, expected {want}")


def merge(out_a: Array, lse_a: Array, out_b: Array, lse_b: Array) -> tuple[Array, Array]:
    # [..., n_q, d_v], [..., n_q] twice -> merged out [..., n_q, d_v], lse [..., n_q] (float64)
    """Combine two attentions over disjoint key sets by their logsumexps (split-KV, ring attention):
    lse = log(e^lse_a + e^lse_b), out = e^(lse_a − lse)·out_a + e^(lse_b − lse)·out_b; a row that
    sees nothing in either part keeps lse = −inf and out = 0."""
    lse = np.logaddexp(lse_a, lse_b)
    safe = np.where(np.isfinite(lse), lse, 0.0)
    # a target's +inf lse makes a weight inf and inf · 0 NaN: the merged output is then NaN, which
    # the comparison reports, so NumPy's warning about it says nothing more
    with np.errstate(invalid="ignore", over="ignore"):
        wa = np.where(np.isneginf(lse_a), 0.0, np.exp(lse_a - safe))[..., None]
        wb = np.where(np.isneginf(lse_b), 0.0, np.exp(lse_b - safe))[..., None]
        return wa * out_a + wb * out_b, lse


@law(strategy=lambda t: cases(t, causal=(False,), masks=("none", "random"), n_k_min=2, n_max=96),
     needs=needs_lse)
def lse_merge_split_keys(target: Target, case: Case) -> None:
    """Splitting the keys (and values, and the mask's columns) in two at t, computing (out, lse)
    on each part and combining them by their logsumexps (`merge`) gives the output and lse
    of the call on all keys (within twice the tolerance; the lse within its rounding) — what
    split-KV decoding and ring attention rely on.

    Catches: an lse of the shifted scores (log Σ exp(s − max), the max not added back): each
    part's output is right, the merge weights are wrong; an lse taken before the mask is applied
    (masked keys counted in the normaliser); lse rows written in the wrong (batch, head) order.
    """
    inputs = case.inputs()
    mask = inputs.mask
    t = split_point(target, case, stream=10)
    parts = []
    for keys in (slice(0, t), slice(t, None)):
        parts.append(run_lse(target, inputs.replace(k=inputs.k[..., keys, :], v=inputs.v[..., keys, :],
                                                    mask=None if mask is None else mask[..., keys])))
    (out_a, lse_a), (out_b, lse_b) = parts
    merged, merged_lse = merge(out_a, lse_a, out_b, lse_b)
    full, full_lse = run_lse(target, inputs)
    what = f"keys split at {t} and merged by logsumexp"
    assert_same(target, inputs, full, merged, what=f"{what}, the output")
    assert_lse_close(target, inputs, merged_lse, full_lse, what=f"{what}, against the full call's lse")
