"""Laws of multi-head latent attention (MLA): ``qv=`` (FlashAttention 3's absorbed MLA: the score
of query i and key j gains ``scale · qv_i · v_j``, `spec.keywords.qv`) and ``Target(v_from_k=True)``
(FlashMLA's shared latent: the values are the keys' first d_v columns, the target called with
``v=None`` and ``d_v=``), forward and backward, at ordinary small shapes and at MLA's: d_k = 576,
d_v = 512, many query heads over one K/V head, a few queries.

Public reports: FlashAttention 3's ``qv`` argument (hopper ``flash_attn_interface``, absorbed MLA
decode) and FlashMLA's dense decode (d_k 576, d_v 512, v read from the latent k).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from spec import oracle
from spec.call import call_grad
from spec.cases import Case, cases
from spec.keywords.qv import MLA_D_K, MLA_D_V, QV, mla_shape, takes_mla_shape
from spec.laws import _needs
from spec.laws._helpers import assert_matches, assert_same, run
from spec.laws.gradients import assert_gradients_match, grad_cases, upstream
from spec.registry import Need, law
from spec.target import Target

Array = np.ndarray

needs_qv = _needs.keyword(QV)
needs_v_from_k = Need(lambda t: None if t.v_from_k else "needs v_from_k (target declares v_from_k=False)",
                      "v read from the keys' first d_v columns (v_from_k)")

N_MAX = 48
"""Sizes of the MLA laws' ordinary cases (MLA-shaped ones have at most 4 queries and 64 keys)."""


def qv_cases(target: Target, **given: Any) -> st.SearchStrategy[Case]:
    """Cases with ``qv=`` (and ``scale=``), grouped K/V heads where the target takes them."""
    return cases(target, n_max=N_MAX, keywords=(QV,), gqa=target.supports_gqa, **given)


def _qv_text(case: Case) -> str:
    return f"with qv= ({case.d_v} wide) and scale={case.scale:.4g}"


@law(strategy=lambda t: qv_cases(t, masks=("none", "random")), needs=needs_qv)
def qv_matches_golden(target: Target, case: Case) -> None:
    """With ``qv=`` every row that sees a key matches the float64 golden of attention with
    ``q' = [q | qv]`` and ``k' = [k | v]`` at the explicit scale: the score of query i and key j
    gains ``scale · qv_i · v_j``; drawn at ordinary shapes and at MLA's (d_k = 576, d_v = 512,
    16 or 128 query heads over one K/V head, 1..4 queries).

    Catches: qv scored against the keys' first d_v columns instead of the values (a kernel
    reusing its K tile for the qv product); qv's product accumulated over the first d_k columns
    only (a fixed 576-wide accumulator that drops the last of 512 + 576). FlashAttention 3's
    ``qv`` (absorbed MLA decode).
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs), what=f"{_qv_text(case)}, the output")


@law(strategy=lambda t: qv_cases(t, masks=("none", "random")), needs=needs_qv)
def qv_zero_is_no_qv(target: Target, case: Case) -> None:
    """``qv`` of zeros adds nothing to any score: the output equals that of the same call without
    ``qv=`` (within tolerance; ``scale=`` passed in both), and matches the golden.

    Catches: a qv path that changes what it should not when qv is zero: a different default
    scale on the qv path (1/√(d_k + d_v) instead of the scale passed), a softmax over the qv
    scores alone, a qv path that drops the causal mask or the mask.
    """
    inputs = case.inputs()
    zero = inputs.replace(qv=np.zeros_like(inputs.get("qv")))
    out = run(target, zero)
    assert_matches(target, zero, out, what=f"with qv= of zeros and scale={case.scale:.4g}, the output")
    plain = inputs.replace(qv=None)
    assert_same(target, plain, run(target, plain), out, what="qv= of zeros against no qv=")


@st.composite
def _scaled_cases(draw: st.DrawFn, target: Target) -> Case:
    """qv cases with a scale far from 1 (0.05..0.3, or 2..4), in which the unscaled qv term would
    move the output by more than 1% of its size (so a kernel that drops the scale on it moves)."""
    case = draw(qv_cases(target, masks=("none",)))
    scale = draw(st.floats(0.05, 0.3) | st.floats(2.0, 4.0))
    case = case.replace(scale=scale)
    assume(min(case.n_k, case.d_v) >= 2)
    inputs = case.inputs()
    gold = oracle.golden_of(inputs, target.alignment)[0]
    unscaled = inputs.replace(qv=np.asarray(inputs.get("qv"), dtype=np.float64) / scale)
    moved = float(np.max(np.abs(oracle.golden_of(unscaled, target.alignment)[0] - gold), initial=0.0))
    assume(moved > 0.01 * float(np.max(np.abs(gold), initial=0.0)))
    return case


@law(strategy=_scaled_cases, needs=needs_qv)
def qv_scale_applied(target: Target, case: Case) -> None:
    """The qv term is scaled as the q·k term is: with a scale far from 1 (0.05..0.3 or 2..4, where
    the unscaled term would move the output by more than 1%), the output matches the golden of
    ``scale · (q·k + qv·v)``.

    Catches: ``scale · q·k + qv·v``, the qv product added after the scale (right only at scale 1);
    the qv product scaled twice.
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs), what=f"{_qv_text(case)}, the output")


