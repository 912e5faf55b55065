"""The gallery for spec.laws.gradients and spec.laws.grad_keywords: backward passes (a target's
``grad_fn``), each broken one changing the textbook backward (or impl's backward) in one named
place, and correct ones computing it another way.

The forward is `impl.attention` (`impl.flash_attention` for the backward handed its
forward's residuals) throughout, so only the backward is on trial.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gallery._keywords import visible
from gallery.base import broken, scores
from impl import attention, flash_attention, flash_attention_backward
from impl.attention import compute_dtype
from impl.grad import attention_backward
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
    """A ``grad_fn`` that is the textbook backward with ``bug`` (one of `BUGS`; "" = none)."""
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
"""The one-place bugs of `textbook_backward`, each rejected by grad_matches_golden."""


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
    """`reordered` for a target in (batch, n, heads, d) layout, behind transposes."""
    dq, dk, dv = reordered(*(_to_bhnd(x) for x in (q, k, v, d_out)), causal=causal)
    return _to_bhnd(dq), _to_bhnd(dk), _to_bhnd(dv)


def bnhd_forward(q: Array, k: Array, v: Array, *, causal: bool = False) -> Array:
    return _to_bhnd(attention(_to_bhnd(q), _to_bhnd(k), _to_bhnd(v), causal=causal))


# --- the backward under keywords: impl's backward with one thing changed ------------------------


def backward_without(*dropped: str) -> Any:
    """A ``grad_fn`` that is impl's backward with the keyword arguments ``dropped`` left out: the
    forward honours them, the backward's recomputed pattern does not."""
    def grad_fn(q: Array, k: Array, v: Array, d_out: Array, **kw: Any) -> Grads:
        return attention_backward(q, k, v, d_out, **{n: x for n, x in kw.items() if n not in dropped})

    grad_fn.__name__ = "backward_without_" + "_".join(dropped)
    return grad_fn


