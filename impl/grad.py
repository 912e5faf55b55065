"""Gradients of attention written by hand, and a central-difference checker.

With ``S = q kᵀ · scale`` (−∞ where a key is hidden), ``P = softmax(S)`` row by row and
``O = P v``, an upstream gradient ``dO`` flows back as

    dv = Pᵀ dO
    dP = dO vᵀ
    dS = P ∘ (dP − D),   D = rowsum(dO ∘ O) = rowsum(P ∘ dP)
    dq = dS k · scale,   dk = dSᵀ q · scale

``dS`` is ``dP`` pushed through the softmax Jacobian ``diag(p) − p pᵀ`` of each row; writing its
``pᵀ dP`` term as ``D = rowsum(dO ∘ O)`` is the form of FlashAttention-2 (Dao, 2023, Algorithm 2),
which needs only the output, not the pattern, to form it. Hidden keys have ``P = 0`` and so
receive no gradient; a query row with no visible key has ``P = 0`` throughout and gets zeros, the
gradient of the zero output that :func:`impl.attention` returns for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from impl.attention import Array, attention, check_mask, check_qkv, check_scale, compute_dtype


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


def attention_backward(
    q: Any,
    k: Any,
    v: Any,
    d_out: Any,
    *,
    causal: bool = False,
    mask: Any = None,
    scale: float | None = None,
) -> tuple[Array, Array, Array]:  # [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v], [..., n_q, d_v]
    """Gradients ``(dq, dk, dv)`` of ``attention(q, k, v, ...)`` for the upstream gradient ``d_out``.

    Args:
      q, k, v, causal, mask, scale: as for :func:`impl.attention` (same validation, same errors).
      d_out: ``∂loss/∂out``, the shape of the output ``[..., n_q, d_v]`` (leading dims broadcast
        from q, k and v) and the dtype of q.

    Returns:
      ``dq [..., n_q, d_k]``, ``dk [..., n_k, d_k]``, ``dv [..., n_k, d_v]``, each in the shape and
      dtype of its own input: where an input was broadcast over leading dims, its gradient is
      summed over them. The maths runs in :func:`impl.attention.compute_dtype`.

    >>> q = np.zeros((1, 2)); k = np.zeros((2, 2)); v = np.array([[1.0], [3.0]])
    >>> dq, dk, dv = attention_backward(q, k, v, np.ones((1, 1)))
    >>> dv.ravel()  # uniform weights: each value gets half of dO
    array([0.5, 0.5])
    """
    q, k, v, batch = check_qkv(q, k, v)
    n_q, d_k = q.shape[-2:]
    d_v = v.shape[-1]
    scale = check_scale(scale, d_k)
    d_out = _check_d_out(d_out, q.dtype, (*batch, n_q, d_v))
    if mask is not None:
        mask = check_mask(mask, (*batch, n_q, k.shape[-2]))
    work = compute_dtype(q.dtype)
    q_, k_, v_, do = (x.astype(work, copy=False) for x in (q, k, v, d_out))
    # Views at the full leading shape, so the pattern has the shape of d_out's rows even when
    # only v carries a leading dim.
    q_ = np.broadcast_to(q_, (*batch, *q.shape[-2:]))
    k_ = np.broadcast_to(k_, (*batch, *k.shape[-2:]))

    # The forward pattern, recomputed by the forward itself (the validation above already ran).
    _, p = attention(q_, k_, v_, causal=causal, mask=mask, scale=scale, return_weights=True)
    out = p @ v_  # [..., n_q, d_v], kept in the compute dtype for D
    dv = _swap(p) @ do  # [..., n_k, n_q] @ [..., n_q, d_v]
    dp = do @ _swap(v_)  # [..., n_q, d_v] @ [..., d_v, n_k]
    d_row = np.sum(do * out, axis=-1, keepdims=True)  # D: [..., n_q, 1]
    ds = p * (dp - d_row)  # softmax Jacobian; hidden keys (p = 0) get exactly 0
    dq = (ds @ k_) * work.type(scale)  # [..., n_q, n_k] @ [..., n_k, d_k]
    dk = (_swap(ds) @ q_) * work.type(scale)  # [..., n_k, n_q] @ [..., n_q, d_k]
    return tuple(  # type: ignore[return-value]
        _unbroadcast(g, x.shape).astype(x.dtype, copy=False) for g, x in ((dq, q), (dk, k), (dv, v))
    )


@dataclass(frozen=True)
class GradCheck:
    """The outcome of :func:`gradcheck`: one row per sampled parameter, and the worst relative difference."""

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
      floor: gradients smaller than this are compared absolutely (see :func:`relative_difference`).
      seed: picks the sampled positions.

    Returns:
      :class:`GradCheck` with the maximum relative difference over the sampled parameters.
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
