"""Gallery of the window laws: broken sliding windows, each rejected by its law, and a correct
variant that loops over the query rows."""

from __future__ import annotations

from typing import Any

import numpy as np

from gallery._keywords import KEYWORDS, scale_for, sink_logits, softmax_with_sinks, textbook, visible
from gallery.base import broken, scores
from impl import attention
from spec import Target

Array = np.ndarray


def _row(x: Any, i: int, n_q: int, keys: slice = slice(None)) -> Any:  # [..., n_q | 1, n_k] -> row i
    if x is None or np.ndim(x) < 2:
        return x
    x = np.asarray(x)
    return (x[..., i:i + 1, :] if x.shape[-2] == n_q else x)[..., keys]


def window_negative_slice(q: Array, k: Array, v: Array, *, window: Any = None, causal: bool = False,
                          mask: Any = None, bias: Any = None, **kw: Any) -> Array:
    if window is None:
        return textbook(q, k, v, causal=causal, mask=mask, bias=bias, **kw)
    n_q, n_k = q.shape[-2], k.shape[-2]
    keep = visible(n_q, n_k, causal=causal, mask=mask, window=window)
    rows = []
    for i in range(n_q):  # k[i − left : i + right + 1]: a negative start wraps to the end
        keys = slice(i - window[0], i + window[1] + 1)
        ks, vs = k[..., keys, :], v[..., keys, :]
        if ks.shape[-2] == 0:
            rows.append(np.zeros((*np.broadcast_shapes(q.shape[:-2], v.shape[:-2]), 1, v.shape[-1]), q.dtype))
            continue
        rows.append(textbook(q[..., i:i + 1, :], ks, vs, mask=_row(keep, i, n_q, keys),
                             bias=_row(bias, i, n_q, keys), **kw))
    return np.concatenate(rows, axis=-2)


def window_off_by_one(q: Array, k: Array, v: Array, *, window: Any = None, **kw: Any) -> Array:
    wider = None if window is None else (window[0] + 1, window[1])  # key diag − left − 1 still seen
    return textbook(q, k, v, window=wider, **kw)


def window_zero_is_none(q: Array, k: Array, v: Array, *, window: Any = None, **kw: Any) -> Array:
    """A side of 0 read as "no limit" (as -1 is FlashAttention's): a one-token window (0, 0)
    becomes no window, (0, right) a window with no left edge."""
    n = q.shape[-2] + k.shape[-2]
    wide = None if window is None else tuple(side or n for side in window)
    return textbook(q, k, v, window=wide, **kw)


def window_clipped(q: Array, k: Array, v: Array, *, window: Any = None, **kw: Any) -> Array:
    band = None if window is None else (min(window[0], 16), min(window[1], 16))  # a fixed 16-key band
    return textbook(q, k, v, window=band, **kw)


def window_top_left(q: Array, k: Array, v: Array, *, window: Any = None, causal: bool = False,
                    mask: Any = None, scale: Any = None, bias: Any = None, softcap: Any = None,
                    sinks: Any = None) -> Array:
    # causal bottom-right (as declared), but the window built top-left
    s = scores(q, k, scale_for(q, scale))
    keep = visible(q.shape[-2], k.shape[-2], causal=causal, mask=mask, window=None, align="bottom_right")
    if window is not None:
        keep = keep & visible(q.shape[-2], k.shape[-2], causal=False, mask=None, window=window)
    s = np.where(keep, s, -np.inf)
    w = softmax_with_sinks(s, sink_logits(q, sinks, s.dtype))
    return (w @ v.astype(w.dtype)).astype(q.dtype)


def window_drops_causal(q: Array, k: Array, v: Array, *, window: Any = None, causal: bool = False,
                        **kw: Any) -> Array:
    return textbook(q, k, v, window=window, causal=causal and window is None, **kw)


def _declared(fn: Any, catches: str, bug: str, **more: Any) -> Any:
    return broken(fn, catches, bug, **(KEYWORDS | {"ndims": (2, 3, 4)} | more))


def window_drops_lengths(q: Array, k: Array, v: Array, *, window: Any = None, kv_lengths: Any = None,
                         **kw: Any) -> Array:
    """The sliding-window path builds its own mask and forgets the key lengths."""
    return attention(q, k, v, window=window, kv_lengths=None if window is not None else kv_lengths, **kw)


BROKEN = [
    broken(window_drops_lengths, "window_with_kv_lengths", "the sliding-window path drops kv_lengths",
           supports_window=True, supports_kv_lengths=True, supports_mask=True, ndims=(2, 3, 4)),
    _declared(window_negative_slice, "window_matches_golden",
              "per-row slice k[i − left : i + right + 1]: a negative start wraps to the end of the keys"),
    _declared(window_off_by_one, "window_no_leak",
              "window of left + 1 keys: key diag − left − 1 leaks in (transformers#39408, vllm#3385)"),
    _declared(window_zero_is_none, "window_matches_golden",
              "a window side of 0 read as no limit: the one-token window (0, 0) is no window at all"),
    _declared(window_clipped, "window_wider_than_sequence", "window silently clipped to a fixed 16-key band"),
    _declared(window_top_left, "window_alignment",
              "window aligned top-left while the causal mask is bottom-right",
              causal_alignment="bottom_right"),
    _declared(window_drops_causal, "window_with_causal", "the window path drops the causal mask"),
]


def per_row(q: Array, k: Array, v: Array, *, causal: bool = False, mask: Any = None, window: Any = None,
            bias: Any = None, **kw: Any) -> Array:
    """Correct, one query row at a time, its visibility and bias sliced out of the full ones."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    keep = visible(n_q, n_k, causal=causal, mask=mask, window=window)
    rows = [textbook(q[..., i:i + 1, :], k, v, mask=_row(keep, i, n_q), bias=_row(bias, i, n_q), **kw)
            for i in range(n_q)]
    return np.concatenate(rows, axis=-2)


# --- serving kernels that take a window in one form only, each with its declaration ------------

def left_window_kernel(q: Array, k: Array, v: Array, *, window: Any = None, **kw: Any) -> Array:
    """A sliding window that looks back only: ``window=(left, 0)``; a right side has no spelling."""
    if window is not None and window[1] != 0:
        raise ValueError(f"window must be (left, 0): this kernel's window has no right side, got {window}")
    return attention(q, k, v, window=window, **kw)


def causal_window_kernel(q: Array, k: Array, v: Array, *, window: Any = None, causal: bool = False,
                         **kw: Any) -> Array:
    """A sliding window that exists only in the causal mode."""
    if window is not None and not causal:
        raise ValueError("window= needs causal=True: this kernel's window exists only in its causal mode")
    return attention(q, k, v, window=window, causal=causal, **kw)


SERVING = {"ndims": (2, 3, 4), "supports_scale": True, "supports_mask": True, "supports_kv_lengths": True,
           "supports_softcap": True, "empty_keys": "compute"}
"""What the serving kernels of the gallery take besides their keyword (`impl.attention` takes it all)."""

# Its row max raises on an empty key axis (n_k = 0): declared.
CORRECT = [Target(per_row, name="per_row_keywords", ndims=(2, 3, 4), empty_keys="raise", **KEYWORDS),
           Target(left_window_kernel, name="left_window",
                  supports_window=True, window_sides="left", **SERVING),
           Target(causal_window_kernel, name="causal_window",
                  supports_window=True, window_needs_causal=True, **SERVING)]
