"""Laws for a target's backward pass: gradients of ``L = Σ out ∘ dO`` against a float64 golden,
and the causal mask's exactness in the backward.

A target declares ``grad_fn(q, k, v, d_out, *, causal=False) -> (dq, dk, dv)``; these laws skip
any target that does not. The golden backward is written here, independently of
:mod:`impl.grad`: it pushes ``dP = dO vᵀ`` through each row's explicit softmax Jacobian
``J = diag(p) − p pᵀ`` (no ``D = rowsum(dO ∘ O)`` shortcut), with ``p`` the pattern of
:func:`spec.tolerance.golden`. The tolerance policy is the forward's (:mod:`spec.tolerance`) with
the baseline the same naive backward in the target's dtype, a gradient floor, and the factor
``GRAD_FACTOR · target.tolerance`` (see :data:`GRAD_FACTOR` for why gradients need more).

Listed in :data:`spec.registry.LAW_MODULES`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import strategies as st

from spec import dtypes, golden, tolerance
from spec.calling import GRADS, call_grad
from spec.cases import Case, cases
from spec.laws._helpers import assert_within_tolerance, scale_of
from spec.registry import law
from spec.target import Target

Array = np.ndarray

GRAD_FACTOR = 2.0
"""Gradients are allowed ``GRAD_FACTOR`` times the forward's k (so 4 for the default k = 2) times
the naive backward's error, plus the gradient floor. The backward has a cancellation the forward
lacks, ``dS = P ∘ (dP − D)``: where ``dP ≈ D`` a correct backward and the naive baseline lose
different digits, so their errors are less alike than forward errors are. Measured over 300
random cases per dtype (n_q, n_k ≤ 64, d_k ≤ 64, causal or not, normal and integer values): the worst
max|out − golden| / max|baseline − golden| was, forward / gradients (dq, dk, dv),

- reference: float16 1.0 / 1.0, 0.92, 1.0 · float32 1.0 / 5.7, 6.2, 1.0 · float64 1.0 / 14.5, 6.2, 1.0
- torch 2.13 autograd: float16 1.0 / 2.1, 2.3, 2.0 · float32 5.8 / 4.7, 4.5, 8.7 · float64 5.2 / 4.0, 5.0, 8.5

