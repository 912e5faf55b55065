"""Gallery of the keyword-pair laws: kernels right under every keyword alone and wrong under two
together, each rejected by its pair law (and passed by every single-keyword law)."""

from __future__ import annotations

from typing import Any

import numpy as np

from gallery._keywords import KEYWORDS, scale_for, sink_logits, softmax_with_sinks, visible
from gallery.alibi import slopes_bias, with_alibi
from gallery.base import broken, scores
from gallery.gradients import _keyword_bug, _stretched
from impl.attention import compute_dtype
from impl.grad import attention_backward

Array = np.ndarray


def alibi_before_softcap(q: Array, k: Array, v: Array, *, alibi_slopes: Any = None, softcap: Any = None,
                         scale: Any = None, bias: Any = None, causal: bool = False, mask: Any = None,
                         window: Any = None, sinks: Any = None) -> Array:
    """ALiBi's term added to the scores before the cap, so the cap bends it: c·tanh((s + a)/c)
    instead of c·tanh(s/c) + a. Either keyword alone is right."""
    if alibi_slopes is None or softcap is None:
        return with_alibi()(q, k, v, alibi_slopes=alibi_slopes, softcap=softcap, scale=scale, bias=bias,
                            causal=causal, mask=mask, window=window, sinks=sinks)
    s = scores(q, k, scale_for(q, scale))
    s = s + slopes_bias(q, k, alibi_slopes).astype(s.dtype)
    s = s.dtype.type(softcap) * np.tanh(s / s.dtype.type(softcap))
    s = s + (0 if bias is None else np.asarray(bias).astype(s.dtype))
    s = np.where(visible(q.shape[-2], k.shape[-2], causal=causal, mask=mask, window=window), s, -np.inf)
    w = softmax_with_sinks(s, sink_logits(q, sinks, s.dtype))
    return (w @ v.astype(w.dtype)).astype(q.dtype)


def dbias_through_softcap(q: Array, k: Array, v: Array, d_out: Array, *, bias: Any = None,
                          softcap: Any = None, scale: Any = None, **kw: Any) -> Any:
    """dbias taken after the softcap's derivative, dS·(1 − tanh²(r/c)), as if the bias were added
    to the scores before the cap (it is added after: its gradient is dS itself)."""
    if bias is None or softcap is None:
        *grads, extras = attention_backward(q, k, v, d_out, bias=bias, softcap=softcap, scale=scale,
                                            return_extras=True, **kw)
        return (*grads, extras)
    full = np.broadcast_to(bias, (*np.broadcast_shapes(q.shape[:-2], k.shape[:-2]), q.shape[-2], k.shape[-2]))
    *grads, extras = attention_backward(q, k, v, d_out, bias=np.ascontiguousarray(full), softcap=softcap,
                                        scale=scale, return_extras=True, **kw)
    work = compute_dtype(q.dtype)
    bent = 1 - np.tanh(scores(q, k, scale_for(q, scale)) / work.type(softcap)) ** 2
    dbias = extras["dbias"].astype(work) * bent
    summed = _stretched(np.shape(bias), full.shape)
    dbias = dbias.sum(axis=summed, keepdims=True) if summed else dbias
    return (*grads, {"dbias": dbias.reshape(np.shape(bias)).astype(np.asarray(bias).dtype)})


def softcap_dropped_when_packed(q: Array, k: Array, v: Array, d_out: Array, **kw: Any) -> Any:
    """A packed (varlen) backward that leaves out the softcap: its dense path caps, its packed one
    does not."""
    if kw.get("cu_seqlens_q") is not None:
        kw.pop("softcap", None)
    return attention_backward(q, k, v, d_out, **kw)


BROKEN = [
    broken(alibi_before_softcap, "keyword_pairs_match_golden",
           "ALiBi's term added before the softcap (the cap bends it)", supports_alibi=True,
           ndims=(2, 3, 4), empty_keys="raise", **KEYWORDS),  # textbook: max over no keys raises
    _keyword_bug(dbias_through_softcap, "grad_keyword_pairs_match_golden",
                 "dbias carries the softcap's derivative (the bias is added after the cap)",
                 supports_bias=True, supports_softcap=True, grad_extras=("dbias",)),
    _keyword_bug(softcap_dropped_when_packed, "grad_keyword_pairs_match_golden",
                 "a packed (varlen) backward that leaves out the softcap", supports_varlen=True,
                 supports_softcap=True),
]

CORRECT: list[Any] = []  # every keyword variant of the other families declares pairs and must pass them
