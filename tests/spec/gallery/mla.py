"""Gallery of the MLA laws (``qv=``, FlashAttention 3's absorbed MLA, and ``Target(v_from_k=True)``,
FlashMLA's shared latent): broken MLA kernels, each rejected by its law, and correct ones, in NumPy.

Every variant is one formula, `forward`/`backward`, written from the definition (the score of
query i and key j is ``scale · (q_i·k_j + qv_i·v_j)``; a latent target reads ``v = k[..., :d_v]``)
with its bug switched on in one place."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gallery.base import stable_softmax
from impl.attention import compute_dtype
from impl.masks import causal_mask
from spec import Target

Array = np.ndarray


def _grouped(q: Array, x: Array) -> Array:  # [..., g, n, d] -> [..., h, n, d]
    """K/V heads repeated so that query head i reads K/V head i // (h // g)."""
    if x.ndim >= 3 and x.shape[-3] != q.shape[-3]:
        return np.repeat(x, q.shape[-3] // x.shape[-3], axis=-3)
    return x


def _summed(g: Array, like: Array) -> Array:  # [..., h, n, d] -> [..., g, n, d]: a group's gradients summed
    if g.ndim >= 3 and g.shape[-3] != like.shape[-3]:
        group = g.shape[-3] // like.shape[-3]
        return g.reshape(*g.shape[:-3], like.shape[-3], group, *g.shape[-2:]).sum(axis=-3)
    return g


def latent_values(k: Array, v: Array | None, d_v: int | None, *, suffix: bool = False) -> Array:
    """v as given, or (a latent call, ``v=None``) the keys' first ``d_v`` columns (``suffix``: the
    last ones, a bug)."""
    if v is not None:
        return v
    assert d_v is not None, "a latent call (v=None) passes d_v="
    return k[..., k.shape[-1] - d_v:] if suffix else k[..., :d_v]


def _wrong_group(q: Array, v: Array) -> Array:  # [..., g, n, d] -> [..., h, n, d], head i reading i mod g
    if v.ndim >= 3 and v.shape[-3] != q.shape[-3]:
        return np.tile(v, (1,) * (v.ndim - 3) + (q.shape[-3] // v.shape[-3], 1, 1))
    return v


def _pattern(q: Array, k: Array, v: Array, *, causal: bool, mask: Any, scale: float | None, qv: Any,
             qv_unscaled: bool = False, qv_against_k: bool = False, qv_rescaled: bool = False,
             qv_wrong_group: bool = False) -> tuple[Array, Array, Array]:
    # -> weights [..., n_q, n_k], k and v with the query heads, in the compute dtype
    work = compute_dtype(q.dtype)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    if qv is not None and qv_rescaled:  # the scale recomputed for the widened product
        scale = scale * math.sqrt(q.shape[-1] / (q.shape[-1] + v.shape[-1]))
    kh, vh = _grouped(q, k).astype(work), _grouped(q, v).astype(work)
    s = (q.astype(work) @ np.swapaxes(kh, -1, -2)) * work.type(scale)
    if qv is not None:
        against = kh[..., :v.shape[-1]] if qv_against_k else \
            _wrong_group(q, v).astype(work) if qv_wrong_group else vh
        extra = np.asarray(qv).astype(work) @ np.swapaxes(against, -1, -2)
        s = s + (extra if qv_unscaled else extra * work.type(scale))
    keep = np.ones(s.shape, dtype=bool)
    if causal:
        keep &= causal_mask(q.shape[-2], k.shape[-2])
    if mask is not None:
        keep &= np.asarray(mask, dtype=bool)
    return stable_softmax(np.where(keep, s, -np.inf)), kh, vh


def forward(q: Array, k: Array, v: Array | None = None, *, causal: bool = False, mask: Any = None,
            scale: float | None = None, qv: Any = None, d_v: int | None = None, suffix: bool = False,
            rope_width: int | None = None, **bug: bool) -> Array:  # -> [..., n_q, d_v]
    """softmax(scale · (q kᵀ + qv vᵀ)) v, v read from the latent k where ``v=None`` (``suffix``:
    its last d_v columns; ``rope_width``: d_v taken as d_k minus it, bugs); ``bug``: `_pattern`'s."""
    if rope_width is not None and v is None:
        d_v = k.shape[-1] - rope_width
    v = latent_values(k, v, d_v, suffix=suffix)
    p, _, vh = _pattern(q, k, v, causal=causal, mask=mask, scale=scale, qv=qv, **bug)
    return (p @ vh).astype(q.dtype)


def backward(q: Array, k: Array, v: Array | None, d_out: Array, *, causal: bool = False, mask: Any = None,
             scale: float | None = None, qv: Any = None, d_v: int | None = None,
             drop_dv_scores: bool = False, unfolded: bool = False) -> tuple:
    """(dq, dk, dv, extras) of ``Σ out ∘ d_out``, extras ``{"dqv": ...}`` with qv; a latent call
    (``v=None``) returns (dq, dk, None) with dv added into dk's first d_v columns.
    ``drop_dv_scores``: dv = Pᵀ dO alone; ``unfolded``: a latent dk without dv (bugs)."""
    latent = v is None
    v = latent_values(k, v, d_v)
    p, kh, vh = _pattern(q, k, v, causal=causal, mask=mask, scale=scale, qv=qv)
    work = p.dtype
    do = d_out.astype(work)
    dp = do @ np.swapaxes(vh, -1, -2)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    ds = p * (dp - np.sum(p * dp, axis=-1, keepdims=True)) * work.type(scale)
    dq = ds @ kh
    dk = np.swapaxes(ds, -1, -2) @ q.astype(work)
    dv = np.swapaxes(p, -1, -2) @ do
    extras = {}
    if qv is not None:
        extras["dqv"] = (ds @ vh).astype(q.dtype)
        if not drop_dv_scores:
            dv = dv + np.swapaxes(ds, -1, -2) @ np.asarray(qv).astype(work)
    dk, dv = _summed(dk, k), _summed(dv, v)
    if latent and not unfolded:
        dk = dk.copy()
        dk[..., :dv.shape[-1]] += dv
    grads = (dq.astype(q.dtype), dk.astype(k.dtype), None if latent else dv.astype(q.dtype))
    return (*grads, extras)


def _backward_of(**bug: Any) -> Any:
    def grad_fn(q: Array, k: Array, v: Array | None, d_out: Array, **kw: Any) -> tuple:
        return backward(q, k, v, d_out, **kw, **bug)
    return grad_fn


def _forward_of(**bug: Any) -> Any:
    def fn(q: Array, k: Array, v: Array | None, **kw: Any) -> Array:
        return forward(q, k, v, **kw, **bug)
    return fn


QV = {"supports_qv": True, "supports_mask": True, "supports_scale": True, "supports_gqa": True,
      "ndims": (2, 3, 4), "empty_keys": "compute"}
"""What the qv variants declare (top-left causal, grouped K/V heads)."""
LATENT = {**QV, "v_from_k": True}
"""What the latent variants declare."""


def _named(fn: Any, name: str) -> Any:
    fn.__name__ = fn.__qualname__ = name
    return fn


def mla_target(name: str = "mla_numpy", **declared: Any) -> Target:
    """A correct qv target with its backward (``grad_extras=("dqv",)``)."""
    return Target(_named(_forward_of(), name), name=name, grad_fn=_backward_of(), grad_extras=("dqv",),
                  **(QV | declared))


def latent_target(name: str = "mla_latent_numpy", **declared: Any) -> Target:
    """A correct v_from_k target (and qv) with its backward."""
    return Target(_named(_forward_of(), name), name=name, grad_fn=_backward_of(), grad_extras=("dqv",),
                  **(LATENT | declared))


def _broken(name: str, catches: str, bug: str, *, latent: bool = False, forward_bug: dict | None = None,
            backward_bug: dict | None = None) -> Any:
    from gallery.base import Broken
    target = Target(_named(_forward_of(**(forward_bug or {})), name), name=name,
                    grad_fn=_backward_of(**(backward_bug or {})), grad_extras=("dqv",),
                    **(LATENT if latent else QV))
    return Broken(target, catches, bug)


BROKEN = [
    _broken("qv_unscaled", "qv_scale_applied", "qv·v added after the scale: scale·q·k + qv·v",
            forward_bug={"qv_unscaled": True}),
    _broken("qv_against_k", "qv_matches_golden", "qv scored against the keys' first d_v columns, not v",
            forward_bug={"qv_against_k": True}),
    _broken("qv_rescaled", "qv_zero_is_no_qv",
            "with qv= the scale recomputed for the widened product (times √(d_k / (d_k + d_v)))",
            forward_bug={"qv_rescaled": True}),
    _broken("qv_wrong_group", "qv_with_causal",
            "qv of query head h scored against the values of K/V head h mod g, not h // (h / g)",
            forward_bug={"qv_wrong_group": True}),
    _broken("latent_rope_width", "v_from_k_matches_golden",
            "d_v taken as the key width minus MLA's 64 rope columns instead of the d_v passed",
            latent=True, forward_bug={"rope_width": 64}),
    _broken("latent_backward_unfolded", "v_from_k_gradients_match_golden",
            "the latent's backward returns dk without the values' gradient added into its first d_v columns",
            latent=True, backward_bug={"unfolded": True}),
    _broken("latent_suffix", "v_from_k_reads_prefix", "the latent's values read from k[..., -d_v:]",
            latent=True, forward_bug={"suffix": True}),
    _broken("qv_backward_drops_dv_scores", "qv_gradients_match_golden",
            "the backward's dv is Pᵀ·dO alone: the part through the qv scores dropped",
            backward_bug={"drop_dv_scores": True}),
]

CORRECT = [mla_target(), latent_target()]
