"""The oracle: attention in float64, forward (out, weights, lse) and backward, with its own
visibility builders.

Everything here is written from the definitions, independently of :mod:`impl` (an off-by-one
shared by the reference and its oracle would pass silently), in log-sum-exp form:

    s   = scale · q kᵀ                       scores
    s   = c · tanh(s / c)                    softcap=c (before the bias, so a hidden key stays hidden)
    s   = s + bias                           bias= (−inf hides a key)
    s   = −inf where not visible             causal / mask / window / kv_lengths
    lse = log(Σ_j exp(s_j) + exp(sink))      sinks=: one extra logit per query head, no value
    p   = exp(s − lse),  out = p v           a row that sees nothing: lse = −inf, out = 0

Visibility: query i sees key j when every declared restriction allows it — ``causal`` (j ≤ diag),
``window=(left, right)`` (diag − left ≤ j ≤ diag + right), ``kv_lengths`` (j < kv_lengths[b]) and
a boolean ``mask`` (True = may attend) — where ``diag`` is i (top-left alignment) or
i + n_k − n_q (bottom-right).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Array = np.ndarray
Alignment = Literal["top_left", "bottom_right"]


def diagonal(n_q: int, n_k: int, align: Alignment) -> Array:  # -> [n_q, 1] int
    """Each query's diagonal key: i (top-left) or i + n_k − n_q (bottom-right)."""
    if align not in ("top_left", "bottom_right"):
        raise ValueError(f"align must be 'top_left' or 'bottom_right', got {align!r}")
    shift = 0 if align == "top_left" else n_k - n_q
    return np.arange(n_q)[:, None] + shift


def causal_visible(n_q: int, n_k: int, align: Alignment = "top_left") -> Array:  # -> [n_q, n_k] bool
    """Query i sees key j when j ≤ diag(i)."""
    return np.arange(n_k)[None, :] <= diagonal(n_q, n_k, align)


def window_visible(
    n_q: int, n_k: int, window: tuple[int, int], align: Alignment = "top_left"
) -> Array:  # -> [n_q, n_k] bool
    """Query i sees key j when diag(i) − left ≤ j ≤ diag(i) + right."""
    left, right = window
    if int(left) != left or int(right) != right or left < 0 or right < 0:
        raise ValueError(f"window must be two integers >= 0, got {window!r}")
    j, diag = np.arange(n_k)[None, :], diagonal(n_q, n_k, align)
    return (j >= diag - left) & (j <= diag + right)


def lengths_visible(kv_lengths: Array, n_k: int) -> Array:  # [batch] -> [batch, 1, 1, n_k] bool
    """Batch row b sees keys j < kv_lengths[b] (broadcasts over heads and queries)."""
    lengths = np.asarray(kv_lengths)
    if lengths.ndim != 1 or lengths.dtype.kind not in "iu":
        raise ValueError(f"kv_lengths must be a 1-D integer array [batch], "
                         f"got {lengths.dtype} {lengths.shape}")
    return (np.arange(n_k) < lengths[:, None])[:, None, None, :]


def visibility(
    lead: tuple[int, ...], n_q: int, n_k: int, *, causal: bool = False, align: Alignment = "top_left",
    mask: Array | None = None, window: tuple[int, int] | None = None, kv_lengths: Array | None = None,
) -> Array:  # -> [*lead, n_q, n_k] bool
    """Every restriction ANDed: what each query may see."""
    keep = np.ones((*lead, n_q, n_k), dtype=bool)
    if causal:
        keep &= causal_visible(n_q, n_k, align)
    if window is not None:
        keep &= window_visible(n_q, n_k, window, align)
    if kv_lengths is not None:
        keep &= lengths_visible(kv_lengths, n_k)
    if mask is not None:
        keep &= np.asarray(mask, dtype=bool)
    return keep


