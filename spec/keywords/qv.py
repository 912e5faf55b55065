"""Absorbed MLA's query-value scores (``qv=``, FlashAttention 3's): the score of query i and key j
gains ``scale · qv_i · v_j``.

``qv`` is float ``[batch, heads, n_q, d_v]`` (3-D ``[heads, n_q, d_v]``, 2-D ``[n_q, d_v]``): one
row per query head and query, as wide as the values. Multi-head latent attention with its value
projection absorbed into the query (DeepSeek's MLA decode) scores each key twice, once against
its rope part k and once against the latent v; the maths is exactly attention with
``q' = [q | qv]`` and ``k' = [k | v]`` concatenated on the last axis, at the same explicit scale
(a `spec.keywords.Widens` term: the golden, the baseline, the floor and the gradients follow).
``scale=`` is always passed with it: kernels differ on its default (1/√d_k, 1/√(d_k + d_v)).

Its cases are drawn at ordinary small shapes and, one in three where the target takes them, at
MLA's: d_k = 576, d_v = 512, many query heads over one K/V head (grouped-query attention), a
decode-like 1..4 queries over up to 64 keys (`mla_shape`). The backward returns ``dqv`` among its
extras, and dv gains the part that reaches it through the scores.

Its declaration (`QV`) and the functions it is made of; its laws are `spec.laws.mla`'s.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from spec.keywords.record import Keyword, Widens

if TYPE_CHECKING:
    from spec.cases import Case
    from spec.target import Target

Array = np.ndarray

MLA_D_K = 576
"""MLA's key width: the 512 columns of the shared latent and 64 of rope (FlashMLA, DeepSeek V3)."""
MLA_D_V = 512
"""MLA's value width: the latent."""
MLA_HEADS = (16, 128)
"""Query heads over MLA's one K/V head (a tensor-parallel shard of DeepSeek V3's 128, and all)."""
MLA_N_Q = 4
"""The most queries an MLA-shaped case has (decode, and a few speculative tokens)."""
MLA_N_K = 64
"""The most keys an MLA-shaped case has (cheap: the widths are what it is about)."""
QV_SCALES = (1.0, 0.25)
"""How large qv's entries are drawn, relative to q's (N(0, 1) times this)."""


def query_columns(qv: Array) -> Array:  # [*lead, n_q, d_v] -> the same
    """The columns qv appends to each query (`Widens.query`): qv itself."""
    return np.asarray(qv)


def qv_values(case: Case, size: float) -> Array:  # -> [*lead, n_q, d_v] in the case's dtype
    """qv for ``case``: N(0, 1) (or the case's integers) times ``size``, in its own random stream,
    one row per query head and query, d_v wide."""
    drawn = case.values_like(case.rng(41), (*case.lead(), case.n_q, case.d_v))
    return (drawn.astype(np.float64) * size).astype(case.np_dtype)


def takes_mla_shape(target: Target) -> bool:
    """Whether ``target`` takes MLA's widths: head_dims None or holding 576 and 512, and d_v ≠ d_k
    allowed."""
    dims = target.head_dims
    return not target.equal_head_dims and (dims is None or {MLA_D_K, MLA_D_V} <= set(dims))


def mla_shape(draw: st.DrawFn, target: Target, case: Case) -> Case:
    """``case`` at MLA's shapes: d_k = 576, d_v = 512, at most `MLA_N_Q` queries and `MLA_N_K`
    keys, and (4-D or 3-D, where the target takes grouped K/V heads) 16 or 128 query heads over
    one K/V head; rejected where the target's shape declarations exclude it."""
    from spec.cases import outside_limits  # the cases import the keywords

    n_q, n_k = min(case.n_q, MLA_N_Q), min(case.n_k, MLA_N_K)
    if case.ndim >= 3 and target.supports_gqa:
        heads = draw(st.sampled_from(MLA_HEADS)) if case.ndim == 3 else MLA_HEADS[0]
        shaped = case.replace(heads=heads, kv_heads=1, batch=min(case.batch, 2))
    else:
        shaped = case
    shaped = shaped.replace(n_q=n_q, n_k=n_k, d_k=MLA_D_K, d_v=MLA_D_V)
    assume(not shaped.causal or target.causal_shape_ok(n_q, n_k))
    assume(outside_limits(target, shaped) is None)
    return shaped


def draw(draw: st.DrawFn, target: Target, case: Case) -> Case:
    """qv of N(0, 1) entries (or a quarter of that), with ``scale=`` always passed (drawn where the
    case has none: 1/√d_k, 1/√(d_k + d_v) or any in [0.05, 1]); one case in three, where no other
    keyword has shaped it and the target takes them, at MLA's shapes (`mla_shape`)."""
    if not case.keywords and takes_mla_shape(target) and draw(st.integers(0, 2)) == 0:
        case = mla_shape(draw, target, case)
    if case.scale is None:
        scales = (1 / math.sqrt(case.d_k), 1 / math.sqrt(case.d_k + case.d_v))
        case = case.replace(scale=draw(st.sampled_from(scales) | st.floats(0.05, 1.0)))
    return case.with_keyword("qv", draw(st.sampled_from(QV_SCALES)))


def qv_declared(target: Target) -> str | None:
    """``qv=`` is always passed with ``scale=``: a target declaring it must take scale."""
    if target.supports_qv and not target.supports_scale:
        return ("Target supports_qv=True needs supports_scale=True: qv= is always passed with scale= "
                "(kernels differ on its default)")
    return None


QV = Keyword(
    name="qv",
    field="supports_qv",
    passes=("qv",),
    meaning="A float array [batch, heads, n_q, d_v] (3-D [heads, n_q, d_v], 2-D [n_q, d_v]), one row per "
            "query head and query: the score of query i and key j gains scale * qv_i . v_j (FlashAttention "
            "3's qv, absorbed MLA), which is attention with q' = [q | qv] and k' = [k | v] at the same "
            "scale; scale= is always passed with it. The backward returns dqv among its extras, and dv "
            "gains the part that comes through the scores.",
    terms=(Widens(query_columns, grad="dqv"),),
    received=lambda case, size: (qv_values(case, float(size)),),
    draw=draw,
    with_q=("qv",),
    reshapes=True,
    check_target=qv_declared,
)