so a gradient strays up to 2.5 times further from the baseline than an output does (14.5 against
5.8). These extremes occur where the baseline is luckily exact and the floor decides: with the
floor of :func:`grad_floors`, the worst error / allowed at factor 2·k = 4 was 0.034 (reference)
and 0.027 (torch), while the backward bugs of ``tests/test_properties_grad.py`` reach 990 to 6e5
(float32) and 21 to 580 (float16) on their shrunk counterexamples."""


def _swap(x: Array) -> Array:  # [..., a, b] -> [..., b, a]
    return np.swapaxes(x, -1, -2)


golden_backward = golden.backward  # the float64 backward oracle lives in spec.golden


def baseline_backward(
    q: Array, k: Array, v: Array, d_out: Array, *, visible: Array, scale: float
) -> tuple[Array, Array, Array]:  # same shapes as golden_backward's gradients, in q's dtype
    """The textbook backward in the inputs' dtype: P from :func:`spec.tolerance.baseline`'s
    softmax, ``dS = P ∘ (dP − rowsum(P ∘ dP))``."""
    dtype = q.dtype
    s = dtype.type(scale)
    n_k = k.shape[-2]
    eye = np.broadcast_to(np.eye(n_k, dtype=dtype), (*k.shape[:-2], n_k, n_k))
    p = tolerance.baseline(q, k, eye, visible=visible, scale=scale)  # V = I gives the pattern
    with np.errstate(invalid="ignore", over="ignore"):
        dp = d_out @ _swap(v)
        ds = p * (dp - np.sum(p * dp, axis=-1, keepdims=True))
        grads = ((ds @ k) * s, (_swap(ds) @ q) * s, _swap(p) @ d_out)
    return tuple(g.astype(dtype) for g in grads)


def grad_floors(
    q: Array, k: Array, v: Array, d_out: Array, *, p: Array, scale: float
) -> tuple[float, float, float]:
    """The a-priori error of a correct backward in q's dtype, per gradient (dq, dk, dv).

    A first-order bound in the forward's style: each gradient is a sum of products whose sizes
    are bounded by the same backward run on absolute values (``|dP| ≤ |dO||v|ᵀ``,
    ``|dS| ≤ P ∘ (|dP| + rowsum(P ∘ |dP|))``, ...); each term carries the weights' relative error
    (d_k + 2)·S·eps (as in :func:`spec.tolerance.floor`) twice — once in P, once in D — plus the
    rounding of the sums of n_q, n_k and d_v terms.
    """
    if min(q.size, k.size, v.size) == 0:
        return 0.0, 0.0, 0.0
    aq, ak, av, ado = (np.abs(np.asarray(x, dtype=np.float64)) for x in (q, k, v, d_out))
    s_abs = abs(scale) * float(np.max(aq @ _swap(ak)))
    n_q, d_k = q.shape[-2:]
    n_k, d_v = v.shape[-2:]
    m_dp = ado @ _swap(av)
    m_ds = p * (m_dp + np.sum(p * m_dp, axis=-1, keepdims=True))
    sizes = (abs(scale) * m_ds @ ak, abs(scale) * _swap(m_ds) @ aq, _swap(p) @ ado)
    c = dtypes.eps(q.dtype) * (4 + math.sqrt(n_q) + math.sqrt(n_k) + math.sqrt(d_v)
                                  + 2 * (d_k + 2) * s_abs)
    return tuple(c * float(np.max(m)) for m in sizes)


def needs_grad(t: Target) -> str | None:
    """gradients (grad_fn)"""
    return None if t.has_gradients else "needs gradients (target declares no grad_fn)"


def upstream(case: Case) -> Array:  # -> [*lead, n_q, d_v] in the case's dtype
    """The upstream gradient dO for this case, N(0, 1) (its own random stream)."""
    return case.rng(8).standard_normal((*case.lead(), case.n_q, case.d_v)).astype(case.dtype)


def _grad_cases(t: Target, **kwargs: Any) -> st.SearchStrategy[Case]:
    """grad_fn takes no mask= or scale=; n ≤ 64 keeps the golden's full Jacobians small.

    A query that sees no key (bottom-right causal, n_q > n_k) has a zero output, so zero
    gradients, only under ``masked_rows="zeros"``; for the other policies the derivative of a NaN
    or of the plain mean is another law's business, so such cases are not drawn.
    """
    drawn = cases(t, n_max=64, **kwargs)
    if t.masked_rows == "zeros" or t.causal_alignment != "bottom_right":
        return drawn
    return drawn.filter(lambda c: not c.causal or c.n_q <= c.n_k)


# --- the laws ------------------------------------------------------------------------------


@law(strategy=_grad_cases, needs=needs_grad)
def grad_matches_golden(target: Target, case: Case) -> None:
    """The target's gradients dq, dk, dv of ``Σ out ∘ dO`` equal the float64 golden backward
    (softmax Jacobian) within the tolerance policy, the factor doubled for gradients (GRAD_FACTOR).

    Catches: dS = P ∘ dP without subtracting the row term D = rowsum(dO ∘ O); dk (or dq) missing
    the scale; dv = P dO instead of Pᵀ dO; a backward that forgets the causal mask (future keys
    then receive gradient from past queries).
    """
    q, k, v = case.arrays()
    d_out = upstream(case)
    vis = case.visible(target)
    s = scale_of(case)
    got = call_grad(target, q, k, v, d_out, causal=case.causal)
    *gold, p = golden_backward(q, k, v, d_out, visible=vis, scale=s)
    base = baseline_backward(q, k, v, d_out, visible=vis, scale=s)
    floors = grad_floors(q, k, v, d_out, p=p, scale=s)
    for name, g, want, b, fl in zip(GRADS, got, gold, base, floors, strict=True):
        rows = np.ones(want.shape[:-1], dtype=bool)
        cmp = tolerance.compare(g, want, b, rows=rows, tolerance=GRAD_FACTOR * target.tolerance, floor_=fl)
        assert_within_tolerance(cmp, dtype=case.dtype, what=name, against="the float64 golden backward")


def _needs_grad_causal(t: Target) -> str | None:
    """gradients (grad_fn), a causal mode and exact masking"""
    if t.grad_fn is None:
        return needs_grad(t)
    if t.causal_alignment is None:
        return "needs a causal mode (target declares causal_alignment=None)"
    if not t.exact_masking:
        return "needs exact masking (target declares exact_masking=False; grad_matches_golden applies)"
    return None


@law(strategy=lambda t: _grad_cases(t, causal=(True,), n_k_min=2), needs=_needs_grad_causal)
def grad_causal_no_leak(target: Target, case: Case) -> None:
    """Under the causal mask, changing the keys and values from position t on leaves dq of every
    query that cannot see t bit-identical (up to the sign of zero), and a key that no query sees
    gets exactly zero dk and dv.

    Catches: a backward that recomputes the pattern with the row maximum taken before masking —
    right to rounding at moderate scores (grad_matches_golden passes it), but large future scores
    move past gradients, or underflow them to 0/0 = NaN; a backward that forgets the causal mask.
    """
    q, k, v = case.arrays()
    d_out = upstream(case)
    rng = case.rng(9)
    t = int(rng.integers(1, case.n_k))
    factor = 10.0 if case.dtype == "float16" else 1e3
    k2, v2 = k.copy(), v.copy()
    k2[..., t:, :] = (case.values_like(rng, k2[..., t:, :].shape) * factor).astype(case.dtype)
    v2[..., t:, :] = (case.values_like(rng, v2[..., t:, :].shape) * factor).astype(case.dtype)
    vis = case.visible(target)
    dq, dk, dv = call_grad(target, q, k, v, d_out, causal=True)
    unseen = ~np.asarray(np.broadcast_to(vis, (*case.lead(), case.n_q, case.n_k)).any(axis=-2))  # [..., n_k]
    for name, g in (("dk", dk), ("dv", dv)):
        bad = unseen[..., None] & (g != 0)
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            raise AssertionError(
                f"{name} {list(at)} is {float(g[at])!r}, not 0, though no query sees key {at[-2]}")
    dq2, _, _ = call_grad(target, q, k2, v2, d_out, causal=True)
    blind = np.asarray(~vis[..., t:].any(axis=-1))  # [..., n_q]: rows that see no changed position
    bad = blind[..., None] & ~((dq == dq2) | (np.isnan(dq) & np.isnan(dq2)))
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(
            f"changing keys/values from position {t} on changed dq {list(at)} from {float(dq[at])!r} "
            f"to {float(dq2[at])!r}, though query {at[-2]} cannot see position {t}"
        )
