"""Gradients of attention written by hand, and a central-difference checker.

With ``R = q kᵀ · scale``, ``S = c·tanh(R/c) + bias`` (−∞ where a key is hidden), ``P`` the softmax
of each row of S (its sink, if any, in the denominator), ``W = dropout(P)`` and ``O = W v``, an
upstream gradient ``dO`` flows back as

    dv = Wᵀ dO
    dP = dropout(dO vᵀ)              the same kept set and 1/(1 − p): dropout is linear
    dS = P ∘ (dP − D),   D = rowsum(dO ∘ O) = rowsum(P ∘ dP)
    dR = dS ∘ (1 − tanh²(R/c))       (dR = dS without a softcap)
    dq = dR k · scale,   dk = dRᵀ q · scale
    dbias = dS (summed over the axes the bias was broadcast along)
    dσ_h = −Σ p_sink · D             p_sink = e^(σ_h − lse), the sink's share of its row
    dqv = dR v · scale,  dv += dRᵀ qv · scale      with qv: R = (q kᵀ + qv vᵀ) · scale

``dS`` is ``dP`` pushed through the softmax Jacobian ``diag(p) − p pᵀ`` of each row; writing its
``pᵀ dP`` term as ``D = rowsum(dO ∘ O)`` is the form of FlashAttention-2 (Dao, 2023, Algorithm 2),
which needs only the output, not the pattern, to form it (it holds under dropout too:
``rowsum(P ∘ dP) = rowsum(W ∘ dO vᵀ) = rowsum(dO ∘ O)``). ALiBi's term is part of the bias here.
Hidden keys have ``P = W = 0`` and so receive no gradient; a query row with no visible key has
``P = 0`` throughout and gets zeros, the gradient of the zero output that `impl.attention`
returns for it. Grouped K/V heads sum their group's gradients, as broadcast inputs do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Unpack

import numpy as np

from impl.attention import (
    Array,
    _cap,
    _checked,
    _dropout,
    _full_rows,
    _grouped,
    _raw_scores,
    _weights,
    compute_dtype,
    latent_values,
)
from impl.keywords import Keywords, given, takes


def _swap(x: Array) -> Array:  # [..., a, b] -> [..., b, a]
    return np.swapaxes(x, -1, -2)


def _unbroadcast(grad: Array, shape: tuple[int, ...]) -> Array:  # [..., *shape] -> shape
    """Sum ``grad`` back to ``shape``: the adjoint of broadcasting ``shape`` up to ``grad.shape``.

    An input that was broadcast was used once per copy, so its gradient is the sum over copies.
    """
    extra = grad.ndim - len(shape)
    grad = grad.sum(axis=tuple(range(extra))) if extra else grad
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    return grad.sum(axis=stretched, keepdims=True) if stretched else grad


def _check_d_out(d_out: Any, dtype: np.dtype, shape: tuple[int, ...], *, name: str = "d_out") -> Array:
    """``d_out`` (or another array called ``name``) as an array shaped like the attention output."""
    if isinstance(d_out, (bool, int, float, complex)) or d_out is None:
        raise TypeError(f"{name} must be an array of shape {shape}, got {type(d_out).__name__}")
    d_out = np.asarray(d_out)
    if d_out.dtype != dtype:
        raise TypeError(f"{name} must have the dtype of q, k and v ({dtype}), got {d_out.dtype}")
    if d_out.shape != shape:
        raise ValueError(
            f"{name} must have the shape of the attention output (..., n_q, d_v) = {shape}, "
            f"got {d_out.shape}"
        )
    return d_out


def _core_backward(
    q: Array, k: Array, v: Array, *, d_out: Array, qv: Array | None, scale: float, softcap: float | None,
    bias: Array | None, keep: Array | None, sinks: Array | float, dropout: tuple[float, int | None],
) -> tuple[Array, Array, Array, Array, Array, Array]:
    # [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v], d_out [..., n_q, d_v]; the rest as _core's
    # -> dq, dk, dv in the shapes of q, k, v; dS [..., n_q, n_k] (the bias's); dσ per row [..., n_q, 1];
    # dqv in qv's shape ([..., n_q, 0] without qv)
    """The backward of ``impl.attention``'s core (the law above), its forward recomputed by the
    forward's own helpers."""
    rows = _full_rows(q, k, v)
    raw = _raw_scores(q, k, v, qv, scale)  # R
    p, lse = _weights(_cap(raw, softcap), bias=bias, keep=keep, sinks=sinks)
    w = _dropout(p, *dropout)
    dv = _swap(w) @ d_out  # [..., n_k, n_q] @ [..., n_q, d_v]
    dp = _dropout(d_out @ _swap(v), *dropout)  # [..., n_q, d_v] @ [..., d_v, n_k]
    d_row = np.sum(d_out * (w @ v), axis=-1, keepdims=True)  # D: [..., n_q, 1]
    ds = p * (dp - d_row)  # softmax Jacobian; hidden keys (p = 0) get exactly 0
    # The sink's share: a row with lse = −∞ has a −∞ sink (lse counts it), whose share is 0.
    d_sinks = -np.exp(sinks - np.where(np.isneginf(lse), 0, lse)) * d_row
    d_raw = ds if softcap is None else ds * (1 - np.tanh(raw / raw.dtype.type(softcap)) ** 2)
    dq = (d_raw @ k) * q.dtype.type(scale)  # [..., n_q, n_k] @ [..., n_k, d_k]
    dk = (_swap(d_raw) @ rows) * q.dtype.type(scale)  # [..., n_k, n_q] @ [..., n_q, d_k]
    dqv = q[..., :0]
    if qv is not None:  # R gains scale·qv·vᵀ: qv and v are a query and a key of their own
        dqv = _unbroadcast((d_raw @ v) * q.dtype.type(scale), qv.shape)
        dv = dv + (_swap(d_raw) @ _full_rows(qv, k, v)) * q.dtype.type(scale)
    return (_unbroadcast(dq, q.shape), _unbroadcast(dk, k.shape), _unbroadcast(dv, v.shape), ds, d_sinks,
            dqv)


