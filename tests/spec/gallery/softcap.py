"""Gallery of the softcap laws: broken caps, each rejected by its law, and a correct variant
that walks the keys in tiles with an online softmax."""

from __future__ import annotations

from typing import Any

import numpy as np

from gallery._keywords import KEYWORDS, final_scores, scale_for, sink_logits, softmax_with_sinks, visible
from gallery.base import broken, scores
from spec import Target

Array = np.ndarray


def _finish(q: Array, v: Array, s: Array, sinks: Any) -> Array:
    w = softmax_with_sinks(s, sink_logits(q, sinks, s.dtype))
    return (w @ v.astype(w.dtype)).astype(q.dtype)


def _hide(q: Array, k: Array, s: Array, causal: bool, mask: Any, window: Any) -> Array:
    return np.where(visible(q.shape[-2], k.shape[-2], causal=causal, mask=mask, window=window), s, -np.inf)


def cap_before_scale(q: Array, k: Array, v: Array, *, softcap: Any = None, scale: Any = None,
                     causal: bool = False, mask: Any = None, window: Any = None, bias: Any = None,
                     sinks: Any = None) -> Array:
    s = scores(q, k, 1.0)
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)  # capped before the scale: c·tanh(q·k/c)·scale
    s = s * s.dtype.type(scale_for(q, scale)) + (0 if bias is None else np.asarray(bias).astype(s.dtype))
    return _finish(q, v, _hide(q, k, s, causal, mask, window), sinks)


def _tanh_by_exp(x: Array) -> Array:
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(2 * x)
        return (e - 1) / (e + 1)  # inf/inf = NaN for large x


def cap_tanh_overflows(q: Array, k: Array, v: Array, *, softcap: Any = None, scale: Any = None,
                       causal: bool = False, mask: Any = None, window: Any = None, bias: Any = None,
                       sinks: Any = None) -> Array:
    s = scores(q, k, scale_for(q, scale))
    if softcap is not None:
        s = softcap * _tanh_by_exp(s / s.dtype.type(softcap))
    s = s + (0 if bias is None else np.asarray(bias).astype(s.dtype))
    return _finish(q, v, _hide(q, k, s, causal, mask, window), sinks)


def _tanh_by_two_exponentials(x: Array) -> Array:
    with np.errstate(over="ignore", invalid="ignore"):
        up, down = np.exp(x), np.exp(-x)
        return (up - down) / (up + down)  # inf/inf = NaN once |x| > 88.7 in float32


def cap_by_exponentials(q: Array, k: Array, v: Array, *, softcap: Any = None, scale: Any = None,
                        causal: bool = False, mask: Any = None, window: Any = None, bias: Any = None,
                        sinks: Any = None) -> Array:
    """c·(e^(s/c) − e^(−s/c))/(e^(s/c) + e^(−s/c)), as a Triton kernel writes tanh: NaN for |s/c| past
    the exponential's range (88.7 in float32)."""
    s = scores(q, k, scale_for(q, scale))
    if softcap is not None:
        c = s.dtype.type(softcap)
        s = c * _tanh_by_two_exponentials(s / c)
    s = s + (0 if bias is None else np.asarray(bias).astype(s.dtype))
    return _finish(q, v, _hide(q, k, s, causal, mask, window), sinks)


def cap_one_sided(q: Array, k: Array, v: Array, *, softcap: Any = None, scale: Any = None,
                  causal: bool = False, mask: Any = None, window: Any = None, bias: Any = None,
                  sinks: Any = None) -> Array:
    s = scores(q, k, scale_for(q, scale))
    if softcap is not None:
        s = np.where(s > 0, softcap * np.tanh(s / softcap), s)  # only positive scores capped
    s = s + (0 if bias is None else np.asarray(bias).astype(s.dtype))
    return _finish(q, v, _hide(q, k, s, causal, mask, window), sinks)


def cap_after_mask(q: Array, k: Array, v: Array, *, softcap: Any = None, **kw: Any) -> Array:
    s = final_scores(q, k, **{n: x for n, x in kw.items() if n != "sinks"})  # hidden: −inf
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)  # c·tanh(−inf) = −c: hidden keys get weight again
    return _finish(q, v, s, kw.get("sinks"))


def cap_without_c(q: Array, k: Array, v: Array, *, softcap: Any = None, scale: Any = None,
                  causal: bool = False, mask: Any = None, window: Any = None, bias: Any = None,
                  sinks: Any = None) -> Array:
    s = scores(q, k, scale_for(q, scale))
    if softcap is not None:
        s = np.tanh(s)  # the c factors forgotten: every score squashed into [−1, 1]
    s = s + (0 if bias is None else np.asarray(bias).astype(s.dtype))
    return _finish(q, v, _hide(q, k, s, causal, mask, window), sinks)


def _declared(fn: Any, catches: str, bug: str, **more: Any) -> Any:
    return broken(fn, catches, bug, **(KEYWORDS | {"ndims": (2, 3, 4)} | more))


BROKEN = [
    _declared(cap_before_scale, "softcap_matches_golden",
              "cap applied before the scale: c·tanh(q·k/c)·scale"),
    _declared(cap_tanh_overflows, "softcap_bounds_scores",
              "tanh as (e^(2x) − 1)/(e^(2x) + 1): inf/inf = NaN for large logits"),
    _declared(cap_by_exponentials, "softcap_bounds_scores",
              "tanh as (e^x − e^(−x))/(e^x + e^(−x)): inf/inf = NaN once |s/c| > 88.7 in float32"),
    _declared(cap_one_sided, "softcap_bounds_scores", "only positive scores capped", name="cap_one_sided"),
    _declared(cap_after_mask, "softcap_keeps_hidden_keys_hidden",
              "cap applied after the mask: −inf becomes −c and hidden keys get weight"),
    _declared(cap_without_c, "softcap_far_above_is_no_cap", "tanh(s) without the c factors"),
]


def tiled(q: Array, k: Array, v: Array, *, sinks: Any = None, block: int = 5, **kw: Any) -> Array:
    """Correct, over key tiles of 5 with an online softmax (running max, rescaled sums)."""
    s = final_scores(q, k, **kw)
    sink = np.broadcast_to(sink_logits(q, sinks, s.dtype), (*s.shape[:-1], 1))
    top = np.array(sink, copy=True)
    total = np.where(np.isfinite(sink), 1.0, 0.0).astype(s.dtype)  # exp(sink − top) with top = sink
    acc = np.zeros((*s.shape[:-1], v.shape[-1]), dtype=s.dtype)
    vw = np.broadcast_to(v.astype(s.dtype), (*s.shape[:-2], *v.shape[-2:]))
    for j in range(0, s.shape[-1], block):
        tile = s[..., j:j + block]
        new = np.maximum(top, np.max(tile, axis=-1, keepdims=True))
        shift = np.where(np.isfinite(new), new, 0)
        rescale = np.where(np.isfinite(top), np.exp(top - shift), 0)
        e = np.exp(tile - shift)
        total = total * rescale + e.sum(axis=-1, keepdims=True)
        acc = acc * rescale + e @ vw[..., j:j + block, :]
        top = new
    return (acc / np.where(total > 0, total, 1)).astype(q.dtype)


CORRECT = [Target(tiled, name="tiled_keywords", ndims=(2, 3, 4), **KEYWORDS)]