@law(strategy=lambda t: qv_cases(t, causal=(True,), masks=("none", "random")),
     needs=needs_qv & _needs.causal_mode)
def qv_with_causal(target: Target, case: Case) -> None:
    """``qv=`` with ``causal=True`` (and grouped K/V heads where taken): the qv scores are hidden
    as the q·k scores are, and every query head reads its group's values; the output matches the
    golden.

    Catches: a qv product computed over every key and added after the causal mask (a query sees
    later keys through qv); qv of query head h scored against the values of K/V head h instead of
    its group's (h // (h_q / h_kv)).
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs), what=f"causal {_qv_text(case)}, the output")


# --- v_from_k: the values are the keys' first d_v columns ----------------------------------------


@st.composite
def latent_cases(draw: st.DrawFn, target: Target, *, gradients: bool = False, narrower: bool = False) -> Case:
    """Cases of a ``v_from_k`` target (v = k[..., :d_v]), half of them at MLA's shapes where the
    target takes them (`spec.keywords.qv.mla_shape`). ``narrower``: d_v < d_k (so that the first
    and the last d_v columns differ)."""
    drawn = grad_cases(target, masks=("none", "random"), scale=True, gqa=target.supports_gqa) if gradients \
        else cases(target, n_max=N_MAX, masks=("none", "random"), scale=True, gqa=target.supports_gqa)
    case = draw(drawn)
    if takes_mla_shape(target) and draw(st.booleans()):
        case = mla_shape(draw, target, case)
    assume(case.v_prefix and (not narrower or case.d_v < case.d_k))
    return case


def _latent_text(case: Case) -> str:
    shape = " (MLA's shapes)" if (case.d_k, case.d_v) == (MLA_D_K, MLA_D_V) else ""
    return f"with v = k[..., :{case.d_v}] of k {case.d_k} wide{shape}"


@law(strategy=latent_cases, needs=needs_v_from_k)
def v_from_k_matches_golden(target: Target, case: Case) -> None:
    """A ``v_from_k`` target, called with ``v=None`` and ``d_v=``, matches the float64 golden whose
    values are the keys' first d_v columns, at ordinary shapes and at MLA's (d_k = 576,
    d_v = 512, many query heads over one K/V head, 1..4 queries over up to 64 keys).

    Catches: a latent kernel that reads d_v from the key width (v = k whole: output 576 wide);
    a decode kernel wrong past one query or past one query head per K/V head (FlashMLA's dense
    decode, d_k 576 / d_v 512).
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs), what=f"{_latent_text(case)}, the output")


@law(strategy=lambda t: latent_cases(t, narrower=True), needs=needs_v_from_k)
def v_from_k_reads_prefix(target: Target, case: Case) -> None:
    """With d_v < d_k the values are the keys' FIRST d_v columns: the output matches the golden
    read from ``k[..., :d_v]``, which differs from one read at any other offset.

    Catches: the latent's values read from the last d_v columns (``k[..., -d_v:]``: the rope
    part where the latent should be), or from a column offset (a latent stored after the rope
    columns).
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs), what=f"{_latent_text(case)}, the output")


@law(strategy=lambda t: latent_cases(t, gradients=True), needs=needs_v_from_k & _needs.gradients)
def v_from_k_gradients_match_golden(target: Target, case: Case) -> None:
    """A ``v_from_k`` target's ``grad_fn``, called with ``v=None`` and ``d_v=``, returns
    ``(dq, dk, None)`` with dk the gradient of the latent: the golden dk with the golden dv added
    into its first d_v columns; dq and that folded dk match the float64 golden backward.

    Catches: a latent backward that returns dk without the values' share (dv dropped: the latent's
    first d_v columns get only the scores' gradient); dv added into the last d_v columns.
    """
    inputs = case.inputs()
    d_out = upstream(case)
    assert_gradients_match(target, inputs, d_out, call_grad(target, inputs, d_out),
                           what=f"{_latent_text(case)}, ")


@law(strategy=lambda t: grad_cases(t, keywords=(QV,), masks=("none", "random"), gqa=t.supports_gqa),
     needs=needs_qv & _needs.gradients)
def qv_gradients_match_golden(target: Target, case: Case) -> None:
    """With ``qv=`` the gradients dq, dk, dv and ``dqv`` (among the extras, where the target
    declares ``grad_extras=("dqv",)``) match the float64 golden backward of attention with
    ``q' = [q | qv]``, ``k' = [k | v]``: dqv = dS·v·scale, and dv gains dSᵀ·qv·scale, the part that
    reaches it through the scores; at ordinary shapes and at MLA's.

    Catches: a backward whose dv is Pᵀ·dO alone (the score term dropped: right whenever qv is
    zero); dqv computed against k instead of v.
    """
    inputs = case.inputs()
    d_out = upstream(case)
    assert_gradients_match(target, inputs, d_out, call_grad(target, inputs, d_out),
                           what=f"{_qv_text(case)}, ")