@takes(Keywords, align="top_left")
def attention_backward(
    q: Any, k: Any, v: Any, d_out: Any, *, return_extras: bool = False, **keywords: Unpack[Keywords],
) -> Any:  # [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v], [..., n_q, d_v]
    """Gradients ``(dq, dk, dv)`` of ``attention(q, k, v, ...)`` for the upstream gradient ``d_out``.

    Args:
      q, k, v: as for `impl.attention`, grouped K/V heads included.
      d_out: ``∂loss/∂out``, the shape of the output ``[..., n_q, d_v]`` (leading dims broadcast
        from q, k and v) and the dtype of q.
      causal, mask, scale, bias, window, attention_chunk, align, softcap, sinks: exactly as given to
        the forward.
      kv_lengths, cu_seqlens_q, cu_seqlens_k, dropout_p, seed, alibi_slopes: likewise (the same
        validation, the same errors); with dropout, the same seed gives the forward's kept set.
      return_extras: also return a dict of the gradients of the extra inputs given in this call:
        ``"dbias"`` (the bias's shape as passed, summed over the axes it was broadcast along, and
        its dtype) when ``bias`` is given, ``"dsinks"`` (``[h]``, summed over batch and rows, the
        sinks' dtype) when ``sinks`` is, ``"dqv"`` (qv's shape and dtype) when ``qv`` is.
      qv, topk_indices, topk_length, topk_blocks, topk_block_size: as given to the forward.
      d_v: with ``v=None`` (MLA's shared latent, ``v = k[..., :d_v]``): the result is
        ``(dq, dk, None)``, dk the gradient of the latent k, the values' gradient added into its
        first d_v columns.

    Returns:
      ``dq [..., n_q, d_k]``, ``dk [..., n_k, d_k]``, ``dv [..., n_k, d_v]``, each in the shape and
      dtype of its own input: where an input was broadcast over leading dims, or a K/V head served
      a group of query heads, its gradient is summed over them. Then the extras' dict, if asked.
      The maths runs in `impl.attention.compute_dtype`. A key hidden from every query gets
      exactly zero dk and dv, and a query that sees no key zero dq (for finite inputs).

    >>> q = np.zeros((1, 2)); k = np.zeros((2, 2)); v = np.array([[1.0], [3.0]])
    >>> dq, dk, dv = attention_backward(q, k, v, np.ones((1, 1)))
    >>> dv.ravel()  # uniform weights: each value gets half of dO
    array([0.5, 0.5])
    >>> *_, extras = attention_backward(q, k, v, np.ones((1, 1)), sinks=np.array([0.0]), return_extras=True)
    >>> extras["dsinks"]  # the sink takes 1/3 of the row: dσ = −(1/3)·D, D = dO·O = 4/3
    array([-0.44444444])
    """
    keywords = given(attention_backward, keywords)
    latent = v is None
    q, k, v, batch, core = _checked(q, k, latent_values(k, v, keywords["d_v"]), keywords)
    d_out = _check_d_out(d_out, q.dtype, (*batch, q.shape[-2], v.shape[-1]))
    work = compute_dtype(q.dtype)
    dq, dk, dv, d_scores, d_sinks, dqv = _grouped(
        _core_backward, *(x.astype(work, copy=False) for x in (q, k, v)),
        d_out=d_out.astype(work, copy=False), **core,
    )
    if latent:  # v = k[..., :d_v]: the latent's gradient is dk with dv added into its first d_v columns
        dk = dk.copy()
        dk[..., : v.shape[-1]] += dv
    grads = tuple(g.astype(x.dtype, copy=False) for g, x in ((dq, q), (dk, k), (dv, v)))
    if latent:
        grads = (grads[0], grads[1], None)
    if not return_extras:
        return grads
    extras = {}
    bias, sinks, qv = keywords["bias"], keywords["sinks"], keywords["qv"]
    if qv is not None:
        extras["dqv"] = dqv.astype(np.asarray(qv).dtype, copy=False)
    if bias is not None:
        extras["dbias"] = _unbroadcast(d_scores, np.shape(bias)).astype(np.asarray(bias).dtype, copy=False)
    if sinks is not None:  # per head: [h, 1, 1] ([1, 1] for 2-D inputs) -> [h]
        per_head = _unbroadcast(d_sinks, np.shape(core["sinks"])).reshape(np.shape(sinks))
        extras["dsinks"] = per_head.astype(np.asarray(sinks).dtype, copy=False)
    return (*grads, extras)


