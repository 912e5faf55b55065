"""Laws of ``bias=``: an additive float array ``[batch, heads, n_q, n_k]`` (or broadcastable to
it) added to the scaled (and capped) scores before the softmax — relative-position biases, the
additive ``finfo.min`` masks of transformers. ``-inf`` hides a key.

A case draws the bias as ``(amplitude, broadcast)``: a N(0, 1) array times the amplitude, in the
case's dtype, full-shape (``""``) or broadcast over the heads (``"heads"``: ``[batch, 1, n_q,
n_k]``) or over the batch (``"batch"``: ``[1, heads, n_q, n_k]``).
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from spec.cases import Case, cases
from spec.dtypes import finfo
from spec.keywords.bias import BIAS, received
from spec.laws import _needs
from spec.laws._helpers import assert_hidden_unmoved, assert_matches, assert_same, first_true, run, sees_any
from spec.registry import law
from spec.target import Target

Array = np.ndarray

needs_bias = _needs.keyword(BIAS)


def bias_cases(target: Target, **given: object) -> st.SearchStrategy[Case]:
    return cases(target, n_max=48, keywords=(BIAS,), **given)  # type: ignore[arg-type]


@law(strategy=lambda t: bias_cases(t, masks=("none", "random"), scale=True), needs=needs_bias)
def bias_matches_golden(target: Target, case: Case) -> None:
    """With ``bias=B`` the output equals the float64 golden of softmax(scale·q·kᵀ + B)·V within
    the tolerance policy (whatever the causal mask and mask= hide stays hidden).

    Catches: a bias added before the scale (``(q·kᵀ + B)·scale``, so the bias shrinks by √d_k); a
    bias read transposed ([n_k, n_q]) or broadcast over the wrong axis.
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs), what="with bias=, the output")


@st.composite
def _broadcast_cases(draw: st.DrawFn, target: Target) -> Case:
    case = draw(bias_cases(target, ndims=(4,)))
    case = case.replace(batch=max(case.batch, 2), heads=max(case.heads, 2), kv_heads=None)
    return case.with_keyword("bias", (case.param("bias")[0], draw(st.sampled_from(("heads", "batch")))))


