"""Gallery of the sinks laws: broken sinks, each rejected by its law, and a correct variant that
appends the sink as an extra key column with no value."""

from __future__ import annotations

from typing import Any

import numpy as np

from gallery._keywords import KEYWORDS, final_scores, sink_logits, softmax_with_sinks, textbook
from gallery.base import broken
from spec import Target

Array = np.ndarray


def _weighted(q: Array, v: Array, w: Array) -> Array:
    return (w @ v.astype(w.dtype)).astype(q.dtype)


def sink_not_shifted(q: Array, k: Array, v: Array, *, sinks: Any = None, **kw: Any) -> Array:
    s = final_scores(q, k, **kw)
    top = np.max(s, axis=-1, keepdims=True)
    shift = np.where(np.isfinite(top), top, 0)
    e = np.exp(s - shift)
    # exp(sink), not exp(sink − max):
    total = e.sum(axis=-1, keepdims=True) + np.exp(sink_logits(q, sinks, s.dtype))
    return _weighted(q, v, e / np.where(total > 0, total, 1))


def sink_renormalised(q: Array, k: Array, v: Array, *, sinks: Any = None, **kw: Any) -> Array:
    s = final_scores(q, k, **kw)
    w = softmax_with_sinks(s, sink_logits(q, sinks, s.dtype))
    total = w.sum(axis=-1, keepdims=True)
    return _weighted(q, v, w / np.where(total > 0, total, 1))  # renormalised: the sink has no effect


def sink_as_zero_logit(q: Array, k: Array, v: Array, *, sinks: Any = None, **kw: Any) -> Array:
    s = final_scores(q, k, **kw)
    zero = None if sinks is None else np.zeros_like(np.asarray(sinks))  # softmax + 1, whatever the sink
    return _weighted(q, v, softmax_with_sinks(s, sink_logits(q, zero, s.dtype)))


def sink_of_head0(q: Array, k: Array, v: Array, *, sinks: Any = None, **kw: Any) -> Array:
    first = None if sinks is None else np.full_like(np.asarray(sinks), np.asarray(sinks)[0])
    return textbook(q, k, v, sinks=first, **kw)


def sink_dropped_when_decoding(q: Array, k: Array, v: Array, *, sinks: Any = None, **kw: Any) -> Array:
    return textbook(q, k, v, sinks=None if q.shape[-2] == 1 else sinks, **kw)  # the n_q = 1 path


def sink_left_out_of_max(q: Array, k: Array, v: Array, *, sinks: Any = None, **kw: Any) -> Array:
    s = final_scores(q, k, **kw)
    sink = sink_logits(q, sinks, s.dtype)
    top = np.max(s, axis=-1, keepdims=True)  # the row maximum, without the sink
    shift = np.where(np.isfinite(top), top, 0)
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(s - shift)
        total = e.sum(axis=-1, keepdims=True) + np.exp(sink - shift)  # inf once the sink is large
        return _weighted(q, v, e / total)


def lse_without_sink(q: Array, k: Array, v: Array, *, sinks: Any = None, return_lse: bool = False,
                     **kw: Any) -> Any:
    out = textbook(q, k, v, sinks=sinks, **kw)
    if not return_lse:
        return out
    s = final_scores(q, k, **kw)
    top = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(top), top, 0)
    with np.errstate(divide="ignore"):
        lse = (m + np.log(np.sum(np.exp(s - m), axis=-1, keepdims=True)))[..., 0]  # the sink left out
    return out, lse.astype(np.float64 if q.dtype == np.float64 else np.float32)


def _declared(fn: Any, catches: str, bug: str, **more: Any) -> Any:
    return broken(fn, catches, bug, **(KEYWORDS | {"ndims": (2, 3, 4)} | more))


BROKEN = [
    _declared(sink_not_shifted, "sinks_matches_golden",
              "exp(sink) added to a denominator of exp(s − max): the sink's weight is off by e^max"),
    _declared(sink_renormalised, "sinks_rows_sum_below_one",
              "weights renormalised to sum to 1 after the sink"),
    _declared(sink_as_zero_logit, "sinks_neg_inf_is_no_sink", "every sink taken as logit 0 (softmax + 1)"),
    _declared(sink_of_head0, "sinks_per_head", "head 0's sink used for every head"),
    _declared(sink_dropped_when_decoding, "sinks_single_query_matches_batch",
              "the single-query (decoding) path ignores the sinks (cf. mlx#3452)"),
    _declared(sink_left_out_of_max, "sinks_at_range_edge",
              "the sink left out of the row maximum: exp(sink − max) overflows once the sink is large "
              "(the class reviewed in flash-attention#2752)"),
    _declared(lse_without_sink, "sinks_in_lse", "lse of the keys alone, the sink left out", returns_lse=True),
]


def extra_column(q: Array, k: Array, v: Array, *, sinks: Any = None, **kw: Any) -> Array:
    """Correct: the sink as one more key column, softmax over n_k + 1 columns, the column dropped."""
    s = final_scores(q, k, **kw)
    sink = np.broadcast_to(sink_logits(q, sinks, s.dtype), (*s.shape[:-1], 1))
    w = softmax_with_sinks(np.concatenate([s, sink], axis=-1), np.asarray(-np.inf, dtype=s.dtype))
    return _weighted(q, v, w[..., :-1])


CORRECT = [Target(extra_column, name="extra_column_keywords", ndims=(2, 3, 4), **KEYWORDS)]
