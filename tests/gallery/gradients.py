"""The gallery for spec.laws.gradients: backward passes (a target's ``grad_fn``), each broken one
changing the textbook backward in one named place, and correct ones computing it another way.

The forward is :func:`impl.attention` throughout, so only the backward is on trial.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gallery.base import broken
from impl import attention
from impl.masks import causal_mask
from spec import Target

Array = np.ndarray
Grads = tuple[Array, Array, Array]


def _swap(x: Array) -> Array:
    return np.swapaxes(x, -1, -2)


def textbook_backward(q: Array, k: Array, v: Array, d_out: Array, *, causal: bool = False,
                      bug: str = "") -> Grads:  # -> dq, dk, dv
    """The textbook backward in the inputs' dtype, with one named bug (or none)."""
    scale = q.dtype.type(1 / math.sqrt(q.shape[-1]))
    out, p = attention(q, k, v, causal=causal and bug != "causal_ignored", return_weights=True)
    square = p.shape[-1] == p.shape[-2]
    dv = p @ d_out if bug == "dv_transposed" and square else _swap(p) @ d_out
    dp = d_out @ _swap(v)
    d_row = 0 if bug == "no_row_term" else np.sum(d_out * out, axis=-1, keepdims=True)
    ds = p * (dp - d_row)
    dq = ds @ k * scale
    dk = _swap(ds) @ q * (1 if bug == "dk_unscaled" else scale)
    return dq.astype(q.dtype), dk.astype(q.dtype), dv.astype(q.dtype)


def backward_with(bug: str) -> Any:
    """A ``grad_fn`` that is the textbook backward with ``bug`` (one of :data:`BUGS`; "" = none)."""
    def grad_fn(q: Array, k: Array, v: Array, d_out: Array, *, causal: bool = False) -> Grads:
        return textbook_backward(q, k, v, d_out, causal=causal, bug=bug)

    grad_fn.__name__ = bug or "textbook"
    return grad_fn


BUGS = {
    "no_row_term": "dS = P ∘ dP, the row term D never subtracted",
    "dk_unscaled": "dK = dSᵀ Q without the 1/√d_k",
    "dv_transposed": "dV = P dO instead of Pᵀ dO (only visible when n_q = n_k)",
    "causal_ignored": "the backward recomputes P without the causal mask",
}
"""The one-place bugs of :func:`textbook_backward`, each rejected by grad_matches_golden."""


def max_before_mask(q: Array, k: Array, v: Array, d_out: Array, *, causal: bool = False) -> Grads:
    """The textbook backward with its own softmax, whose row maximum is taken before masking:
    right to rounding (and passes grad_matches_golden), but future keys move past gradients."""
    scale = q.dtype.type(1 / math.sqrt(q.shape[-1]))
    s = q @ _swap(k) * scale
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    if causal:
        e = np.where(causal_mask(q.shape[-2], k.shape[-2]), e, q.dtype.type(0))
    with np.errstate(invalid="ignore"):  # 0/0 once the past underflows: the bug's own NaN
        p = e / e.sum(axis=-1, keepdims=True)
    dp = d_out @ _swap(v)
    ds = p * (dp - np.sum(p * dp, axis=-1, keepdims=True))
    dq, dk, dv = ds @ k * scale, _swap(ds) @ q * scale, _swap(p) @ d_out
    return dq.astype(q.dtype), dk.astype(q.dtype), dv.astype(q.dtype)


def reordered(q: Array, k: Array, v: Array, d_out: Array, *, causal: bool = False) -> Grads:
    """Correct, in another order: D from P ∘ dP, the scale folded into dS before the products."""
    scale = q.dtype.type(1 / math.sqrt(q.shape[-1]))
    _, p = attention(q, k, v, causal=causal, return_weights=True)
    dp = d_out @ _swap(v)
    ds = (p * (dp - np.sum(p * dp, axis=-1, keepdims=True))) * scale
    return (ds @ k).astype(q.dtype), (_swap(ds) @ q).astype(q.dtype), (_swap(p) @ d_out).astype(q.dtype)


def _to_bhnd(x: Array) -> Array:  # (batch, n, heads, d) <-> (batch, heads, n, d); 2-D/3-D as they are
    return np.swapaxes(x, 1, 2) if x.ndim == 4 else x


def bnhd_backward(q: Array, k: Array, v: Array, d_out: Array, *, causal: bool = False) -> Grads:
    """:func:`reordered` for a target in (batch, n, heads, d) layout, behind transposes."""
    dq, dk, dv = reordered(*(_to_bhnd(x) for x in (q, k, v, d_out)), causal=causal)
    return _to_bhnd(dq), _to_bhnd(dk), _to_bhnd(dv)


def bnhd_forward(q: Array, k: Array, v: Array, *, causal: bool = False) -> Array:
    return _to_bhnd(attention(_to_bhnd(q), _to_bhnd(k), _to_bhnd(v), causal=causal))


def _grad(bug: str, catches: str, **declared: Any) -> Any:
    return broken(attention, catches, BUGS[bug], name=bug, ndims=(2, 3, 4), grad_fn=backward_with(bug),
                  **declared)


BROKEN = [
    _grad("no_row_term", "grad_matches_golden"),
    _grad("dk_unscaled", "grad_matches_golden"),
    _grad("dv_transposed", "grad_matches_golden"),
    _grad("causal_ignored", "grad_matches_golden"),
    _grad("causal_ignored", "grad_causal_no_leak"),
    broken(attention, "grad_causal_no_leak", "row max taken before the causal mask in the backward",
           name="max_before_mask_backward", ndims=(2, 3, 4), grad_fn=max_before_mask),
]

CORRECT = [
    Target(attention, name="textbook_backward", ndims=(2, 3, 4), grad_fn=backward_with("")),
    Target(attention, name="reordered_backward", ndims=(2, 3, 4), dtypes=("float16", "float32", "float64"),
           grad_fn=reordered),
    Target(bnhd_forward, name="bnhd_backward", layout="bnhd", ndims=(4,), grad_fn=bnhd_backward),
]
