"""Laws of ``bias=``: an additive float array ``[batch, heads, n_q, n_k]`` (or broadcastable to
it) added to the scaled (and capped) scores before the softmax — ALiBi, relative-position bias,
the additive ``finfo.min`` masks of transformers. ``-inf`` hides a key.

Each law needs ``supports_bias``; the cases carry the bias as an amplitude (``Case.bias``: a
N(0, 1) array times it, in the case's dtype) or, for shapes a case does not describe, the law
builds the array from the case and passes it as an override.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import strategies as st

from spec.cases import Case, cases
from spec.dtypes import finfo
from spec.laws._helpers import assert_matches, assert_same, needs_keyword, run, same_bits, sees_any
from spec.registry import law
from spec.target import Target

Array = np.ndarray

needs_bias = needs_keyword("bias")


@st.composite
def bias_cases(draw: st.DrawFn, target: Target, **given: object) -> Case:
    """Cases with a N(0, 1)·b bias, b from 0.5 to 8 (a bias that matters against unit scores)."""
    case = draw(cases(target, n_max=48, **given))  # type: ignore[arg-type]
    return dataclasses.replace(case, bias=draw(st.sampled_from((0.5, 1.0, 2.0, 8.0))))


def row_shift(case: Case) -> float:
    """A constant large enough that exp of it overflows every float type (2^(nmant/2 + 4) or
    more: 512 for float16, 128 for bfloat16, ~3e4 for float32), and small enough that the shifted
    bias keeps ~half the dtype's significand."""
    info = finfo(case.dtype)
    return float(2.0 ** max(7, int(info.nmant) // 2 + 4))


@law(strategy=lambda t: bias_cases(t, masks=("none", "random"), scale=True), needs=needs_bias)
def bias_matches_golden(target: Target, case: Case) -> None:
    """With ``bias=B`` the output equals the float64 golden of softmax(scale·q·kᵀ + B)·V within
    the tolerance policy (whatever the causal mask and mask= hide stays hidden).

    Catches: a bias added before the scale (``(q·kᵀ + B)·scale``, so the bias shrinks by √d_k); a
    bias read transposed ([n_k, n_q]) or broadcast over the wrong axis.
    """
    q, k, v = case.arrays()
    assert_matches(target, case, run(target, case, q, k, v), q, k, v, what="with bias=, the output")


@law(strategy=lambda t: bias_cases(t, masks=("none", "random")), needs=needs_bias)
def bias_row_shift_invariance(target: Target, case: Case) -> None:
    """Adding a constant c to a whole row of the bias changes nothing (softmax is invariant to a
    shift): with c = ±2^(nmant/2 + 4) per row (exp(c) overflows every float type) the output is
    finite and still matches the golden.

    Catches: a row maximum taken over q·kᵀ before the bias is added, so exp(s + B − max s)
    overflows to inf and the row turns NaN once the bias is large (a fused kernel that folds the
    bias in after its running maximum).
    """
    q, k, v = case.arrays()
    signs = np.where(case.rng(12).random((*case.lead(), case.n_q, 1)) < 0.5, -1.0, 1.0)
    base = case.bias_array()
    assert base is not None
    shifted = (base.astype(np.float64) + signs * row_shift(case)).astype(case.dtype)
    out = run(target, case, q, k, v, bias=shifted)
    rows = sees_any(target, case)
    bad = rows[..., None] & ~np.isfinite(out)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(f"with every bias row shifted by ±{row_shift(case):g}, output {list(at)} "
                             f"is {out[at]}")
    assert_matches(target, case, out, q, k, v, bias=shifted,
                   what=f"with every bias row shifted by ±{row_shift(case):g}, the output")


def hiding_bias(case: Case) -> tuple[Array, Array, Array]:
    # -> bias [*lead, n_q, n_k], changed keys [*lead, n_k], blind rows [*lead, n_q] (bool)
    """The case's bias with −inf on ~30% of the entries, and a set of keys (~40% per slice) that
    the −inf entries hide from a set of rows (~half): those rows see none of them. Every row keeps
    at least one key."""
    rng = case.rng(13)
    shape = (*case.lead(), case.n_q, case.n_k)
    changed = rng.random((*shape[:-2], case.n_k)) < 0.4
    spare = rng.integers(0, case.n_k, size=shape[:-2])  # one key per slice is never changed
    np.put_along_axis(changed, spare[..., None], False, axis=-1)
    blind = rng.random(shape[:-1]) < 0.5
    hidden = (rng.random(shape) < 0.3) | (blind[..., None] & changed[..., None, :])
    np.put_along_axis(hidden, np.broadcast_to(spare[..., None, None], (*shape[:-1], 1)), False, axis=-1)
    base = case.bias_array()
    assert base is not None
    return np.where(hidden, case.np_dtype.type(-np.inf), base), changed, blind


@law(strategy=lambda t: bias_cases(t, causal=(False,), n_k_min=2), needs=needs_bias)
def bias_neg_inf_hides_keys(target: Target, case: Case) -> None:
    """A −inf bias entry hides its key exactly as a boolean mask does: the output matches the
    golden (and, with mask=, the call that hides the same keys by the mask), and replacing keys
    and values (by others ×1e5; ×10 in float16) leaves every row that a −inf hides them from
    bit-identical (within tolerance if the target declares exact_masking=False).

    Catches: −inf clamped to a finite fill (−1e4, transformers' old additive mask value), so a
    hidden key whose score exceeds the fill still leaks; −inf − (−inf) = NaN when the bias is
    folded into a running maximum.
    """
    q, k, v = case.arrays()
    bias, changed, blind = hiding_bias(case)
    out = run(target, case, q, k, v, bias=bias)
    assert_matches(target, case, out, q, k, v, bias=bias, what="with −inf bias entries, the output")
    if target.supports_mask:  # the same keys hidden by mask= instead: the same output
        finite = case.bias_array()
        as_mask = run(target, case, q, k, v, bias=finite, mask=~np.isneginf(bias))
        assert_same(target, case, as_mask, out, q, k, v, bias=bias,
                    what="−inf bias entries against the same keys hidden by mask=")
    rng = case.rng(14)
    factor = 10.0 if case.dtype == "float16" else 1e5
    where = changed[..., None]  # [*lead, n_k, 1] against [*lead, n_k, d]
    k2 = np.where(where, (case.values_like(rng, k.shape) * factor).astype(case.dtype), k)
    v2 = np.where(where, (case.values_like(rng, v.shape) * factor).astype(case.dtype), v)
    after = run(target, case, q, k2, v2, bias=bias)
    if target.exact_masking:
        bad = blind[..., None] & ~same_bits(out, after)
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            raise AssertionError(f"changing keys that a −inf bias hides from query {at[-2]} changed output "
                                 f"{list(at)} from {float(out[at])!r} to {float(after[at])!r}")
    else:
        assert_matches(target, case, after, q, k, v, bias=bias, rows=blind,
                       what="after changing keys hidden by a −inf bias, the output")


def alibi(case: Case) -> Array:  # -> [1, heads, n_q, n_k] (4-D) or [heads, n_q, n_k] (3-D)
    """ALiBi: head h adds slope_h·(j − i), slopes 2^(−8(h+1)/heads) (Press et al.), one per head."""
    slopes = 2.0 ** (-8.0 * np.arange(1, case.heads + 1) / case.heads)
    distance = np.arange(case.n_k)[None, :] - np.arange(case.n_q)[:, None]
    bias = (slopes[:, None, None] * distance).astype(case.dtype)
    return bias[None] if case.ndim == 4 else bias


@law(strategy=lambda t: bias_cases(t, ndims=(3, 4)).filter(lambda c: c.heads >= 2),
     needs=lambda t: needs_bias(t) or (None if {3, 4} & set(t.ndims) else "needs 3-D or 4-D inputs"),
     requires="bias= (supports_bias) and inputs with a head axis (ndims 3 or 4)")
def bias_per_head(target: Target, case: Case) -> None:
    """A per-head bias (ALiBi: head h adds slope_h·(j − i), shape [1, heads, n_q, n_k] or
    [heads, n_q, n_k], broadcast over the batch) reaches its own head: the output matches the
    golden head by head.

    Catches: a kernel whose bias path only handles one bias per batch row ([batch, 1, n_q, n_k])
    and silently applies head 0's slopes to every head; heads and batch confused when the bias is
    broadcast.
    """
    q, k, v = case.arrays()
    bias = alibi(case)
    out = run(target, case, q, k, v, bias=bias)
    assert_matches(target, case, out, q, k, v, bias=bias, what="with a per-head (ALiBi) bias, the output")
