"""Gallery of the past-cache laws (`spec.laws.past`): a past key/value cache ignored, joined in the
wrong order, or aligned wrong, and presents that are not the concatenation.

Each joins the past to the call's keys and values (or fails to) and hands them to
`impl.attention`, the causal queries continuing the past through a mask; the correct one does so
as the operator's definition says.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gallery.base import broken
from impl import attention
from spec import Target

Array = np.ndarray

PAST = {"supports_past_kv": True, "supports_mask": True, "supports_scale": True, "supports_gqa": True,
        "ndims": (2, 3, 4)}


def _with_past(q: Array, k: Array, v: Array, *, causal: bool = False, mask: Array | None = None,
               past_key: Array | None = None, past_value: Array | None = None, bug: str = "",
               **kw: Any) -> Any:
    """``(out, present_key, present_value)`` with one named bug (or none): ``ignored`` (the output
    attends to the call's own keys only), ``new_first`` (the new keys and values before the past,
    in the output and the presents), ``prepended`` (the presents new-first, the output right),
    ``top_left`` (causal queries aligned top-left on the concatenation)."""
    if past_key is None or past_value is None:
        return attention(q, k, v, causal=causal, mask=mask, **kw)
    keys, values = np.concatenate([past_key, k], axis=-2), np.concatenate([past_value, v], axis=-2)
    presents = (np.concatenate([k, past_key], axis=-2), np.concatenate([v, past_value], axis=-2)) \
        if bug in ("prepended", "new_first") else (keys, values)
    if bug == "new_first":
        keys, values = presents
    if bug == "ignored":
        keys, values = k, v
        mask = None if mask is None else mask[..., past_key.shape[-2]:]
    if causal:
        n_q, n_k = q.shape[-2], keys.shape[-2]
        offset = 0 if bug == "top_left" else n_k - k.shape[-2] if bug != "ignored" else 0
        diagonal = np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + offset
        mask = diagonal if mask is None else np.asarray(mask) & diagonal
    return attention(q, keys, values, mask=mask, **kw), *presents


def past_ignored(q: Array, k: Array, v: Array, **kw: Any) -> Any:
    return _with_past(q, k, v, bug="ignored", **kw)


def past_after_new_keys(q: Array, k: Array, v: Array, **kw: Any) -> Any:
    return _with_past(q, k, v, bug="new_first", **kw)


def past_causal_top_left(q: Array, k: Array, v: Array, **kw: Any) -> Any:
    return _with_past(q, k, v, bug="top_left", **kw)


def presents_new_keys_first(q: Array, k: Array, v: Array, **kw: Any) -> Any:
    return _with_past(q, k, v, bug="prepended", **kw)


def presents_past_only(q: Array, k: Array, v: Array, **kw: Any) -> Any:
    got = _with_past(q, k, v, **kw)
    if not isinstance(got, tuple):
        return got
    return got[0], kw["past_key"], kw["past_value"]


BROKEN = [
    broken(past_ignored, "past_kv_matches_concatenation", "the past cache ignored: the call attends to its "
           "own keys only", **PAST),
    broken(past_after_new_keys, "past_kv_matches_concatenation", "the past joined after the new keys, so a "
           "causal query sees the wrong ones", **PAST),
    broken(past_causal_top_left, "past_kv_matches_concatenation", "causal queries aligned top-left on the "
           "concatenation instead of continuing the past", **PAST),
    broken(presents_new_keys_first, "present_kv_is_concatenation", "the presents are concat(k, past): the "
           "new keys prepended", **PAST),
    broken(presents_past_only, "present_kv_is_concatenation", "the presents are the past alone (the new keys "
           "dropped from the cache)", **PAST),
]


# --- correct -----------------------------------------------------------------------------------


def past_cache(q: Array, k: Array, v: Array, **kw: Any) -> Any:
    """The operator's definition: the past then the call's keys, causal queries at n_past + i."""
    return _with_past(q, k, v, **kw)


CORRECT = [Target(past_cache, name="past cache joined, causal from n_past", **PAST)]