def softcap_derivative_forgotten(q: Array, k: Array, v: Array, d_out: Array, *, softcap: Any = None,
                                 scale: Any = None, **kw: Any) -> Grads:
    """dq and dk from dS at the capped scores, never multiplied by the cap's derivative 1 − tanh²."""
    dq, dk, dv = attention_backward(q, k, v, d_out, softcap=softcap, scale=scale, **kw)
    if softcap is None:
        return dq, dk, dv
    work = compute_dtype(q.dtype)
    zero = np.zeros((*np.broadcast_shapes(q.shape[:-2], k.shape[:-2]), q.shape[-2], k.shape[-2]), q.dtype)
    *_, extras = attention_backward(q, k, v, d_out, softcap=softcap, scale=scale, bias=zero,
                                    return_extras=True, **kw)
    ds = extras["dbias"].astype(work)  # the gradient of the capped scores
    s = work.type(1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    return (ds @ k.astype(work) * s).astype(q.dtype), (_swap(ds) @ q.astype(work) * s).astype(q.dtype), dv


def filled_backward(fill: float) -> Any:
    """The textbook backward whose recomputed softmax puts ``fill`` on hidden keys (−1e9: a row
    that sees nothing is uniform; −inf without a guard: it is 0/0 = NaN), while the forward
    (impl) gives such a row zeros."""
    def grad_fn(q: Array, k: Array, v: Array, d_out: Array, *, causal: bool = False,
                mask: Any = None) -> Grads:
        work = compute_dtype(q.dtype)
        s = scores(q, k, 1 / math.sqrt(q.shape[-1]))
        seen = visible(q.shape[-2], k.shape[-2], causal=causal, mask=mask, window=None)
        s = np.where(seen, s, work.type(fill))
        with np.errstate(invalid="ignore"):
            e = np.exp(s - s.max(axis=-1, keepdims=True))
            p = e / e.sum(axis=-1, keepdims=True)
        do, vw = d_out.astype(work), v.astype(work)
        dp = do @ _swap(vw)
        ds = p * (dp - np.sum(p * dp, axis=-1, keepdims=True))
        scale = work.type(1 / math.sqrt(q.shape[-1]))
        grads = (ds @ k.astype(work) * scale, _swap(ds) @ q.astype(work) * scale, _swap(p) @ do)
        return tuple(g.astype(q.dtype) for g in grads)

    grad_fn.__name__ = f"fill_{fill:g}_backward"
    return grad_fn


def _stretched(shape: tuple[int, ...], full: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(i for i, (n, m) in enumerate(zip(shape, full, strict=True)) if n == 1 and m != 1)


def dbias_one_slice(q: Array, k: Array, v: Array, d_out: Array, *, bias: Any = None, **kw: Any) -> Any:
    """dbias of a broadcast bias taken from its first copy (head 0 or batch row 0), not summed."""
    if bias is None:
        return (*attention_backward(q, k, v, d_out, **kw), {})
    full = np.broadcast_to(bias, (*np.broadcast_shapes(q.shape[:-2], k.shape[:-2]), q.shape[-2], k.shape[-2]))
    *grads, extras = attention_backward(q, k, v, d_out, bias=np.ascontiguousarray(full), return_extras=True,
                                        **kw)
    first = tuple(slice(0, 1) if i in _stretched(np.shape(bias), full.shape) else slice(None)
                  for i in range(full.ndim))
    return (*grads, {"dbias": np.ascontiguousarray(extras["dbias"][first])})


def dsinks_per_kv_head(q: Array, k: Array, v: Array, d_out: Array, *, sinks: Any = None, **kw: Any) -> Any:
    """dsinks accumulated per K/V head: each query head is given its group's sum."""
    *grads, extras = attention_backward(q, k, v, d_out, sinks=sinks, return_extras=True, **kw)
    if sinks is None:
        return (*grads, {})
    d = extras["dsinks"]
    g = k.shape[-3] if k.ndim >= 3 else 1
    return (*grads, {"dsinks": np.repeat(d.reshape(g, -1).sum(axis=1), d.size // g).astype(d.dtype)})


def gqa_first_head(q: Array, k: Array, v: Array, d_out: Array, **kw: Any) -> Grads:
    """dk and dv of each grouped K/V head taken from the first query head of its group."""
    if k.ndim < 3 or k.shape[-3] == q.shape[-3]:
        return attention_backward(q, k, v, d_out, **kw)
    group = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)  # one K/V head per query head
    dq, dk, dv = attention_backward(q, k, v, d_out, **kw)
    return dq, np.ascontiguousarray(dk[..., ::group, :, :]), np.ascontiguousarray(dv[..., ::group, :, :])


def dropout_next_stream(q: Array, k: Array, v: Array, d_out: Array, *, seed: Any = None, **kw: Any) -> Grads:
    """The backward draws its kept set from the seed's next stream, not the forward's."""
    return attention_backward(q, k, v, d_out, seed=None if seed is None else seed + 1, **kw)


def dropout_unscaled(q: Array, k: Array, v: Array, d_out: Array, *, dropout_p: float = 0.0,
                     **kw: Any) -> Grads:
    """The kept weights' 1/(1 − p) left out of the backward (every gradient shrinks by 1 − p)."""
    grads = attention_backward(q, k, v, d_out, dropout_p=dropout_p, **kw)
    return tuple((g * g.dtype.type(1 - dropout_p)).astype(g.dtype) for g in grads)


def lse_read_as_base2(q: Array, k: Array, v: Array, d_out: Array, *, out: Any = None, lse: Any = None,
                      **kw: Any) -> Grads:
    """Flash's backward that, handed the forward's natural-log lse, reads it as base 2:
    P = 2^(s·log₂e − lse) = exp(s − lse·ln 2). Recomputing its own lse, it is right."""
    if out is None or lse is None:
        out, lse = flash_attention(q, k, v, return_lse=True, **kw)
        return flash_attention_backward(q, k, v, out, lse, d_out, **kw)
    return flash_attention_backward(q, k, v, out, (lse * np.log(2)).astype(lse.dtype), d_out, **kw)


def _grad(bug: str, catches: str, **declared: Any) -> Any:
    return broken(attention, catches, BUGS[bug], name=bug, ndims=(2, 3, 4), grad_fn=backward_with(bug),
                  **declared)


def _keyword_bug(grad_fn: Any, catches: str, bug: str, **declared: Any) -> Any:
    return broken(attention, catches, bug, name=grad_fn.__name__, ndims=(2, 3, 4), grad_fn=grad_fn,
                  **({"supports_mask": True, "supports_scale": True} | declared))


BROKEN = [
    _grad("no_row_term", "grad_matches_golden"),
    _grad("dk_unscaled", "grad_matches_golden"),
    _grad("dv_transposed", "grad_matches_golden"),
    _grad("causal_ignored", "grad_matches_golden"),
    _grad("causal_ignored", "grad_causal_no_leak"),
    broken(attention, "grad_causal_no_leak", "row max taken before the causal mask in the backward",
           name="max_before_mask_backward", ndims=(2, 3, 4), grad_fn=max_before_mask),
    _keyword_bug(backward_without("mask"), "grad_matches_golden", "mask= left out of the backward"),
    _keyword_bug(backward_without("scale"), "grad_matches_golden",
                 "scale= left out of the backward (1/√d_k used)"),
    _keyword_bug(softcap_derivative_forgotten, "grad_keywords_match_golden",
                 "the softcap's derivative 1 − tanh²(s/c) forgotten", supports_softcap=True),
    _keyword_bug(backward_without("bias"), "grad_keywords_match_golden", "bias= left out of the backward",
                 supports_bias=True),
    _keyword_bug(backward_without("alibi_slopes"), "grad_keywords_match_golden",
                 "alibi_slopes= left out of the backward", supports_alibi=True),
    _keyword_bug(backward_without("window"), "grad_keywords_match_golden", "window= left out of the backward",
                 supports_window=True),
    _keyword_bug(backward_without("attention_chunk"), "grad_keywords_match_golden",
                 "attention_chunk= left out of the backward", supports_chunk=True),
    _keyword_bug(backward_without("kv_lengths"), "grad_keywords_match_golden",
                 "kv_lengths= left out of the backward", supports_kv_lengths=True),
    _keyword_bug(backward_without("cu_seqlens_q", "cu_seqlens_k"), "grad_keywords_match_golden",
                 "packed sequences left out of the backward (keys seen across sequences)",
                 supports_varlen=True),
    _keyword_bug(backward_without("sinks"), "grad_keywords_match_golden",
                 "the sink's share left out of the backward's denominator", supports_sinks=True),
    _keyword_bug(filled_backward(-1e9), "grad_hidden_keys_get_nothing",
                 "hidden keys filled with -1e9 in the backward: an empty row is uniform, feeds unseen keys",
                 supports_scale=False),
    _keyword_bug(filled_backward(-np.inf), "grad_hidden_keys_get_nothing",
                 "a plain softmax in the backward: an empty row is 0/0 = NaN", supports_scale=False),
    _keyword_bug(dbias_one_slice, "grad_bias_broadcast_summed",
                 "dbias of a broadcast bias taken from its first copy, not summed", supports_bias=True,
                 grad_extras=("dbias",)),
    _keyword_bug(dsinks_per_kv_head, "grad_sinks_per_head", "dsinks summed per K/V head group",
                 supports_sinks=True, supports_gqa=True, grad_extras=("dsinks",)),
    _keyword_bug(gqa_first_head, "grad_gqa_sums_group",
                 "dk, dv of a K/V head from its group's first query head",
                 supports_gqa=True),
    _keyword_bug(dropout_next_stream, "grad_dropout_uses_forward_kept_set",
                 "the backward's kept set drawn from the seed's next stream", supports_dropout=True),
    _keyword_bug(dropout_unscaled, "grad_dropout_uses_forward_kept_set",
                 "the kept weights' 1/(1 − p) left out of the backward", supports_dropout=True),
    broken(flash_attention, "grad_residuals_agree",
           "the forward's natural-log lse read as base 2 by the backward",
           name="lse_read_as_base2", ndims=(2, 3, 4), supports_scale=True, returns_lse=True,
           grad_fn=lse_read_as_base2, grad_takes_residuals=True),
]


def in_float64(q: Array, k: Array, v: Array, d_out: Array, **kw: Any) -> Any:
    """Correct: impl's backward run in float64 on the same inputs, each gradient rounded once to its
    input's dtype (extras included)."""
    wide = {n: x.astype(np.float64) if n in ("bias", "sinks") else x for n, x in kw.items()}
    *grads, extras = attention_backward(*(x.astype(np.float64) for x in (q, k, v, d_out)), return_extras=True,
                                        **wide)
    grads = [g.astype(x.dtype) for g, x in zip(grads, (q, k, v), strict=True)]
    of = {"dbias": "bias", "dsinks": "sinks"}
    return (*grads, {n: g.astype(np.asarray(kw[of[n]]).dtype) for n, g in extras.items()})


def _bnhd(x: Array, packed: bool) -> Array:  # (batch, n, heads, d) <-> (batch, heads, n, d), packed too
    if x.ndim == 4:
        return np.swapaxes(x, 1, 2)
    return np.swapaxes(x, 0, 1) if packed and x.ndim == 3 else x


def bnhd_keywords(q: Array, k: Array, v: Array, **kw: Any) -> Array:
    packed = kw.get("cu_seqlens_q") is not None
    return _bnhd(attention(*(_bnhd(x, packed) for x in (q, k, v)), **kw), packed)


def bnhd_keywords_backward(q: Array, k: Array, v: Array, d_out: Array, **kw: Any) -> Any:
    """Correct: impl's backward behind the transposes of a (batch, n, heads, d) layout."""
    packed = kw.get("cu_seqlens_q") is not None
    *grads, extras = attention_backward(*(_bnhd(x, packed) for x in (q, k, v, d_out)), return_extras=True,
                                        **kw)
    return (*(_bnhd(g, packed) for g in grads), extras)


_EVERY_KEYWORD = {"supports_mask": True, "supports_scale": True, "supports_gqa": True, "supports_bias": True,
                  "supports_window": True, "supports_softcap": True, "supports_sinks": True,
                  "supports_kv_lengths": True, "supports_varlen": True, "grad_extras": ("dbias", "dsinks")}

CORRECT = [
    Target(attention, name="textbook_backward", ndims=(2, 3, 4), grad_fn=backward_with("")),
    Target(attention, name="reordered_backward", ndims=(2, 3, 4), dtypes=("float16", "float32", "float64"),
           grad_fn=reordered),
    Target(bnhd_forward, name="bnhd_backward", layout="bnhd", ndims=(4,), grad_fn=bnhd_backward),
    Target(attention, name="float64_backward", ndims=(2, 3, 4), grad_fn=in_float64, supports_dropout=True,
           supports_alibi=True, **_EVERY_KEYWORD),
    Target(bnhd_keywords, name="bnhd_keywords_backward", layout="bnhd", ndims=(3, 4),
           grad_fn=bnhd_keywords_backward, **_EVERY_KEYWORD),
]