@dataclass(frozen=True)
class GradCheck:
    """The outcome of `gradcheck`: one row per sampled parameter, and the worst relative difference."""

    max_rel_diff: float
    samples: tuple[tuple[str, tuple[int, ...], float, float, float], ...]
    """(name, index, analytic, numeric, relative difference) for each sampled parameter."""


def relative_difference(analytic: float, numeric: float, floor: float) -> float:
    """``|a − n| / max(|a|, |n|, floor)``: relative, except for gradients below ``floor`` in size.

    Below the floor the difference is measured against ``floor`` (an absolute test scaled by it),
    because central differences carry an absolute rounding error of about ε·|f|/h that no
    relative test of a near-zero gradient can absorb.
    """
    return abs(analytic - numeric) / max(abs(analytic), abs(numeric), floor)


def _sample_indices(
    params: Mapping[str, Array], n_samples: int | None, rng: np.random.Generator
) -> list[tuple[str, tuple[int, ...]]]:
    """``n_samples`` flat positions spread over the arrays in turn (every entry when None)."""
    names = list(params)
    if n_samples is None:
        return [(name, idx) for name in names for idx in np.ndindex(params[name].shape)]
    per_array = [n_samples // len(names) + (i < n_samples % len(names)) for i in range(len(names))]
    picked = []
    for name, count in zip(names, per_array, strict=True):
        shape = params[name].shape
        flat = rng.choice(int(np.prod(shape)), size=min(count, int(np.prod(shape))), replace=False)
        picked += [(name, tuple(int(i) for i in np.unravel_index(f, shape))) for f in sorted(flat)]
    return picked


def gradcheck(
    f: Callable[[Mapping[str, Array]], float],
    params: Mapping[str, Any],
    grads: Mapping[str, Any],
    *,
    n_samples: int | None = 24,
    eps: float = 1e-6,
    floor: float = 1e-8,
    seed: int = 0,
) -> GradCheck:
    """Compare analytic gradients with central differences ``(f(θ + h) − f(θ − h)) / 2h``.

    Args:
      f: the scalar loss as a function of ``params`` (a mapping name → array); called with copies.
      params: the point to check at; float64 arrays (float32 central differences are noise).
      grads: the analytic ``∂f/∂params``, same names and shapes.
      n_samples: how many parameters to nudge, spread evenly over the arrays (so every matrix is
        checked); None checks every entry.
      eps: the step h. The error is O(h²) from truncation plus O(ε_float·|f|/h) from rounding;
        1e-6 balances the two for losses of order 1 in float64.
      floor: gradients smaller than this are compared absolutely (see `relative_difference`).
      seed: picks the sampled positions.

    Returns:
      `GradCheck` with the maximum relative difference over the sampled parameters.
    """
    point = {name: np.array(p, copy=True) for name, p in params.items()}
    if not point:
        raise ValueError("params must hold at least one array")
    for name, p in point.items():
        if p.dtype != np.float64:
            raise TypeError(f"params[{name!r}] must be float64 for central differences, got {p.dtype}")
        g = np.asarray(grads.get(name)) if name in grads else None
        if g is None or g.shape != p.shape:
            got = "missing" if g is None else f"shape {g.shape}"
            raise ValueError(f"grads[{name!r}] must have the shape of params[{name!r}] {p.shape}, got {got}")
    if not (eps > 0 and np.isfinite(eps)):
        raise ValueError(f"eps must be a positive finite step, got {eps}")
    if n_samples is not None and (isinstance(n_samples, bool) or n_samples < 1):
        raise ValueError(f"n_samples must be a positive integer or None, got {n_samples!r}")

    rows = []
    for name, idx in _sample_indices(point, n_samples, np.random.default_rng(seed)):
        original = point[name][idx]
        point[name][idx] = original + eps
        up = float(f(point))
        point[name][idx] = original - eps
        down = float(f(point))
        point[name][idx] = original
        numeric = (up - down) / (2 * eps)
        analytic = float(np.asarray(grads[name])[idx])
        rows.append((name, idx, analytic, numeric, relative_difference(analytic, numeric, floor)))
    # np.max, not max(): a NaN difference must surface, whatever its position.
    return GradCheck(max_rel_diff=float(np.max([r[4] for r in rows])), samples=tuple(rows))
