"""The oracle's engine: attention in float64, forward (out, weights, lse) and backward, from terms.

Everything here is written from the definitions, independently of `impl` (an off-by-one shared by
the reference and its oracle would pass silently), in log-sum-exp form:

    s   = scale · q kᵀ                           scores
    s   = f(s)                                   transforms (softcap: c·tanh(s/c)), in order
    s   = s + A₁ + A₂ + …                        added terms (bias, ALiBi); −inf hides a key
    s   = −inf where not visible                 causal / mask / window / kv_lengths / …
    lse = log(Σ_j exp(s_j) + exp(σ))             σ: a sink logit per row, joining the denominator
    p   = exp(s − lse),  out = (p ∘ keep) v      keep: a dropout multiplier (0 or 1/(1 − p)), if any

A row that sees nothing has lse = −inf (or σ, with a finite sink) and out = 0. The transforms,
added terms and sinks come from the keywords' declarations (`spec.keywords`): this module knows
no keyword by name, so a new keyword never edits it.

Visibility: query i sees key j when every restriction allows it; ``causal`` is j ≤ diag, where
``diag`` is i (top-left alignment) or i + n_k − n_q (bottom-right, and ``kv_lengths`` before a
keyword moves it); a keyword may move the diagonals (packed sequences align each sequence on its
own; key lengths and paged caches each batch row on its own).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

Array = np.ndarray
Alignment = Literal["top_left", "bottom_right", "kv_lengths", "top_left_kv_lengths"]
"""``kv_lengths``: bottom-right per sequence; here, without the lengths, bottom-right (the keyword
``kv_lengths=`` moves each batch row's diagonal: `spec.laws.lengths`). ``top_left_kv_lengths``:
the same per sequence, and top-left without the lengths (ONNX's ``Attention``)."""
Transform = Callable[[Array], Array]


def diagonal(n_q: int, n_k: int, align: Alignment) -> Array:  # -> [n_q, 1] int
    """Each query's diagonal key: i (top-left; top_left_kv_lengths before its lengths move it) or
    i + n_k − n_q (bottom-right; kv_lengths before its lengths move it)."""
    if align not in ("top_left", "bottom_right", "kv_lengths", "top_left_kv_lengths"):
        raise ValueError(f"align must be 'top_left', 'bottom_right', 'kv_lengths' or 'top_left_kv_lengths', "
                         f"got {align!r}")
    shift = 0 if align in ("top_left", "top_left_kv_lengths") else n_k - n_q
    return np.arange(n_q)[:, None] + shift


def causal_visible(n_q: int, n_k: int, align: Alignment = "top_left") -> Array:  # -> [n_q, n_k] bool
    """Query i sees key j when j ≤ diag(i)."""
    return np.arange(n_k)[None, :] <= diagonal(n_q, n_k, align)


def visibility(
    lead: tuple[int, ...], n_q: int, n_k: int, *, causal: bool = False, align: Alignment = "top_left",
    mask: Array | None = None, restrictions: Sequence[Array] = (),
) -> Array:  # -> [*lead, n_q, n_k] bool
    """Every restriction ANDed: what each query may see. ``restrictions`` are boolean arrays
    broadcastable to ``[*lead, n_q, n_k]`` (a keyword's visibility term, already built)."""
    keep = np.ones((*lead, n_q, n_k), dtype=bool)
    if causal:
        keep &= causal_visible(n_q, n_k, align)
    for hidden in restrictions:
        keep &= hidden
    if mask is not None:
        keep &= np.asarray(mask, dtype=bool)
    return keep


def with_kv_heads(q: Array, x: Array) -> Array:  # [..., g, n, d] -> [..., h, n, d]
    """Grouped K/V heads repeated so that query head i reads K/V head i // (h // g)."""
    if x.ndim >= 3 and q.ndim == x.ndim and x.shape[-3] != q.shape[-3]:
        return np.repeat(x, q.shape[-3] // x.shape[-3], axis=-3)
    return x


@dataclass(frozen=True)
class Terms:
    """What the keywords add to plain attention, each already bound to its value, in float64.

    ``transforms`` (s → s, applied in order to the scaled scores) with their derivatives ds'/ds;
    ``added`` arrays broadcastable to ``[..., n_q, n_k]`` (−inf hides a key); ``sinks`` a logit
    per row broadcastable to ``[..., n_q]``; ``keep`` a multiplier of the weights (dropout's
    kept set, 0 or 1/(1 − p)) broadcastable to ``[..., n_q, n_k]``.
    """

    transforms: tuple[tuple[Transform, Transform], ...] = ()
    added: tuple[Array, ...] = ()
    sinks: Array | None = None
    keep: Array | None = field(default=None)


PLAIN = Terms()


def _raw_scores(q: Array, k: Array, scale: float) -> Array:  # -> [..., n_q, n_k] float64
    q64 = np.asarray(q, dtype=np.float64)
    k64 = with_kv_heads(q64, np.asarray(k, dtype=np.float64))
    return (q64 @ np.swapaxes(k64, -1, -2)) * scale


def _finish(s: Array, visible: Array, terms: Terms) -> Array:  # transformed scores -> final scores
    for added in terms.added:
        s = s + np.asarray(added, dtype=np.float64)
    return np.where(visible, s, -np.inf)


def scores(q: Array, k: Array, *, visible: Array, scale: float, terms: Terms = PLAIN) -> Array:
    # [..., n_q, d_k], [..., n_k, d_k] -> [..., n_q, n_k] float64, -inf where hidden
    """The final scores, in float64: scaled, transformed, added to, masked."""
    s = _raw_scores(q, k, scale)
    for f, _ in terms.transforms:
        s = f(s)
    return _finish(s, visible, terms)


def _normalise(s: Array, terms: Terms) -> tuple[Array, Array]:  # final scores -> weights, lse
    top = np.max(s, axis=-1, initial=-np.inf)
    sinks = None if terms.sinks is None else np.broadcast_to(np.asarray(terms.sinks, np.float64), top.shape)
    if sinks is not None:
        top = np.maximum(top, sinks)
    shift = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):  # log(0) = -inf: a row that sees nothing
        total = np.sum(np.exp(s - shift[..., None]), axis=-1)
        if sinks is not None:
            total = total + np.exp(sinks - shift)
        lse = shift + np.log(total)
    finite = np.where(np.isfinite(lse), lse, 0.0)[..., None]
    weights = np.where(np.isfinite(s) & np.isfinite(lse)[..., None], np.exp(s - finite), 0.0)
    return weights, lse


def at_rows(q: Array, rows: Array | None) -> Array:  # [..., n_q, d] -> [..., r, d]
    """The query ``rows`` of ``q`` (every row when None): row i of attention reads q_i alone
    among the queries, so the golden of some rows is that of a call with only those queries,
    given what the keywords make of those rows (``visible`` and ``terms`` at them)."""
    return q if rows is None else np.asarray(q)[..., np.asarray(rows, dtype=np.int64), :]


def forward(
    q: Array, k: Array, v: Array, *, visible: Array, scale: float, terms: Terms = PLAIN,
    rows: Array | None = None,
) -> tuple[Array, Array, Array]:
    """float64 ``(out, weights, lse)``; a row that sees nothing gives zeros and lse = −inf.

    [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v], visible [..., n_q, n_k]
    -> out [..., n_q, d_v], weights [..., n_q, n_k], lse [..., n_q]

    ``rows`` (``[r]`` int, None: every row): only those query rows are evaluated; ``visible``
    and ``terms`` are then those rows' (``[..., r, n_k]``, as `spec.oracle` evaluates them
    there), and so are the results (``[..., r, ...]``).

    With sinks a row's weights sum to 1 − its sink's weight; a row that sees no key but has a
    finite sink has lse = sink, out = 0. ``weights`` are the softmax's, before ``terms.keep``;
    ``out`` uses the kept weights.
    """
    q = at_rows(q, rows)
    weights, lse = _normalise(scores(q, k, visible=visible, scale=scale, terms=terms), terms)
    used = weights if terms.keep is None else weights * terms.keep
    v64 = with_kv_heads(np.asarray(q), np.asarray(v, dtype=np.float64))
    return used @ v64, weights, lse


JACOBIAN_ENTRIES = 2**25
"""The most entries of the softmax's Jacobians (n_k² a row) that `jacobian_product` forms at once."""


def jacobian_product(p: Array, dp: Array) -> Array:  # [..., n_q, n_k], [..., n_q, n_k] -> [..., n_q, n_k]
    """Row i of ``dS = J_i dP_i``, ``J_i = diag(p_i) − p_i p_iᵀ`` the Jacobian of row i's softmax.

    J is formed in full where its n_k² entries a row, over every row, are at most
    `JACOBIAN_ENTRIES` (every backward of the laws' drawn cases: n ≤ 64). Past that (350,000
    keys: 10¹¹ entries a row) it is applied without being formed, ``p_i ∘ dP_i − p_i (p_i · dP_i)``:
    the same product, its sum over the keys taken once instead of once per entry of the row. Both
    read P and dP alone, never the forward's output (the D = rowsum(dO ∘ O) of FlashAttention)."""
    if p.size * p.shape[-1] <= JACOBIAN_ENTRIES:
        eye = np.eye(p.shape[-1])
        jac = p[..., :, None] * eye - p[..., :, None] * p[..., None, :]  # [..., n_q, n_k, n_k]
        return np.einsum("...ij,...ijl->...il", dp, jac)  # J is symmetric: J dP = dP J
    return p * (dp - np.sum(p * dp, axis=-1, keepdims=True))


GRADS = ("dq", "dk", "dv")
"""The names of the gradients of q, k and v, in that order."""


@dataclass(frozen=True)
class Gradients:
    """float64 gradients of ``L = Σ out ∘ d_out``: of q, k, v, of each added term (in the term's
    broadcast shape: sum it back to the shape passed), of the sink logits (per row), and the
    forward pattern P (before ``keep``)."""

    dq: Array
    dk: Array
    dv: Array
    added: tuple[Array, ...]
    sinks: Array | None
    weights: Array


def backward(
    q: Array, k: Array, v: Array, d_out: Array, *, visible: Array, scale: float, terms: Terms = PLAIN,
    rows: Array | None = None,
) -> Gradients:
    """float64 gradients of ``L = Σ out ∘ d_out`` through the explicit softmax Jacobian.

    [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v], [..., n_q, d_v], [..., n_q, n_k] -> Gradients

    ``rows`` (``[r]`` int, None: every row): the upstream gradient is zero off those query rows,
    and ``d_out``, ``visible`` and ``terms`` are given at them (``[..., r, ...]``); then dq is zero
    off them and is given at them (``[..., r, d_k]``), as are the added terms' and sinks'
    gradients and the weights, while dk and dv are sums over those rows alone: the whole backward,
    exact, at the cost of those rows.

    With P the weights and K = keep (1 without dropout), ``out = (P ∘ K) v``, so ``dv = (P ∘ K)ᵀ dO``
    and ``dP = (dO vᵀ) ∘ K``. Row i of ``dS`` is ``J_i dP_i`` with ``J_i = diag(p_i) − p_i p_iᵀ``
    (`jacobian_product`: formed in full where its n_k² entries a row fit, keep n ≤ 64; past that
    applied without being formed); a sink takes part in the softmax
    without a value, so its own entry of J is not formed: ``dσ_i = −p_σ,i · (p_i · dP_i)``. Hidden
    keys have p = 0, so their row and column of J are zero and they get no gradient. ``dS`` then
    flows back through each transform (times its derivative, last first) to ``dq = dS k · scale``,
    ``dk = dSᵀ q · scale``; each added term's gradient is ``dS`` itself. No
    ``D = rowsum(dO ∘ O)`` shortcut is used: nothing here reads the forward's output.
    """
    q64, k64, v64, do64 = (np.asarray(x, dtype=np.float64) for x in (at_rows(q, rows), k, v, d_out))
    raw = _raw_scores(q64, k64, scale)
    stages = [raw]
    for f, _ in terms.transforms:
        stages.append(f(stages[-1]))
    p, lse = _normalise(_finish(stages[-1], visible, terms), terms)
    p = np.broadcast_to(p, (*do64.shape[:-1], p.shape[-1]))
    keep = 1.0 if terms.keep is None else np.asarray(terms.keep, dtype=np.float64)
    kv = with_kv_heads(q64, v64)
    dp = (do64 @ np.swapaxes(kv, -1, -2)) * keep  # [..., n_q, n_k]
    ds = jacobian_product(p, dp)
    d_sinks = None
    if terms.sinks is not None:
        sink = np.broadcast_to(np.asarray(terms.sinks, np.float64), lse.shape)
        p_sink = np.where(np.isfinite(lse), np.exp(sink - np.where(np.isfinite(lse), lse, 0.0)), 0.0)
        d_sinks = -p_sink * np.sum(p * dp, axis=-1)
    d_added = tuple(ds for _ in terms.added)
    for (_, derivative), before in zip(reversed(terms.transforms), reversed(stages[:-1]), strict=True):
        ds = ds * derivative(before)
    kq = with_kv_heads(q64, k64)
    dq = ds @ kq * scale
    dk = np.swapaxes(ds, -1, -2) @ q64 * scale
    dv = np.swapaxes(p * keep, -1, -2) @ do64
    if kv.shape != v64.shape:  # grouped K/V heads: each K/V head sums its group's gradients
        group = q64.shape[-3] // v64.shape[-3]
        dk = dk.reshape(*dk.shape[:-3], v64.shape[-3], group, *dk.shape[-2:]).sum(axis=-3)
        dv = dv.reshape(*dv.shape[:-3], v64.shape[-3], group, *dv.shape[-2:]).sum(axis=-3)
    return Gradients(dq, dk, dv, d_added, d_sinks, p)