def _with_kv_heads(q: Array, x: Array) -> Array:  # [..., g, n, d] -> [..., h, n, d]
    """Grouped K/V heads repeated so that query head i reads K/V head i // (h // g)."""
    if x.ndim >= 3 and q.ndim == x.ndim and x.shape[-3] != q.shape[-3]:
        return np.repeat(x, q.shape[-3] // x.shape[-3], axis=-3)
    return x


def scores(
    q: Array, k: Array, *, visible: Array, scale: float,
    bias: Array | None = None, softcap: float | None = None,
) -> Array:  # [..., n_q, d_k], [..., n_k, d_k] -> [..., n_q, n_k] float64, -inf where hidden
    """The final scores, in float64: scaled, capped, biased, masked."""
    q64 = np.asarray(q, dtype=np.float64)
    k64 = _with_kv_heads(q64, np.asarray(k, dtype=np.float64))
    s = (q64 @ np.swapaxes(k64, -1, -2)) * scale
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    if bias is not None:
        s = s + np.asarray(bias, dtype=np.float64)
    return np.where(visible, s, -np.inf)


def _sink_logits(q: Array, sinks: Array) -> Array:  # [heads] -> broadcastable to [..., n_q]
    s = np.asarray(sinks, dtype=np.float64)
    return s[:, None] if q.ndim >= 3 else s


def forward(
    q: Array, k: Array, v: Array, *, visible: Array, scale: float,
    bias: Array | None = None, softcap: float | None = None, sinks: Array | None = None,
) -> tuple[Array, Array, Array]:
    """float64 ``(out, weights, lse)``; a row that sees nothing gives zeros and lse = −inf.

    [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v], visible [..., n_q, n_k]
    -> out [..., n_q, d_v], weights [..., n_q, n_k], lse [..., n_q]

    ``sinks`` [heads] ([1] for 2-D inputs) joins each row's denominator, so a row's weights sum
    to 1 − its sink's weight; a row that sees no key but has a finite sink has lse = sink, out = 0.
    """
    s = scores(q, k, visible=visible, scale=scale, bias=bias, softcap=softcap)
    top = np.max(s, axis=-1, initial=-np.inf)
    if sinks is not None:
        top = np.maximum(top, np.broadcast_to(_sink_logits(q, sinks), top.shape))
    shift = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):  # log(0) = -inf: a row that sees nothing
        total = np.sum(np.exp(s - shift[..., None]), axis=-1)
        if sinks is not None:
            total = total + np.exp(_sink_logits(q, sinks) - shift)
        lse = shift + np.log(total)
    finite = np.where(np.isfinite(lse), lse, 0.0)[..., None]
    weights = np.where(np.isfinite(s) & np.isfinite(lse)[..., None], np.exp(s - finite), 0.0)
    v64 = _with_kv_heads(np.asarray(q), np.asarray(v, dtype=np.float64))
    return weights @ v64, weights, lse


def backward(
    q: Array, k: Array, v: Array, d_out: Array, *, visible: Array, scale: float
) -> tuple[Array, Array, Array, Array]:
    """float64 ``(dq, dk, dv)`` of ``L = Σ out ∘ d_out`` through the explicit softmax Jacobian,
    and the pattern P.

    [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v], [..., n_q, d_v], [..., n_q, n_k]
    -> [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v], [..., n_q, n_k]

    Row i of ``dS`` is ``J_i dP_i`` with ``J_i = diag(p_i) − p_i p_iᵀ`` formed in full
    (n_q·n_k² entries per slice: keep n ≤ 64). Hidden keys have p = 0, so their row and column of
    J are zero and they get no gradient; no ``D = rowsum(dO ∘ O)`` shortcut is used.
    """
    q64, k64, v64, do64 = (np.asarray(x, dtype=np.float64) for x in (q, k, v, d_out))
    _, p, _ = forward(q64, k64, v64, visible=visible, scale=scale)
    p = np.broadcast_to(p, (*do64.shape[:-1], k64.shape[-2]))
    jac = p[..., :, None] * np.eye(p.shape[-1]) - p[..., :, None] * p[..., None, :]  # [..., n_q, n_k, n_k]
    dp = do64 @ np.swapaxes(v64, -1, -2)  # [..., n_q, n_k]
    ds = np.einsum("...ij,...ijl->...il", dp, jac)  # J is symmetric: J dP = dP J
    return ds @ k64 * scale, np.swapaxes(ds, -1, -2) @ q64 * scale, np.swapaxes(p, -1, -2) @ do64, p