@law(strategy=_broadcast_cases, needs=needs_bias & _needs.ndim(4))
def bias_broadcast_reaches_every_slice(target: Target, case: Case) -> None:
    """A bias broadcast over the heads (``[batch, 1, n_q, n_k]``, one per batch row) or over the
    batch (``[1, heads, n_q, n_k]``, one per head), with two or more of each, reaches every
    (batch, head) slice as broadcasting says: the output matches the golden slice by slice.

    Catches: onnxruntime#24017 — with a bias of shape [B, 1, n_q, n_k] and B > 1, batch b read the
    bias slab at b·heads (the flattened (batch, head) index), so every batch row after the first
    got another row's bias or memory past it; a bias broadcast over the batch indexed by batch.
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs),
                   what=f"with a bias of shape {inputs.get('bias').shape}, the output")


def row_shift(target: Target, case: Case) -> float:
    """A constant large enough that exp of it overflows every float type (2^(nmant/2 + 4) or
    more: 512 for float16, 128 for bfloat16, ~3e4 for float32), and small enough that the shifted
    bias keeps ~half the significand of the dtype the target computes in."""
    info = finfo(target.precision(case.dtype))
    return float(2.0 ** max(7, int(info.nmant) // 2 + 4))


@law(strategy=lambda t: bias_cases(t, masks=("none", "random")), needs=needs_bias)
def bias_row_shift_invariance(target: Target, case: Case) -> None:
    """Adding a constant c to a whole row of the bias changes nothing (softmax is invariant to a
    shift): with c = ±2^(nmant/2 + 4) per row (exp(c) overflows every float type) the output is
    finite and still matches the golden.

    Catches: a row maximum taken over q·kᵀ before the bias is added, so exp(s + B − max s)
    overflows to inf and the row turns NaN once the bias is large (a fused kernel that folds the
    bias in after its running maximum).
    """
    inputs = case.inputs()
    signs = np.where(case.rng(12).random((*case.lead(), case.n_q, 1)) < 0.5, -1.0, 1.0)
    shifted = (inputs.get("bias").astype(np.float64) + signs * row_shift(target, case)).astype(case.dtype)
    inputs = inputs.replace(bias=shifted)
    out = run(target, inputs)
    bad = sees_any(target, inputs)[..., None] & ~np.isfinite(out)
    if (at := first_true(bad)) is not None:
        raise AssertionError(f"with every bias row shifted by ±{row_shift(target, case):g}, "
                             f"output {list(at)} is {out[at]}")
    assert_matches(target, inputs, out,
                   what=f"with every bias row shifted by ±{row_shift(target, case):g}, the output")


def hiding_bias(case: Case) -> tuple[Array, Array]:
    # -> bias [*lead, n_q, n_k], changed keys [*lead, n_k] (bool)
    """A full-shape bias with −inf on ~30% of the entries, and a set of keys (~40% per slice)
    that the −inf entries hide from a set of rows (~half): those rows see none of them. Every row
    keeps at least one key."""
    rng = case.rng(13)
    shape = (*case.lead(), case.n_q, case.n_k)
    changed = rng.random((*shape[:-2], case.n_k)) < 0.4
    spare = rng.integers(0, case.n_k, size=shape[:-2])  # one key per slice is never changed
    np.put_along_axis(changed, spare[..., None], False, axis=-1)
    blind = rng.random(shape[:-1]) < 0.5
    hidden = (rng.random(shape) < 0.3) | (blind[..., None] & changed[..., None, :])
    np.put_along_axis(hidden, np.broadcast_to(spare[..., None, None], (*shape[:-1], 1)), False, axis=-1)
    (base,) = received(case, (case.param("bias")[0], ""))
    return np.where(hidden, case.np_dtype.type(-np.inf), base), changed


@law(strategy=lambda t: bias_cases(t, causal=(False,), n_k_min=2), needs=needs_bias)
def bias_neg_inf_hides_keys(target: Target, case: Case) -> None:
    """A −inf bias entry hides its key exactly as a boolean mask does: the output matches the
    golden (and, with mask=, the call that hides the same keys by the mask), and replacing keys
    and values leaves every row that a −inf hides them from bit-identical (within tolerance if
    the target declares exact_masking=False).

    Catches: −inf clamped to a finite fill (−1e4, transformers' old additive mask value), so a
    hidden key whose score exceeds the fill still leaks; −inf − (−inf) = NaN when the bias is
    folded into a running maximum.
    """
    bias, changed = hiding_bias(case)
    inputs = case.inputs().replace(bias=bias)
    out = run(target, inputs)
    assert_matches(target, inputs, out, what="with −inf bias entries, the output")
    if target.supports_mask:  # the same keys hidden by mask= instead: the same output
        finite = np.where(np.isneginf(bias), case.np_dtype.type(0), bias)
        as_mask = inputs.replace(bias=finite, mask=~np.isneginf(bias))
        assert_same(target, inputs, run(target, as_mask), out,
                    what="−inf bias entries against the same keys hidden by mask=")
    assert_hidden_unmoved(target, case, inputs, changed, before=out,
                          what="changing keys that a −inf bias hides")


def per_head_bias(case: Case) -> Array:  # -> [1, heads, n_q, n_k] (4-D) or [heads, n_q, n_k] (3-D)
    """A linear bias with a slope per head: head h adds slope_h·(j − i), slopes 2^(−8(h+1)/heads),
    distinct per head (a signed relative-position bias; ALiBi itself, −slope·|distance|, is the
    ``alibi_slopes=`` keyword's, `spec.laws.alibi`)."""
    slopes = 2.0 ** (-8.0 * np.arange(1, case.heads + 1) / case.heads)
    distance = np.arange(case.n_k)[None, :] - np.arange(case.n_q)[:, None]
    bias = (slopes[:, None, None] * distance).astype(case.dtype)
    return bias[None] if case.ndim == 4 else bias


@law(strategy=lambda t: bias_cases(t, ndims=(3, 4)).filter(lambda c: c.heads >= 2),
     needs=needs_bias & _needs.ndim(3, 4))
def bias_per_head(target: Target, case: Case) -> None:
    """A per-head bias (head h adds its own slope times the signed distance j − i, shape
    [1, heads, n_q, n_k] or [heads, n_q, n_k], broadcast over the batch) reaches its own head: the
    output matches the golden head by head.

    Catches: a kernel whose bias path only handles one bias per batch row ([batch, 1, n_q, n_k])
    and silently applies head 0's slopes to every head; heads and batch confused when the bias is
    broadcast.
    """
    inputs = case.inputs().replace(bias=per_head_bias(case))
    assert_matches(target, inputs, run(target, inputs), what="with a per-head bias, the output")
